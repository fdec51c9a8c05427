//! `PgStore`: records in one PostgreSQL table, on `sqlx`. Each transition is one statement (see
//! `sql.rs`), leases and expiry are on the database's clock, fencing tokens come from a sequence,
//! waiters are woken by `LISTEN/NOTIFY`, and a transactional mode commits the completed record in
//! the body's own transaction (`transaction.rs`). The table: `schema.sql`; the guarantees:
//! docs/postgres.md.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::postgres::{PgArguments, PgConnectOptions, PgPool, PgRow};
use sqlx::query::Query;
use sqlx::{Postgres, Row};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use super::{
    error_text, one_by_one, AcquireOutcome, AcquireRequest, CommitRequest, FailRequest, Forgotten, Inspected, Lapse,
    Lease, PurgeHandler, RecordState, RecordView, Resolution, Resolved, ScanPage, Store, StoreFuture, Transition,
    Watcher,
};
use crate::error::{StoreError, StoreErrorKind};

mod batch;
mod batch_sql;
mod builder;
mod errors;
mod failures;
mod flights;
mod fragments;
mod inbox;
mod listen;
mod pools;
mod rows;
mod sql;
mod transaction;

pub use builder::PgStoreBuilder;
pub(crate) use errors::pg_error;
use flights::{Failed, Flights};
use pools::Pool;
use rows::{fence_param, found, millis, record_state, view};
pub(crate) use rows::{stored, unstored};
pub use sqlx;
pub use transaction::PgTransaction;

use sql::Statements;

/// The default schema of the records table.
pub const DEFAULT_SCHEMA: &str = "public";
/// The default name of the records table.
pub const DEFAULT_TABLE: &str = "idempotency";

/// A store on PostgreSQL: one row per key in one table, shared by every process that connects to
/// the database, and a transactional mode ([`run_in_transaction`](PgStore::run_in_transaction))
/// whose completed record commits in the body's own transaction.
///
/// ```no_run
/// # async fn f() -> Result<(), idempotent_core::StoreError> {
/// use std::time::Duration;
/// use idempotent_core::{Idempotency, PgStore};
///
/// let store = PgStore::builder("postgres://app@127.0.0.1/app")
///     .table("idempotency")
///     .timeout(Duration::from_secs(1))
///     .migrate() // creates the table if it is missing (or apply schema.sql yourself)
///     .connect()
///     .await?;
/// let idem = Idempotency::new(store.clone());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

/// Connections of the store's own for renewals and releases, beside the pool (see `Inner`).
const CONTROL_CONNECTIONS: u32 = 2;

struct Inner {
    /// Acquires, commits, operators' reads, transactional bodies.
    pool: Pool,
    /// Renewals and releases, on connections of their own: bodies (a transactional one holds a
    /// connection of `pool` for as long as it runs) can fill `pool`, and a lease must still be
    /// renewed and a key still given back.
    control: Pool,
    /// The `LISTEN` connection, on a pool of its own: it holds its connection for good.
    listen_pool: PgPool,
    sql: Statements,
    /// `"schema"."table"`.
    table: String,
    timeout: Duration,
    /// How long opening a connection may take (the `LISTEN` connection's too).
    connect_timeout: Duration,
    /// What a transactional body's transaction begins with.
    begin: String,
    /// Acquires in flight, and what became of those that failed: see `abandon`.
    flights: Flights,
    listener: OnceCell<listen::Listener>,
    reaper: Option<tokio::task::JoinHandle<()>>,
    /// The secrets runtimes on this store sign tokens with, read at connect.
    token_secrets: Vec<Vec<u8>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(reaper) = &self.reaper {
            reaper.abort();
        }
    }
}

impl PgStore {
    /// The connection pool, for queries of your own next to the store's (its sessions carry the
    /// store's `statement_timeout`).
    pub fn pool(&self) -> &PgPool {
        self.inner.pool.sqlx()
    }

    /// The records table, quoted and qualified: `"public"."idempotency"`. For operators and
    /// tests: `SELECT * FROM <it> WHERE key = '...'` shows a record.
    pub fn table(&self) -> &str {
        &self.inner.table
    }

