//! `PgStore`: records in one PostgreSQL table, on `sqlx`. Each transition is one statement (see
//! `sql.rs`), leases and expiry are on the database's clock, fencing tokens come from a sequence,
//! waiters are woken by `LISTEN/NOTIFY`, and a transactional mode commits the completed record in
//! the body's own transaction (`transaction.rs`). The table: `schema.sql`; the guarantees:
//! docs/postgres.md.

use std::borrow::Cow;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::pool::PoolOptions;
use sqlx::postgres::{PgConnectOptions, PgPool, PgRow};
use sqlx::{Postgres, Row};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use super::{
    within, AcquireOutcome, AcquireRequest, CommitRequest, Forgotten, Inspected, Lease, PurgeHandler, RecordState,
    RecordView, ScanPage, Store, StoreFuture, Transition, Watcher,
};
use crate::error::{StoreError, StoreErrorKind};

mod listen;
mod sql;
mod transaction;

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
    pool: PgPool,
    /// Renewals and releases, on connections of their own: bodies (a transactional one holds a
    /// connection of `pool` for as long as it runs) can fill `pool`, and a lease must still be
    /// renewed and a key still given back.
    control: PgPool,
    /// The `LISTEN` connection, on a pool of its own: it holds its connection for good.
    listen_pool: PgPool,
    sql: Statements,
    /// `"schema"."table"`.
    table: String,
    timeout: Duration,
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

/// Configures and connects a [`PgStore`].
#[must_use]
pub struct PgStoreBuilder {
    options: Result<PgConnectOptions, StoreError>,
    /// The URL, password masked, for errors.
    shown: String,
    schema: String,
    table: String,
    timeout: Duration,
    connect_timeout: Duration,
    pool_size: u32,
    reap_every: Duration,
    reap_batch: u32,
    application_name: String,
    transaction_statement_timeout: Option<Duration>,
    migrate: bool,
}

impl PgStore {
    /// Connects to the database at `url` (`postgres://user:password@host:port/db?...`, libpq's
    /// forms as sqlx reads them) with the default settings: table `public.idempotency`, a 2 s
    /// bound on every call. The table must exist (see [`PgStoreBuilder::migrate`]).
    pub async fn connect(url: &str) -> Result<PgStore, StoreError> {
        Self::builder(url).connect().await
    }

    /// A builder for a store on the database at `url`.
    pub fn builder(url: &str) -> PgStoreBuilder {
        let shown = masked(url);
        let options = url.parse::<PgConnectOptions>().map_err(|e| {
            StoreError::new(
                StoreErrorKind::Config,
                format!("{shown} is not a PostgreSQL URL: {}", scrub(&e.to_string(), url)),
            )
        });
        Self::from_options(options).shown(shown)
    }

    /// A builder for a store connecting with sqlx's options (for settings a URL cannot carry).
    pub fn from_options(options: impl Into<Result<PgConnectOptions, StoreError>>) -> PgStoreBuilder {
        PgStoreBuilder {
            options: options.into(),
            shown: "the configured database".to_owned(),
            schema: DEFAULT_SCHEMA.to_owned(),
            table: DEFAULT_TABLE.to_owned(),
            timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(5),
            pool_size: 10,
            reap_every: Duration::from_secs(10),
            reap_batch: 1000,
            application_name: "idempotency".to_owned(),
            transaction_statement_timeout: None,
            migrate: false,
        }
    }

    /// The connection pool, for queries of your own next to the store's (its sessions carry the
    /// store's `statement_timeout`).
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
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

    /// The SQL that creates the records table (and its sequence and index) for `schema` and
    /// `table`, as [`PgStoreBuilder::migrate`] runs it: for migration tools of your own. Both
    /// names must be plain identifiers.
    pub fn schema_sql(schema: &str, table: &str) -> Result<String, StoreError> {
        check_names(schema, table)?;
        Ok(Statements::new(schema, table).migrate)
    }

