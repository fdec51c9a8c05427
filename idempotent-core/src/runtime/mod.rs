//! `Idempotency`: the runtime. Takes a key, decides from the record found whether the body runs,
//! runs it under a renewed lease, and commits or releases the key after it.
//!
//! Its rooms, in the order a call goes through them:
//! - `builder`: the settings (`IdempotencyBuilder`), from code or the environment;
//! - `tokens`: token mode, a call's token checked before anything else;
//! - `pipeline`: a call from its key to its answer (`Outcome`): the span and metrics, the replay
//!   cache asked, the body run under the lease;
//! - `waiting`: taking the key, and waiting for it; `turns`: the callers of the process that
//!   wait for one lock, in line;
//! - `commit`: storing the result; `replay`: the replay cache filled and kept in step with
//!   purges; `releasing`: what a call that does not complete leaves (a release, a failure
//!   counted, a key held); `resolving`: unknown outcomes resolved; `kept_errors` and
//!   `giving_up`: the `on_error` policies;
//! - `operations`: the operator's API (inspect, forget, scan);
//! - `batch`: many calls' keys claimed, run and committed together (`claim`), and `settled`,
//!   what became of each item and what a queue consumer does with it.
//!
//! Lock guards (`crate::lock`) build on the same pieces.

mod batch;
mod batch_committing;
mod builder;
mod commit;
mod giving_up;
mod kept_errors;
mod operations;
mod pipeline;
mod releasing;
mod replay;
mod resolving;
mod settled;
mod state;
mod tokens;
mod turns;
mod waiting;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::context::CallContext;
use crate::error::Error;
use crate::store::{Store, Transition};
use crate::token::TokenKeys;

use crate::cache::ReplayCache;
use crate::watchdog::{Registration, Watchdog};

pub use crate::store::Completed;
pub use batch::Batch;
pub use builder::{IdempotencyBuilder, RUNTIME_ENV_VARS};
pub use operations::{Force, ScanFilter};
pub use pipeline::Outcome;
pub use resolving::{Resolve, Unresolved, DEFAULT_RESOLVER_TIMEOUT};
pub use settled::{Ack, AckPlan, Settled};
pub(crate) use state::Track;
use tokens::TokenClock;
pub(crate) use turns::{NoTurn, Turn};
pub(crate) use waiting::{Taken, Taking};

/// The default lease.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
/// How long a completed result is kept by default.
pub const DEFAULT_KEEP: Duration = Duration::from_secs(24 * 3600);
/// How far apart the clocks of machines that issue and check tokens may be by default
/// (`IdempotencyBuilder::token_skew`): a used token's record is kept this long past the token.
pub const DEFAULT_TOKEN_SKEW: Duration = Duration::from_secs(300);
/// How many calls of one process may wait on one key at a time by default (`OnConflict::Wait`).
pub const DEFAULT_MAX_WAITERS_PER_KEY: usize = 1000;

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
    pub(super) store: Arc<dyn Store>,
    pub(super) watchdog: Watchdog,
    pub(super) cache: Option<Arc<ReplayCache>>,
    pub(super) ttl: Duration,
    pub(super) keep: Duration,
    pub(super) max_result_bytes: usize,
    pub(super) wait_recheck: Duration,
    /// How long a caller waits for its result to be stored before it gets its value anyway.
    pub(super) commit_deadline: Duration,
    /// The keys that sign and verify tokens.
    pub(super) token_keys: TokenKeys,
    /// Callers of this process waiting on each key, and how many may.
    pub(super) waiting: std::sync::Mutex<std::collections::HashMap<String, usize>>,
    pub(super) max_waiters_per_key: usize,
    /// The callers of this process waiting for each lock, in line.
    pub(super) turns: Arc<turns::Turns>,
    /// How far apart the clocks of the machines issuing and checking tokens may be.
    pub(super) token_skew: Duration,
    /// The time tokens are issued and checked by.
    pub(super) token_clock: TokenClock,
    /// Asked about unknown outcomes (`on_crash = hold`).
    pub(super) resolver: Option<resolving::Resolver>,
    pub(super) resolver_timeout: Duration,
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
                turns: Default::default(),
                token_skew: DEFAULT_TOKEN_SKEW,
                token_clock: TokenClock::new(),
                resolver: None,
                resolver_timeout: DEFAULT_RESOLVER_TIMEOUT,
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

    /// `key`'s turn among the callers of this runtime that wait for the lock (see `turns`), by
    /// `deadline` at the latest, unless `max_waiters_per_key` hold or wait for it already.
    pub(crate) async fn lock_turn(&self, key: &str, deadline: Instant) -> Result<Turn, NoTurn> {
        self.inner.turns.wait(key, deadline, self.inner.max_waiters_per_key).await
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

    /// Whether `self` and `other` are the same runtime (clones of one).
    #[cfg(feature = "testing")]
    pub(crate) fn same_runtime(&self, other: &Idempotency) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// How long a call's lease lasts unless the call sets its own (`IdempotencyBuilder::default_ttl`).
    pub fn default_ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// How long a completed result is kept for replay unless the call sets its own
    /// (`IdempotencyBuilder::default_keep`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotent_core::{Idempotency, MemoryStore};
    ///
    /// let idem = Idempotency::builder(MemoryStore::new()).default_keep(Duration::from_secs(3600)).build();
    /// assert_eq!(idem.default_keep(), Duration::from_secs(3600));
    /// ```
    pub fn default_keep(&self) -> Duration {
        self.inner.keep
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
    use crate::call::Call;
    use crate::error::{StoreError, StoreErrorKind};
    use crate::store::memory::MemoryStore;
    use crate::store::{CommitRequest, Transition};

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
                    lease_in_record: false,
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
