//! The statements of `PgStore`, one per transition, built once per store from its table's name.
//!
//! Every statement reads the database's clock (`statement_timestamp()`: the start of the
//! statement; outside a transaction it is `now()`, inside the body's transaction `now()` would be
//! the transaction's start), and treats a row past its `expires_at` as absent. A statement that
//! changes several things does so in one statement (data-modifying `WITH`), so each transition is
//! atomic and one round trip.

/// The most bytes a schema's and a table's names may have together, so that the names derived from
/// them (the sequence, the index, the notification channels) fit PostgreSQL's 63.
pub(crate) const MAX_NAME_BYTES: usize = 52;

/// Checks a schema or table name; the reason it is refused otherwise.
pub(crate) fn check_identifier(what: &str, name: &str) -> Result<(), String> {
    let valid =
        name.bytes().enumerate().all(|(i, b)| b == b'_' || b.is_ascii_lowercase() || (i > 0 && b.is_ascii_digit()));
    if name.is_empty() || !valid {
        return Err(format!(
            "{what} {name:?} is not a plain identifier (lower-case ASCII letters, digits and underscores, not \
             starting with a digit)"
        ));
    }
    Ok(())
}

/// The statements, with the table's name in them.
#[derive(Debug)]
pub(crate) struct Statements {
    /// schema.sql for this schema and table, as `PgStore::schema_sql` gives it.
    pub(crate) migrate: String,
    /// The same as the store runs it: without the server's notices about what exists already
    /// (`schema "public" already exists, skipping`, logged by sqlx at every start otherwise).
    pub(crate) migrate_quietly: String,
    pub(crate) acquire: String,
    /// The batch transitions: `acquire`, `commit` and `remove` over arrays, one row per item.
    pub(crate) acquire_many: String,
    pub(crate) commit_many: String,
    pub(crate) remove_many: String,
    pub(crate) renew: String,
    pub(crate) commit: String,
    pub(crate) remove: String,
    pub(crate) tx_commit: String,
    pub(crate) tx_remove: String,
    pub(crate) tx_commit_many: String,
    pub(crate) inspect: String,
    pub(crate) forget: String,
    pub(crate) scan: String,
    pub(crate) reap: String,
    /// The channel commits and releases of watched keys notify (the payload is the full key).
    pub(crate) watch_channel: String,
    /// The channel forgets notify (the payload is the full key).
    pub(crate) purge_channel: String,
}

/// Milliseconds from now to `at`, as `bigint` (negative once past).
const LEFT_MS: &str = "(extract(epoch FROM ({at} - statement_timestamp())) * 1000)::bigint";

impl Statements {
    pub(crate) fn new(schema: &str, table: &str) -> Statements {
        let t = format!("\"{schema}\".\"{table}\"");
        let seq = format!("nextval('\"{schema}\".\"{table}_fence\"')");
        let migrate = include_str!("schema.sql").replace("{schema}", schema).replace("{table}", table);
        let watch_channel = format!("{schema}.{table}.w");
        let purge_channel = format!("{schema}.{table}.p");
        let left = |at: &str| LEFT_MS.replace("{at}", at);
        let lease = "statement_timestamp() + $4::bigint * interval '1 millisecond'";

        // $1 key, $2 owner, $3 fingerprint, $4 lease (ms), $5 will wait.
        // Takes an absent key (the INSERT), or one whose row has expired (the UPDATE); the fencing
        // token is drawn in RETURNING, after the row is written: a later holder's row can only be
        // written after this one is gone, so its token is drawn later, and is larger. Otherwise
        // reports the row as the statement's snapshot shows it (marking it watched for a caller
        // that will wait): `found` is 'A' (acquired, also a re-sent acquire finding its own row,
        // which draws a token while it holds the key), 'P', 'C', or 'X' (the row changed between
        // the snapshot and the write: the caller runs the statement again); no row at all means
        // the same.
        let acquire = format!(
            "WITH ins AS (
                INSERT INTO {t} (key, state, owner, fingerprint, expires_at)
                VALUES ($1, 'P', $2, $3, {lease})
                ON CONFLICT (key) DO NOTHING
                RETURNING {seq} AS fence
            ), took AS (
                UPDATE {t} SET state = 'P', owner = $2, fence = NULL, fingerprint = $3, result = NULL,
                    stored_at = NULL, expires_at = {lease}, watched = false
                WHERE key = $1 AND expires_at <= statement_timestamp() AND NOT EXISTS (SELECT FROM ins)
                RETURNING {seq} AS fence
            ), marked AS (
                UPDATE {t} SET watched = true
                WHERE $5 AND key = $1 AND state = 'P' AND owner <> $2 AND NOT watched
                    AND expires_at > statement_timestamp() AND NOT EXISTS (SELECT FROM ins)
                RETURNING 1
            )
            SELECT 'A' AS found, fence, NULL::text AS fingerprint, NULL::bytea AS result, 0::bigint AS left_ms,
                false AS watched, 0::bigint AS marked FROM ins
            UNION ALL
            SELECT 'A', fence, NULL, NULL, 0, false, 0 FROM took
            UNION ALL
            SELECT CASE
                    WHEN r.expires_at <= statement_timestamp() THEN 'X'
                    WHEN r.state = 'P' AND r.owner = $2 THEN 'A'
                    ELSE r.state END,
                CASE WHEN r.state = 'P' AND r.owner = $2 AND r.expires_at > statement_timestamp() THEN {seq} END,
                r.fingerprint, r.result, {left_r}, r.watched, (SELECT count(*) FROM marked)
            FROM {t} r
            WHERE r.key = $1 AND NOT EXISTS (SELECT FROM ins) AND NOT EXISTS (SELECT FROM took)",
            left_r = left("r.expires_at"),
        );

