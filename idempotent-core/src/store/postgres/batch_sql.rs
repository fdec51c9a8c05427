//! The batch statements of `PgStore`: `acquire`, `commit` and `remove` over arrays, and the
//! commit of a batch in its transaction, each item as the one-key statement takes it, all in one
//! statement, one row per item, `i` its position in the arrays (from 1).

use super::fragments::{counts_earlier, lapsed, lease_left, takeable, CLEARED, LEASE_END_MS, RELEASED_SET};

/// The batch statements, with the table's name in them.
#[derive(Debug)]
pub(crate) struct BatchStatements {
    /// The claim: `acquire` per item.
    pub(crate) acquire_many: String,
    /// The commit of the items that ran: `commit` per item.
    pub(crate) commit_many: String,
    /// The release of the items that failed or were lost: `remove` per item.
    pub(crate) remove_many: String,
    /// The commit of a batch in its transaction: `tx_commit` or `tx_remove` per item.
    pub(crate) tx_commit_many: String,
}

impl BatchStatements {
    /// `t` the quoted table, `seq` the fence's `nextval`, `watch_channel` the channel waiters
    /// listen on.
    pub(crate) fn new(t: &str, seq: &str, watch_channel: &str) -> BatchStatements {
        // An item whose key another
        // item of the same batch took in this statement (or whose row changed under the
        // statement) gets no row, or 'X': the caller runs the statement again for those items.
        // $1 keys, $2 owners, $3 fingerprints, $4 leases (ms), $5 keeps (ms), $6 lapses (as the
        // one-key statement's $6). Takes what the one-key statement takes (an absent key, an
        // expired row, the record of failed attempts, a row past its lease's end and not held) and
        // writes the same row (the attempt, the lease's end where it keeps it, `hold`). Rows are
        // inserted in key order, so that two batches over the same keys wait for each other in one
        // order (no deadlock between their inserts), and the copies of one key in their batch's
        // order, so that the first copy is the one that takes it (a row to take again is taken by
        // its key's first copy alone: an UPDATE joined to two rows would take either).
        let lease_q = "statement_timestamp() + q.lease * interval '1 millisecond'";
        let keep_q = "q.keep * interval '1 millisecond'";
        let keeps_end_q = "(q.lapse <> '0' OR r.expires_at > statement_timestamp())";
        let acquire_many = format!(
            "WITH req AS (
                SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::text[])
                    WITH ORDINALITY AS q(key, owner, fingerprint, lease, keep, lapse, i)
            ), ins AS (
                INSERT INTO {t} (key, state, owner, fingerprint, expires_at, attempt, lease_end, hold)
                SELECT q.key, 'P', q.owner, q.fingerprint,
                    {lease_q} + CASE WHEN q.lapse = '0' THEN interval '0' ELSE {keep_q} END,
                    1, CASE WHEN q.lapse <> '0' THEN {lease_q} END, q.lapse = '2'
                FROM req q ORDER BY q.key, q.i
                ON CONFLICT (key) DO NOTHING
                RETURNING key, owner, {seq} AS fence, attempt
            ), took AS (
                UPDATE {t} AS r SET state = 'P', owner = q.owner, fence = NULL, fingerprint = q.fingerprint,
                    result = NULL, stored_at = NULL, last_error = NULL, hold = q.lapse = '2',
                    attempt = CASE WHEN r.expires_at <= statement_timestamp() THEN 1
                        ELSE coalesce(r.attempt, 1) + 1 END,
                    lease_end = CASE WHEN {keeps_end_q} THEN {lease_q} END,
                    expires_at = {lease_q} + CASE WHEN {keeps_end_q} THEN {keep_q} ELSE interval '0' END,
                    watched = r.state = 'P' AND r.expires_at > statement_timestamp() AND r.watched
                FROM (SELECT DISTINCT ON (key) * FROM req ORDER BY key, i) q
                WHERE r.key = q.key AND {takeable_r}
                    AND NOT (r.state = 'P' AND r.owner = q.owner AND r.expires_at > statement_timestamp())
                    AND NOT EXISTS (SELECT FROM ins WHERE ins.key = q.key)
                RETURNING r.key, r.owner, {seq} AS fence, r.attempt
            )
            SELECT q.i, 'A' AS found, ins.fence, NULL::text AS fingerprint, NULL::bytea AS result,
                0::bigint AS left_ms, false AS watched, 0::bigint AS marked, ins.attempt, NULL::text AS owner,
                NULL::text AS last_error, NULL::bigint AS lease_end_ms
            FROM req q JOIN ins ON ins.key = q.key AND ins.owner = q.owner
            UNION ALL
            SELECT q.i, 'A', took.fence, NULL, NULL, 0, false, 0, took.attempt, NULL, NULL, NULL
            FROM req q JOIN took ON took.key = q.key AND took.owner = q.owner
            UNION ALL
            SELECT q.i, CASE
                    WHEN r.expires_at <= statement_timestamp() THEN 'X'
                    WHEN r.state = 'P' AND r.owner = q.owner THEN 'A'
                    WHEN {takeable_r} THEN 'X'
                    WHEN {lapsed_r} THEN 'U'
                    ELSE r.state END,
                CASE WHEN r.state = 'P' AND r.owner = q.owner AND r.expires_at > statement_timestamp() THEN {seq} END,
                r.fingerprint, r.result, {left_r}, r.watched, 0, coalesce(r.attempt, 1), r.owner, r.last_error,
                {lease_end_ms_r}
            FROM req q JOIN {t} r ON r.key = q.key
            WHERE NOT EXISTS (SELECT FROM ins WHERE ins.key = q.key)
                AND NOT EXISTS (SELECT FROM took WHERE took.key = q.key)",
            left_r = lease_left("r."),
            takeable_r = takeable("r."),
            lapsed_r = lapsed("r."),
            lease_end_ms_r = LEASE_END_MS.replace("{r}", "r."),
        );

        // $1 keys, $2 owners, $3 fences, $4 fingerprints, $5 results, $6 keeps (ms, > 0): `commit`
        // per item (an UPDATE and an INSERT, where the one-key statement has one INSERT ... ON
        // CONFLICT: its DO UPDATE checks the owner, which a completed row does not carry). The row
        // held by the owner (or expired, or completed by this acquisition already) is updated; an absent key is written; `done` per item.
        let keep_q = "statement_timestamp() + q.keep * interval '1 millisecond'";
        // The commits' items, and the update that completes those of them its WHERE picks.
        let completing = format!(
            "WITH req AS (
                SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::bytea[], $6::bigint[])
                    WITH ORDINALITY AS q(key, owner, fence, fingerprint, result, keep, i)
            ), up AS (
                UPDATE {t} AS r SET state = 'C', owner = NULL, fence = q.fence, fingerprint = q.fingerprint,
                    result = q.result, stored_at = statement_timestamp(), expires_at = {keep_q}, {CLEARED}
                FROM req q"
        );
        let commit_many = format!(
            "{completing}
                WHERE r.key = q.key AND ((r.state = 'P' AND r.owner = q.owner) OR r.expires_at <= statement_timestamp()
                    OR r.state = 'R' OR (r.state = 'C' AND r.fence = q.fence))
                RETURNING r.key, q.owner, r.watched
            ), ins AS (
                INSERT INTO {t} (key, state, owner, fence, fingerprint, result, stored_at, expires_at)
                SELECT q.key, 'C', NULL, q.fence, q.fingerprint, q.result, statement_timestamp(), {keep_q}
                FROM req q WHERE NOT EXISTS (SELECT FROM {t} r WHERE r.key = q.key) ORDER BY q.key
                ON CONFLICT (key) DO NOTHING
                RETURNING key
            ), notified AS (
                SELECT pg_notify('{watch_channel}', key) FROM up WHERE watched
            )
            SELECT q.i, EXISTS (SELECT FROM up WHERE up.key = q.key AND up.owner = q.owner)
                OR EXISTS (SELECT FROM ins WHERE ins.key = q.key) AS done, (SELECT count(*) FROM notified) AS notified
            FROM req q"
        );

        // $1 keys, $2 owners: `remove` per item (`released`, `other` as there).
        let remove_many = format!(
            "WITH req AS (
                SELECT * FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS q(key, owner, i)
            ), kept AS (
                UPDATE {t} AS r SET {released}
                FROM req q
                WHERE r.key = q.key AND {counts}
                RETURNING r.key, q.owner, r.watched
            ), gone AS (
                DELETE FROM {t} AS r USING req q
                WHERE r.key = q.key AND ((r.state = 'P' AND r.owner = q.owner AND NOT {counts})
                    OR r.expires_at <= statement_timestamp())
                RETURNING r.key, q.owner, r.watched,
                    r.state = 'P' AND r.owner = q.owner AND r.expires_at > statement_timestamp() AS ours
            ), notified AS (
                SELECT pg_notify('{watch_channel}', key)
                FROM (SELECT key, watched FROM gone UNION ALL SELECT key, watched FROM kept) w WHERE watched
            )
            SELECT q.i, EXISTS (SELECT FROM gone g WHERE g.key = q.key AND g.owner = q.owner AND g.ours)
                    OR EXISTS (SELECT FROM kept k WHERE k.key = q.key AND k.owner = q.owner) AS released,
                EXISTS (SELECT FROM {t} r WHERE r.key = q.key AND r.expires_at > statement_timestamp()
                    AND NOT (r.state IN ('P', 'R') AND r.owner = q.owner)) AS other,
                (SELECT count(*) FROM notified) AS notified
            FROM req q",
            released = RELEASED_SET.replace("{r}", "r."),
            counts = counts_earlier("r.", "q.owner"),
        );

        // In a batch's transaction, $1 keys, $2 owners, $3 fences, $4 fingerprints, $5 results,
        // $6 keeps (ms; 0: the row goes): `tx_commit` or `tx_remove` per item, `done` per item.
        let tx_commit_many = format!(
            "{completing}
                WHERE q.keep > 0 AND r.key = q.key AND r.state = 'P' AND r.owner = q.owner
                RETURNING q.i, r.key, r.watched
            ), gone AS (
                DELETE FROM {t} AS r USING req q
                WHERE q.keep = 0 AND r.key = q.key AND r.state = 'P' AND r.owner = q.owner
                RETURNING q.i, r.key, r.watched
            ), notified AS (
                SELECT pg_notify('{watch_channel}', d.key)
                FROM (SELECT key, watched FROM up UNION ALL SELECT key, watched FROM gone) d WHERE d.watched
            )
            SELECT q.i, EXISTS (SELECT FROM up WHERE up.i = q.i) OR EXISTS (SELECT FROM gone WHERE gone.i = q.i) AS done,
                (SELECT count(*) FROM notified) AS notified
            FROM req q"
        );

        BatchStatements { acquire_many, commit_many, remove_many, tx_commit_many }
    }
}
