//! Failed attempts and unknown outcomes on PostgreSQL (`Store::fail`, `fail_many`, `resolve`):
//! their statements, one per transition (a batch's over arrays), and the store's side of them.
//! A failure's row is 'R' (the count of failed attempts and the last error; the next acquire
//! takes it as the next attempt) or 'F' (the key given up), with its owner kept so that a
//! repeated command knows itself.

use super::batch::item_of;
use super::fragments::shown_state;
use super::*;

/// The statements, with the table's name in them.
#[derive(Debug)]
pub(crate) struct Statements {
    fail: String,
    fail_many: String,
    resolve: String,
}

/// A failure's row as the `INSERT` writes it, from the values `{v}` names (`$`-parameters or a
/// request's columns).
const FAILURE_ROW: &str = "CASE WHEN {give_up} THEN 'F' ELSE 'R' END, {owner}, 0, CASE WHEN {give_up} THEN {fp} END, \
    statement_timestamp(), statement_timestamp() + {keep} * interval '1 millisecond', {attempt}, {error}";

/// The columns a failure's row takes over an in-progress one.
const FAILURE_SET: &str = "state = excluded.state, owner = excluded.owner, fence = 0, \
    fingerprint = excluded.fingerprint, result = NULL, stored_at = excluded.stored_at, \
    expires_at = excluded.expires_at, attempt = excluded.attempt, lease_end = NULL, hold = false, \
    last_error = excluded.last_error";

impl Statements {
    pub(crate) fn new(t: &str, watch_channel: &str) -> Statements {
        let columns = "key, state, owner, fence, fingerprint, stored_at, expires_at, attempt, last_error";
        // $1 key, $2 owner, $3 attempt, $4 keep (ms, > 0), $5 give up, $6 fingerprint, $7 error.
        // The row held by this owner (its lease's end passed or not), an expired one or none
        // becomes the failure's (`done` = 1); this owner's failure written already is `again`. A
        // give-up by the owner of an 'R' row (its attempt resolved as not done by an operator)
        // turns it into 'F'.
        let row = FAILURE_ROW
            .replace("{give_up}", "$5")
            .replace("{owner}", "$2")
            .replace("{fp}", "$6")
            .replace("{keep}", "$4::bigint")
            .replace("{attempt}", "$3::integer")
            .replace("{error}", "$7");
        let fail = format!(
            "WITH up AS (
                INSERT INTO {t} AS r ({columns}) VALUES ($1, {row})
                ON CONFLICT (key) DO UPDATE SET {FAILURE_SET}
                WHERE (r.state = 'P' AND r.owner = $2) OR r.expires_at <= statement_timestamp()
                    OR (r.state = 'R' AND r.owner = $2 AND $5)
                RETURNING r.watched
            )
            SELECT (SELECT count(*) FROM up) AS done,
                EXISTS (SELECT FROM {t} WHERE key = $1 AND expires_at > statement_timestamp()
                    AND state IN ('R', 'F') AND owner = $2) AS again,
                (SELECT count(*) FROM (SELECT pg_notify('{watch_channel}', $1) FROM up WHERE watched) n) AS notified"
        );
        // $1 keys, $2 owners, $3 attempts, $4 keeps (ms, > 0), $5 give ups, $6 fingerprints,
        // $7 errors: `fail` per item, `done` per item.
        let row_q = FAILURE_ROW
            .replace("{give_up}", "q.give_up")
            .replace("{owner}", "q.owner")
            .replace("{fp}", "q.fingerprint")
            .replace("{keep}", "q.keep")
            .replace("{attempt}", "q.attempt")
            .replace("{error}", "q.error");
        let fail_many = format!(
            "WITH req AS (
                SELECT * FROM unnest($1::text[], $2::text[], $3::integer[], $4::bigint[], $5::boolean[], $6::text[],
                    $7::text[]) WITH ORDINALITY AS q(key, owner, attempt, keep, give_up, fingerprint, error, i)
            ), up AS (
                INSERT INTO {t} AS r ({columns})
                SELECT q.key, {row_q} FROM (SELECT DISTINCT ON (key) * FROM req ORDER BY key, i) q ORDER BY q.key
                ON CONFLICT (key) DO UPDATE SET {FAILURE_SET}
                WHERE (r.state = 'P' AND r.owner = excluded.owner) OR r.expires_at <= statement_timestamp()
                    OR (r.state = 'R' AND r.owner = excluded.owner AND excluded.state = 'F')
                RETURNING r.key, r.owner, r.watched
            ), notified AS (
                SELECT pg_notify('{watch_channel}', key) FROM up WHERE watched
            )
            SELECT q.i, EXISTS (SELECT FROM up WHERE up.key = q.key AND up.owner = q.owner)
                    OR EXISTS (SELECT FROM {t} r WHERE r.key = q.key AND r.expires_at > statement_timestamp()
                        AND r.state IN ('R', 'F') AND r.owner = q.owner) AS done,
                (SELECT count(*) FROM notified) AS notified
            FROM req q"
        );
        // $1 key, $2 holder (NULL: whichever), $3 completed (or released), $4 result, $5 the text a
        // released row keeps. An unknown row (held past its lease's end), held by $2 when given,
        // becomes completed (no owner: its holder's late commit finds it not its own) or released
        // with its attempt counted, kept as long past now as it was past its lease's end. `found`
        // is the row as the snapshot shows it.
        let resolve = format!(
            "WITH cur AS (
                SELECT state, owner, hold, lease_end, expires_at FROM {t}
                WHERE key = $1 AND expires_at > statement_timestamp()
            ), up AS (
                UPDATE {t} AS r SET state = CASE WHEN $3 THEN 'C' ELSE 'R' END,
                    owner = CASE WHEN $3 THEN NULL ELSE r.owner END, fence = 0,
                    result = CASE WHEN $3 THEN $4::bytea END, stored_at = statement_timestamp(),
                    expires_at = statement_timestamp() + (r.expires_at - r.lease_end),
                    attempt = CASE WHEN $3 THEN NULL ELSE r.attempt END, lease_end = NULL, hold = false,
                    last_error = CASE WHEN $3 THEN NULL ELSE $5 END
                WHERE r.key = $1 AND r.expires_at > statement_timestamp() AND r.state = 'P' AND r.hold
                    AND r.lease_end <= statement_timestamp() AND ($2::text IS NULL OR r.owner = $2)
                RETURNING r.watched
            )
            SELECT (SELECT count(*) FROM up) AS done, (SELECT {shown} FROM cur c) AS found,
                (SELECT c.owner FROM cur c) AS owner, coalesce((SELECT c.hold FROM cur c), false) AS hold,
                (SELECT count(*) FROM (SELECT pg_notify('{watch_channel}', $1) FROM up WHERE watched) n) AS notified",
            shown = shown_state("c."),
        );
        Statements { fail, fail_many, resolve }
    }
}

