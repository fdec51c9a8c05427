//! `Idempotency`: the runtime. Takes a key, decides from the record found whether the body runs,
//! runs it under a renewed lease, and commits or releases the key after it.

use std::future::Future;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::time::Instant;

use crate::cache::ReplayCache;
use crate::call::{Call, Mode, OnConflict, OnDuplicate};
use crate::codec::{self, Encoded};
use crate::context::CallContext;
use crate::error::{Error, StoreError, StoreErrorKind};
use crate::ids;
use crate::lock::{LockGuard, LockRequest};
use crate::store::{
    AcquireOutcome, AcquireRequest, CommitRequest, Forgotten, Inspected, PurgeEvent, PurgeHandler, RecordState,
    ScanPage, Store, Transition, Watcher,
};
use crate::telemetry::{self, CallOutcome};
use crate::token::TokenKeys;
use crate::watchdog::{Registration, Watchdog};

/// The default lease.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
/// How long a completed result is kept by default.
pub const DEFAULT_KEEP: Duration = Duration::from_secs(24 * 3600);
/// How many calls of one process may wait on one key at a time by default (`OnConflict::Wait`).
pub const DEFAULT_MAX_WAITERS_PER_KEY: usize = 1000;

/// The environment variables of the runtime's own settings
/// ([`IdempotencyBuilder::with_vars`], [`Idempotency::from_env`]), with what each sets.
pub const RUNTIME_ENV_VARS: &[(&str, &str)] = &[
    ("IDEMPOTENCY_TTL", "the default lease, a duration like 30s"),
    ("IDEMPOTENCY_KEEP", "how long results are kept by default, like 24h"),
    ("IDEMPOTENCY_COMMIT_DEADLINE", "how long a caller waits for its result to be stored"),
    ("IDEMPOTENCY_REPLAY_CACHE", "the replay cache's capacity (0: off)"),
    ("IDEMPOTENCY_TOKEN_KEY", "the secret that signs tokens (at least 32 bytes), the same on every instance"),
    ("IDEMPOTENCY_TOKEN_KEY_PREVIOUS", "a previous secret still accepted, while it is rotated out"),
];

/// The largest result stored for replay by default; a larger one is kept as "completed, not
/// replayable".
pub const DEFAULT_MAX_RESULT_BYTES: usize = 1 << 20;

/// The runtime: a store and the defaults calls run under. Cheap to clone (one `Arc`).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use idempotent_core::{Call, Error, Idempotency, MemoryStore};
///
/// #[derive(Debug)]
/// enum AppError { Idem(Error), Declined }
/// impl From<Error> for AppError {
///     fn from(e: Error) -> Self { AppError::Idem(e) }
/// }
///
/// let idem = Idempotency::new(MemoryStore::new());
/// let receipt = idem
///     .run(Call::new("pay:stripe:txn_1").scope("payments"), || async {
///         // charge the card once...
///         Ok::<_, AppError>(String::from("receipt-1"))
///     })
///     .await
///     .unwrap();
/// assert_eq!(receipt, "receipt-1");
/// # }
/// ```
#[derive(Clone)]
pub struct Idempotency {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    watchdog: Watchdog,
    cache: Option<Arc<ReplayCache>>,
    ttl: Duration,
    keep: Duration,
    max_result_bytes: usize,
    wait_recheck: Duration,
    /// How long a caller waits for its result to be stored before it gets its value anyway.
    commit_deadline: Duration,
    /// The keys that sign and verify tokens.
    token_keys: TokenKeys,
    /// Callers of this process waiting on each key, and how many may.
    waiting: std::sync::Mutex<std::collections::HashMap<String, usize>>,
    max_waiters_per_key: usize,
    /// How far apart the clocks of the machines issuing and checking tokens may be.
    token_skew: Duration,
    /// The time tokens are issued and checked by.
    token_clock: TokenClock,
}

/// The time tokens are issued and checked by: the system's clock, or, if it is behind, the time
/// the runtime's monotonic clock (tokio's) has counted since the runtime was built. Records
/// expire by the monotonic clock; a token must never be valid while its record has expired, also
/// under tokio's paused clock in a user's tests (where the system's clock does not follow it).
struct TokenClock {
    system: std::time::SystemTime,
    monotonic: Instant,
}

impl TokenClock {
    fn new() -> Self {
        TokenClock { system: std::time::SystemTime::now(), monotonic: Instant::now() }
    }

    fn now(&self) -> std::time::SystemTime {
        std::time::SystemTime::now().max(self.system + self.monotonic.elapsed())
    }
}

/// Configures an [`Idempotency`].
#[must_use]
pub struct IdempotencyBuilder {
    inner: Inner,
}

impl IdempotencyBuilder {
    /// The lease of calls that set none (default 30 s).
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.inner.ttl = ttl.min(crate::MAX_DURATION);
        self
    }

    /// How long completed results are kept when a call sets nothing (default 24 h).
    pub fn default_keep(mut self, keep: Duration) -> Self {
        self.inner.keep = keep.min(crate::MAX_DURATION);
        self
    }

    /// The largest result stored for replay (default 1 MiB).
    pub fn max_result_bytes(mut self, bytes: usize) -> Self {
        self.inner.max_result_bytes = bytes;
        self
    }

    /// How many calls of this process may wait on one key at a time (default 1000); one more
    /// finding the key in progress gets [`Error::Conflict`] at once instead of waiting. A bound
    /// on what a flood of duplicates of one key can hold (a task, a timer and a subscription
    /// each).
    pub fn max_waiters_per_key(mut self, max: usize) -> Self {
        self.inner.max_waiters_per_key = max;
        self
    }

    /// How often a waiting call re-reads the key if no notification came (default 1 s). The
    /// notification normally wakes it first; this bounds the delay if one was missed (the
    /// pub/sub connection reconnecting, say).
    pub fn wait_recheck(mut self, every: Duration) -> Self {
        self.inner.wait_recheck = every.clamp(Duration::from_millis(1), crate::MAX_DURATION);
        self
    }

    /// How long a call whose body succeeded waits for its result to be stored before it returns
    /// the value anyway (default: twice the store's own timeout, 5 s for a store without one).
    ///
    /// A commit that fails (the store unreachable, a failover) is retried; past this deadline the
    /// caller gets its `Ok` (the body ran) and the retries go on in the background until the
    /// lease would have run out, so the record is still written if the store comes back in time.
    /// Meanwhile a duplicate finds the key in progress (`Error::Conflict`, or it waits); once the
    /// record lands it replays it, and if the lease runs out first the key is free and a duplicate
    /// runs the body again.
    pub fn commit_deadline(mut self, deadline: Duration) -> Self {
        self.inner.commit_deadline = deadline.min(crate::MAX_DURATION);
        self
    }

    /// The keys that sign and verify tokens. Default: the secret the store shares with every
    /// runtime on it (Redis and PostgreSQL create one at the first connect and read it at each
    /// connect: a fleet on one store takes each other's tokens with no configuration), or, on a
    /// store that keeps none (`MemoryStore`, a custom store), a random key of this runtime's own.
    /// Keys given here win: every instance then needs the same ones; rotate by putting the new
    /// secret first and the old one in [`TokenKeys::previous`].
    pub fn token_keys(mut self, keys: TokenKeys) -> Self {
        self.inner.token_keys = keys;
        self
    }

    /// How far apart the clocks of the machines that issue and check tokens (and the store's)
    /// may be (default 5 minutes). A used token's record is kept this much past the token's
    /// expiry, so that a machine whose clock is behind never finds the token valid and its
    /// record gone.
    pub fn token_skew(mut self, skew: Duration) -> Self {
        self.inner.token_skew = skew.min(crate::MAX_DURATION);
        self
    }

    /// Keeps up to `capacity` completed results in this process, so that a duplicate of a
    /// recently completed call is answered without a round trip to the store (default: off).
    ///
    /// Only completed results are cached, never a key in progress, and an entry lives no longer
    /// than the record it copies: its lifetime is what the store reported the record has left
    /// when it was read (Redis: the key's `PTTL`), counted from before the read was sent, on this
    /// process's monotonic clock, so no client's idea of the time can stretch it. What it gives
    /// up: a record deleted from the store by hand stays replayable from this process's cache
    /// until then.
    pub fn replay_cache(mut self, capacity: usize) -> Self {
        self.inner.cache = (capacity > 0).then(|| Arc::new(ReplayCache::new(capacity)));
        self
    }

    /// Applies the runtime settings of the environment variables looked up by `vars` (see
    /// [`RUNTIME_ENV_VARS`]); a value that does not parse is [`Error::InvalidCall`] naming the
    /// variable (never showing a token key).
    pub fn with_vars(mut self, vars: &dyn Fn(&str) -> Option<String>) -> Result<Self, Error> {
        let bad = |name: &str, why: String| Error::InvalidCall { key: name.to_owned(), reason: why };
        let duration = |name: &str| -> Result<Option<Duration>, Error> {
            vars(name).map(|t| crate::parse_duration(t.trim()).map_err(|why| bad(name, why))).transpose()
        };
        if let Some(ttl) = duration("IDEMPOTENCY_TTL")? {
            self = self.default_ttl(ttl);
        }
        if let Some(keep) = duration("IDEMPOTENCY_KEEP")? {
            self = self.default_keep(keep);
        }
        if let Some(deadline) = duration("IDEMPOTENCY_COMMIT_DEADLINE")? {
            self = self.commit_deadline(deadline);
        }
        if let Some(n) = vars("IDEMPOTENCY_REPLAY_CACHE") {
            let n = n.trim().parse::<usize>().map_err(|e| bad("IDEMPOTENCY_REPLAY_CACHE", e.to_string()))?;
            self = self.replay_cache(n);
        }
        if let Some(key) = vars("IDEMPOTENCY_TOKEN_KEY") {
            let mut keys = TokenKeys::new(key.as_bytes()).map_err(|_| {
                bad("IDEMPOTENCY_TOKEN_KEY", format!("needs at least {} bytes", crate::MIN_SECRET_BYTES))
            })?;
            if let Some(previous) = vars("IDEMPOTENCY_TOKEN_KEY_PREVIOUS") {
                keys = keys.previous(previous.as_bytes()).map_err(|_| {
                    bad("IDEMPOTENCY_TOKEN_KEY_PREVIOUS", format!("needs at least {} bytes", crate::MIN_SECRET_BYTES))
                })?;
            }
            self = self.token_keys(keys);
        }
        Ok(self)
    }

    /// The runtime. With a replay cache, it starts following the store's purges here (from a
    /// task of the current tokio runtime, for a store that must wait).
    pub fn build(self) -> Idempotency {
        telemetry::describe_metrics();
        let inner = Arc::new(self.inner);
        inner.follow_purges();
        Idempotency { inner }
    }
}

