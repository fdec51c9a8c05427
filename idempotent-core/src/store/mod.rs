//! The `Store` trait: the per-key state machine's four transitions (plus change notification),
//! and the stores that implement it.
//!
//! A store keeps one record per key:
//!
//! ```text
//!   absent ──acquire──▶ IN_PROGRESS ──commit──▶ COMPLETED (kept for `keep`)
//!     ▲                   │   ▲ renew
//!     └──release / lease──┘   └─┘
//! ```
//!
//! (Token mode needs nothing more of a store: tokens are signed, not stored, and a token's first
//! use acquires its key like any other.)
//!
//! Every transition is atomic and checks the owner id of the attempt, and every transition is
//! safe to repeat for the same owner: a client may re-send a command whose reply was lost.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::error::StoreError;

pub(crate) mod background;
mod channels;
#[cfg(any(feature = "redis", feature = "postgres"))]
pub(crate) mod credentials;
mod expiry;
mod failures;
mod future;
pub(crate) mod join;
pub mod memory;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
mod view;
#[cfg(any(feature = "redis", feature = "postgres"))]
mod within;
#[cfg(any(feature = "redis", feature = "postgres"))]
pub(crate) use within::{within, Within};

pub use background::MAX_BACKGROUND;
pub(crate) use failures::error_text;
pub use failures::{FailRequest, Lapse, Resolution, Resolved, LAPSED, MAX_ERROR_BYTES, RESOLVED_RELEASED};
#[cfg(feature = "redis")]
pub(crate) use future::boxed_in_place;
pub use future::{BoxFuture, StoreFuture};
pub(crate) use join::{join_all, one_by_one};
pub use view::{Forgotten, Inspected, RecordState, RecordView, ScanPage};

/// What [`Store::follow_purges`] reports.
///
/// ```
/// use std::sync::Arc;
/// use idempotency::store::{PurgeEvent, PurgeHandler};
///
/// let handler: PurgeHandler = Arc::new(|event| match event {
///     PurgeEvent::Forgotten(key) => println!("drop the cached copy of {key}"),
///     PurgeEvent::Missed => println!("drop everything, cache nothing"),
///     PurgeEvent::Following => println!("cache again"),
/// });
/// # let _ = handler;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PurgeEvent<'a> {
    /// The record of this full key was forgotten (by any process): a cached copy must go.
    Forgotten(&'a str),
    /// Purges may have been missed (the connection that carries them dropped): drop every cached
    /// copy, and cache nothing until [`PurgeEvent::Following`].
    Missed,
    /// Purges are followed (again): caching may resume.
    Following,
}

/// Receives [`PurgeEvent`]s; see [`Store::follow_purges`].
pub type PurgeHandler = Arc<dyn Fn(PurgeEvent<'_>) + Send + Sync>;

fn unsupported<T>(what: &str) -> Result<T, StoreError> {
    Err(StoreError::new(crate::error::StoreErrorKind::Backend, format!("this store cannot {what}")))
}

/// What [`Store::acquire`] is asked.
#[derive(Debug, Clone, Copy)]
pub struct AcquireRequest<'a> {
    /// The full key (scope and key); the store adds its own prefix.
    pub key: &'a str,
    /// The id of this attempt.
    pub owner: &'a str,
    /// How long the lease lasts unless renewed.
    pub lease: Duration,
    /// The payload's fingerprint, stored with the record and reported back to later callers.
    pub fingerprint: Option<&'a str>,
    /// The caller will wait for the key to change: commit and release must notify watchers.
    pub will_wait: bool,
    /// Report `lease_left` and `kept_for`; a store may leave them zero otherwise (they may cost
    /// it a command more).
    pub report_ttl: bool,
    /// The caller needs the fencing token with the acquisition (a lock guard hands it out at
    /// once). Otherwise a store whose token costs a command of its own may leave it unread
    /// (`Acquired { fence: 0 }`) for [`Store::fence`] to read if the body asks for it.
    pub fence_now: bool,
    /// What the key becomes if this attempt's lease runs out without a commit or a release.
    pub lapse: Lapse,
    /// How long the record outlives its lease when it keeps the lease's end itself (a `lapse`
    /// other than `Free`, or an attempt after a failed one): the call's `keep`.
    pub keep: Duration,
}