    /// How `key` (a full key: scope and key) is written in the table's `key` column: as it is,
    /// unless it holds a NUL or a backslash (`text` cannot hold NUL: NUL is written `\0`, a
    /// backslash `\\`). For operators and tests: `SELECT * FROM <table> WHERE key = <it>`.
    pub fn stored_key(key: &str) -> Cow<'_, str> {
        stored(key)
    }

    /// The SQL that creates the records table (and its sequence, index and acquire function) for
    /// `schema` and `table`, as [`PgStoreBuilder::migrate`] runs it: for migration tools of your
    /// own. Both names must be plain identifiers.
    pub fn schema_sql(schema: &str, table: &str) -> Result<String, StoreError> {
        builder::check_names(schema, table)?;
        Ok(Statements::new(schema, table).migrate)
    }

    /// Creates the records table, its sequence and index where they are missing (safe to run
    /// again, and from several processes at once).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let pool = &self.inner.pool;
        pool.within("migrate", sqlx::raw_sql(&self.inner.sql.migrate_quietly).execute(pool.sqlx())).await.map(drop)
    }

    /// Closes the store's connections.
    pub async fn close(&self) {
        self.inner.pool.sqlx().close().await;
        self.inner.control.sqlx().close().await;
        self.inner.listen_pool.close().await;
    }

    /// Runs `query` on a connection of `pool` and returns its rows: a connection within the
    /// store's timeout, and the answer within the timeout and its grace (the server's own
    /// `statement_timeout` answers first); `op` names it in errors.
    async fn rows(
        &self,
        op: &str,
        pool: &Pool,
        query: Query<'_, Postgres, PgArguments>,
    ) -> Result<Vec<PgRow>, StoreError> {
        let mut conn = pool.connection(op, Instant::now() + self.inner.timeout).await?;
        pool.answer(op, query.fetch_all(&mut *conn)).await?.map_err(|e| pg_error(op, e))
    }

    /// The one row `query` answers (see `rows`).
    async fn row(&self, op: &str, pool: &Pool, query: Query<'_, Postgres, PgArguments>) -> Result<PgRow, StoreError> {
        let rows = self.rows(op, pool, query).await?;
        rows.into_iter().next().ok_or_else(|| StoreError::new(StoreErrorKind::Reply, format!("{op}: no row")))
    }

    async fn acquire_inner(&self, req: AcquireRequest<'_>) -> Result<AcquireOutcome, StoreError> {
        let (store, key, owner, fingerprint) =
            (self.clone(), req.key.to_owned(), req.owner.to_owned(), req.fingerprint.map(str::to_owned));
        let taking = Taking { lease: req.lease, will_wait: req.will_wait, lapse: req.lapse, keep: req.keep };
        let lease = req.lease;
        self.inner.flights.start(&owner);
        // The statement runs in a task of its own: a caller that gives up mid-acquire leaves the
        // task to learn what became of it, so that `abandon` releases exactly what landed.
        let task = tokio::spawn(async move {
            let outcome = store.acquire_statement(&key, &owner, fingerprint.as_deref(), taking).await;
            store.landed(&key, &owner, lease, &outcome);
            outcome.map_err(|failed| failed.error)
        });
        task.await.unwrap_or_else(|e| Err(StoreError::new(StoreErrorKind::Backend, format!("acquire: {e}"))))
    }

    /// The acquire statement, run again (on the same connection) while the key changes under
    /// it, none sent past the store's timeout; each answered within the timeout and its grace
    /// (`Pool::answer`), so that one the server cancels is known to have taken nothing.
    async fn acquire_statement(
        &self,
        key: &str,
        owner: &str,
        fingerprint: Option<&str>,
        taking: Taking,
    ) -> Result<AcquireOutcome, Failed> {
        let Taking { lease, will_wait, lapse, keep } = taking;
        let deadline = Instant::now() + self.inner.timeout;
        let pool = &self.inner.pool;
        let mut conn = pool.connection("acquire", deadline).await.map_err(Failed::unsent)?;
        for tried in 0..8 {
            if tried > 0 && Instant::now() >= deadline {
                return Err(Failed::unsent(StoreError::timeout("acquire", self.inner.timeout)));
            }
            let sql = &self.inner.sql;
            let query = sqlx::query(if will_wait { &sql.acquire_waiting } else { &sql.acquire })
                .bind(stored(key))
                .bind(owner)
                .bind(fingerprint)
                .bind(millis(lease))
                .bind(will_wait)
                .bind(lapse.code())
                .bind(millis(keep));
            let rows = match pool.answer("acquire", query.fetch_all(&mut *conn)).await {
                Err(error) => return Err(Failed { error, maybe_landed: true }),
                Ok(Err(e)) => {
                    let maybe_landed = !matches!(e, sqlx::Error::Database(_));
                    return Err(Failed { error: pg_error("acquire", e), maybe_landed });
                }
                Ok(Ok(rows)) => rows,
            };
            match found(rows.first(), will_wait).map_err(Failed::unsent)? {
                Some(outcome) => return Ok(outcome),
                // The row changed between the statement's snapshot and its write: look again.
                None => tokio::task::yield_now().await,
            }
        }
        Err(Failed::unsent(StoreError::new(
            StoreErrorKind::Backend,
            "acquire: the key kept changing under the statement",
        )))
    }

    /// Called by an acquire's task when its statement is done: if the caller gave up meanwhile,
    /// releases what landed; if the statement failed, notes whether it may still land.
    fn landed(&self, key: &str, owner: &str, lease: Duration, outcome: &Result<AcquireOutcome, Failed>) {
        let maybe_landed = match outcome {
            Ok(_) => false,
            Err(failed) => failed.maybe_landed,
        };
        let abandoned = self.inner.flights.finish(owner, maybe_landed);
        match (abandoned, outcome) {
            (true, Ok(AcquireOutcome::Acquired { .. })) => self.release_in_background(key, owner, lease, false),
            (true, Err(failed)) if failed.maybe_landed => self.release_in_background(key, owner, lease, true),
            _ => {}
        }
    }

    async fn renew_inner(&self, leases: &[Lease<'_>]) -> Result<Vec<bool>, StoreError> {
        let keys: Vec<String> = leases.iter().map(|l| stored(l.key).into_owned()).collect();
        let owners: Vec<&str> = leases.iter().map(|l| l.owner).collect();
        let ms: Vec<i64> = leases.iter().map(|l| millis(l.lease)).collect();
        let query = sqlx::query(&self.inner.sql.renew).bind(&keys).bind(owners).bind(ms);
        let rows = self.rows("renew", &self.inner.control, query).await?;
        let mut held = std::collections::HashSet::with_capacity(rows.len());
        for row in &rows {
            let key: &str = row.try_get(0).map_err(|e| pg_error("renew", e))?;
            let owner: &str = row.try_get(1).map_err(|e| pg_error("renew", e))?;
            held.insert((key.to_owned(), owner.to_owned()));
        }
        Ok(keys.iter().zip(leases).map(|(k, l)| held.contains(&(k.clone(), l.owner.to_owned()))).collect())
    }

    async fn commit_inner(&self, req: CommitRequest<'_>) -> Result<Transition, StoreError> {
        if req.keep.is_zero() {
            return Ok(match self.remove("commit", req.key, req.owner).await? {
                Removed::Ours | Removed::Absent => Transition::Done,
                Removed::Other => Transition::Lost,
            });
        }
        let query = sqlx::query(&self.inner.sql.commit)
            .bind(stored(req.key))
            .bind(req.owner)
            .bind(fence_param(req.fence))
            .bind(req.fingerprint)
            .bind(req.result)
            .bind(millis(req.keep));
        let row = self.row("commit", &self.inner.pool, query).await?;
        let done: i64 = row.try_get("done").map_err(|e| pg_error("commit", e))?;
        Ok(if done > 0 { Transition::Done } else { Transition::Lost })
    }

    /// Deletes `owner`'s row at `key` (release, or a commit with nothing to keep).
    async fn remove(&self, op: &str, key: &str, owner: &str) -> Result<Removed, StoreError> {
        let query = sqlx::query(&self.inner.sql.remove).bind(stored(key)).bind(owner);
        let row = self.row(op, &self.inner.control, query).await?;
        let get = |name: &str| row.try_get::<bool, _>(name).map_err(|e| pg_error(op, e));
        Ok(if get("released")? {
            Removed::Ours
        } else if get("other")? {
            Removed::Other
        } else {
            Removed::Absent
        })
    }

    async fn release_inner(&self, key: &str, owner: &str) -> Result<Transition, StoreError> {
        Ok(match self.remove("release", key, owner).await? {
            Removed::Ours | Removed::Absent => Transition::Done,
            Removed::Other => Transition::Lost,
        })
    }

    /// Releases `owner`'s hold on `key` in the background, for a caller that gave up, retrying
    /// failures until a lease and two timeouts have passed (by then a row the owner took has
    /// expired by itself). With `may_land_later` (an acquire whose fate is unknown: it may still
    /// be running on the server), finding the key absent is not the end: the release is tried
    /// again until it removes the owner's row, finds another owner's, or that time has passed.
    fn release_in_background(&self, key: &str, owner: &str, lease: Duration, may_land_later: bool) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(key, "idempotency release outside a runtime; the key is held until its lease ends");
            return;
        };
        let Some(slot) = super::background::slot("release") else { return };
        let (store, key, owner) = (self.clone(), key.to_owned(), owner.to_owned());
        rt.spawn(async move {
            let _slot = slot;
            let until = Instant::now() + lease + 2 * store.inner.timeout;
            let mut backoff = Duration::from_millis(25);
            loop {
                match store.remove("release", &key, &owner).await {
                    Ok(Removed::Ours | Removed::Other) => return,
                    Ok(Removed::Absent) if !may_land_later => return,
                    Ok(Removed::Absent) => {}
                    Err(e) if Instant::now() + backoff >= until => {
                        tracing::warn!(key, error = %e, "idempotency background release failed until the lease ran out");
                        return;
                    }
                    Err(e) => tracing::debug!(key, error = %e, "idempotency background release failed; retrying"),
                }
                if Instant::now() + backoff >= until {
                    return;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        });
    }

    async fn listener(&self) -> Result<&listen::Listener, StoreError> {
        let listener = self
            .inner
            .listener
            .get_or_init(|| async {
                listen::Listener::start(
                    self.inner.listen_pool.clone(),
                    self.inner.sql.watch_channel.clone(),
                    self.inner.sql.purge_channel.clone(),
                    self.inner.connect_timeout,
                )
            })
            .await;
        listener.ready(self.inner.timeout).await?;
        Ok(listener)
    }

    async fn watch_inner(&self, key: &str) -> Result<Watcher, StoreError> {
        Ok(self.listener().await?.watch(&stored(key)))
    }

    async fn follow_purges_inner(&self, handler: PurgeHandler) -> Result<bool, StoreError> {
        self.listener().await?.follow_purges(handler);
        Ok(true)
    }

    async fn inspect_inner(&self, key: &str) -> Result<Inspected, StoreError> {
        let query = sqlx::query(&self.inner.sql.inspect).bind(stored(key));
        let row = self.rows("inspect", &self.inner.pool, query).await?.into_iter().next();
        Ok(match row {
            Some(row) => Inspected::Record(view(&row).map_err(|e| pg_error("inspect", e))?),
            None => Inspected::Absent,
        })
    }

    async fn forget_inner(&self, key: &str, force: bool) -> Result<Forgotten, StoreError> {
        let query = sqlx::query(&self.inner.sql.forget).bind(stored(key)).bind(force);
        let row = self.row("forget", &self.inner.pool, query).await?;
        let state = |name: &str| -> Result<Option<RecordState>, StoreError> {
            let state: Option<&str> = row.try_get(name).map_err(|e| pg_error("forget", e))?;
            Ok(state.map(record_state))
        };
        Ok(match (state("deleted")?, state("found")?) {
            (Some(deleted), _) => Forgotten::Deleted(deleted),
            (None, Some(RecordState::InProgress)) => Forgotten::InProgress,
            // Gone, or changed between the statement's snapshot and its delete.
            (None, _) => Forgotten::Absent,
        })
    }

    /// A page in key order: the table's rows from `prefix` on (after `cursor`, the last key of
    /// the previous page), up to the first key past the prefix.
    async fn scan_inner(&self, prefix: &str, cursor: Option<&str>, count: usize) -> Result<ScanPage, StoreError> {
        let limit = i64::try_from(count.max(1)).unwrap_or(i64::MAX);
        let prefix = stored(prefix);
        let query = sqlx::query(&self.inner.sql.scan).bind(&*prefix).bind(cursor.unwrap_or("")).bind(limit);
        let rows = self.rows("scan", &self.inner.pool, query).await?;
        let mut page = ScanPage { examined: rows.len(), ..ScanPage::default() };
        let mut past_prefix = false;
        let mut last = None;
        for row in &rows {
            let key: &str = row.try_get("key").map_err(|e| pg_error("scan", e))?;
            if !key.starts_with(&*prefix) {
                past_prefix = true;
                break;
            }
            last = Some(key.to_owned());
            if row.try_get::<bool, _>("live").map_err(|e| pg_error("scan", e))? {
                page.records.push(view(row).map_err(|e| pg_error("scan", e))?);
            }
        }
        page.next = if past_prefix || rows.len() < usize::try_from(limit).unwrap_or(usize::MAX) { None } else { last };
        Ok(page)
    }
}

