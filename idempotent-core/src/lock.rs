//! `LockGuard`: a distributed lock for a critical section inside a function, on the same state
//! machine as a guarded call (a key held under a lease the watchdog renews, a fencing token, loss
//! detected locally and by the store), released when the guard goes.

use std::time::Duration;

use tokio::time::Instant;

use crate::call::OnConflict;
use crate::context::CallContext;
use crate::error::Error;
use crate::ids;
use crate::runtime::{Idempotency, Taken, Track};
use crate::telemetry::logged_key;
use crate::watchdog::Registration;

/// The scope of locks' keys unless one is given: apart from guarded calls' keys.
pub const LOCK_SCOPE: &str = "lock";

/// A lock to take: see [`Idempotency::lock`].
#[derive(Debug)]
#[must_use = "a lock request does nothing until `acquire` or `wait`"]
pub struct LockRequest<'a> {
    idem: &'a Idempotency,
    key: String,
    scope: String,
    ttl: Option<Duration>,
}

impl<'a> LockRequest<'a> {
    pub(crate) fn new(idem: &'a Idempotency, key: String) -> Self {
        LockRequest { idem, key, scope: LOCK_SCOPE.to_owned(), ttl: None }
    }

    /// The key space (default `lock`): two locks with the same key and scope exclude each
    /// other, whichever process or function takes them.
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.scope = scope.into();
        self
    }

    /// The lease (default: the runtime's, 30 s): how long the lock outlives a holder that
    /// crashed. The watchdog renews it while the guard lives, so a critical section may take
    /// longer.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Takes the lock if it is free; [`Error::Conflict`] if another holder has it (try-lock).
    pub async fn acquire(self) -> Result<LockGuard, Error> {
        self.take(OnConflict::Reject).await
    }

    /// Takes the lock, waiting up to `patience` for its holder to let it go (woken when it
    /// does); [`Error::Timeout`] if it is still held then.
    pub async fn wait(self, patience: Duration) -> Result<LockGuard, Error> {
        self.take(OnConflict::Wait(patience)).await
    }

    async fn take(self, on_conflict: OnConflict) -> Result<LockGuard, Error> {
        let key = format!("{}:{}", self.scope, self.key);
        let lease = self.ttl.unwrap_or_else(|| self.idem.default_ttl());
        crate::call::check_lock_key(&key, &self.key, lease)?;
        if let OnConflict::Wait(patience) = on_conflict {
            crate::call::check_patience(&key, patience)?;
        }
        let owner = ids::owner_id();
        let mut track = Track::default();
        match self.idem.take(&key, owner, lease, None, on_conflict, &mut track).await? {
            Taken::Held { fence, sent } => {
                tracing::debug!(key = %logged_key(&key), fence, "idempotency lock taken");
                let context = CallContext::new(key, owner, fence, track.attempts());
                let registration = self.idem.watch_lease(lease, sent, context.clone());
                Ok(LockGuard { idem: self.idem.clone(), context, lease, registration: Some(registration) })
            }
            // A completed record under the lock's key: a guarded call's, with the same scope
            // and key. The lock is not free.
            Taken::Completed { .. } => Err(Error::Conflict { key, retry_after: None }),
        }
    }
}

/// A held lock: renewed by the watchdog while it lives, released (owner-checked) when dropped or
/// [`release`](Self::release)d. Its [`fence`](Self::fence) grows with every holder of the key:
/// hand it to the resource the lock protects, which rejects a smaller one.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idempotency::Error> {
/// use std::time::Duration;
/// use idempotency::{Idempotency, MemoryStore};
///
/// let idem = Idempotency::new(MemoryStore::new());
/// let guard = idem.lock("invoice-run").ttl(Duration::from_secs(10)).acquire().await?;
/// assert!(idem.lock("invoice-run").acquire().await.is_err()); // held
/// let fence = guard.fence(); // for writes downstream
/// guard.release().await?;
/// let again = idem.lock("invoice-run").acquire().await?;
/// assert!(again.fence() > fence);
/// # Ok(()) }
/// ```
pub struct LockGuard {
    idem: Idempotency,
    context: CallContext,
    lease: Duration,
    registration: Option<Registration>,
}

impl LockGuard {
    /// The lock's full key (scope and key).
    pub fn key(&self) -> &str {
        self.context.key()
    }

    /// The fencing token of this acquisition: larger than that of every earlier holder.
    pub fn fence(&self) -> u64 {
        self.context.fence()
    }

    /// Whether the lock is known lost (its lease ran out without a confirmed renewal, or the
    /// store says another holder has it): the critical section is no longer exclusive.
    pub fn is_lost(&self) -> bool {
        self.context.is_lease_lost()
    }

    /// Resolves once the lock is known lost, with what showed it; `select!` it against the
    /// critical section to stop at once.
    pub async fn lost(&self) -> &'static str {
        self.context.lost().await
    }

    /// Releases the lock now, owner-checked: `Ok` once the store let it go (or it was already
    /// gone), [`Error::LeaseLost`] if another holder has it meanwhile.
    pub async fn release(mut self) -> Result<(), Error> {
        self.registration.take();
        let started = Instant::now();
        let outcome = self.idem.release_key(self.context.key(), self.context.owner(), self.lease).await;
        tracing::debug!(key = %logged_key(self.context.key()), took = ?started.elapsed(), "lock released");
        outcome
    }
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.key())
            .field("fence", &self.fence())
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.registration.take().is_some() {
            // Not released by hand: released in the background, owner-checked.
            self.idem.release_in_background(self.context.key(), self.context.owner(), self.lease);
        }
    }
}

impl Idempotency {
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
}