impl Idempotency {
    /// A runtime on `store` with the default settings.
    pub fn new(store: impl Store) -> Self {
        Self::builder(store).build()
    }

    /// A builder for a runtime on `store`.
    pub fn builder(store: impl Store) -> IdempotencyBuilder {
        Self::builder_shared(Arc::new(store))
    }

    /// A builder for a runtime on a store shared with other code.
    pub fn builder_shared(store: Arc<dyn Store>) -> IdempotencyBuilder {
        let commit_deadline = store.call_timeout().map_or(Duration::from_secs(5), |t| t * 2);
        // The store's shared secret, so that a fleet on one store takes each other's tokens; one
        // of this process's own where the store keeps none.
        let token_keys = TokenKeys::shared(&store.token_secrets()).unwrap_or_else(TokenKeys::random);
        IdempotencyBuilder {
            inner: Inner {
                watchdog: Watchdog::new(store.clone()),
                cache: None,
                store,
                ttl: DEFAULT_TTL,
                keep: DEFAULT_KEEP,
                max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
                wait_recheck: Duration::from_secs(1),
                commit_deadline,
                token_keys,
                waiting: Default::default(),
                max_waiters_per_key: DEFAULT_MAX_WAITERS_PER_KEY,
                token_skew: Duration::from_secs(300),
                token_clock: TokenClock::new(),
            },
        }
    }

    /// A runtime on a [`RedisStore`](crate::RedisStore) with every setting from the environment
    /// (the store's `IDEMPOTENCY_REDIS_URL` and [`ENV_VARS`](crate::store::redis::ENV_VARS), the
    /// runtime's [`RUNTIME_ENV_VARS`]), connected: a store that cannot be reached is an error
    /// now, at start-up, not at the first request.
    #[cfg(feature = "redis")]
    pub async fn from_env() -> Result<Idempotency, Error> {
        let vars = |name: &str| std::env::var(name).ok();
        let store_error = |source| Error::Store { key: "IDEMPOTENCY_REDIS_URL".into(), source };
        let store =
            crate::RedisStoreBuilder::from_vars(&vars).map_err(store_error)?.connect().await.map_err(store_error)?;
        Ok(Idempotency::builder(store).with_vars(&vars)?.build())
    }