/// Reaps expired rows every `every`, `batch` at most at a time (again at once while batches come
/// back full), while the store lives.
fn start_reaper(inner: std::sync::Weak<Inner>, every: Duration, batch: u32) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut pause = every;
        loop {
            tokio::time::sleep(pause).await;
            let Some(inner) = inner.upgrade() else { return };
            let query = sqlx::query(&inner.sql.reap).bind(i64::from(batch));
            let reaped = inner.pool.within("reap", query.execute(inner.pool.sqlx())).await;
            pause = match reaped {
                Ok(done) if done.rows_affected() >= u64::from(batch) => Duration::from_millis(10),
                Ok(_) => every,
                Err(e) => {
                    tracing::debug!(error = %e, "idempotency reaper: expired records not deleted this time");
                    every
                }
            };
        }
    })
}

/// How an acquire takes its key: what its one-key statement binds besides the key, owner and
/// fingerprint.
#[derive(Debug, Clone, Copy)]
struct Taking {
    lease: Duration,
    will_wait: bool,
    lapse: Lapse,
    keep: Duration,
}

/// What a release's statement found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Removed {
    /// The owner's row was there, and is gone.
    Ours,
    /// No live row.
    Absent,
    /// Another owner's row, or a completed one: left alone.
    Other,
}