/// What [`Store::acquire`] found.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::time::Duration;
/// use idempotency::store::{AcquireOutcome, AcquireRequest, Lapse};
/// use idempotency::{MemoryStore, Store};
///
/// let store = MemoryStore::new();
/// let request = |owner| AcquireRequest {
///     key: "k", owner, lease: Duration::from_secs(5), fingerprint: None, will_wait: false, report_ttl: true,
///     fence_now: false, lapse: Lapse::Free, keep: Duration::from_secs(60),
/// };
/// assert!(matches!(store.acquire(request("a")).await.unwrap(), AcquireOutcome::Acquired { .. }));
/// assert!(matches!(store.acquire(request("b")).await.unwrap(), AcquireOutcome::InProgress { .. }));
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// The key is now held by the requesting owner (also when it already was: a re-sent
    /// acquire). The fencing token is larger than any earlier holder's of this key, including
    /// holders whose records have expired or been released since.
    Acquired {
        /// The fencing token of this acquisition; `0` when the store left it to be read on first
        /// use ([`Store::fence`]), which it may unless the request asked for it
        /// (`fence_now`).
        fence: u64,
        /// Which attempt of the key this is: 1, or one more than the failed attempts its record
        /// counts (see [`Store::fail`]).
        attempt: u32,
    },
    /// Another owner holds the key.
    InProgress {
        /// The fingerprint the holder stored.
        fingerprint: Option<String>,
        /// How long until the holder's lease runs out, unless renewed (zero unless asked for
        /// with `report_ttl`).
        lease_left: Duration,
    },
    /// The key has completed.
    Completed {
        /// The fingerprint stored with the result.
        fingerprint: Option<String>,
        /// The stored result, or `None` when it is not replayable.
        result: Option<Vec<u8>>,
        /// How much longer the record is kept (zero if unknown or not asked for with
        /// `report_ttl`); bounds how long a copy of the result may be cached.
        kept_for: Duration,
    },
    /// The key gave up: its body failed as many times as its policy allows
    /// ([`FailRequest::give_up`]).
    GaveUp {
        /// The fingerprint kept with it.
        fingerprint: Option<String>,
        /// How many attempts failed.
        attempts: u32,
        /// The last one's error.
        last_error: String,
    },
    /// The key's holder stopped without a commit or a release under [`Lapse::Hold`]: its outcome
    /// is unknown until it is resolved ([`Store::resolve`]).
    Unknown {
        /// The fingerprint the holder stored.
        fingerprint: Option<String>,
        /// The owner id of the attempt that held it.
        owner: String,
        /// When its lease ended, unix ms by the store's clock.
        lease_ended_ms: u64,
        /// Which attempt it was.
        attempt: u32,
    },
    /// The key holds something that is not an idempotency record.
    Corrupt {
        /// What was found.
        reason: String,
    },
}

impl AcquireOutcome {
    /// The outcome's name in log lines.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            AcquireOutcome::Acquired { .. } => "acquired",
            AcquireOutcome::InProgress { .. } => "in_progress",
            AcquireOutcome::Completed { .. } => "completed",
            AcquireOutcome::GaveUp { .. } => "gave_up",
            AcquireOutcome::Unknown { .. } => "unknown",
            AcquireOutcome::Corrupt { .. } => "corrupt",
        }
    }
}

