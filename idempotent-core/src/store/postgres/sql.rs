//! The statements of `PgStore`, one per transition, built once per store from its table's name.
//!
//! Every statement reads the database's clock (`statement_timestamp()`: the start of the
//! statement; outside a transaction it is `now()`, inside the body's transaction `now()` would be
//! the transaction's start), and treats a row past its `expires_at` as absent. A statement that
//! changes several things does so in one statement (data-modifying `WITH`), so each transition is
//! atomic and one round trip.

use super::batch_sql::BatchStatements;
use super::fragments::{
    counts_earlier, lapsed, lease_left, shown_state, takeable, CLEARED, LEASE_END_MS, LEFT_MS, RELEASED_SET,
};

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
    /// The acquire of a caller that will not wait (its first attempt): `acquire_waiting` without
    /// the part that marks the row watched, which would do nothing for it.
    pub(crate) acquire: String,
    /// The acquire of a caller that will wait for the holder: marks the row watched.
    pub(crate) acquire_waiting: String,
    /// `acquire` as a call of the table's acquire function (made by `migrate`), which the store
    /// sends in its place where the function is there and the user may execute it.
    pub(crate) acquire_call: String,
    /// The acquire function's signature, for `to_regprocedure`.
    pub(crate) acquire_function: String,
    /// The batch transitions (`batch_sql.rs`).
    pub(crate) batch: BatchStatements,
    pub(crate) renew: String,
    pub(crate) commit: String,
    pub(crate) remove: String,
    pub(crate) tx_commit: String,
    pub(crate) tx_remove: String,
    pub(crate) inspect: String,
    /// The transitions of failed attempts and unknown outcomes (`failures.rs`).
    pub(crate) failures: super::failures::Statements,
    pub(crate) forget: String,
    pub(crate) scan: String,
    pub(crate) reap: String,
    /// The channel commits and releases of watched keys notify (the payload is the full key).
    pub(crate) watch_channel: String,
    /// The channel forgets notify (the payload is the full key).
    pub(crate) purge_channel: String,
}

/// The acquire function of a schema and table, quoted (`migrate` makes it; see `acquire_call`).
fn acquire_function_name(schema: &str, table: &str) -> String {
    format!("\"{schema}\".\"{table}_acquire\"")
}

