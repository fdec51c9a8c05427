//! `LockGuard`: a distributed lock for a critical section inside a function, on the same state
//! machine as a guarded call (a key held under a lease the watchdog renews, a fencing token, loss
//! detected locally and by the store), released when the guard goes.

use std::time::Duration;

use tokio::time::Instant;

use crate::call::OnConflict;
use crate::context::CallContext;
use crate::error::Error;
use crate::ids;
use crate::runtime::{Idempotency, NoTurn, Taken, Taking, Track, Turn};
use crate::store::Lapse;
use crate::telemetry::{self, logged_key, LockOutcome};
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

    /// Takes the lock if it is free; [`Error::Locked`] if another holder has it (try-lock).
    pub async fn acquire(self) -> Result<LockGuard, Error> {
        self.take(OnConflict::Reject).await
    }

    /// Takes the lock, waiting up to `patience` for its holder to let it go (woken when it
    /// does); [`Error::Locked`] (with how long it waited) if it is still held then.
    pub async fn wait(self, patience: Duration) -> Result<LockGuard, Error> {
        self.take(OnConflict::Wait(patience)).await
    }

    /// Takes the lock inside its span (`idempotent.lock`), its outcome recorded there and in
    /// `idempotency_locks_total`.
    async fn take(self, on_conflict: OnConflict) -> Result<LockGuard, Error> {
        let span = tracing::info_span!(
            "idempotent.lock",
            scope = %self.scope,
            key = tracing::field::Empty,
            outcome = tracing::field::Empty,
            fence = tracing::field::Empty,
            attempts = tracing::field::Empty,
            waited_ms = tracing::field::Empty,
        );
        let scope = telemetry::scope_label(Some(&self.scope)).to_owned();
        let mut track = Track::default();
        let mut queued = Duration::ZERO;
        let taken =
            tracing::Instrument::instrument(self.take_in(on_conflict, &span, &mut track, &mut queued), span.clone())
                .await;
        let waited = queued + track.waited();
        let outcome = match &taken {
            Ok(_) if !waited.is_zero() => LockOutcome::WaitedThenTaken,
            Ok(_) => LockOutcome::Taken,
            Err(e) => LockOutcome::of_error(e),
        };
        if !span.is_disabled() {
            span.record("outcome", outcome.as_str());
            if let Ok(guard) = &taken {
                span.record("fence", guard.fence());
            }
            span.record("attempts", track.attempts());
            span.record("waited_ms", waited.as_millis() as u64);
        }
        telemetry::record::lock(outcome, &scope);
        taken
    }

    /// Takes the lock. A caller that waits first waits for its turn among this runtime's
    /// callers waiting for the same lock (`queued`: how long), without a store command, and keeps
    /// the turn in its guard until it lets the lock go: the next in line then finds it free.
    async fn take_in(
        self,
        on_conflict: OnConflict,
        span: &tracing::Span,
        track: &mut Track,
        queued: &mut Duration,
    ) -> Result<LockGuard, Error> {
        let key = format!("{}:{}", self.scope, self.key);
        if !span.is_disabled() {
            span.record("key", tracing::field::display(logged_key(&key)));
        }
        let lease = self.ttl.unwrap_or_else(|| self.idem.default_ttl());
        crate::call::check_lock_key(&key, &self.key, lease)?;
        let (on_conflict, turn) = match on_conflict {
            OnConflict::Wait(patience) => {
                crate::call::check_patience(&key, patience)?;
                let asked = Instant::now();
                let turn = match self.idem.lock_turn(&key, asked + patience).await {
                    Ok(turn) => turn,
                    Err(NoTurn::Full) => {
                        tracing::warn!(
                            key = %logged_key(&key),
                            "idempotency lock not waited for: too many callers already wait for it"
                        );
                        return Err(Error::Locked { key, waited: None });
                    }
                    Err(NoTurn::Late) => {
                        *queued = asked.elapsed();
                        return Err(Error::Locked { key, waited: Some(*queued) });
                    }
                };
                if turn.queued {
                    *queued = asked.elapsed();
                }
                // What is left of the patience (at least a moment: a look at the store).
                let left = patience.saturating_sub(*queued).max(Duration::from_millis(1));
                (OnConflict::Wait(left), Some(turn))
            }
            reject => (reject, None),
        };
        let owner = ids::owner_id();
        let before = *queued;
        // A guard hands its fence out at once: taken with the acquisition (one round trip).
        let how = Taking { on_conflict, fence_now: true, lapse: Lapse::Free, keep: Duration::ZERO };
        let taken = self.idem.take(&key, owner, lease, None, how, track).await.map_err(|e| match e {
            // A lock is not a guarded call: no result comes of its holder.
            Error::Conflict { key, .. } => Error::Locked { key, waited: None },
            Error::Timeout { key, waited } => Error::Locked { key, waited: Some(before + waited) },
            other => other,
        })?;
        match taken {
            Taken::Held { fence, sent, attempt } => {
                tracing::debug!(key = %logged_key(&key), fence, "idempotency lock taken");
                let context = CallContext::new(key, owner, fence, attempt, self.idem.store().clone());
                // A store that left it unread anyway (`fence_now` is a wish): read it now.
                if let Err(e) = context.fence().await {
                    self.idem.store().clone().abandon(context.key(), context.owner(), lease);
                    return Err(e);
                }
                let registration = self.idem.watch_lease(lease, sent, context.clone());
                Ok(LockGuard { idem: self.idem.clone(), context, lease, registration: Some(registration), turn })
            }
            // A completed record under the lock's key: a guarded call's, with the same scope
            // and key. The lock is not free.
            Taken::Completed { .. } => Err(Error::Locked { key, waited: None }),
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
    /// The lock's turn among this runtime's waiters (taken with `wait`): handed on once the lock
    /// is let go.
    turn: Option<Turn>,
}

impl LockGuard {
    /// The lock's full key (scope and key).
    pub fn key(&self) -> &str {
        self.context.key()
    }

    /// The fencing token of this acquisition: larger than that of every earlier holder.
    pub fn fence(&self) -> u64 {
        // Known since the guard was made: taken with the acquisition, or read before `take`
        // returned the guard.
        self.context.fence_read().unwrap_or(0)
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
        if self.registration.take().is_none() {
            return;
        }
        // Not released by hand: released in the background, owner-checked. With callers of this
        // runtime in line for the lock, the next gets its turn once the release has landed, so
        // that it finds the lock free.
        let turn = self.turn.take();
        let (key, owner, lease) = (self.context.key().to_owned(), self.context.owner().to_owned(), self.lease);
        if let (Some(turn), Ok(rt)) = (turn, tokio::runtime::Handle::try_current()) {
            if let Some(slot) = crate::store::background::slot("release") {
                let idem = self.idem.clone();
                rt.spawn(async move {
                    let _slot = slot;
                    // On a store error `release_key` has the store go on in the background.
                    let _ = idem.release_key(&key, &owner, lease).await;
                    drop(turn);
                });
                return;
            }
        }
        self.idem.release_in_background(&key, &owner, lease);
    }
}

impl Idempotency {
    /// A distributed lock on `key` (in the scope `lock` unless [`scope`](LockRequest::scope)
    /// says otherwise), for a critical section inside a function: renewed by the watchdog while
    /// held, with a fencing token and loss detection, released when its guard goes.
    /// [`acquire`](LockRequest::acquire) takes it or fails with [`Error::Locked`];
    /// [`wait`](LockRequest::wait) waits for it. See [`LockGuard`].
    pub fn lock(&self, key: impl Into<String>) -> LockRequest<'_> {
        LockRequest::new(self, key.into())
    }

    /// Takes the lock on `key` if it is free ([`Error::Locked`] otherwise), with the default
    /// lease: `lock(key).acquire()`.
    pub async fn try_lock(&self, key: impl Into<String>) -> Result<LockGuard, Error> {
        self.lock(key).acquire().await
    }

    /// Takes the lock on `key`, waiting up to `patience` for it: `lock(key).wait(patience)`.
    pub async fn lock_wait(&self, key: impl Into<String>, patience: Duration) -> Result<LockGuard, Error> {
        self.lock(key).wait(patience).await
    }
}