/// What [`Store::commit`] is asked.
#[derive(Debug, Clone, Copy)]
pub struct CommitRequest<'a> {
    /// The full key.
    pub key: &'a str,
    /// The owner that acquired it.
    pub owner: &'a str,
    /// The fencing token the acquisition got.
    pub fence: u64,
    /// How long the completed record is kept; zero deletes it at once (mutex use).
    pub keep: Duration,
    /// The encoded result, or `None` when it is not replayable.
    pub result: Option<&'a [u8]>,
    /// The payload's fingerprint.
    pub fingerprint: Option<&'a str>,
    /// The acquire wrote a record that keeps its lease's end (a `lapse` other than
    /// [`Lapse::Free`], or an attempt after a failed one): a store that compares the record it
    /// expects whole (Redis's `SET ... IFEQ`) skips the compare, which could not match.
    pub lease_in_record: bool,
}

/// The completed record a successful body leaves, for a store that writes it together with the
/// body's own effects (`Idempotency::run_committing`): the owner-checked transition from in
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

/// What a commit or release found.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use idempotency::store::Transition;
/// use idempotency::{MemoryStore, Store};
///
/// let store = MemoryStore::new();
/// // Releasing a key nobody holds is done already; releasing twice is done twice.
/// assert_eq!(store.release("k", "me").await.unwrap(), Transition::Done);
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    /// Done (also when it had been done already by the same owner).
    Done,
    /// Another owner holds or completed the key: nothing was changed.
    Lost,
    /// The key holds something that is not an idempotency record: nothing was changed.
    Corrupt {
        /// What was found.
        reason: String,
    },
}

/// One lease to renew: [`Store::renew`] takes many at once.
#[derive(Debug, Clone, Copy)]
pub struct Lease<'a> {
    /// The full key.
    pub key: &'a str,
    /// The owner that holds it.
    pub owner: &'a str,
    /// The new lease, counted from now.
    pub lease: Duration,
}