        // $1 keys, $2 owners, $3 leases (ms): the leases still held, as (key, owner).
        let renew = format!(
            "UPDATE {t} AS r SET expires_at = statement_timestamp() + l.lease * interval '1 millisecond'
            FROM unnest($1::text[], $2::text[], $3::bigint[]) AS l(key, owner, lease)
            WHERE r.key = l.key AND r.state = 'P' AND r.owner = l.owner AND r.expires_at > statement_timestamp()
            RETURNING r.key, r.owner"
        );

        // $1 key, $2 owner, $3 fence, $4 fingerprint, $5 result, $6 keep (ms, > 0).
        // In progress by this owner, absent or expired: completed. Completed by this acquisition
        // already (a repeated commit): written again, so that `keep` counts from this commit, as
        // the caller's replay cache does. Anything else: nothing (`done` = 0, lost).
        let commit = format!(
            "WITH up AS (
                INSERT INTO {t} AS r (key, state, owner, fence, fingerprint, result, stored_at, expires_at)
                VALUES ($1, 'C', NULL, $3, $4, $5, statement_timestamp(),
                    statement_timestamp() + $6::bigint * interval '1 millisecond')
                ON CONFLICT (key) DO UPDATE SET state = 'C', owner = NULL, fence = excluded.fence,
                    fingerprint = excluded.fingerprint, result = excluded.result, stored_at = excluded.stored_at,
                    expires_at = excluded.expires_at
                WHERE (r.state = 'P' AND r.owner = $2) OR r.expires_at <= statement_timestamp()
                    OR (r.state = 'C' AND r.fence = $3)
                RETURNING r.watched
            )
            SELECT (SELECT count(*) FROM up) AS done,
                (SELECT count(*) FROM (SELECT pg_notify('{watch_channel}', $1) FROM up WHERE watched) n) AS notified"
        );

        // $1 key, $2 owner: release, and commit with keep = 0. The row held by this owner goes
        // (an expired one too, anyone's); `released` says ours went, `other` that a live row of
        // someone else's is there (lost). Neither: the key was absent, done.
        let remove = format!(
            "WITH gone AS (
                DELETE FROM {t}
                WHERE key = $1 AND ((state = 'P' AND owner = $2) OR expires_at <= statement_timestamp())
                RETURNING watched, state = 'P' AND owner = $2 AND expires_at > statement_timestamp() AS ours
            )
            SELECT EXISTS (SELECT FROM gone WHERE ours) AS released,
                EXISTS (SELECT FROM {t} WHERE key = $1 AND expires_at > statement_timestamp()
                    AND NOT (state = 'P' AND owner = $2)) AS other,
                (SELECT count(*) FROM (SELECT pg_notify('{watch_channel}', $1) FROM gone WHERE watched) n) AS notified"
        );

        // In the body's transaction, $1 key, $2 owner, $3 fence, $4 fingerprint, $5 result, $6 keep
        // (ms, > 0): the row in progress held by this owner becomes completed (`done` = 1), or
        // nothing happens (0: the key is not this owner's any more, the transaction rolls back).
        // Only an UPDATE: an absent row is not written, so a call whose runtime is not on this
        // table cannot complete a key here.
        let tx_commit = format!(
            "WITH up AS (
                UPDATE {t} SET state = 'C', owner = NULL, fence = $3, fingerprint = $4, result = $5,
                    stored_at = statement_timestamp(),
                    expires_at = statement_timestamp() + $6::bigint * interval '1 millisecond'
                WHERE key = $1 AND state = 'P' AND owner = $2
                RETURNING watched
            )
            SELECT (SELECT count(*) FROM up) AS done,
                (SELECT count(*) FROM (SELECT pg_notify('{watch_channel}', $1) FROM up WHERE watched) n) AS notified"
        );
        // The same with keep = 0: the row goes.
        let tx_remove = format!(
            "WITH gone AS (DELETE FROM {t} WHERE key = $1 AND state = 'P' AND owner = $2 RETURNING watched)
            SELECT (SELECT count(*) FROM gone) AS done,
                (SELECT count(*) FROM (SELECT pg_notify('{watch_channel}', $1) FROM gone WHERE watched) n) AS notified"
        );

        let columns = format!(
            "key, state, owner, fence, fingerprint, result, (extract(epoch FROM stored_at) * 1000)::bigint AS stored_ms, \
             {} AS left_ms, watched",
            left("expires_at")
        );
        let inspect = format!("SELECT {columns} FROM {t} WHERE key = $1 AND expires_at > statement_timestamp()");

        // $1 key, $2 forced: deletes a completed row (an in-progress one when forced), waking its
        // waiters and telling every process following purges.
        let forget = format!(
            "WITH gone AS (
                DELETE FROM {t} WHERE key = $1 AND expires_at > statement_timestamp() AND (state = 'C' OR $2)
                RETURNING state, watched
            )
            SELECT (SELECT state FROM gone) AS deleted,
                (SELECT state FROM {t} WHERE key = $1 AND expires_at > statement_timestamp()) AS found,
                (SELECT count(*) FROM (SELECT pg_notify('{watch_channel}', $1) FROM gone WHERE watched) w)
                + (SELECT count(*) FROM (SELECT pg_notify('{purge_channel}', $1) FROM gone) p) AS notified"
        );

        // $1 prefix, $2 last key of the previous page ('' on the first), $3 rows: a page in key
        // order from the prefix on; the caller stops at the first key past the prefix.
        let scan = format!(
            "SELECT {columns}, expires_at > statement_timestamp() AS live FROM {t}
            WHERE key >= $1 AND key > $2 ORDER BY key LIMIT $3"
        );

        // $1 rows at most: expired rows, oldest first, skipping rows a transition holds.
        let reap = format!(
            "DELETE FROM {t} WHERE ctid = ANY(ARRAY(
                SELECT ctid FROM {t} WHERE expires_at <= statement_timestamp()
                ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED))
            AND expires_at <= statement_timestamp()"
        );

        // The batch statements: each item as the one-key statement takes it, all in one statement,
        // one row per item, `i` its position in the arrays (from 1). An item whose key another
        // item of the same batch took in this statement (or whose row changed under the
        // statement) gets no row, or 'X': the caller runs the statement again for those items.
        // $1 keys, $2 owners, $3 fingerprints, $4 leases (ms). Rows are inserted in key order, so
        // that two batches over the same keys wait for each other in one order (no deadlock
        // between their inserts), and the copies of one key in their batch's order, so that the
        // first copy is the one that takes it (an expired record is taken by its key's first copy alone:
        // an UPDATE joined to two rows would take either).
        let lease_q = "statement_timestamp() + q.lease * interval '1 millisecond'";
        let acquire_many = format!(
            "WITH req AS (
                SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[]) WITH ORDINALITY
                    AS q(key, owner, fingerprint, lease, i)
            ), ins AS (
                INSERT INTO {t} (key, state, owner, fingerprint, expires_at)
                SELECT q.key, 'P', q.owner, q.fingerprint, {lease_q} FROM req q ORDER BY q.key, q.i
                ON CONFLICT (key) DO NOTHING
                RETURNING key, owner, {seq} AS fence
            ), took AS (
                UPDATE {t} AS r SET state = 'P', owner = q.owner, fence = NULL, fingerprint = q.fingerprint,
                    result = NULL, stored_at = NULL, expires_at = {lease_q}, watched = false
                FROM (SELECT DISTINCT ON (key) * FROM req ORDER BY key, i) q
                WHERE r.key = q.key AND r.expires_at <= statement_timestamp()
                    AND NOT EXISTS (SELECT FROM ins WHERE ins.key = q.key)
                RETURNING r.key, r.owner, {seq} AS fence
            )
            SELECT q.i, 'A' AS found, ins.fence, NULL::text AS fingerprint, NULL::bytea AS result,
                0::bigint AS left_ms, false AS watched, 0::bigint AS marked
            FROM req q JOIN ins ON ins.key = q.key AND ins.owner = q.owner
            UNION ALL
            SELECT q.i, 'A', took.fence, NULL, NULL, 0, false, 0
            FROM req q JOIN took ON took.key = q.key AND took.owner = q.owner
            UNION ALL
            SELECT q.i, CASE
                    WHEN r.expires_at <= statement_timestamp() THEN 'X'
                    WHEN r.state = 'P' AND r.owner = q.owner THEN 'A'
                    ELSE r.state END,
                CASE WHEN r.state = 'P' AND r.owner = q.owner AND r.expires_at > statement_timestamp() THEN {seq} END,
                r.fingerprint, r.result, {left_r}, r.watched, 0
            FROM req q JOIN {t} r ON r.key = q.key
            WHERE NOT EXISTS (SELECT FROM ins WHERE ins.key = q.key)
                AND NOT EXISTS (SELECT FROM took WHERE took.key = q.key)",
            left_r = left("r.expires_at"),
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
                    result = q.result, stored_at = statement_timestamp(), expires_at = {keep_q}
                FROM req q"
        );
        let commit_many = format!(
            "{completing}
                WHERE r.key = q.key AND ((r.state = 'P' AND r.owner = q.owner) OR r.expires_at <= statement_timestamp()
                    OR (r.state = 'C' AND r.fence = q.fence))
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
            ), gone AS (
                DELETE FROM {t} AS r USING req q
                WHERE r.key = q.key AND ((r.state = 'P' AND r.owner = q.owner) OR r.expires_at <= statement_timestamp())
                RETURNING r.key, q.owner, r.watched,
                    r.state = 'P' AND r.owner = q.owner AND r.expires_at > statement_timestamp() AS ours
            ), notified AS (
                SELECT pg_notify('{watch_channel}', key) FROM gone WHERE watched
            )
            SELECT q.i, EXISTS (SELECT FROM gone g WHERE g.key = q.key AND g.owner = q.owner AND g.ours) AS released,
                EXISTS (SELECT FROM {t} r WHERE r.key = q.key AND r.expires_at > statement_timestamp()
                    AND NOT (r.state = 'P' AND r.owner = q.owner)) AS other,
                (SELECT count(*) FROM notified) AS notified
            FROM req q"
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

        Statements {
            tx_commit_many,
            acquire_many,
            commit_many,
            remove_many,
            migrate_quietly: format!("SET LOCAL client_min_messages = warning;\n{migrate}"),
            migrate,
            acquire,
            renew,
            commit,
            remove,
            tx_commit,
            tx_remove,
            inspect,
            forget,
            scan,
            reap,
            watch_channel,
            purge_channel,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_plain() {
        for good in ["idempotency", "_x", "a1_b2"] {
            assert!(check_identifier("table", good).is_ok(), "{good}");
        }
        for bad in ["", "1a", "Upper", "a-b", "a\"b", "a b", "é"] {
            assert!(check_identifier("table", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn names_land_in_the_statements() {
        let s = Statements::new("svc", "records");
        assert!(
            s.acquire.contains("\"svc\".\"records\"") && s.acquire.contains("nextval('\"svc\".\"records_fence\"')")
        );
        assert!(s.migrate.contains("CREATE TABLE IF NOT EXISTS \"svc\".\"records\"") && !s.migrate.contains('{'));
        assert_eq!((s.watch_channel.as_str(), s.purge_channel.as_str()), ("svc.records.w", "svc.records.p"));
    }
}