    /// Creates the records table, its sequence and index where they are missing (safe to run
    /// again, and from several processes at once).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        within("migrate", self.inner.timeout, async {
            sqlx::raw_sql(&self.inner.sql.migrate)
                .execute(&self.inner.pool)
                .await
                .map(drop)
                .map_err(|e| pg_error("migrate", e))
        })
        .await
    }

    /// Closes the store's connections.
    pub async fn close(&self) {
        self.inner.pool.close().await;
        self.inner.control.close().await;
        self.inner.listen_pool.close().await;
    }

    /// Runs `statement` with the store's client-side bound; `op` names it in errors.
    async fn bounded<T>(&self, op: &str, fut: impl Future<Output = Result<T, sqlx::Error>>) -> Result<T, StoreError> {
        within(op, self.inner.timeout, async { fut.await.map_err(|e| pg_error(op, e)) }).await
    }

    async fn acquire_inner(&self, req: AcquireRequest<'_>) -> Result<AcquireOutcome, StoreError> {
        let (store, key, owner, fingerprint) =
            (self.clone(), req.key.to_owned(), req.owner.to_owned(), req.fingerprint.map(str::to_owned));
        let (lease, will_wait) = (req.lease, req.will_wait);
        self.inner.flights.start(&owner);
        // The statement runs in a task of its own: a caller that gives up mid-acquire leaves the
        // task to learn what became of it, so that `abandon` releases exactly what landed.
        let task = tokio::spawn(async move {
            let outcome = store.acquire_statement(&key, &owner, fingerprint.as_deref(), lease, will_wait).await;
            store.landed(&key, &owner, lease, &outcome);
            outcome.map_err(|failed| failed.error)
        });
        task.await.unwrap_or_else(|e| Err(StoreError::new(StoreErrorKind::Backend, format!("acquire: {e}"))))
    }

    /// The acquire statement, run again (on the same connection) while the key changes under
    /// it; within the store's timeout as a whole.
    async fn acquire_statement(
        &self,
        key: &str,
        owner: &str,
        fingerprint: Option<&str>,
        lease: Duration,
        will_wait: bool,
    ) -> Result<AcquireOutcome, Failed> {
        let deadline = Instant::now() + self.inner.timeout;
        let timeout = self.inner.timeout;
        let mut conn = tokio::time::timeout_at(deadline, self.inner.pool.acquire())
            .await
            .map_err(|_| Failed::unsent(StoreError::timeout("acquire", timeout)))?
            .map_err(|e| Failed::unsent(pg_error("acquire", e)))?;
        for _ in 0..8 {
            let query = sqlx::query(&self.inner.sql.acquire)
                .bind(stored(key))
                .bind(owner)
                .bind(fingerprint)
                .bind(millis(lease))
                .bind(will_wait);
            let rows = match tokio::time::timeout_at(deadline, query.fetch_all(&mut *conn)).await {
                Err(_) => return Err(Failed { error: StoreError::timeout("acquire", timeout), maybe_landed: true }),
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
        let rows = self.bounded("renew", query.fetch_all(&self.inner.control)).await?;
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
        let row = self.bounded("commit", query.fetch_one(&self.inner.pool)).await?;
        let done: i64 = row.try_get("done").map_err(|e| pg_error("commit", e))?;
        Ok(if done > 0 { Transition::Done } else { Transition::Lost })
    }

    /// Deletes `owner`'s row at `key` (release, or a commit with nothing to keep).
    async fn remove(&self, op: &str, key: &str, owner: &str) -> Result<Removed, StoreError> {
        let query = sqlx::query(&self.inner.sql.remove).bind(stored(key)).bind(owner);
        let row = self.bounded(op, query.fetch_one(&self.inner.control)).await?;
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
                    self.inner.timeout,
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
        let row = self.bounded("inspect", query.fetch_optional(&self.inner.pool)).await?;
        Ok(match row {
            Some(row) => Inspected::Record(view(&row).map_err(|e| pg_error("inspect", e))?),
            None => Inspected::Absent,
        })
    }

    async fn forget_inner(&self, key: &str, force: bool) -> Result<Forgotten, StoreError> {
        let query = sqlx::query(&self.inner.sql.forget).bind(stored(key)).bind(force);
        let row = self.bounded("forget", query.fetch_one(&self.inner.pool)).await?;
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
        let rows = self.bounded("scan", query.fetch_all(&self.inner.pool)).await?;
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
            let reaped = within("reap", inner.timeout, async {
                query.execute(&inner.pool).await.map_err(|e| pg_error("reap", e))
            })
            .await;
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

/// A failed acquire, and whether its statement may still land (it was sent, and no answer
/// says it failed).
struct Failed {
    error: StoreError,
    maybe_landed: bool,
}

impl Failed {
    fn unsent(error: StoreError) -> Failed {
        Failed { error, maybe_landed: false }
    }
}

/// Acquires in flight, by owner, and acquires that failed in a way that may still land, until
/// their callers abandon them.
#[derive(Default)]
struct Flights {
    map: Mutex<HashMap<String, Flight>>,
}

#[derive(Debug, Clone, Copy)]
enum Flight {
    /// The statement runs; `abandoned` once its caller gave up.
    Running { abandoned: bool },
    /// It failed and may still land: `abandon` releases until the row shows up or the lease
    /// has passed. When it was noted, to bound how long unclaimed notes stay.
    MayLand(Instant),
}

/// Notes of failed acquires kept beyond this many are dropped when older than a minute (their
/// callers never abandoned them: not the runtime).
const MAX_NOTES: usize = 1024;

impl Flights {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Flight>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn start(&self, owner: &str) {
        self.lock().insert(owner.to_owned(), Flight::Running { abandoned: false });
    }

    /// The acquire of `owner` is done; whether its caller had abandoned it. A failed one that may
    /// still land is noted for `abandon`.
    fn finish(&self, owner: &str, maybe_landed: bool) -> bool {
        let mut map = self.lock();
        let abandoned = matches!(map.remove(owner), Some(Flight::Running { abandoned: true }));
        if maybe_landed && !abandoned {
            if map.len() >= MAX_NOTES {
                map.retain(|_, f| !matches!(f, Flight::MayLand(at) if at.elapsed() > Duration::from_secs(60)));
            }
            map.insert(owner.to_owned(), Flight::MayLand(Instant::now()));
        }
        abandoned
    }

    /// The caller gave up on `owner`: `Some(may_land_later)` when the store must release now,
    /// `None` when the acquire's task will (it still runs).
    fn abandon(&self, owner: &str) -> Option<bool> {
        let mut map = self.lock();
        match map.get_mut(owner) {
            Some(Flight::Running { abandoned }) => {
                *abandoned = true;
                None
            }
            Some(Flight::MayLand(_)) => {
                map.remove(owner);
                Some(true)
            }
            None => Some(false),
        }
    }
}

/// What the acquire statement's row says; `None` when it must run again.
fn found(row: Option<&PgRow>, will_wait: bool) -> Result<Option<AcquireOutcome>, StoreError> {
    let Some(row) = row else { return Ok(None) };
    let get_err = |e| pg_error("acquire", e);
    let found: &str = row.try_get("found").map_err(get_err)?;
    let fingerprint = || row.try_get::<Option<String>, _>("fingerprint").map_err(get_err);
    let left = || row.try_get::<i64, _>("left_ms").map(|ms| Duration::from_millis(ms.max(0) as u64)).map_err(get_err);
    Ok(Some(match found {
        "A" => match row.try_get::<Option<i64>, _>("fence").map_err(get_err)? {
            Some(fence) => AcquireOutcome::Acquired { fence: fence as u64 },
            None => return Ok(None),
        },
        "P" => {
            let watched: bool = row.try_get("watched").map_err(get_err)?;
            let marked: i64 = row.try_get("marked").map_err(get_err)?;
            // The caller will wait, and the row was not marked: it changed meanwhile (committed,
            // say), and its holder would not notify. Look again.
            if will_wait && !watched && marked == 0 {
                return Ok(None);
            }
            AcquireOutcome::InProgress { fingerprint: fingerprint()?, lease_left: left()? }
        }
        "C" => AcquireOutcome::Completed {
            fingerprint: fingerprint()?,
            result: row.try_get::<Option<Vec<u8>>, _>("result").map_err(get_err)?,
            kept_for: left()?,
        },
        _ => return Ok(None),
    }))
}

fn record_state(state: &str) -> RecordState {
    if state == "P" {
        RecordState::InProgress
    } else {
        RecordState::Completed
    }
}

/// A row of `inspect` or `scan` as operators see it.
fn view(row: &PgRow) -> Result<RecordView, sqlx::Error> {
    let state = record_state(row.try_get("state")?);
    let owner: Option<String> = row.try_get("owner")?;
    let result: Option<Vec<u8>> = row.try_get("result")?;
    let left: i64 = row.try_get("left_ms")?;
    Ok(RecordView {
        key: unstored(row.try_get("key")?).into_owned(),
        state,
        fence: row.try_get::<Option<i64>, _>("fence")?.map(|f| f as u64),
        started_ms: owner.as_deref().and_then(crate::ids::started_ms),
        owner,
        stored_ms: row.try_get::<Option<i64>, _>("stored_ms")?.map(|ms| ms as u64),
        ttl: Some(Duration::from_millis(left.max(0) as u64)),
        fingerprint: row.try_get("fingerprint")?,
        watched: row.try_get("watched")?,
        replayable: state == RecordState::Completed && result.is_some(),
        result,
    })
}

/// A full key as the table keeps it: PostgreSQL's `text` cannot hold NUL, so NUL is written `\0`
/// and a backslash `\\` (an escape that keeps distinct keys distinct and prefixes prefixes).
pub(crate) fn stored(key: &str) -> Cow<'_, str> {
    if !key.contains(['\\', '\0']) {
        return Cow::Borrowed(key);
    }
    Cow::Owned(key.replace('\\', "\\\\").replace('\0', "\\0"))
}

/// The full key of a stored one (see [`stored`]).
pub(crate) fn unstored(key: &str) -> Cow<'_, str> {
    if !key.contains('\\') {
        return Cow::Borrowed(key);
    }
    let mut out = String::with_capacity(key.len());
    let mut chars = key.chars();
    while let Some(c) = chars.next() {
        match (c, c == '\\') {
            (_, true) => match chars.next() {
                Some('0') => out.push('\0'),
                Some(other) => out.push(other),
                None => out.push('\\'),
            },
            (c, false) => out.push(c),
        }
    }
    Cow::Owned(out)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A fencing token as the `bigint` the table keeps (tokens come from a `bigint` sequence).
fn fence_param(fence: u64) -> i64 {
    i64::try_from(fence).unwrap_or(i64::MAX)
}

/// The token secrets every runtime on the table shares (see `Store::token_secrets`): the current
/// one, created by the first store that connects (`ON CONFLICT DO NOTHING`, so that racing
/// processes agree on one), and the previous one if a rotation left it, from the table beside the
/// records (`<table>_secret`, made by `migrate`). Without that table (a schema made by hand from an
/// older `schema_sql`) or its permissions, none: runtimes then sign with keys of their own, and a
/// warning says so.
async fn shared_token_secrets(conn: &mut sqlx::PgConnection, schema: &str, table: &str) -> Vec<Vec<u8>> {
    let secrets = format!("\"{schema}\".\"{table}_secret\"");
    let insert = format!("INSERT INTO {secrets} (name, secret) VALUES ('token', $1) ON CONFLICT (name) DO NOTHING");
    let select = format!("SELECT secret FROM {secrets} WHERE name IN ('token', 'token:previous') ORDER BY name");
    let read = async {
        sqlx::query(&insert).bind(crate::token::TokenKeys::fresh_secret()).execute(&mut *conn).await?;
        sqlx::query_scalar::<_, String>(&select).fetch_all(&mut *conn).await
    };
    match read.await {
        Ok(found) => found.iter().filter_map(|s| crate::token::TokenKeys::decode_secret(s)).collect(),
        Err(e) => {
            tracing::warn!(
                table = %secrets,
                error = %pg_error("token secret", e),
                "idempotency store: cannot read or create the shared token secret; this process signs tokens \
                 with a key of its own, which other instances refuse (migrate, or give every instance the same TokenKeys)"
            );
            Vec::new()
        }
    }
}

/// An sqlx error as a store error, with the kind a caller can act on.
pub(crate) fn pg_error(op: &str, e: sqlx::Error) -> StoreError {
    use sqlx::Error as E;
    let kind = match &e {
        E::Database(db) => match db.code().as_deref().unwrap_or("") {
            // query_canceled: the statement_timeout (or a cancel request).
            "57014" => StoreErrorKind::Timeout,
            "40001" | "40P01" => StoreErrorKind::Serialization,
            // The server going away, refusing connections, or ending ours.
            c if c.starts_with("08") || c.starts_with("57P") || c == "53300" => StoreErrorKind::Unavailable,
            // Missing table or schema (not migrated), no permission, wrong database or login.
            "42P01" | "3F000" | "42501" | "3D000" => {
                let message = format!(
                    "{op}: {} (the records table must exist with this store's schema and table: \
                     PgStoreBuilder::migrate, or PgStore::schema_sql; and the user needs SELECT, INSERT, UPDATE, \
                     DELETE on it and USAGE on its sequence; see docs/postgres.md)",
                    db.message()
                );
                return StoreError::new(StoreErrorKind::Config, message).with_source(e);
            }
            c if c.starts_with("28") => StoreErrorKind::Config,
            // Data exceptions (a value out of range, an interval too long) and syntax errors:
            // the statement can never succeed as sent.
            c if c.starts_with("22") || c.starts_with("42") => StoreErrorKind::Refused,
            _ => StoreErrorKind::Backend,
        },
        E::Io(_) | E::Tls(_) | E::PoolClosed | E::WorkerCrashed => StoreErrorKind::Unavailable,
        E::PoolTimedOut => {
            let message = format!("{op}: no connection to the database within the store's timeout (is it up?)");
            return StoreError::new(StoreErrorKind::Unavailable, message).with_source(e);
        }
        E::Configuration(_) => StoreErrorKind::Config,
        _ => StoreErrorKind::Reply,
    };
    StoreError::new(kind, format!("{op}: {e}")).with_source(e)
}

/// `url` with its password replaced by `***`, for errors and `Debug`.
fn masked(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
            let hidden = if userinfo.contains(':') { ":***" } else { "" };
            // A password may also come as a parameter.
            let path = match path.find("password=") {
                Some(at) => format!("{}password=***", &path[..at]),
                None => path.to_owned(),
            };
            format!("{scheme}://{user}{hidden}@{host}{path}")
        }
        None => match path.find("password=") {
            Some(at) => format!("{scheme}://{authority}{}password=***", &path[..at]),
            None => url.to_owned(),
        },
    }
}