/// A storage backend for the per-key state machine.
///
/// Implement it to keep records somewhere other than [`MemoryStore`](memory::MemoryStore) or
/// [`RedisStore`](redis::RedisStore). Each method is one atomic transition of one key's record
/// and must check the owner id where it says so; each must give the same answer when repeated
/// by the same owner (a client may re-send a command whose reply was lost), and none may wait
/// unboundedly: return a [`StoreError`] of kind `Timeout` instead.
///
/// Each method returns a [`StoreFuture`]: `StoreFuture::ready(answer)` when the store has the
/// answer at once (no allocation), `StoreFuture::new(async move { .. })` when it must wait.
///
/// A store that counts the renewals of another, as a wrapper (the operator methods, `abandon`
/// and `call_timeout` have defaults):
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::time::Duration;
/// use idempotency::store::{
///     AcquireOutcome, AcquireRequest, CommitRequest, Lease, StoreFuture, Transition, Watcher,
/// };
/// use idempotency::{Idempotency, MemoryStore, Store, StoreError};
///
/// struct Counting { inner: MemoryStore, renewals: AtomicUsize }
///
/// impl Store for Counting {
///     fn acquire<'a>(&'a self, r: AcquireRequest<'a>) -> StoreFuture<'a, Result<AcquireOutcome, StoreError>> {
///         self.inner.acquire(r)
///     }
///     fn renew<'a>(&'a self, leases: &'a [Lease<'a>]) -> StoreFuture<'a, Result<Vec<bool>, StoreError>> {
///         self.renewals.fetch_add(1, Ordering::Relaxed);
///         // A store that must wait boxes its future instead: StoreFuture::new(async move { .. }).
///         self.inner.renew(leases)
///     }
///     fn commit<'a>(&'a self, r: CommitRequest<'a>) -> StoreFuture<'a, Result<Transition, StoreError>> {
///         self.inner.commit(r)
///     }
///     fn release<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, Result<Transition, StoreError>> {
///         self.inner.release(key, owner)
///     }
///     fn watch<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<Watcher, StoreError>> {
///         self.inner.watch(key)
///     }
/// }
///
/// let idem = Idempotency::new(Counting { inner: MemoryStore::new(), renewals: AtomicUsize::new(0) });
/// ```
pub trait Store: Send + Sync + 'static {
    /// Absent → IN_PROGRESS held by `owner` with a lease. IN_PROGRESS already held by `owner` (a re-sent acquire) → `Acquired` with a fencing token
    /// as good as the first: the same one, or one stamped later while `owner` holds the key.
    /// Anything else is reported as found, unchanged (except that `will_wait` marks the record
    /// as watched).
    ///
    /// The fencing token must be larger than that of every earlier acquisition of the key, also
    /// one whose record has since gone: stamp it with a clock the store owns (Redis `TIME`, a
    /// database sequence), never a client's.
    ///
    /// A store that keeps attempts ([`keeps_attempts`](Self::keeps_attempts)) also takes a
    /// RELEASED record (the attempt after its count), and an IN_PROGRESS one whose lease's end it
    /// keeps and which has passed by its clock under `Lapse::Free` or `Lapse::Count` (the attempt
    /// after it: that attempt counted); it reports one under `Lapse::Hold` as `Unknown`, and a
    /// FAILED record as `GaveUp`. The record it writes keeps its lease's end, and outlives it by
    /// `keep`, when `lapse` is not `Free` or the attempt is not the first.
    fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> StoreFuture<'a, Result<AcquireOutcome, StoreError>>;

    /// The fencing token of `owner`'s hold on `key`, for a store that left it unread at the
    /// acquisition (`Acquired { fence: 0 }`): `Some` while `owner` holds the key in progress,
    /// larger than every earlier holder's (a holder that reads it later than its acquisition
    /// still reads it while it holds the key, so before any later holder could acquire);
    /// `None` when `owner` no longer holds it (its lease ran out). Asked at most once per
    /// acquisition. The default says the store cannot: a store that always stamps the token at
    /// the acquisition needs nothing more.
    fn fence<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, Result<Option<u64>, StoreError>> {
        let _ = (key, owner);
        StoreFuture::ready(unsupported("read a fencing token after the acquisition"))
    }

    /// Extends each lease whose owner still holds the key; returns, per lease, whether it did.
    fn renew<'a>(&'a self, leases: &'a [Lease<'a>]) -> StoreFuture<'a, Result<Vec<bool>, StoreError>>;

    /// IN_PROGRESS held by `owner` → COMPLETED with the result, kept for `keep` (deleted when
    /// zero). When the key is absent (the lease ran out and nobody took it) the result is
    /// recorded anyway. COMPLETED by this owner already (a repeated commit) → `Done`. Held by
    /// another owner, or completed by another acquisition → `Lost`. Notifies watchers. `fence` is
    /// `0` when the store left it unread and the body never read it: a store that gives every
    /// acquisition a token of its own at once may tell a repeated commit by its fence; one that
    /// leaves tokens unread must by the owner.
    fn commit<'a>(&'a self, request: CommitRequest<'a>) -> StoreFuture<'a, Result<Transition, StoreError>>;

    /// IN_PROGRESS held by `owner` → absent (a record that counts attempts: RELEASED with the
    /// attempts before this one, which is not counted). Absent → `Done`. Held or completed by
    /// another owner → `Lost`. Notifies watchers.
    fn release<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, Result<Transition, StoreError>>;

    /// Many acquires at once, for a batch (`Idempotency::claim`): per request, in order, what
    /// [`acquire`](Self::acquire) would answer it, or the error of the command that carried it.
    /// A store that can send them together should (Redis: one script call per hash slot); the
    /// default sends them one after the other. An error says nothing of whether that request's
    /// key was taken: the caller abandons it ([`abandon`](Self::abandon)).
    fn acquire_many<'a>(
        &'a self,
        requests: &'a [AcquireRequest<'a>],
    ) -> StoreFuture<'a, Vec<Result<AcquireOutcome, StoreError>>> {
        StoreFuture::new(one_by_one(requests, |request| self.acquire(request)))
    }

    /// Many commits at once, for a batch: per request, in order, what [`commit`](Self::commit)
    /// would answer it. The default sends them one after the other.
    fn commit_many<'a>(
        &'a self,
        requests: &'a [CommitRequest<'a>],
    ) -> StoreFuture<'a, Vec<Result<Transition, StoreError>>> {
        StoreFuture::new(one_by_one(requests, |request| self.commit(request)))
    }

    /// Many releases at once (key and owner each), for a batch: per release, in order, what
    /// [`release`](Self::release) would answer it. The default sends them one after the other.
    fn release_many<'a>(
        &'a self,
        releases: &'a [(&'a str, &'a str)],
    ) -> StoreFuture<'a, Vec<Result<Transition, StoreError>>> {
        StoreFuture::new(one_by_one(releases, |(key, owner)| self.release(key, owner)))
    }

    /// Whether the store keeps attempts: records that keep their lease's end ([`Lapse`]), the
    /// count of failed attempts ([`fail`](Self::fail)), keys given up, and unknown outcomes
    /// resolved ([`resolve`](Self::resolve)). The default says no: the runtime then refuses the
    /// calls that need it (`on_crash = hold`, `give_up_after`) with `Error::InvalidCall`, and
    /// releases a failed attempt ([`release`](Self::release)) without counting it.
    fn keeps_attempts(&self) -> bool {
        false
    }

    /// `owner`'s attempt failed: IN_PROGRESS held by `owner` (its lease run out or not), or
    /// absent → RELEASED, counting `attempt` with its error, kept for `keep` (the next acquire
    /// takes it as attempt `attempt + 1`); with `give_up`, FAILED instead (every acquire reports
    /// `GaveUp`). `keep` zero: the key is released and nothing is kept. The same owner's record
    /// already written (a repeated command) → `Done`; another owner's record → `Lost`. Notifies
    /// watchers. The default releases the key (a store that does not keep attempts).
    fn fail<'a>(&'a self, request: FailRequest<'a>) -> StoreFuture<'a, Result<Transition, StoreError>> {
        self.release(request.key, request.owner)
    }

    /// Many failures at once, for a batch: per request, in order, what [`fail`](Self::fail)
    /// would answer it. The default sends them one after the other.
    fn fail_many<'a>(
        &'a self,
        requests: &'a [FailRequest<'a>],
    ) -> StoreFuture<'a, Vec<Result<Transition, StoreError>>> {
        StoreFuture::new(one_by_one(requests, |request| self.fail(request)))
    }

    /// Resolves an UNKNOWN record (its holder's lease ended under `Lapse::Hold`), when `holder`
    /// is `None` or the owner that held it: COMPLETED with the given result, or RELEASED with its
    /// attempt counted, kept for the `keep` the holder's acquire gave. Anything else is reported
    /// as found, unchanged. Notifies watchers. The default says the store cannot.
    fn resolve<'a>(
        &'a self,
        key: &'a str,
        holder: Option<&'a str>,
        resolution: Resolution<'a>,
    ) -> StoreFuture<'a, Result<Resolved, StoreError>> {
        let _ = (key, holder, resolution);
        StoreFuture::ready(unsupported("resolve unknown outcomes"))
    }

    /// A watcher woken when the key's record is committed or released. It must be in place
    /// before this returns, so that a change made after `watch` returns wakes it.
    fn watch<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<Watcher, StoreError>>;

    /// The caller gave up on `owner`'s attempt at `key` without knowing whether the store holds
    /// it: an acquire that failed or timed out (it may still land later: a client re-sends
    /// queued commands after a reconnect), a call dropped while its acquire or its body was in
    /// flight. The store makes sure that nothing stays held for that owner: it releases the key,
    /// owner-checked, in the background, after anything already sent for that owner has landed,
    /// and without depending on what a timed-out call left half done (a script cache emptied by
    /// a restart, say). `lease` bounds how long this needs to keep trying: past it, a record the
    /// owner took has expired by itself.
    ///
    /// The default releases once, from a task on the current tokio runtime.
    fn abandon(self: Arc<Self>, key: &str, owner: &str, lease: Duration) {
        let _ = lease;
        let (key, owner) = (key.to_owned(), owner.to_owned());
        let Some(slot) = background::slot("release") else { return };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _slot = slot;
                if let Err(e) = self.release(&key, &owner).await {
                    tracing::warn!(error = %e, "idempotency release after an abandoned call failed; the key is held until its lease ends");
                }
            });
        }
    }

    /// Reads `key`'s record whole, for operators (`Idempotency::inspect`, the CLI). The default
    /// says the store cannot.
    fn inspect<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<Inspected, StoreError>> {
        let _ = key;
        StoreFuture::ready(unsupported("inspect records"))
    }

    /// Deletes `key`'s record for an operator: a completed one, or an in-progress one when
    /// `force` is set (a second body may then start while the first runs). Wakes the key's
    /// waiters, and tells every process following purges ([`follow_purges`](Self::follow_purges))
    /// to drop its cached copy. The default says the store cannot.
    fn forget<'a>(&'a self, key: &'a str, force: bool) -> StoreFuture<'a, Result<Forgotten, StoreError>> {
        let _ = (key, force);
        StoreFuture::ready(unsupported("forget records"))
    }

    /// One page of the records whose full keys start with `prefix`, from `cursor` (`None`: the
    /// first page), about `count` keys examined; without blocking the store (Redis: `SCAN`, on
    /// every primary of a cluster). The default says the store cannot.
    fn scan<'a>(
        &'a self,
        prefix: &'a str,
        cursor: Option<&'a str>,
        count: usize,
    ) -> StoreFuture<'a, Result<ScanPage, StoreError>> {
        let _ = (prefix, cursor, count);
        StoreFuture::ready(unsupported("scan records"))
    }

    /// Calls `handler` with every key forgotten from now on, by any process, and when purges may
    /// have been missed or are followed again; `Ok(true)` once purges are followed, `Ok(false)`
    /// when the store cannot tell (the default). A replay cache follows them: it caches only
    /// while purges are followed.
    fn follow_purges(&self, handler: PurgeHandler) -> StoreFuture<'_, Result<bool, StoreError>> {
        let _ = handler;
        StoreFuture::ready(Ok(false))
    }

    /// The secrets that sign tokens for every runtime on this store, the current one first, then
    /// the previous ones still accepted: read when the store connected (the first process to
    /// connect creates the current one), so that the runtimes of a fleet on one store accept
    /// each other's tokens with no configuration and no store command per token. Empty when the
    /// store keeps none (the default): a runtime then signs with a key of its own, good for one
    /// process. Keys given to the runtime (`IdempotencyBuilder::token_keys`) win.
    fn token_secrets(&self) -> Vec<Vec<u8>> {
        Vec::new()
    }

    /// The bound on one call of this store (a network round trip and the server's work), when
    /// it has one: the runtime waits for a commit a small multiple of it before answering the
    /// caller (see `IdempotencyBuilder::commit_deadline`).
    fn call_timeout(&self) -> Option<Duration> {
        None
    }
}

/// Wakes a waiting caller when a key it watches changes; see [`Store::watch`].
///
/// A store builds one from the receiving end of a [`tokio::sync::watch`] channel whose sender it
/// bumps on every change of the key, plus an optional guard dropped with the watcher (to
/// unsubscribe, for example).
pub struct Watcher {
    rx: watch::Receiver<u64>,
    _guard: Option<Box<dyn Any + Send + Sync>>,
}

impl Watcher {
    /// A watcher on `rx`; changes already seen by `rx` do not wake it.
    pub fn new(rx: watch::Receiver<u64>) -> Self {
        Watcher { rx, _guard: None }
    }

    /// Keeps `guard` alive as long as the watcher.
    pub fn with_guard(mut self, guard: impl Any + Send + Sync) -> Self {
        self._guard = Some(Box::new(guard));
        self
    }

    /// Waits for the next change. If the store side went away, it never returns: callers
    /// always bound it with a timer.
    pub async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher").finish_non_exhaustive()
    }
}