impl Statements {
    pub(crate) fn new(schema: &str, table: &str) -> Statements {
        let t = format!("\"{schema}\".\"{table}\"");
        let seq = format!("nextval('\"{schema}\".\"{table}_fence\"')");
        let tables = include_str!("schema.sql").replace("{schema}", schema).replace("{table}", table);
        let watch_channel = format!("{schema}.{table}.w");
        let purge_channel = format!("{schema}.{table}.p");
        let left = |at: &str| LEFT_MS.replace("{at}", at);
        let lease = "statement_timestamp() + $4::bigint * interval '1 millisecond'";

        // $1 key, $2 owner, $3 fingerprint, $4 lease (ms), $5 will wait, $6 what the key becomes if
        // the lease runs out ('0' free, '1' free with the attempt counted, '2' held), $7 keep (ms).
        // Takes an absent key (the INSERT), or one whose row has expired, or holds the record of
        // failed attempts ('R'), or is in progress past the lease's end it keeps and not held (the
        // UPDATE: the attempt after the row's); the fencing token is drawn in RETURNING, after the
        // row is written: a later holder's row can only be written after this one is gone, so
        // its token is drawn later, and is larger. A row that keeps its lease's end (`lease_end`;
        // asked for by $6, or not the key's first attempt) lives `keep` past it. Otherwise
        // reports the row as the statement's snapshot shows it (marking it watched for a caller
        // that will wait): `found` is 'A' (acquired, also a re-sent acquire finding its own row,
        // which draws a token while it holds the key), 'P', 'C', 'F' (given up), 'U' (unknown: held
        // past its lease's end), or 'X' (the row changed between the snapshot and the write: the
        // caller runs the statement again); no row at all means the same.
        // Marking costs a third data-modifying part, which PostgreSQL sets up at every execution
        // whether it runs or not (about 8 % of the server's CPU per first execution, measured with
        // pgbench); a caller that will not wait ($5 false: every first attempt) gets a statement
        // whose `marked` part modifies nothing.
        let keeps_end = "($6 <> '0' OR expires_at > statement_timestamp())";
        let marks = format!(
            "UPDATE {t} SET watched = true
                WHERE $5 AND key = $1 AND state = 'P' AND owner <> $2 AND NOT watched
                    AND expires_at > statement_timestamp() AND NOT {lapsed} AND NOT EXISTS (SELECT FROM ins)
                RETURNING 1",
            lapsed = lapsed(""),
        );
        let insert = format!(
            "INSERT INTO {t} (key, state, owner, fingerprint, expires_at, attempt, lease_end, hold)
                VALUES ($1, 'P', $2, $3,
                    {lease} + CASE WHEN $6 = '0' THEN interval '0' ELSE $7::bigint * interval '1 millisecond' END,
                    1, CASE WHEN $6 <> '0' THEN {lease} END, $6 = '2')
                ON CONFLICT (key) DO NOTHING"
        );
        // What follows the insert (`ins`), with `{marks}` to fill.
        let after_insert = format!(
            "took AS (
                UPDATE {t} SET state = 'P', owner = $2, fence = NULL, fingerprint = $3, result = NULL,
                    stored_at = NULL, last_error = NULL, hold = $6 = '2',
                    attempt = CASE WHEN expires_at <= statement_timestamp() THEN 1 ELSE coalesce(attempt, 1) + 1 END,
                    lease_end = CASE WHEN {keeps_end} THEN {lease} END,
                    expires_at = {lease}
                        + CASE WHEN {keeps_end} THEN $7::bigint * interval '1 millisecond' ELSE interval '0' END,
                    watched = state = 'P' AND expires_at > statement_timestamp() AND watched
                WHERE key = $1 AND NOT EXISTS (SELECT FROM ins) AND ({takeable}) AND NOT (state = 'P' AND owner = $2
                    AND expires_at > statement_timestamp())
                RETURNING {seq} AS fence, attempt
            ), marked AS (
                {{marks}}
            )
            SELECT 'A' AS found, fence, NULL::text AS fingerprint, NULL::bytea AS result, 0::bigint AS left_ms,
                false AS watched, 0::bigint AS marked, attempt, NULL::text AS owner, NULL::text AS last_error,
                NULL::bigint AS lease_end_ms FROM ins
            UNION ALL
            SELECT 'A', fence, NULL, NULL, 0, false, 0, attempt, NULL, NULL, NULL FROM took
            UNION ALL
            SELECT CASE
                    WHEN r.expires_at <= statement_timestamp() THEN 'X'
                    WHEN r.state = 'P' AND r.owner = $2 THEN 'A'
                    WHEN {takeable_r} THEN 'X'
                    WHEN {lapsed_r} THEN 'U'
                    ELSE r.state END,
                CASE WHEN r.state = 'P' AND r.owner = $2 AND r.expires_at > statement_timestamp() THEN {seq} END,
                r.fingerprint, r.result, {left_r}, r.watched, (SELECT count(*) FROM marked),
                coalesce(r.attempt, 1), r.owner, r.last_error, {lease_end_ms_r}
            FROM {t} r
            WHERE r.key = $1 AND NOT EXISTS (SELECT FROM ins) AND NOT EXISTS (SELECT FROM took)",
            takeable = takeable(""),
            takeable_r = takeable("r."),
            lapsed_r = lapsed("r."),
            left_r = lease_left("r."),
            lease_end_ms_r = LEASE_END_MS.replace("{r}", "r."),
        );
        let no_marks = "SELECT 1 WHERE $5 AND false";
        let acquire_waiting = format!("WITH ins AS ({insert} RETURNING {seq} AS fence, attempt), {after_insert}")
            .replace("{marks}", &marks);
        let acquire = format!("WITH ins AS ({insert} RETURNING {seq} AS fence, attempt), {after_insert}")
            .replace("{marks}", no_marks);
        // The same as a function, for a first execution: the insert alone, and only when it finds
        // the key taken, the rest (as `acquire`, with nothing inserted). A statement's every part is
        // set up at each execution, run or not; the function's parts are set up only when it
        // reaches them, so the usual case, an absent key, costs the insert and the token. Its
        // arguments are the statement's, its rows the same.
        let function_sql = format!(
            "-- The acquire of a first execution, as a function (schema version 3; see acquire_call).
CREATE OR REPLACE FUNCTION {function}(text, text, text, bigint, boolean, text, bigint)
RETURNS TABLE (found text, fence bigint, fingerprint text, result bytea, left_ms bigint, watched boolean,
    marked bigint, attempt integer, owner text, last_error text, lease_end_ms bigint)
LANGUAGE plpgsql AS $acquire$
#variable_conflict use_column
BEGIN
    {insert};
    IF FOUND THEN
        RETURN QUERY SELECT 'A'::text, {seq}, NULL::text, NULL::bytea, 0::bigint, false, 0::bigint, 1, NULL::text,
            NULL::text, NULL::bigint;
        RETURN;
    END IF;
    RETURN QUERY WITH ins AS (SELECT NULL::bigint AS fence, NULL::integer AS attempt WHERE false), {after_insert};
END
$acquire$;
",
            function = acquire_function_name(schema, table),
        )
        .replace("{marks}", no_marks);
        let migrate = format!("{tables}\n{function_sql}");
        let acquire_function =
            format!("{}(text, text, text, bigint, boolean, text, bigint)", acquire_function_name(schema, table));
        let acquire_call =
            format!("SELECT * FROM {}($1, $2, $3, $4, $5, $6, $7)", acquire_function_name(schema, table));