    /// A distributed lock on `key` (in the scope `lock` unless [`scope`](LockRequest::scope)
    /// says otherwise), for a critical section inside a function: renewed by the watchdog while
    /// held, with a fencing token and loss detection, released when its guard goes.
    /// [`acquire`](LockRequest::acquire) takes it or fails with [`Error::Conflict`];
    /// [`wait`](LockRequest::wait) waits for it. See [`LockGuard`].
    pub fn lock(&self, key: impl Into<String>) -> LockRequest<'_> {
        LockRequest::new(self, key.into())
    }

    /// Takes the lock on `key` if it is free ([`Error::Conflict`] otherwise), with the default
    /// lease: `lock(key).acquire()`.
    pub async fn try_lock(&self, key: impl Into<String>) -> Result<LockGuard, Error> {
        self.lock(key).acquire().await
    }

    /// Takes the lock on `key`, waiting up to `patience` for it: `lock(key).wait(patience)`.
    pub async fn lock_wait(&self, key: impl Into<String>, patience: Duration) -> Result<LockGuard, Error> {
        self.lock(key).wait(patience).await
    }

    /// The lease of calls that set none.
    pub(crate) fn default_ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// Has the watchdog renew `context`'s lease, acquired by a request sent at `sent`, until the
    /// registration goes.
    pub(crate) fn watch_lease(&self, lease: Duration, sent: Instant, context: CallContext) -> Registration {
        self.inner.watchdog.register(lease, true, sent, context)
    }

    /// Releases `key` for `owner` now: `LeaseLost` if another owner has it; on a store error the
    /// store goes on trying in the background.
    pub(crate) async fn release_key(&self, key: &str, owner: &str, lease: Duration) -> Result<(), Error> {
        match self.inner.store.release(key, owner).await {
            Ok(Transition::Done) => Ok(()),
            Ok(Transition::Lost) => Err(Error::LeaseLost {
                key: key.to_owned(),
                reason: "another holder has the key: the lease had run out".into(),
            }),
            Ok(Transition::Corrupt { reason }) => Err(Error::Corrupt { key: key.to_owned(), reason }),
            Err(source) => {
                self.release_in_background(key, owner, lease);
                Err(Error::Store { key: key.to_owned(), source })
            }
        }
    }

    /// Releases `key` for `owner` in the background ([`Store::abandon`]).
    pub(crate) fn release_in_background(&self, key: &str, owner: &str, lease: Duration) {
        self.inner.store.clone().abandon(key, owner, lease);
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// Issues a one-time token for token mode, valid for `ttl`: hand it to the client, which
    /// sends it back with the request (`Call::token(token)`). It is signed, not stored: issuing
    /// writes nothing, and only its first use creates a record (kept until the token expires).
    /// 56 URL-safe characters.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// use idempotency::{Call, Error, Idempotency, MemoryStore};
    ///
    /// let idem = Idempotency::new(MemoryStore::new());
    /// let token = idem.issue_token(Duration::from_secs(3600)).unwrap(); // with the form
    /// let submit = || idem.run(Call::token(&token), || async { Ok::<_, Error>(7u32) });
    /// assert_eq!(submit().await.unwrap(), 7);
    /// assert_eq!(submit().await.unwrap(), 7); // a double click: replayed
    /// let forged: Result<u32, Error> = idem.run(Call::token("made-up"), || async { Ok(8) }).await;
    /// assert!(matches!(forged, Err(Error::InvalidToken { .. })));
    /// # }
    /// ```
    pub fn issue_token(&self, ttl: Duration) -> Result<String, Error> {
        self.issue(None, ttl)
    }

    /// Issues a token in `scope`, for calls made with `Call::token(t).scope(scope)`: a token
    /// issued for one scope is refused in any other.
    pub fn issue_token_scoped(&self, scope: &str, ttl: Duration) -> Result<String, Error> {
        self.issue(Some(scope), ttl)
    }

    fn issue(&self, scope: Option<&str>, ttl: Duration) -> Result<String, Error> {
        let scope = scope.unwrap_or("token");
        if ttl < crate::call::MIN_LEASE {
            return Err(Error::InvalidCall {
                key: scope.to_owned(),
                reason: format!("a token's lifetime of {ttl:?} is too short"),
            });
        }
        if ttl > crate::MAX_DURATION {
            return Err(Error::InvalidCall {
                key: scope.to_owned(),
                reason: format!("a token's lifetime of {ttl:?} is over the {:?} maximum", crate::MAX_DURATION),
            });
        }
        self.inner.token_keys.issue(scope, ttl, self.inner.token_clock.now())
    }

    /// Checks a token-mode call's token (no store command) and puts the part of it that names
    /// its record in its place; when the token expires.
    fn verify_token(&self, call: &mut Call) -> Result<std::time::SystemTime, Error> {
        let scope = call.token_scope();
        match self.inner.token_keys.verify(scope, call.key(), self.inner.token_clock.now()) {
            Ok(verified) => {
                call.set_key(verified.id);
                Ok(verified.expires)
            }
            Err(why) => {
                tracing::debug!(reason = %why, "idempotency token refused");
                Err(Error::InvalidToken { key: call.full_key() })
            }
        }
    }

    /// Reads the record of `key` in `scope` whole, for operators: its state, fence, owner, how
    /// long it has left, fingerprint, and result (see [`RecordView`](crate::store::RecordView)).
    /// An empty `scope` reads `key` as a full key.
    pub async fn inspect(&self, scope: &str, key: &str) -> Result<Inspected, Error> {
        let key = full_key(scope, key);
        self.inner.store.inspect(&key).await.map_err(|source| Error::Store { key, source })
    }

    /// Deletes the record of `key` in `scope` (an empty scope: `key` is a full key): a completed
    /// one, so that the next call runs the body again (after a bug fix, say), or an in-progress
    /// one with [`Force::InProgress`], which means a second body may start while the first still
    /// runs (the first learns its lease is lost at its next renewal). Waiters are woken, and every
    /// process whose replay cache follows purges drops its copy.
    pub async fn forget(&self, scope: &str, key: &str, force: Force) -> Result<Forgotten, Error> {
        let key = full_key(scope, key);
        let forgotten = self.inner.store.forget(&key, force == Force::InProgress).await;
        if let (Ok(Forgotten::Deleted(_)), Some(cache)) = (&forgotten, &self.inner.cache) {
            cache.forget(&key);
        }
        forgotten.map_err(|source| Error::Store { key, source })
    }

    /// One page of the records whose full keys start with `filter.prefix` and pass its filters
    /// (state, age, fingerprint), from `cursor` (`None`: the first page), about `count` keys
    /// examined; on Redis a `SCAN` (every primary of a cluster), which never blocks the server.
    pub async fn scan(&self, filter: &ScanFilter, cursor: Option<&str>, count: usize) -> Result<ScanPage, Error> {
        let mut page = self
            .inner
            .store
            .scan(&filter.prefix, cursor, count.max(1))
            .await
            .map_err(|source| Error::Store { key: filter.prefix.clone(), source })?;
        let now = std::time::SystemTime::now();
        page.records.retain(|r| filter.matches(r, now));
        Ok(page)
    }

    /// Runs `body` at most once for `call`'s key (per the call's policies) and returns its
    /// result, or the stored result of the run that completed before.
    ///
    /// - Key absent: runs the body under a lease the watchdog renews. `Ok` is stored for
    ///   `keep` and returned; `Err` releases the key (a retry may run) and is returned as is; a
    ///   panic releases the key and goes on unwinding; a cancelled (dropped) call releases the
    ///   key in the background.
    /// - Key completed: the stored `Ok` value, decoded, without running the body
    ///   ([`OnDuplicate::Replay`]), or [`Error::Duplicate`] ([`OnDuplicate::Reject`]).
    /// - Key in progress elsewhere: [`Error::Conflict`], or wait ([`OnConflict::Wait`]).
    /// - Same key, different fingerprint: [`Error::KeyReused`].
    ///
    /// If the result cannot be stored (the store fails at commit, or another owner took the key
    /// after this call's lease was lost), the body's value is still returned, since the body
    /// ran, and a warning is logged; a commit that keeps failing is retried for at most the
    /// commit deadline before the value is returned, and in the background after it
    /// ([`IdempotencyBuilder::commit_deadline`]). The exception: a store that requires replica
    /// acknowledgements and did not get them fails the call with [`Error::Unconfirmed`]; the
    /// record stays on the primary, so a retry replays it unless a failover lost it.
    pub async fn run<T, E, F, Fut>(&self, call: Call, body: F) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.run_with_outcome(call, body).await.map(|(value, _)| value)
    }

    /// Runs `body` like [`run`](Self::run), in a task of its own, so that dropping the call (an
    /// HTTP client that goes away and takes the request's future with it, an outer timeout, a
    /// `select!`) does not cancel it: once started, the call runs to its end and its result is
    /// stored, and a retry meanwhile finds the key in progress, after it the result. With `run`,
    /// a dropped call releases the key and a retry runs the body again. The body and its value
    /// must be `Send + 'static` to move to the task; a panic of the body reaches the caller as
    /// with `run`. The attribute's `on_cancel = finish`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// use idempotency::{Call, Error, Idempotency, MemoryStore};
    ///
    /// let idem = Idempotency::new(MemoryStore::new());
    /// let slow = idem.run_to_completion(Call::new("charge:1"), || async {
    ///     tokio::time::sleep(Duration::from_millis(50)).await;
    ///     Ok::<_, Error>(7)
    /// });
    /// // The caller gives up after 10 ms; the charge goes on and is stored.
    /// assert!(tokio::time::timeout(Duration::from_millis(10), slow).await.is_err());
    /// tokio::time::sleep(Duration::from_millis(100)).await;
    /// let again = idem.run(Call::new("charge:1"), || async { Ok::<_, Error>(8) }).await;
    /// assert_eq!(again.unwrap(), 7);
    /// # }
    /// ```
    pub async fn run_to_completion<T, E, F, Fut>(&self, call: Call, body: F) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
        E: From<Error> + Send + 'static,
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        let key = call.full_key();
        let idem = self.clone();
        let task = tokio::spawn(tracing::Instrument::in_current_span(async move { idem.run(call, body).await }));
        match task.await {
            Ok(out) => out,
            Err(e) if e.is_panic() => resume_unwind(e.into_panic()),
            // The task's runtime shut down under it.
            Err(_) => Err(E::from(Error::Store {
                key,
                source: StoreError::new(
                    StoreErrorKind::Unavailable,
                    "the call's task was cancelled: its runtime shut down",
                ),
            })),
        }
    }

    /// Runs `body` like [`run`](Self::run), and says what happened: whether the value was
    /// replayed or the body ran, the fencing token, how long the call waited and how many times
    /// it asked the store.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use idempotency::{Call, Error, Idempotency, MemoryStore};
    /// use idempotency::telemetry::CallOutcome;
    ///
    /// let idem = Idempotency::new(MemoryStore::new());
    /// let (value, outcome) = idem.run_with_outcome(Call::new("k"), || async { Ok::<_, Error>(7) }).await.unwrap();
    /// assert_eq!((value, outcome.kind, outcome.replayed), (7, CallOutcome::Executed, false));
    /// let (_, outcome) = idem.run_with_outcome(Call::new("k"), || async { Ok::<_, Error>(8) }).await.unwrap();
    /// assert!(outcome.replayed && outcome.fence.is_none());
    /// # }
    /// ```
    pub async fn run_with_outcome<T, E, F, Fut>(&self, call: Call, body: F) -> Result<(T, Outcome), E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let body = move || {
            let fut = body();
            async move { fut.await.map(|value| (value, ())) }
        };
        self.run_inner(call, body, CommitWith::<NoCommit>::Store).await
    }

    /// Runs `body` like [`run`](Self::run), for a store that writes the completed record
    /// together with the body's own effects: the body returns its value and a handle `X` (a
    /// database transaction holding its writes), and `commit` receives `X` with the record to
    /// write ([`Completed`]), and makes both durable at once (one database commit).
    ///
    /// What differs from `run`: if `commit` finds another owner holds the key
    /// (`Transition::Lost`: the lease was lost and the key taken), it must have dropped the body's
    /// effects, and the call fails with [`Error::LeaseLost`]; if `commit` fails (a serialization
    /// failure, the database gone), nothing of the body stayed either: the key is released and
    /// the call fails with [`Error::Store`]. An `Err` or a panic of the body drops `X` (rolling
    /// its writes back) and releases the key, as in `run`.
    pub async fn run_committing<T, E, X, F, Fut, C, CFut>(&self, call: Call, body: F, commit: C) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(T, X), E>>,
        C: FnOnce(X, Completed) -> CFut,
        CFut: Future<Output = Result<Transition, StoreError>>,
    {
        self.run_inner(call, body, CommitWith::Custom(commit)).await.map(|(value, _)| value)
    }

    /// Every run: the call's span around it, its outcome recorded in the span and the metrics.
    ///
    /// The span is at `INFO` for every call that reaches the store (its cost, a microsecond or
    /// two with a subscriber that records it, is small beside a round trip), and at `DEBUG` for
    /// a replay answered by the in-process cache, which would otherwise cost more to trace than
    /// to answer; the metrics count both.
    async fn run_inner<T, E, X, F, Fut, C, CFut>(
        &self,
        mut call: Call,
        body: F,
        commit: CommitWith<C>,
    ) -> Result<(T, Outcome), E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(T, X), E>>,
        C: FnOnce(X, Completed) -> CFut,
        CFut: Future<Output = Result<Transition, StoreError>>,
    {
        let mut track = Track::default();
        let (span, result) = match self.prepare(&mut call) {
            Ok(Prepared::Cached { key, hit }) => {
                let span = call_span!(tracing::Level::DEBUG, call);
                let _entered = span.enter();
                shown_key(&span, &key, &mut track);
                track.replayed();
                let replayed = replay(&key, call.on_duplicate, Some(&hit.result)).map_err(Fail::Lib);
                drop(_entered);
                (span, replayed)
            }
            Ok(Prepared::Store(go)) => {
                let span = call_span!(tracing::Level::INFO, call);
                shown_key(&span, &go.key, &mut track);
                let guarded = self.guarded(&call, go, body, commit, &mut track);
                let result = tracing::Instrument::instrument(guarded, span.clone()).await;
                (span, result)
            }
            Err(e) => (call_span!(tracing::Level::INFO, call), Err(Fail::Lib(e))),
        };
        let outcome = match &result {
            Ok(_) => track.outcome,
            Err(Fail::Lib(e)) => {
                // Refused before its record key was known: the key as the error names it.
                if !track.key_shown && !e.key().is_empty() {
                    shown_key(&span, e.key(), &mut track);
                }
                CallOutcome::of_error(e)
            }
            Err(Fail::Body(_)) => CallOutcome::BodyError,
        };
        if !span.is_disabled() {
            span.record("outcome", outcome.as_str());
            if let Some(fence) = track.fence {
                span.record("fence", fence);
            }
            span.record("attempts", track.attempts);
            span.record("waited_ms", track.waited.as_millis() as u64);
        }
        telemetry::record::call(outcome, telemetry::scope_label(call.scope_str()));
        if !track.waited.is_zero() {
            telemetry::record::wait(track.waited);
        }
        match result {
            Ok(value) => Ok((
                value,
                Outcome {
                    kind: outcome,
                    replayed: track.replayed,
                    fence: track.fence,
                    waited: track.waited,
                    attempts: track.attempts,
                    stored: track.stored,
                },
            )),
            Err(Fail::Lib(e)) => Err(E::from(e)),
            Err(Fail::Body(e)) => Err(e),
        }
    }

    /// What a call needs before the store: its token checked, its key and fingerprint, and the
    /// replay cache asked.
    fn prepare(&self, call: &mut Call) -> Result<Prepared, Error> {
        let lease = call.ttl.unwrap_or(self.inner.ttl);
        // A token is checked before anything else, without the store.
        let token_expires = match call.mode {
            Mode::Token => Some(self.verify_token(call)?),
            Mode::Param => None,
        };
        let (key, fingerprint) = call.take_key(lease)?;
        if let Some(cache) = &self.inner.cache {
            let hit = cache.get(&key);
            telemetry::record::cache(hit.is_some());
            if let Some(hit) = hit {
                check_fingerprint(&key, hit.fingerprint.as_deref(), fingerprint.as_deref())?;
                return Ok(Prepared::Cached { key, hit });
            }
        }
        Ok(Prepared::Store(Go { key, fingerprint, lease, token_expires }))
    }

    /// A call that goes to the store, inside its span: a library error is told apart from the
    /// body's.
    async fn guarded<T, E, X, F, Fut, C, CFut>(
        &self,
        call: &Call,
        go: Go,
        body: F,
        commit: CommitWith<C>,
        track: &mut Track,
    ) -> Result<T, Fail<E>>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(T, X), E>>,
        C: FnOnce(X, Completed) -> CFut,
        CFut: Future<Output = Result<Transition, StoreError>>,
    {
        let Go { key, fingerprint, lease, token_expires } = go;
        let owner = ids::owner_id();
        match self.take(&key, owner, lease, fingerprint.as_deref(), call.on_conflict, track).await? {
            Taken::Held { fence, sent } => {
                track.fence = Some(fence);
                track.outcome =
                    if track.waited.is_zero() { CallOutcome::Executed } else { CallOutcome::WaitedThenExecuted };
                let context = CallContext::new(key, owner, fence, track.attempts);
                let held = Held { context, lease, sent, fingerprint, token_expires };
                self.execute(call, held, body, commit, track).await
            }
            Taken::Completed { fingerprint: theirs, result, kept_until, generation } => {
                if let Some(bytes) = &result {
                    self.inner.cache_put(&key, theirs.as_deref(), bytes, kept_until, generation);
                }
                track.replayed();
                tracing::debug!(stored = result.is_some(), "idempotency key completed: replaying");
                Ok(replay(&key, call.on_duplicate, result.as_deref())?)
            }
        }
    }

    /// Takes `key` for `owner`: acquires it, or finds it completed, or, held by another owner,
    /// fails with `Conflict` or waits for it (`on_conflict`). A different fingerprint than the
    /// one stored is `KeyReused`.
    pub(crate) async fn take(
        &self,
        key: &str,
        owner: ids::OwnerId,
        lease: Duration,
        fingerprint: Option<&str>,
        on_conflict: OnConflict,
        track: &mut Track,
    ) -> Result<Taken, Error> {
        let store = &*self.inner.store;
        // When the first acquire was sent: the wait's patience counts from there.
        let mut started: Option<Instant> = None;
        let mut watcher: Option<Watcher> = None;
        let mut _waiting: Option<WaitSlot<'_>> = None;
        loop {
            let generation = self.inner.cache_generation();
            let sent = Instant::now();
            let started = *started.get_or_insert(sent);
            let request = AcquireRequest {
                key,
                owner: owner.as_str(),
                lease,
                fingerprint,
                will_wait: watcher.is_some(),
                // The wait needs the holder's lease; the cache, how long a result is kept.
                report_ttl: watcher.is_some() || self.inner.cache.is_some(),
            };
            // Armed before the acquire is sent: if this call is dropped while the acquire is in
            // flight, or the acquire fails (it may still land later), the store releases the key
            // for this owner in the background.
            let abandon = Abandon { store: Some(&self.inner.store), key, owner: owner.as_str(), lease };
            track.attempts += 1;
            if track.attempts > 1 {
                track.waited = sent - started;
            }
            tracing::debug!(attempt = track.attempts, wait = request.will_wait, "idempotency acquire sent");
            let found = match store.acquire(request).await {
                Ok(found) => {
                    abandon.disarm();
                    found
                }
                Err(source) => {
                    drop(abandon);
                    tracing::debug!(error = %source, "idempotency acquire failed");
                    return Err(Error::Store { key: key.to_owned(), source });
                }
            };
            let answered = sent.elapsed();
            telemetry::record::acquire(answered);
            tracing::debug!(
                found = found.name(),
                took_us = answered.as_micros() as u64,
                "idempotency acquire answered"
            );
            if track.attempts > 1 {
                track.waited = Instant::now() - started;
            }
            match found {
                AcquireOutcome::Acquired { fence } => {
                    // A reply that came after the lease may have run out (a slow link, a stalled
                    // process): another caller may hold the key by now. The body must not start;
                    // the key goes back, owner-checked, in case it is still this owner's.
                    let margin = crate::watchdog::safety_margin(lease);
                    if Instant::now() + margin >= sent + lease {
                        tracing::warn!(
                            key = %telemetry::logged_key(key),
                            took_ms = answered.as_millis() as u64,
                            lease_ms = lease.as_millis() as u64,
                            "idempotency acquire answered after its lease could have run out; not running the body"
                        );
                        self.release_in_background(key, owner.as_str(), lease);
                        return Err(Error::LeaseLost {
                            key: key.to_owned(),
                            reason: format!(
                                "the store answered the acquire after {answered:?}, with the lease of {lease:?} \
                                 (less its safety margin) run out: another caller may hold the key"
                            ),
                        });
                    }
                    return Ok(Taken::Held { fence, sent });
                }
                AcquireOutcome::Completed { fingerprint: theirs, result, kept_for } => {
                    check_fingerprint(key, theirs.as_deref(), fingerprint)?;
                    // Counted from before the read was sent: never past the record's end.
                    return Ok(Taken::Completed {
                        fingerprint: theirs,
                        result,
                        kept_until: sent + kept_for,
                        generation,
                    });
                }
                AcquireOutcome::Corrupt { reason } => {
                    tracing::warn!(key = %telemetry::logged_key(key), reason = %reason, "idempotency key holds something that is not a record");
                    return Err(Error::Corrupt { key: key.to_owned(), reason });
                }
                AcquireOutcome::InProgress { fingerprint: theirs, lease_left } => {
                    check_fingerprint(key, theirs.as_deref(), fingerprint)?;
                    let conflict = || Error::Conflict {
                        key: key.to_owned(),
                        retry_after: (!lease_left.is_zero()).then_some(lease_left),
                    };
                    let OnConflict::Wait(patience) = on_conflict else { return Err(conflict()) };
                    let now = Instant::now();
                    if now >= started + patience {
                        track.waited = now - started;
                        return Err(Error::Timeout { key: key.to_owned(), waited: now - started });
                    }
                    match &mut watcher {
                        // Watch first, then look again: a change after this look wakes us.
                        None => {
                            let Some(slot) = WaitSlot::take(&self.inner, key) else {
                                tracing::warn!(
                                    key = %telemetry::logged_key(key),
                                    max = self.inner.max_waiters_per_key,
                                    "idempotency call not waiting: too many calls already wait on this key"
                                );
                                return Err(conflict());
                            };
                            _waiting = Some(slot);
                            let w = store
                                .watch(key)
                                .await
                                .map_err(|source| Error::Store { key: key.to_owned(), source })?;
                            watcher = Some(w);
                        }
                        Some(w) => {
                            // Until a notification, the holder's lease running out, the recheck
                            // interval, or the end of patience, whichever comes first.
                            let until = (started + patience)
                                .min(now + lease_left + Duration::from_millis(2))
                                .min(now + self.inner.wait_recheck);
                            tokio::select! {
                                () = w.changed() => {}
                                () = tokio::time::sleep_until(until) => {}
                            }
                        }
                    }
                }
            }
        }
    }

    /// Runs the body on a held key, then commits or releases the key.
    async fn execute<T, E, X, F, Fut, C, CFut>(
        &self,
        call: &Call,
        held: Held,
        body: F,
        commit: CommitWith<C>,
        track: &mut Track,
    ) -> Result<T, Fail<E>>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(T, X), E>>,
        C: FnOnce(X, Completed) -> CFut,
        CFut: Future<Output = Result<Transition, StoreError>>,
    {
        let context = &held.context;
        let mut guard = ReleaseOnDrop { store: Some(&self.inner.store), context, lease: held.lease };
        let body_started = Instant::now();
        let fut = match catch_unwind(AssertUnwindSafe(body)) {
            Ok(fut) => fut,
            Err(panic) => {
                guard.release().await;
                panicked(call);
                resume_unwind(panic);
            }
        };
        let scoped = context.clone().scope(fut);
        let caught = async {
            let mut scoped = std::pin::pin!(scoped);
            std::future::poll_fn(|cx| match catch_unwind(AssertUnwindSafe(|| scoped.as_mut().poll(cx))) {
                Ok(Poll::Pending) => Poll::Pending,
                Ok(Poll::Ready(out)) => Poll::Ready(Ok(out)),
                Err(panic) => Poll::Ready(Err(panic)),
            })
            .await
        };
        let registration = self.inner.watchdog.register(held.lease, call.renew, held.sent, context.clone());
        let driven = if call.abort_on_lease_lost {
            // The loss first: a lease known lost stops the body before its next poll.
            tokio::select! {
                biased;
                reason = context.lost() => Driven::Lost(reason),
                out = caught => Driven::Finished(out),
            }
        } else {
            Driven::Finished(caught.await)
        };
        // The lease as last renewed bounds the commit's retries.
        let lease_end = registration.finish().unwrap_or(held.sent + held.lease);
        telemetry::record::body(body_started.elapsed());
        match driven {
            Driven::Lost(reason) => {
                // Released in the background: the store may be what failed, and the caller
                // should hear of the loss now, not after the store's timeout.
                guard.abandon();
                Err(Error::LeaseLost { key: context.key().to_owned(), reason: reason.to_owned() }.into())
            }
            Driven::Finished(Err(panic)) => {
                guard.release().await;
                panicked(call);
                resume_unwind(panic)
            }
            Driven::Finished(Ok(Err(e))) => {
                tracing::debug!("idempotency body failed: releasing the key");
                guard.release().await;
                Err(Fail::Body(e))
            }
            Driven::Finished(Ok(Ok((value, handle)))) => {
                // Encoded before any await: the call's future holds no `&T` across one, so it is
                // `Send` whenever `T` is. A value that would not replay as itself is kept as
                // completed but not replayable (the body ran: a duplicate must not run it again),
                // and this first call says so.
                let (encoded, inexact) = match codec::encode(&value, self.inner.max_result_bytes) {
                    Ok(encoded) => (encoded, None),
                    Err(why) => (Encoded::NotReplayable(why.clone()), Some(why)),
                };
                let commit_started = Instant::now();
                let stored = match commit {
                    CommitWith::Store => {
                        // From here on the key is never released: the body ran.
                        guard.store = None;
                        drop(handle);
                        self.commit(call, &held, encoded, lease_end)
                            .await
                            .map(|confirmed| track.stored = confirmed)
                            .map_err(|source| Error::Unconfirmed { key: context.key().to_owned(), source })
                    }
                    CommitWith::Custom(commit) => {
                        let completed = self.completed(call, &held, encoded);
                        let (result, fingerprint, keep) =
                            (completed.result.clone(), completed.fingerprint.clone(), completed.keep);
                        let generation = self.inner.cache_generation();
                        let sent = Instant::now();
                        match commit(handle, completed).await {
                            Ok(Transition::Done) => {
                                guard.store = None;
                                track.stored = true;
                                if let Some(bytes) = &result {
                                    let until = sent + keep;
                                    self.inner.cache_put(
                                        context.key(),
                                        fingerprint.as_deref(),
                                        bytes,
                                        until,
                                        generation,
                                    );
                                }
                                Ok(())
                            }
                            // The store dropped the body's effects with its record: the key is
                            // not ours to release.
                            Ok(Transition::Lost) => {
                                guard.store = None;
                                Err(Error::LeaseLost {
                                    key: context.key().to_owned(),
                                    reason: "another owner took the key: the body's writes were rolled back".into(),
                                })
                            }
                            Ok(Transition::Corrupt { reason }) => {
                                guard.store = None;
                                Err(Error::Corrupt { key: context.key().to_owned(), reason })
                            }
                            // Nothing of the body stayed: the key goes back, a retry runs it.
                            Err(source) => {
                                guard.release().await;
                                Err(Error::Store { key: context.key().to_owned(), source })
                            }
                        }
                    }
                };
                telemetry::record::commit(commit_started.elapsed());
                tracing::debug!(stored = stored.is_ok(), "idempotency commit done");
                match (stored, inexact) {
                    (Ok(()), None) => Ok(value),
                    (Ok(()), Some(why)) => Err(Error::Codec {
                        key: context.key().to_owned(),
                        message: format!(
                            "the result, of type `{}`, cannot be stored to replay as itself: {why}. The body ran; the \
                             key is kept as completed but not replayable, so a duplicate gets `Error::Duplicate`",
                            std::any::type_name::<T>()
                        ),
                    }
                    .into()),
                    (Err(e), _) => Err(e.into()),
                }
            }
        }
    }

    /// Stores the result. A failed attempt is retried (a commit is safe to repeat) until the
    /// commit deadline; past it the caller gets its value and the retries go on in the
    /// background until the lease would have run out. A lost key or a corrupt record is logged
    /// (the body ran, so its value is returned anyway); a store that says too few replicas have
    /// the record fails the call, which is the caller's to know.
    /// `Ok(true)` when the store confirmed the record; `Ok(false)` when it refused it (another
    /// owner has the key) or the commit goes on in the background past the deadline.
    async fn commit(&self, call: &Call, held: &Held, encoded: Encoded, lease_end: Instant) -> Result<bool, StoreError> {
        let key = held.context.key();
        let result = replayable(key, encoded);
        let keep = self.keep_for(call, held);
        let request = CommitRequest {
            key,
            owner: held.context.owner(),
            fence: held.context.fence(),
            keep,
            result: result.as_deref(),
            fingerprint: held.fingerprint.as_deref(),
        };
        // The common case, inline and without copying anything.
        let generation = self.inner.cache_generation();
        let sent = Instant::now();
        let first = match self.inner.store.commit(request).await {
            Err(e) if e.may_succeed_later() => e,
            outcome => return self.inner.committed(&request, outcome, sent, generation),
        };
        tracing::warn!(key = %telemetry::logged_key(key), error = %first, "idempotency commit failed; retrying");
        let pending = PendingCommit {
            key: key.to_owned(),
            owner: held.context.owner().to_owned(),
            fence: held.context.fence(),
            keep,
            result,
            fingerprint: held.fingerprint.clone(),
        };
        // A retry's cached copy still ends `keep` after this first send: the record may have
        // been written by it, whatever the retry that confirms it finds.
        let mut retries = Box::pin(self.inner.clone().retry_commit(pending, lease_end, sent, generation));
        // The deadline counts from the first attempt, not from its failure.
        match tokio::time::timeout_at(sent + self.inner.commit_deadline, &mut retries).await {
            Ok(outcome) => outcome,
            Err(_) => {
                tracing::warn!(
                    key = %telemetry::logged_key(key),
                    deadline = ?self.inner.commit_deadline,
                    "idempotency result not stored within the commit deadline; the caller gets its value, \
                     storing goes on in the background until the lease would end"
                );
                if let Some(slot) = crate::store::background::slot("commit") {
                    tokio::spawn(async move {
                        let _slot = slot;
                        retries.await
                    });
                }
                Ok(false)
            }
        }
    }
}