impl PgStore {
    pub(super) async fn fail_inner(&self, req: FailRequest<'_>) -> Result<Transition, StoreError> {
        if req.keep.is_zero() {
            // Nothing is kept: the key is released.
            return self.release_inner(req.key, req.owner).await;
        }
        let query = sqlx::query(&self.inner.sql.failures.fail)
            .bind(stored(req.key))
            .bind(req.owner)
            .bind(i32::try_from(req.attempt).unwrap_or(i32::MAX))
            .bind(millis(req.keep))
            .bind(req.give_up)
            .bind(req.fingerprint)
            .bind(error_text(req.error));
        let row = self.row("fail", &self.inner.control, query).await?;
        let done: i64 = row.try_get("done").map_err(|e| pg_error("fail", e))?;
        let again: bool = row.try_get("again").map_err(|e| pg_error("fail", e))?;
        Ok(if done > 0 || again { Transition::Done } else { Transition::Lost })
    }

    pub(super) async fn fail_many_inner(&self, requests: &[FailRequest<'_>]) -> Vec<Result<Transition, StoreError>> {
        if requests.len() < 2 || requests.iter().any(|r| r.keep.is_zero()) {
            return one_by_one(requests, |request| self.fail_inner(request)).await;
        }
        let keys: Vec<String> = requests.iter().map(|r| stored(r.key).into_owned()).collect();
        let owners: Vec<&str> = requests.iter().map(|r| r.owner).collect();
        let attempts: Vec<i32> = requests.iter().map(|r| i32::try_from(r.attempt).unwrap_or(i32::MAX)).collect();
        let keeps: Vec<i64> = requests.iter().map(|r| millis(r.keep)).collect();
        let give_ups: Vec<bool> = requests.iter().map(|r| r.give_up).collect();
        let fingerprints: Vec<Option<&str>> = requests.iter().map(|r| r.fingerprint).collect();
        let errors: Vec<&str> = requests.iter().map(|r| error_text(r.error)).collect();
        let query = sqlx::query(&self.inner.sql.failures.fail_many)
            .bind(keys)
            .bind(owners)
            .bind(attempts)
            .bind(keeps)
            .bind(give_ups)
            .bind(fingerprints)
            .bind(errors);
        let n = requests.len();
        let rows = match self.rows("fail", &self.inner.control, query).await {
            Ok(rows) => rows,
            Err(e) => return (0..n).map(|_| Err(e.copied())).collect(),
        };
        let mut out: Vec<Option<Result<Transition, StoreError>>> = (0..n).map(|_| None).collect();
        for row in &rows {
            let Some(i) = item_of("fail", row, n) else { continue };
            out[i] = Some(match row.try_get::<bool, _>("done") {
                Ok(true) => Ok(Transition::Done),
                Ok(false) => Ok(Transition::Lost),
                Err(e) => Err(pg_error("fail", e)),
            });
        }
        out.into_iter().map(|o| o.unwrap_or_else(|| Err(StoreError::reply("fail", "no row for an item")))).collect()
    }

    pub(super) async fn resolve_inner(
        &self,
        key: &str,
        holder: Option<&str>,
        resolution: Resolution<'_>,
    ) -> Result<Resolved, StoreError> {
        let (completed, result) = match resolution {
            Resolution::Completed(result) => (true, result),
            Resolution::Release => (false, None),
        };
        let query = sqlx::query(&self.inner.sql.failures.resolve)
            .bind(stored(key))
            .bind(holder)
            .bind(completed)
            .bind(result)
            .bind(crate::store::RESOLVED_RELEASED);
        let row = self.row("resolve", &self.inner.control, query).await?;
        let get_err = |e| pg_error("resolve", e);
        let done: i64 = row.try_get("done").map_err(get_err)?;
        if done > 0 {
            return Ok(Resolved::Done);
        }
        let found: Option<String> = row.try_get("found").map_err(get_err)?;
        let owner: Option<String> = row.try_get("owner").map_err(get_err)?;
        let hold: bool = row.try_get("hold").map_err(get_err)?;
        let theirs = holder.is_some_and(|h| owner.as_deref() != Some(h));
        Ok(match found.as_deref() {
            None => Resolved::Absent,
            Some("P") if hold && !theirs => Resolved::Running,
            Some(state) => Resolved::NotUnknown(record_state(state)),
        })
    }
}