        // $1 keys, $2 owners, $3 leases (ms): the leases still held, as (key, owner). A row that
        // keeps its lease's end gets a new one and lives as long past it as before; one whose end
        // has passed is not renewed (its holder stopped: the next acquire decides what that means).
        let renew = format!(
            "UPDATE {t} AS r SET
                lease_end = CASE WHEN r.lease_end IS NOT NULL
                    THEN statement_timestamp() + l.lease * interval '1 millisecond' END,
                expires_at = statement_timestamp() + l.lease * interval '1 millisecond'
                    + coalesce(r.expires_at - r.lease_end, interval '0')
            FROM unnest($1::text[], $2::text[], $3::bigint[]) AS l(key, owner, lease)
            WHERE r.key = l.key AND r.state = 'P' AND r.owner = l.owner AND r.expires_at > statement_timestamp()
                AND NOT {lapsed_r}
            RETURNING r.key, r.owner",
            lapsed_r = lapsed("r."),
        );

        // $1 key, $2 owner, $3 fence, $4 fingerprint, $5 result, $6 keep (ms, > 0).
        // In progress by this owner (its lease's end passed or not), absent, expired, or released
        // by a later attempt that failed: completed. Completed by this acquisition already (a
        // repeated commit): written again, so that `keep` counts from this commit, as the caller's
        // replay cache does. Anything else (another holder, a key given up): nothing (`done` = 0,
        // lost).
        let commit = format!(
            "WITH up AS (
                INSERT INTO {t} AS r (key, state, owner, fence, fingerprint, result, stored_at, expires_at)
                VALUES ($1, 'C', NULL, $3, $4, $5, statement_timestamp(),
                    statement_timestamp() + $6::bigint * interval '1 millisecond')
                ON CONFLICT (key) DO UPDATE SET state = 'C', owner = NULL, fence = excluded.fence,
                    fingerprint = excluded.fingerprint, result = excluded.result, stored_at = excluded.stored_at,
                    expires_at = excluded.expires_at, {cleared}
                WHERE (r.state = 'P' AND r.owner = $2) OR r.expires_at <= statement_timestamp() OR r.state = 'R'
                    OR (r.state = 'C' AND r.fence = $3)
                RETURNING r.watched
            )
            SELECT (SELECT count(*) FROM up) AS done,
                (SELECT count(*) FROM (SELECT pg_notify('{watch_channel}', $1) FROM up WHERE watched) n) AS notified",
            cleared = CLEARED,
        );

        // $1 key, $2 owner: a release, and a commit with keep = 0. The row held by this owner goes
        // (an expired one too, anyone's), unless it counts attempts before this one (it keeps its
        // lease's end and lives past it): then it becomes the record of those ('R', this attempt
        // not counted), kept as long past now as it was past its lease's end. `released` says ours
        // went, `other` that a live row of someone else's is there (lost; a record of failed
        // attempts by this owner is its own release, repeated). Neither: the key was absent, done.
        let remove = format!(
            "WITH kept AS (
                UPDATE {t} SET {released}
                WHERE key = $1 AND {counts}
                RETURNING watched
            ), gone AS (
                DELETE FROM {t}
                WHERE key = $1 AND ((state = 'P' AND owner = $2 AND NOT {counts}) OR expires_at <= statement_timestamp())
                RETURNING watched, state = 'P' AND owner = $2 AND expires_at > statement_timestamp() AS ours
            )
            SELECT EXISTS (SELECT FROM gone WHERE ours) OR EXISTS (SELECT FROM kept) AS released,
                EXISTS (SELECT FROM {t} WHERE key = $1 AND expires_at > statement_timestamp()
                    AND NOT (state IN ('P', 'R') AND owner = $2)) AS other,
                (SELECT count(*) FROM (SELECT pg_notify('{watch_channel}', $1)
                    FROM (SELECT watched FROM gone UNION ALL SELECT watched FROM kept) w WHERE watched) n) AS notified",
            released = RELEASED_SET.replace("{r}", ""),
            counts = counts_earlier("", "$2"),
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
                    expires_at = statement_timestamp() + $6::bigint * interval '1 millisecond', {cleared}
                WHERE key = $1 AND state = 'P' AND owner = $2
                RETURNING watched
            )
            SELECT (SELECT count(*) FROM up) AS done,
                (SELECT count(*) FROM (SELECT pg_notify('{watch_channel}', $1) FROM up WHERE watched) n) AS notified",
            cleared = CLEARED,
        );
        // The same with keep = 0: the row goes.
        let tx_remove = format!(
            "WITH gone AS (DELETE FROM {t} WHERE key = $1 AND state = 'P' AND owner = $2 RETURNING watched)
            SELECT (SELECT count(*) FROM gone) AS done,
                (SELECT count(*) FROM (SELECT pg_notify('{watch_channel}', $1) FROM gone WHERE watched) n) AS notified"
        );

        let columns = format!(
            "key, state, owner, fence, fingerprint, result, (extract(epoch FROM stored_at) * 1000)::bigint AS stored_ms, \
             {} AS left_ms, watched, attempt, last_error, hold, {} AS lease_end_ms, {} AS lapsed",
            left("expires_at"),
            LEASE_END_MS.replace("{r}", ""),
            lapsed(""),
        );
        let inspect = format!("SELECT {columns} FROM {t} WHERE key = $1 AND expires_at > statement_timestamp()");

        // $1 key, $2 forced: deletes a row that is not in progress (completed, released, failed,
        // or past the lease's end it keeps), or an in-progress one when forced, waking its waiters
        // and telling every process following purges. States as operators see them ('U' unknown).
        let forget = format!(
            "WITH gone AS (
                DELETE FROM {t} WHERE key = $1 AND expires_at > statement_timestamp()
                    AND (state <> 'P' OR $2 OR {lapsed})
                RETURNING {shown} AS state, watched
            )
            SELECT (SELECT state FROM gone) AS deleted,
                (SELECT {shown} FROM {t} WHERE key = $1 AND expires_at > statement_timestamp()) AS found,
                (SELECT count(*) FROM (SELECT pg_notify('{watch_channel}', $1) FROM gone WHERE watched) w)
                + (SELECT count(*) FROM (SELECT pg_notify('{purge_channel}', $1) FROM gone) p) AS notified",
            lapsed = lapsed(""),
            shown = shown_state(""),
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

        let batch = BatchStatements::new(&t, &seq, &watch_channel);

        Statements {
            failures: super::failures::Statements::new(&t, &watch_channel),
            batch,
            migrate_quietly: format!("SET LOCAL client_min_messages = warning;\n{migrate}"),
            migrate,
            acquire,
            acquire_waiting,
            acquire_call,
            acquire_function,
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
        assert!(!s.acquire.contains("SET watched = true") && s.acquire_waiting.contains("SET watched = true"));
        assert!(s.migrate.contains("CREATE OR REPLACE FUNCTION \"svc\".\"records_acquire\"(text,"));
        assert!(s.acquire_call.starts_with("SELECT * FROM \"svc\".\"records_acquire\"($1,"));
        assert!(s.migrate.contains("CREATE TABLE IF NOT EXISTS \"svc\".\"records\"") && !s.migrate.contains('{'));
        assert_eq!((s.watch_channel.as_str(), s.purge_channel.as_str()), ("svc.records.w", "svc.records.p"));
    }
}
