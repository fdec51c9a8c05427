//! A batch's transitions on PostgreSQL (`Store::acquire_many`, `commit_many`, `release_many`):
//! one statement over arrays each (`batch_sql.rs`), one row per item, each item taken as the one-key
//! statement takes it. The acquire runs in a task of its own, as one call's does, so that a caller
//! that gives up mid-statement leaves the task to release what landed.

use super::*;
use crate::store::one_by_one;

/// One item of a batch's acquire, owned by the statement's task.
struct Item {
    /// The full key (written as the table keeps it when bound: `stored`).
    key: String,
    owner: String,
    fingerprint: Option<String>,
    lease: Duration,
    keep: Duration,
    lapse: Lapse,
}

/// An error for each item a failed statement carried.
fn for_each<T>(n: usize, error: impl Fn() -> T) -> Vec<T> {
    (0..n).map(|_| error()).collect()
}

/// The item a batch statement's row answers: its column `i`, the item's position in the arrays
/// (from 1, `WITH ORDINALITY`), as an index below `n`.
pub(super) fn item_of(op: &str, row: &PgRow, n: usize) -> Option<usize> {
    match row.try_get::<i64, _>("i") {
        Ok(i) if i >= 1 && (i as usize) <= n => Some(i as usize - 1),
        Ok(i) => {
            tracing::warn!(op, position = i, "idempotency batch statement: a row for no item");
            None
        }
        Err(e) => {
            tracing::warn!(op, error = %e, "idempotency batch statement: a row without its position");
            None
        }
    }
}

/// PostgreSQL's `deadlock_detected` and `serialization_failure`: the statement was rolled back
/// whole, and runs again.
fn rolled_back(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if matches!(d.code().as_deref(), Some("40P01" | "40001")))
}