impl Store for PgStore {
    fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> StoreFuture<'a, Result<AcquireOutcome, StoreError>> {
        StoreFuture::new(self.acquire_inner(request))
    }

    fn renew<'a>(&'a self, leases: &'a [Lease<'a>]) -> StoreFuture<'a, Result<Vec<bool>, StoreError>> {
        StoreFuture::new(self.renew_inner(leases))
    }

    fn commit<'a>(&'a self, request: CommitRequest<'a>) -> StoreFuture<'a, Result<Transition, StoreError>> {
        StoreFuture::new(self.commit_inner(request))
    }

    fn release<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, Result<Transition, StoreError>> {
        StoreFuture::new(self.release_inner(key, owner))
    }

    fn watch<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<Watcher, StoreError>> {
        StoreFuture::new(self.watch_inner(key))
    }

    fn acquire_many<'a>(
        &'a self,
        requests: &'a [AcquireRequest<'a>],
    ) -> StoreFuture<'a, Vec<Result<AcquireOutcome, StoreError>>> {
        StoreFuture::new(self.acquire_many_inner(requests))
    }

    fn commit_many<'a>(
        &'a self,
        requests: &'a [CommitRequest<'a>],
    ) -> StoreFuture<'a, Vec<Result<Transition, StoreError>>> {
        StoreFuture::new(self.commit_many_inner(requests))
    }

    fn release_many<'a>(
        &'a self,
        releases: &'a [(&'a str, &'a str)],
    ) -> StoreFuture<'a, Vec<Result<Transition, StoreError>>> {
        StoreFuture::new(self.release_many_inner(releases))
    }

    fn keeps_attempts(&self) -> bool {
        true
    }

    fn fail<'a>(&'a self, request: FailRequest<'a>) -> StoreFuture<'a, Result<Transition, StoreError>> {
        StoreFuture::new(self.fail_inner(request))
    }

    fn fail_many<'a>(
        &'a self,
        requests: &'a [FailRequest<'a>],
    ) -> StoreFuture<'a, Vec<Result<Transition, StoreError>>> {
        StoreFuture::new(self.fail_many_inner(requests))
    }

    fn resolve<'a>(
        &'a self,
        key: &'a str,
        holder: Option<&'a str>,
        resolution: Resolution<'a>,
    ) -> StoreFuture<'a, Result<Resolved, StoreError>> {
        StoreFuture::new(self.resolve_inner(key, holder, resolution))
    }

    /// Releases in the background, owner-checked. An acquire still in flight is left to its own
    /// task, which releases what it took once its statement is done; an acquire that failed in a
    /// way that may still land (its statement sent, no answer) is released again until its row
    /// shows up and goes, another owner's row is found, or a lease and two timeouts have passed.
    fn abandon(self: Arc<Self>, key: &str, owner: &str, lease: Duration) {
        if let Some(may_land_later) = self.inner.flights.abandon(owner) {
            self.release_in_background(key, owner, lease, may_land_later);
        }
    }

    fn inspect<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<Inspected, StoreError>> {
        StoreFuture::new(self.inspect_inner(key))
    }

    fn forget<'a>(&'a self, key: &'a str, force: bool) -> StoreFuture<'a, Result<Forgotten, StoreError>> {
        StoreFuture::new(self.forget_inner(key, force))
    }

    fn scan<'a>(
        &'a self,
        prefix: &'a str,
        cursor: Option<&'a str>,
        count: usize,
    ) -> StoreFuture<'a, Result<ScanPage, StoreError>> {
        StoreFuture::new(self.scan_inner(prefix, cursor, count))
    }

    fn follow_purges(&self, handler: PurgeHandler) -> StoreFuture<'_, Result<bool, StoreError>> {
        StoreFuture::new(self.follow_purges_inner(handler))
    }

    fn token_secrets(&self) -> Vec<Vec<u8>> {
        self.inner.token_secrets.clone()
    }

    fn call_timeout(&self) -> Option<Duration> {
        Some(self.inner.timeout)
    }
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("table", &self.inner.table)
            .field("timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::builder::{check_names, masked, scrub};
    use super::*;

    #[test]
    fn passwords_are_masked() {
        assert_eq!(masked("postgres://app:s3cret@db:5432/app"), "postgres://app:***@db:5432/app");
        assert_eq!(masked("postgres://app@db/app"), "postgres://app@db/app");
        assert_eq!(masked("postgres://db/app?user=a&password=s3cret"), "postgres://db/app?user=a&password=***");
        assert_eq!(scrub("bad s3cret here", "postgres://app:s3cret@db/app"), "bad *** here");
    }

    #[test]
    fn keys_are_stored_injectively_and_keep_prefixes() {
        for key in ["plain:1", "a\0b", "a\\0b", "\\", "\0", "ключ\0\n🔑", "x\\\\y\0"] {
            assert!(!stored(key).contains('\0'), "{key:?}");
            assert_eq!(unstored(&stored(key)), key, "{key:?}");
        }
        assert_ne!(stored("a\0"), stored("a\\0"));
        assert!(matches!(stored("orders:42"), Cow::Borrowed(_)));
        for (prefix, key) in [("a\\", "a\\0"), ("a\0", "a\0b"), ("a", "a\\")] {
            assert!(stored(key).starts_with(&*stored(prefix)), "{prefix:?} {key:?}");
        }
        assert!(!stored("a\0").starts_with(&*stored("a\\")));
    }

    #[test]
    fn names_are_checked() {
        assert!(check_names("public", "idempotency").is_ok());
        assert!(check_names("public", "Robert'); DROP TABLE students;--").is_err());
        assert!(check_names(&"s".repeat(30), &"t".repeat(30)).is_err());
    }

    #[test]
    fn abandoned_acquires_are_released_by_whoever_learns_their_fate() {
        let flights = Flights::default();
        // Abandoned while running: the acquire's task releases; after it, nothing is noted.
        flights.start("r");
        assert_eq!(flights.abandon("r"), None);
        assert!(flights.finish("r", true));
        assert_eq!(flights.abandon("r"), Some(false));
        // A failed acquire that may land: released until it shows up.
        flights.start("m");
        assert!(!flights.finish("m", true));
        assert_eq!(flights.abandon("m"), Some(true));
    }
}