impl Idempotency {
    /// How long the completed record is kept: the call's `keep`, and in token mode at least until
    /// the token expires.
    fn keep_for(&self, call: &Call, held: &Held) -> Duration {
        let keep = call.keep.unwrap_or(self.inner.keep);
        match held.token_expires {
            // A used token stays used until it expires, whatever `keep` says: its record lives
            // until then, plus the clock skew allowed between machines.
            Some(expires) => {
                let left = expires.duration_since(self.inner.token_clock.now()).unwrap_or_default();
                keep.max(left.saturating_add(self.inner.token_skew)).min(crate::MAX_DURATION)
            }
            None => keep,
        }
    }

    /// The completed record of a call, owned, for a store that writes it itself.
    fn completed(&self, call: &Call, held: &Held, encoded: Encoded) -> Completed {
        let key = held.context.key();
        Completed {
            key: key.to_owned(),
            owner: held.context.owner().to_owned(),
            fence: held.context.fence(),
            keep: self.keep_for(call, held),
            result: replayable(key, encoded),
            fingerprint: held.fingerprint.clone(),
        }
    }
}

/// The bytes to store, or `None` for a result kept as not replayable (logged).
fn replayable(key: &str, encoded: Encoded) -> Option<Vec<u8>> {
    match encoded {
        Encoded::Replayable(bytes) => Some(bytes),
        Encoded::NotReplayable(why) => {
            tracing::warn!(key = %telemetry::logged_key(key), why = %why, "idempotency result stored as not replayable");
            None
        }
    }
}

