//! Storing a result: the store's commit, retried until the commit deadline and then in the
//! background until the lease ends; a caller's own commit (`run_committing`); how long a record
//! is kept.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::call::Call;
use crate::codec::Encoded;
use crate::context::Kept;
use crate::error::StoreError;
use crate::store::{CommitRequest, Transition};
use crate::telemetry::{self};

use super::state::Held;
use super::{Idempotency, Inner};
use crate::store::Completed;

impl Idempotency {
    /// Stores the result. A failed attempt is retried (a commit is safe to repeat) until the
    /// commit deadline; past it the caller gets its value and the retries go on in the
    /// background until the lease would have run out. A lost key or a corrupt record is logged
    /// (the body ran, so its value is returned anyway); a store that says too few replicas have
    /// the record fails the call, which is the caller's to know.
    /// `Ok(true)` when the store confirmed the record; `Ok(false)` when it refused it (another
    /// owner has the key) or the commit goes on in the background past the deadline.
    pub(super) async fn commit(
        &self,
        call: &Call,
        held: &Held,
        encoded: Encoded,
        lease_end: Instant,
    ) -> Result<bool, StoreError> {
        let key = held.context.key();
        let result = replayable(key, encoded);
        let keep = self.keep_for(call, held);
        let request = CommitRequest {
            key,
            owner: held.context.owner(),
            fence: held.context.fence_read().unwrap_or(0),
            keep,
            result: result.as_deref(),
            fingerprint: held.fingerprint.as_deref(),
            lease_in_record: held.lease_in_record(call),
        };
        // The common case, inline and without copying anything.
        let generation = self.inner.cache_generation();
        let sent = Instant::now();
        // A caller dropped from here on (an outer timeout, a `select!`) leaves its commit to the
        // background: the body ran, and a key left in progress would be free again after its
        // lease, for a retry to run the body a second time.
        let mut unsettled = Unsettled { inner: &self.inner, request: Some(request), lease_end, sent, generation };
        let first = match self.inner.store.commit(request).await {
            Err(e) if e.may_succeed_later() => e,
            outcome => {
                unsettled.request = None;
                return self.inner.committed(&request, outcome, sent, generation);
            }
        };
        // Settled: the retries below own what they store, and are handed over the same way.
        unsettled.request = None;
        drop(unsettled);
        tracing::warn!(key = %telemetry::logged_key(key), error = %first, "idempotency commit failed; retrying");
        let pending = PendingCommit {
            key: key.to_owned(),
            owner: held.context.owner().to_owned(),
            fence: held.context.fence_read().unwrap_or(0),
            keep,
            result,
            fingerprint: held.fingerprint.clone(),
            lease_in_record: held.lease_in_record(call),
        };
        // A retry's cached copy still ends `keep` after this first send: the record may have
        // been written by it, whatever the retry that confirms it finds.
        // Dropped unfinished (the deadline passed, or the caller went away), the retries go on
        // in the background.
        let mut retries =
            InBackground(Some(Box::pin(self.inner.clone().retry_commit(pending, lease_end, sent, generation))));
        let Some(running) = retries.0.as_mut() else { unreachable!("just set") };
        // The deadline counts from the first attempt, not from its failure.
        match tokio::time::timeout_at(sent + self.inner.commit_deadline, running).await {
            Ok(outcome) => {
                retries.0 = None;
                outcome
            }
            Err(_) => {
                tracing::warn!(
                    key = %telemetry::logged_key(key),
                    deadline = ?self.inner.commit_deadline,
                    "idempotency result not stored within the commit deadline; the caller gets its value, \
                     storing goes on in the background until the lease would end"
                );
                Ok(false)
            }
        }
    }
}

impl Idempotency {
    /// How long the completed record is kept: the call's `keep`; in token mode, until the token
    /// expires plus the clock skew allowed between machines, whatever `keep` says. A used token
    /// stays used while any machine may still accept it; after that every machine refuses it
    /// before its record is read, so keeping the record longer would hold memory for nothing.
    pub(super) fn keep_for(&self, call: &Call, held: &Held) -> Duration {
        self.kept(call, held.token_expires).left(|| self.inner.token_clock.now())
    }