impl PgStore {
    pub(super) async fn acquire_many_inner(
        &self,
        requests: &[AcquireRequest<'_>],
    ) -> Vec<Result<AcquireOutcome, StoreError>> {
        // A caller that will wait marks rows watched: the one-key statement does that.
        if requests.len() < 2 || requests.iter().any(|r| r.will_wait) {
            return one_by_one(requests, |request| self.acquire_inner(request)).await;
        }
        let items: Vec<Item> = requests
            .iter()
            .map(|r| Item {
                key: r.key.to_owned(),
                owner: r.owner.to_owned(),
                fingerprint: r.fingerprint.map(str::to_owned),
                lease: r.lease,
                keep: r.keep,
                lapse: r.lapse,
            })
            .collect();
        for item in &items {
            self.inner.flights.start(&item.owner);
        }
        let n = items.len();
        let store = self.clone();
        let task = tokio::spawn(async move {
            let outcomes = store.acquire_many_statement(&items).await;
            for (item, outcome) in items.iter().zip(&outcomes) {
                store.landed(&item.key, &item.owner, item.lease, outcome);
            }
            outcomes.into_iter().map(|o| o.map_err(|failed| failed.error)).collect::<Vec<_>>()
        });
        task.await
            .unwrap_or_else(|e| for_each(n, || Err(StoreError::new(StoreErrorKind::Backend, format!("acquire: {e}")))))
    }

    /// The batch acquire statement, run again (on the same connection) for the items whose rows
    /// changed under it or that another item of the batch took first; none sent past the store's
    /// timeout, each answered within the timeout and its grace (see `acquire_statement`).
    async fn acquire_many_statement(&self, items: &[Item]) -> Vec<Result<AcquireOutcome, Failed>> {
        let deadline = Instant::now() + self.inner.timeout;
        let pool = &self.inner.pool;
        let mut out: Vec<Option<Result<AcquireOutcome, Failed>>> = (0..items.len()).map(|_| None).collect();
        let mut conn = match pool.connection("acquire", deadline).await {
            Ok(conn) => conn,
            Err(e) => return for_each(items.len(), || Err(Failed::unsent(e.copied()))),
        };
        // The items the statement has not settled yet, by index.
        let mut pending: Vec<usize> = (0..items.len()).collect();
        for tried in 0..8 {
            if tried > 0 && Instant::now() >= deadline {
                for &i in &pending {
                    out[i] = Some(Err(Failed::unsent(StoreError::timeout("acquire", self.inner.timeout))));
                }
                break;
            }
            let sent = pending.iter().map(|&i| &items[i]);
            let keys: Vec<String> = sent.clone().map(|item| stored(&item.key).into_owned()).collect();
            let owners: Vec<&str> = sent.clone().map(|item| item.owner.as_str()).collect();
            let fingerprints: Vec<Option<&str>> = sent.clone().map(|item| item.fingerprint.as_deref()).collect();
            let leases: Vec<i64> = sent.clone().map(|item| millis(item.lease)).collect();
            let keeps: Vec<i64> = sent.clone().map(|item| millis(item.keep)).collect();
            let lapses: Vec<&str> = sent.map(|item| item.lapse.code()).collect();
            let query = sqlx::query(&self.inner.sql.batch.acquire_many)
                .bind(keys)
                .bind(owners)
                .bind(fingerprints)
                .bind(leases)
                .bind(keeps)
                .bind(lapses);
            let rows = match pool.answer("acquire", query.fetch_all(&mut *conn)).await {
                Err(error) => {
                    for &i in &pending {
                        out[i] = Some(Err(Failed { error: error.copied(), maybe_landed: true }));
                    }
                    break;
                }
                Ok(Err(e)) if rolled_back(&e) => {
                    tokio::task::yield_now().await;
                    continue;
                }
                Ok(Err(e)) => {
                    let maybe_landed = !matches!(e, sqlx::Error::Database(_));
                    let error = pg_error("acquire", e);
                    for &i in &pending {
                        out[i] = Some(Err(Failed { error: error.copied(), maybe_landed }));
                    }
                    break;
                }
                Ok(Ok(rows)) => rows,
            };
            for row in &rows {
                let Some(i) = item_of("acquire", row, pending.len()).map(|at| pending[at]) else { continue };
                match found(Some(row), false) {
                    Ok(Some(outcome)) => out[i] = Some(Ok(outcome)),
                    Ok(None) => {}
                    Err(e) => out[i] = Some(Err(Failed::unsent(e))),
                }
            }
            pending.retain(|&i| out[i].is_none());
            if pending.is_empty() {
                break;
            }
            tokio::task::yield_now().await;
        }
        drop(conn);
        out.into_iter()
            .map(|o| {
                o.unwrap_or_else(|| {
                    Err(Failed::unsent(StoreError::new(
                        StoreErrorKind::Backend,
                        "acquire: the key kept changing under the statement",
                    )))
                })
            })
            .collect()
    }

    pub(super) async fn commit_many_inner(
        &self,
        requests: &[CommitRequest<'_>],
    ) -> Vec<Result<Transition, StoreError>> {
        // A commit with nothing to keep deletes the row: the one-key path does that.
        if requests.len() < 2 || requests.iter().any(|r| r.keep.is_zero()) {
            return one_by_one(requests, |request| self.commit_inner(request)).await;
        }
        let keys: Vec<String> = requests.iter().map(|r| stored(r.key).into_owned()).collect();
        let owners: Vec<&str> = requests.iter().map(|r| r.owner).collect();
        let fences: Vec<i64> = requests.iter().map(|r| fence_param(r.fence)).collect();
        let fingerprints: Vec<Option<&str>> = requests.iter().map(|r| r.fingerprint).collect();
        let results: Vec<Option<&[u8]>> = requests.iter().map(|r| r.result).collect();
        let keeps: Vec<i64> = requests.iter().map(|r| millis(r.keep)).collect();
        let query = sqlx::query(&self.inner.sql.batch.commit_many)
            .bind(keys)
            .bind(owners)
            .bind(fences)
            .bind(fingerprints)
            .bind(results)
            .bind(keeps);
        self.per_item("commit", &self.inner.pool, query, requests.len(), |row| {
            let done: bool = row.try_get("done").map_err(|e| pg_error("commit", e))?;
            Ok(if done { Transition::Done } else { Transition::Lost })
        })
        .await
    }

    pub(super) async fn release_many_inner(&self, releases: &[(&str, &str)]) -> Vec<Result<Transition, StoreError>> {
        let keys: Vec<String> = releases.iter().map(|r| stored(r.0).into_owned()).collect();
        let owners: Vec<&str> = releases.iter().map(|r| r.1).collect();
        let query = sqlx::query(&self.inner.sql.batch.remove_many).bind(keys).bind(owners);
        self.per_item("release", &self.inner.control, query, releases.len(), |row| {
            let get = |name: &str| row.try_get::<bool, _>(name).map_err(|e| pg_error("release", e));
            // Ours went, or the key was absent: done. A live row of someone else's: lost.
            Ok(if !get("released")? && get("other")? { Transition::Lost } else { Transition::Done })
        })
        .await
    }

    /// Runs a batch statement answering one row per item (`i` its position) and reads each with
    /// `read`; the statement's error for every item if it fails.
    async fn per_item(
        &self,
        op: &str,
        pool: &Pool,
        query: Query<'_, Postgres, PgArguments>,
        n: usize,
        read: impl Fn(&PgRow) -> Result<Transition, StoreError>,
    ) -> Vec<Result<Transition, StoreError>> {
        let rows = match self.rows(op, pool, query).await {
            Ok(rows) => rows,
            Err(e) => return for_each(n, || Err(e.copied())),
        };
        let mut out: Vec<Option<Result<Transition, StoreError>>> = (0..n).map(|_| None).collect();
        for row in &rows {
            if let Some(i) = item_of(op, row, n) {
                out[i] = Some(read(row));
            }
        }
        out.into_iter().map(|o| o.unwrap_or_else(|| Err(StoreError::reply(op, "no row for the item")))).collect()
    }
}