/// How a successful body's record is written: by the store's own commit, or by the caller's
/// ([`Idempotency::run_committing`]).
enum CommitWith<C> {
    Store,
    Custom(C),
}

/// The commit type of a call that commits through the store.
type NoCommit = fn((), Completed) -> std::future::Ready<Result<Transition, StoreError>>;

/// The completed record a successful body leaves, for a store that writes it together with the
/// body's own effects ([`Idempotency::run_committing`]): the owner-checked transition from in
/// progress to completed, as [`Store::commit`] would make it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completed {
    /// The full key.
    pub key: String,
    /// The owner that holds it.
    pub owner: String,
    /// The acquisition's fencing token.
    pub fence: u64,
    /// How long the completed record is kept (zero: delete it).
    pub keep: Duration,
    /// The encoded result, or `None` when it is not replayable.
    pub result: Option<Vec<u8>>,
    /// The payload's fingerprint.
    pub fingerprint: Option<String>,
}

/// A commit to retry, owning what it stores (it may outlive the call).
struct PendingCommit {
    key: String,
    owner: String,
    fence: u64,
    keep: Duration,
    result: Option<Vec<u8>>,
    fingerprint: Option<String>,
}

impl Inner {
    /// Caches a completed result (when the cache is on and follows purges).
    /// `generation` is the replay cache's purge generation when the request that read or wrote
    /// the result was sent ([`Inner::cache_generation`]): a purge since keeps it out.
    fn cache_put(&self, key: &str, fingerprint: Option<&str>, result: &[u8], until: Instant, generation: u64) {
        if let Some(cache) = &self.cache {
            self.follow_purges();
            cache.put(key, fingerprint, result, until, generation);
        }
    }