/// `message` with any password of `url` replaced by `***`.
fn scrub(message: &str, url: &str) -> String {
    let Some((_, rest)) = url.split_once("://") else { return message.to_owned() };
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    match authority.rsplit_once('@').and_then(|(userinfo, _)| userinfo.split_once(':')) {
        Some((_, password)) if !password.is_empty() => message.replace(password, "***"),
        _ => message.to_owned(),
    }
}

fn check_names(schema: &str, table: &str) -> Result<(), StoreError> {
    let config = |m: String| StoreError::new(StoreErrorKind::Config, m);
    sql::check_identifier("schema", schema).map_err(config)?;
    sql::check_identifier("table", table).map_err(config)?;
    if schema.len() + table.len() > sql::MAX_NAME_BYTES {
        return Err(config(format!(
            "schema {schema:?} and table {table:?} have more than {} bytes together",
            sql::MAX_NAME_BYTES
        )));
    }
    Ok(())
}

impl PgStoreBuilder {
    fn shown(mut self, shown: String) -> Self {
        self.shown = shown;
        self
    }

    /// The schema of the records table (default `public`): a plain identifier.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// The records table's name (default `idempotency`): a plain identifier (lower-case ASCII
    /// letters, digits, underscores); with the schema's, at most 52 bytes.
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// The bound on every store call (default 2 s): each statement runs under this
    /// `statement_timeout`, and the client gives up after it too; past it the call fails with a
    /// store error of kind `Timeout`.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The bound on connecting, checking the table and migrating (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The most connections the store's pool opens (default 10, at least 1); a transactional body
    /// holds one for its transaction. Besides the pool, the store keeps connections of its own
    /// that bodies never take: two for renewals and releases, one for `LISTEN` (waiters and
    /// replay caches), so that a pool full of running bodies never starves a lease's renewal, a
    /// release, or the commit of a caller whose waiters are woken by notification.
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size.max(1);
        self
    }

    /// How often expired records are deleted, and how many at most at a time (defaults: every
    /// 10 s, 1000; again at once while a batch comes back full). Expired records are treated as
    /// absent by every statement whether reaped or not. A zero interval turns the reaper off
    /// (another process, or a job of yours, reaps).
    pub fn reap(mut self, every: Duration, batch: u32) -> Self {
        self.reap_every = every;
        self.reap_batch = batch.max(1);
        self
    }

    /// The `application_name` of the store's sessions (default `idempotency`), as
    /// `pg_stat_activity` shows them.
    pub fn application_name(mut self, name: impl Into<String>) -> Self {
        self.application_name = name.into();
        self
    }

    /// The `statement_timeout` of a transactional body's own statements (default: none; the
    /// store's own timeout bounds the store's statements only).
    pub fn transaction_statement_timeout(mut self, timeout: Duration) -> Self {
        self.transaction_statement_timeout = Some(timeout);
        self
    }

    /// Creates the records table (with its sequence and index) at connect where it is missing,
    /// instead of failing. Safe with several processes starting at once.
    pub fn migrate(mut self) -> Self {
        self.migrate = true;
        self
    }

    /// Connects: opens a first connection, migrates if asked, and checks the records table is
    /// there; all of it within the connect timeout. An unreachable database, refused
    /// credentials or a missing table are errors now, not at the first call.
    pub async fn connect(self) -> Result<PgStore, StoreError> {
        check_names(&self.schema, &self.table)?;
        let shown = self.shown.clone();
        let named = |e: StoreError| e.prefixed(&shown);
        let options = self
            .options
            .map_err(named)?
            .application_name(&self.application_name)
            .options([("statement_timeout", millis(self.timeout).to_string())]);
        let side = |connections: u32| {
            PoolOptions::<Postgres>::new()
                .max_connections(connections)
                .min_connections(0)
                // Below the call's own bound, so that a database that cannot be reached is
                // reported as such rather than as a timeout.
                .acquire_timeout(self.timeout.mul_f64(0.8))
        };
        let pool: PgPool = side(self.pool_size).connect_lazy_with(options.clone());
        let control: PgPool = side(CONTROL_CONNECTIONS).connect_lazy_with(options.clone());
        let listen_pool: PgPool = side(1).max_lifetime(None).idle_timeout(None).connect_lazy_with(options);
        let sql = Statements::new(&self.schema, &self.table);
        let table = format!("\"{}\".\"{}\"", self.schema, self.table);
        let ready = async {
            let mut conn = pool.acquire().await.map_err(|e| pg_error("connect", e))?;
            if self.migrate {
                sqlx::raw_sql(&sql.migrate).execute(&mut *conn).await.map_err(|e| pg_error("migrate", e))?;
            }
            let check = format!("SELECT 1 FROM {table} LIMIT 0");
            sqlx::query(&check).execute(&mut *conn).await.map_err(|e| pg_error("check the records table", e))?;
            Ok(shared_token_secrets(&mut conn, &self.schema, &self.table).await)
        };
        // The connect timeout bounds everything, including the pool's own wait for a connection.
        let connected = tokio::time::timeout(self.connect_timeout, ready).await;
        let token_secrets = match connected {
            Ok(Ok(secrets)) => secrets,
            Ok(Err(e)) => return Err(named(e)),
            Err(_) => return Err(named(StoreError::timeout("connect", self.connect_timeout))),
        };
        let begin = match self.transaction_statement_timeout {
            Some(t) => format!("BEGIN; SET LOCAL statement_timeout = {}", millis(t)),
            None => "BEGIN; SET LOCAL statement_timeout = 0".to_owned(),
        };
        let inner = Arc::new_cyclic(|weak| Inner {
            pool,
            control,
            listen_pool,
            sql,
            table,
            timeout: self.timeout,
            begin,
            flights: Flights::default(),
            listener: OnceCell::new(),
            token_secrets,
            reaper: (!self.reap_every.is_zero()).then(|| start_reaper(weak.clone(), self.reap_every, self.reap_batch)),
        });
        Ok(PgStore { inner })
    }
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

impl std::fmt::Debug for PgStoreBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStoreBuilder")
            .field("database", &self.shown)
            .field("schema", &self.schema)
            .field("table", &self.table)
            .field("timeout", &self.timeout)
            .field("pool_size", &self.pool_size)
            .finish_non_exhaustive()
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