    /// How long a call's result is kept, as its context tells the body (`kept_until`) and its
    /// commit keeps it (`keep_for`).
    pub(super) fn kept(&self, call: &Call, token_expires: Option<SystemTime>) -> Kept {
        match token_expires {
            Some(expires) => Kept::Token { expires, skew: self.inner.token_skew },
            None => Kept::For(call.keep.unwrap_or(self.inner.keep)),
        }
    }

    /// The completed record of a call, owned, for a store that writes it itself.
    pub(super) fn completed(&self, call: &Call, held: &Held, encoded: Encoded) -> Completed {
        let key = held.context.key();
        Completed {
            key: key.to_owned(),
            owner: held.context.owner().to_owned(),
            fence: held.context.fence_read().unwrap_or(0),
            keep: self.keep_for(call, held),
            result: replayable(key, encoded),
            fingerprint: held.fingerprint.clone(),
        }
    }
}

/// A commit whose first attempt has not settled: dropped with its request still in it (its
/// caller went away), it hands the commit, owned, to the background retries.
struct Unsettled<'a> {
    inner: &'a Arc<Inner>,
    request: Option<CommitRequest<'a>>,
    lease_end: Instant,
    sent: Instant,
    generation: u64,
}

impl Drop for Unsettled<'_> {
    fn drop(&mut self) {
        let Some(r) = self.request.take() else { return };
        tracing::warn!(
            key = %telemetry::logged_key(r.key),
            "idempotency call dropped during its commit; storing its result in the background"
        );
        let pending = PendingCommit {
            key: r.key.to_owned(),
            owner: r.owner.to_owned(),
            fence: r.fence,
            keep: r.keep,
            result: r.result.map(<[u8]>::to_vec),
            fingerprint: r.fingerprint.map(str::to_owned),
            lease_in_record: r.lease_in_record,
        };
        let retries = self.inner.clone().retry_commit(pending, self.lease_end, self.sent, self.generation);
        drop(InBackground(Some(Box::pin(retries))));
    }
}

/// Commit retries that go on in the background when dropped unfinished, within the bound on
/// background work (`MAX_BACKGROUND`), on the tokio runtime of the dropping task.
struct InBackground<F: std::future::Future<Output = Result<bool, StoreError>> + Send + 'static>(
    Option<std::pin::Pin<Box<F>>>,
);

impl<F: std::future::Future<Output = Result<bool, StoreError>> + Send + 'static> Drop for InBackground<F> {
    fn drop(&mut self) {
        let Some(retries) = self.0.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        if let Some(slot) = crate::store::background::slot("commit") {
            runtime.spawn(async move {
                let _slot = slot;
                retries.await
            });
        }
    }
}

/// The bytes to store, or `None` for a result kept as not replayable (logged).
pub(super) fn replayable(key: &str, encoded: Encoded) -> Option<Vec<u8>> {
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
pub(super) enum CommitWith<C> {
    Store,
    Custom(C),
}

/// The commit type of a call that commits through the store.
pub(super) type NoCommit = fn((), Completed) -> std::future::Ready<Result<Transition, StoreError>>;

/// A commit to retry, owning what it stores (it may outlive the call).
pub(super) struct PendingCommit {
    pub(super) key: String,
    pub(super) owner: String,
    pub(super) fence: u64,
    pub(super) keep: Duration,
    pub(super) result: Option<Vec<u8>>,
    pub(super) fingerprint: Option<String>,
    pub(super) lease_in_record: bool,
}

impl PendingCommit {
    /// The request that stores it.
    pub(super) fn request(&self) -> CommitRequest<'_> {
        CommitRequest {
            key: &self.key,
            owner: &self.owner,
            fence: self.fence,
            keep: self.keep,
            result: self.result.as_deref(),
            fingerprint: self.fingerprint.as_deref(),
            lease_in_record: self.lease_in_record,
        }
    }
}

impl Inner {
    /// What a commit's outcome means for the caller: `Done` fills the replay cache (until `keep`
    /// after the first commit of this result was sent: never past the record's end, whichever
    /// attempt wrote it; unless a purge came since `generation`), a lost key or corrupt record is
    /// logged, a store error is returned.
    pub(super) fn committed(
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
    pub(super) async fn retry_commit(
        self: Arc<Self>,
        pending: PendingCommit,
        lease_end: Instant,
        first_sent: Instant,
        generation: u64,
    ) -> Result<bool, StoreError> {
        let request = pending.request();
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