    /// The replay cache's purge generation (0 without a cache), read before a request whose
    /// reply may be cached is sent.
    fn cache_generation(&self) -> u64 {
        self.cache.as_ref().map_or(0, |c| c.generation())
    }

    /// Starts following the store's purges for the replay cache, once, from a task of the
    /// current tokio runtime (without one, a later call starts it). Until it follows them the
    /// cache caches nothing.
    fn follow_purges(&self) {
        let Some(cache) = &self.cache else { return };
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        if !cache.start_following() {
            return;
        }
        let (store, followed) = (self.store.clone(), Arc::downgrade(cache));
        let handler: PurgeHandler = Arc::new(move |event| {
            let Some(cache) = followed.upgrade() else { return };
            match event {
                PurgeEvent::Forgotten(key) => cache.forget(key),
                PurgeEvent::Missed => cache.set_live(false),
                PurgeEvent::Following => cache.set_live(true),
            }
        });
        rt.spawn(async move {
            match store.follow_purges(handler).await {
                Ok(true) => {}
                Ok(false) => tracing::debug!("the store cannot tell purges: the replay cache stays off"),
                Err(e) => tracing::warn!(error = %e, "cannot follow the store's purges: the replay cache stays off"),
            }
        });
    }

    /// What a commit's outcome means for the caller: `Done` fills the replay cache (until `keep`
    /// after the first commit of this result was sent: never past the record's end, whichever
    /// attempt wrote it; unless a purge came since `generation`), a lost key or corrupt record is
    /// logged, a store error is returned.
    fn committed(
        &self,
        request: &CommitRequest<'_>,
        outcome: Result<Transition, StoreError>,
        first_sent: Instant,
        generation: u64,
    ) -> Result<bool, StoreError> {
        let key = request.key;
        match outcome? {
            Transition::Done => {
                if let Some(bytes) = request.result {
                    self.cache_put(key, request.fingerprint, bytes, first_sent + request.keep, generation);
                }
                Ok(true)
            }
            Transition::Lost => {
                tracing::warn!(key = %telemetry::logged_key(key), "idempotency result not stored: another owner holds the key");
                Ok(false)
            }
            Transition::Corrupt { reason } => {
                tracing::warn!(key = %telemetry::logged_key(key), reason = %reason, "idempotency result not stored: the key is corrupt");
                Ok(false)
            }
        }
    }

    /// Retries a failed commit with backoff until it is stored, the store refuses it, or the
    /// lease would have run out (at least three attempts).
    async fn retry_commit(
        self: Arc<Self>,
        pending: PendingCommit,
        lease_end: Instant,
        first_sent: Instant,
        generation: u64,
    ) -> Result<bool, StoreError> {
        let request = CommitRequest {
            key: &pending.key,
            owner: &pending.owner,
            fence: pending.fence,
            keep: pending.keep,
            result: pending.result.as_deref(),
            fingerprint: pending.fingerprint.as_deref(),
        };
        let until = Instant::now().max(lease_end);
        let mut backoff = Duration::from_millis(25);
        for attempt in 2u32.. {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
            match self.store.commit(request).await {
                Err(e) if e.may_succeed_later() => {
                    if attempt >= 3 && Instant::now() + backoff >= until {
                        // The body ran: its caller gets its value; a duplicate may run it again.
                        tracing::warn!(key = %telemetry::logged_key(&pending.key), error = %e, attempt, "idempotency result not stored: the store failed until the lease ran out");
                        return Ok(false);
                    }
                    tracing::debug!(key = %telemetry::logged_key(&pending.key), error = %e, attempt, "idempotency commit failed; retrying");
                }
                outcome => return self.committed(&request, outcome, first_sent, generation),
            }
        }
        unreachable!("the attempts run out before the counter does")
    }
}

/// One of the places to wait on a key ([`IdempotencyBuilder::max_waiters_per_key`]), given
/// back when dropped.
struct WaitSlot<'a> {
    inner: &'a Inner,
    key: String,
}

impl<'a> WaitSlot<'a> {
    fn take(inner: &'a Inner, key: &str) -> Option<WaitSlot<'a>> {
        let mut waiting = inner.waiting.lock().unwrap_or_else(|p| p.into_inner());
        let count = waiting.entry(key.to_owned()).or_default();
        if *count >= inner.max_waiters_per_key {
            return None;
        }
        *count += 1;
        Some(WaitSlot { inner, key: key.to_owned() })
    }
}

impl Drop for WaitSlot<'_> {
    fn drop(&mut self) {
        let mut waiting = self.inner.waiting.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = waiting.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                waiting.remove(&self.key);
            }
        }
    }
}

/// What became of a call, gathered as it runs.
#[derive(Debug)]
pub(crate) struct Track {
    /// The span shows the record key.
    key_shown: bool,
    outcome: CallOutcome,
    replayed: bool,
    fence: Option<u64>,
    waited: Duration,
    attempts: u32,
    /// The store confirmed this call's record (or the value replayed is a stored one).
    stored: bool,
}

impl Default for Track {
    fn default() -> Self {
        Track {
            key_shown: false,
            outcome: CallOutcome::Executed,
            replayed: false,
            fence: None,
            waited: Duration::ZERO,
            attempts: 0,
            stored: false,
        }
    }
}

impl Track {
    /// How many acquires were sent.
    pub(crate) fn attempts(&self) -> u32 {
        self.attempts
    }

    fn replayed(&mut self) {
        self.replayed = true;
        self.stored = true;
        self.outcome = if self.waited.is_zero() { CallOutcome::Replayed } else { CallOutcome::WaitedThenReplayed };
    }
}

/// What happened to a call that returned a value ([`Idempotency::run_with_outcome`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Outcome {
    /// Executed, replayed, or either after waiting for another holder.
    pub kind: CallOutcome,
    /// The value is a stored one: the body did not run.
    pub replayed: bool,
    /// The fencing token of this call's acquisition, when the body ran.
    pub fence: Option<u64>,
    /// How long the call waited for another holder (`OnConflict::Wait`).
    pub waited: Duration,
    /// How many times the call asked the store for the key (0: answered from the replay cache).
    pub attempts: u32,
    /// Whether the value is stored: a replayed one, or the body's own with its record confirmed
    /// by the store. `false` when the body ran but the store refused its record (its lease was
    /// lost and another caller took the key: a duplicate may run the body again) or the commit
    /// still goes on in the background past the commit deadline.
    pub stored: bool,
}

/// A call's failure: the library's, or the body's own.
pub(crate) enum Fail<E> {
    Lib(Error),
    Body(E),
}

impl<E> From<Error> for Fail<E> {
    fn from(e: Error) -> Self {
        Fail::Lib(e)
    }
}

/// Records a panicked body's outcome (the span and the counter) before the panic goes on.
fn panicked(call: &Call) {
    tracing::Span::current().record("outcome", CallOutcome::Panicked.as_str());
    telemetry::record::call(CallOutcome::Panicked, telemetry::scope_label(call.scope_str()));
}

/// A call's span: `idempotent.call` at `$level`, with the fields a call fills in as it goes.
macro_rules! call_span {
    ($level:expr, $call:expr) => {
        tracing::span!(
            $level,
            "idempotent.call",
            scope = $call.scope_str().unwrap_or(""),
            key = tracing::field::Empty,
            mode = if $call.mode == Mode::Token { "token" } else { "param" },
            outcome = tracing::field::Empty,
            fence = tracing::field::Empty,
            attempts = tracing::field::Empty,
            waited_ms = tracing::field::Empty,
        )
    };
}
use call_span;

/// Shows `key` (as [`telemetry::logged_key`] does) in the call's span, if it records anything.
fn shown_key(span: &tracing::Span, key: &str, track: &mut Track) {
    if !span.is_disabled() {
        span.record("key", tracing::field::display(telemetry::logged_key(key)));
        track.key_shown = true;
    }
}

/// A call ready for the store, or answered by the replay cache ([`Idempotency::prepare`]).
enum Prepared {
    Cached { key: String, hit: crate::cache::Cached },
    Store(Go),
}

/// What a call takes to the store.
struct Go {
    key: String,
    fingerprint: Option<String>,
    lease: Duration,
    token_expires: Option<std::time::SystemTime>,
}

/// What [`Idempotency::take`] found.
pub(crate) enum Taken {
    /// The key is held: the acquisition's fence, and when its acquire was sent.
    Held { fence: u64, sent: Instant },
    /// The key completed: what it keeps, until when it may be cached, and the replay cache's
    /// purge generation when the read was sent.
    Completed { fingerprint: Option<String>, result: Option<Vec<u8>>, kept_until: Instant, generation: u64 },
}

/// How a body ended.
enum Driven<T> {
    Finished(T),
    /// The lease was lost and the call aborts: the body was dropped.
    Lost(&'static str),
}

/// A key this call holds.
struct Held {
    /// The key, owner and fence, as the body sees them.
    context: CallContext,
    lease: Duration,
    /// When the acquire that took the key was sent.
    sent: Instant,
    fingerprint: Option<String>,
    /// Token mode: when the token expires (its record is kept at least that long).
    token_expires: Option<std::time::SystemTime>,
}

/// Releases the key unless disarmed (`store` taken); if dropped armed, which is a cancelled
/// call, or if the release fails, the store releases it in the background
/// ([`Store::abandon`]).
struct ReleaseOnDrop<'a> {
    store: Option<&'a Arc<dyn Store>>,
    context: &'a CallContext,
    lease: Duration,
}

impl ReleaseOnDrop<'_> {
    /// Has the store release the key in the background, without a word: the caller knows why.
    fn abandon(mut self) {
        if let Some(store) = self.store.take() {
            store.clone().abandon(self.context.key(), self.context.owner(), self.lease);
        }
    }

    async fn release(&mut self) {
        if let Some(store) = self.store.take() {
            let key = self.context.key();
            match store.release(key, self.context.owner()).await {
                Ok(Transition::Done) => tracing::debug!("idempotency key released"),
                Ok(other) => tracing::warn!(
                    key = %telemetry::logged_key(key),
                    outcome = ?other,
                    "idempotency release found the key not ours"
                ),
                Err(e) => {
                    tracing::warn!(
                        key = %telemetry::logged_key(key),
                        error = %e,
                        "idempotency release failed; releasing in the background"
                    );
                    store.clone().abandon(key, self.context.owner(), self.lease);
                }
            }
        }
    }
}

impl Drop for ReleaseOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(store) = self.store.take() {
            tracing::warn!(
                key = %telemetry::logged_key(self.context.key()),
                "idempotency call dropped while its body ran; releasing the key in the background"
            );
            store.clone().abandon(self.context.key(), self.context.owner(), self.lease);
        }
    }
}

/// Armed around an acquire: dropped armed (the call was dropped mid-acquire, or the acquire
/// failed and may still land), it has the store release the key for this owner
/// ([`Store::abandon`]).
struct Abandon<'a> {
    store: Option<&'a Arc<dyn Store>>,
    key: &'a str,
    owner: &'a str,
    lease: Duration,
}

impl Abandon<'_> {
    fn disarm(mut self) {
        self.store = None;
    }
}

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if let Some(store) = self.store.take() {
            tracing::warn!(
                key = %telemetry::logged_key(self.key),
                "idempotency acquire failed or dropped in flight; releasing the key in the background"
            );
            store.clone().abandon(self.key, self.owner, self.lease);
        }
    }
}

/// The full key of `key` in `scope` (`key` alone when `scope` is empty).
fn full_key(scope: &str, key: &str) -> String {
    if scope.is_empty() {
        key.to_owned()
    } else {
        format!("{scope}:{key}")
    }
}

/// Whether [`Idempotency::forget`] may delete a record in progress.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use idempotency::store::{Forgotten, RecordState};
/// use idempotency::{Call, Error, Force, Idempotency, MemoryStore};
///
/// let idem = Idempotency::new(MemoryStore::new());
/// let _: Result<u8, Error> = idem.run(Call::new("7").scope("invoices"), || async { Ok(1) }).await;
/// // After a bug fix: run invoice 7 again.
/// let forgotten = idem.forget("invoices", "7", Force::CompletedOnly).await.unwrap();
/// assert_eq!(forgotten, Forgotten::Deleted(RecordState::Completed));
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Force {
    /// Only a completed record is deleted; an in-progress one is left (`Forgotten::InProgress`).
    #[default]
    CompletedOnly,
    /// An in-progress record is deleted too: a second body may start while the first runs.
    InProgress,
}

/// Which records a [`Idempotency::scan`] returns.
///
/// ```
/// use std::time::Duration;
/// use idempotency::store::RecordState;
/// use idempotency::ScanFilter;
///
/// // Payments stuck in progress for more than ten minutes.
/// let stuck = ScanFilter::prefix("payments::").state(RecordState::InProgress).older_than(Duration::from_secs(600));
/// ```
#[derive(Debug, Clone, Default)]
pub struct ScanFilter {
    /// The start of the full keys (a scope and `:`, say); empty for every record.
    pub prefix: String,
    /// Only records in this state.
    pub state: Option<RecordState>,
    /// Only records older than this (see [`RecordView::age`](crate::store::RecordView::age));
    /// records of unknown age are left out.
    pub older_than: Option<Duration>,
    /// Only records with (`true`) or without (`false`) a fingerprint.
    pub fingerprinted: Option<bool>,
}

impl ScanFilter {
    /// Every record whose full key starts with `prefix`.
    pub fn prefix(prefix: impl Into<String>) -> Self {
        ScanFilter { prefix: prefix.into(), ..Self::default() }
    }

    /// Only records in `state`.
    pub fn state(mut self, state: RecordState) -> Self {
        self.state = Some(state);
        self
    }

    /// Only records older than `age`.
    pub fn older_than(mut self, age: Duration) -> Self {
        self.older_than = Some(age);
        self
    }

    /// Only records with (`true`) or without (`false`) a fingerprint.
    pub fn fingerprinted(mut self, present: bool) -> Self {
        self.fingerprinted = Some(present);
        self
    }

    /// Whether `record` passes, at `now`.
    pub fn matches(&self, record: &crate::store::RecordView, now: std::time::SystemTime) -> bool {
        self.state.is_none_or(|s| record.state == s)
            && self.fingerprinted.is_none_or(|f| record.fingerprint.is_some() == f)
            && self.older_than.is_none_or(|min| record.age(now).is_some_and(|age| age > min))
    }
}

/// A stored fingerprint differing from the call's: the key was reused for another payload.
fn check_fingerprint(key: &str, theirs: Option<&str>, ours: Option<&str>) -> Result<(), Error> {
    match (theirs, ours) {
        (Some(theirs), Some(ours)) if theirs != ours => Err(Error::KeyReused { key: key.to_owned() }),
        _ => Ok(()),
    }
}

/// What a call on a completed key returns.
fn replay<T: DeserializeOwned>(key: &str, policy: OnDuplicate, result: Option<&[u8]>) -> Result<T, Error> {
    match (policy, result) {
        (OnDuplicate::Replay, Some(bytes)) => {
            codec::decode(bytes).map_err(|message| Error::Codec { key: key.to_owned(), message })
        }
        (_, result) => Err(Error::Duplicate { key: key.to_owned(), replayable: result.is_some() }),
    }
}

impl std::fmt::Debug for Idempotency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency")
            .field("ttl", &self.inner.ttl)
            .field("keep", &self.inner.keep)
            .field("max_result_bytes", &self.inner.max_result_bytes)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;

    /// `run_committing`: the caller's commit writes the record (here through the store, as a
    /// database store would within the body's transaction); a failed commit releases the key and
    /// fails the call; a commit that finds the key lost fails with `LeaseLost`.
    #[tokio::test]
    async fn a_caller_commit_writes_the_record_or_fails_the_call() {
        let store = Arc::new(MemoryStore::new());
        let idem = Idempotency::builder_shared(store.clone()).build();
        let through_store = |store: Arc<MemoryStore>| {
            move |handle: &'static str, c: Completed| async move {
                assert_eq!(handle, "tx");
                let request = CommitRequest {
                    key: &c.key,
                    owner: &c.owner,
                    fence: c.fence,
                    keep: c.keep,
                    result: c.result.as_deref(),
                    fingerprint: c.fingerprint.as_deref(),
                };
                store.commit(request).await
            }
        };
        let ran: Result<u32, Error> =
            idem.run_committing(Call::new("k"), || async { Ok((7, "tx")) }, through_store(store.clone())).await;
        assert_eq!(ran.unwrap(), 7);
        let replayed: Result<u32, Error> = idem.run(Call::new("k"), || async { Ok(8) }).await;
        assert_eq!(replayed.unwrap(), 7);

        let failed: Result<u32, Error> = idem
            .run_committing(
                Call::new("f"),
                || async { Ok((1, "tx")) },
                |_, _| async { Err(StoreError::new(StoreErrorKind::Backend, "could not serialize access")) },
            )
            .await;
        assert!(matches!(failed, Err(Error::Store { .. })), "{failed:?}");
        let after: Result<u32, Error> = idem.run(Call::new("f"), || async { Ok(2) }).await;
        assert_eq!(after.unwrap(), 2, "a failed commit left the key held or stored");

        let lost: Result<u32, Error> = idem
            .run_committing(Call::new("l"), || async { Ok((1, "tx")) }, |_, _| async { Ok(Transition::Lost) })
            .await;
        assert!(matches!(lost, Err(Error::LeaseLost { .. })), "{lost:?}");
    }
}
