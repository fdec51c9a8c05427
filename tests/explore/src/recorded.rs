//! The store a process of the real-server layer talks through: a real store (Redis, Valkey, a
//! Cluster, PostgreSQL, each behind the harness's relay) with every acquire, commit and release
//! recorded in the history when it is sent and when its answer reaches the caller, and every purge
//! broadcast when it reaches the process. Faults come from outside (the relay, signals to the
//! server), not from here. A process that crashes sends nothing more: [`Recorded::crash`] makes
//! every later command fail at once, unsent and unrecorded, while what it sent before may still
//! land, as a killed process's bytes in flight do.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idempotency::store::{
    AcquireOutcome, AcquireRequest, CommitRequest, FailRequest, Forgotten, Inspected, Lease, PurgeEvent, PurgeHandler,
    Resolution, Resolved, ScanPage, StoreFuture, Transition, Watcher,
};
use idempotency::{Store, StoreError, StoreErrorKind};

use crate::history::{Event, History, OpKind, OpResult};

/// One process's recorded store over a real one.
pub struct Recorded {
    proc: usize,
    inner: Arc<dyn Store>,
    history: History,
    ids: Arc<AtomicU64>,
    dead: Arc<AtomicBool>,
}

impl Recorded {
    /// Process `proc`'s store on `inner`, recording into `history`.
    pub fn new(proc: usize, inner: Arc<dyn Store>, history: History) -> Self {
        Recorded { proc, inner, history, ids: Arc::default(), dead: Arc::default() }
    }

    /// The store of the process that takes this one's place after a crash: the same real store,
    /// its commands numbered on from this one's.
    pub fn successor(&self) -> Self {
        let (inner, history, ids) = (self.inner.clone(), self.history.clone(), self.ids.clone());
        Recorded { proc: self.proc, inner, history, ids, dead: Arc::default() }
    }

    /// The process is gone: nothing more leaves it, nothing more reaches it.
    pub fn crash(&self) {
        self.dead.store(true, Ordering::SeqCst);
    }

    fn gone<T>(&self) -> Result<T, StoreError> {
        Err(StoreError::new(StoreErrorKind::Unavailable, "the process crashed (explorer fault)"))
    }

    fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }

    /// Records `kind` sent, awaits `fut`, records what it answered (unless the process died
    /// meanwhile: nobody heard the answer).
    async fn sent<T>(
        &self,
        kind: OpKind,
        key: &str,
        owner: &str,
        fut: StoreFuture<'_, Result<T, StoreError>>,
        summary: impl Fn(&Result<T, StoreError>) -> OpResult,
    ) -> Result<T, StoreError> {
        if self.is_dead() {
            return self.gone();
        }
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        let proc = self.proc;
        self.history.record(Event::OpSent { proc, id, kind, key: key.to_owned(), owner: owner.to_owned() });
        let out = fut.await;
        if !self.is_dead() {
            self.history.record(Event::OpAnswered { proc, id, result: summary(&out) });
        }
        out
    }
}

impl Recorded {
    /// As [`sent`](Self::sent), for a batch transition: each item recorded as a command of its
    /// own, sent together and answered together, so that the checker sees per key what one call's
    /// transition would have shown, while the real store runs its batch path (its pipelines,
    /// batch scripts, statements over arrays).
    async fn sent_many<T>(
        &self,
        kind: impl Fn(usize) -> OpKind,
        items: &[(&str, &str)],
        fut: StoreFuture<'_, Vec<Result<T, StoreError>>>,
        summary: impl Fn(&Result<T, StoreError>) -> OpResult,
    ) -> Vec<Result<T, StoreError>> {
        if self.is_dead() {
            return items.iter().map(|_| self.gone()).collect();
        }
        let proc = self.proc;
        let ids: Vec<u64> = items
            .iter()
            .enumerate()
            .map(|(i, (key, owner))| {
                let id = self.ids.fetch_add(1, Ordering::Relaxed);
                let (key, owner) = ((*key).to_owned(), (*owner).to_owned());
                self.history.record(Event::OpSent { proc, id, kind: kind(i), key, owner });
                id
            })
            .collect();
        let out = fut.await;
        if !self.is_dead() {
            for (id, answer) in ids.into_iter().zip(&out) {
                self.history.record(Event::OpAnswered { proc, id, result: summary(answer) });
            }
        }
        out
    }
}

fn acquired(out: &Result<AcquireOutcome, StoreError>) -> OpResult {
    match out {
        Ok(AcquireOutcome::Acquired { fence, .. }) => OpResult::Acquired { fence: *fence },
        Ok(AcquireOutcome::InProgress { .. }) => OpResult::InProgress,
        Ok(AcquireOutcome::Completed { .. }) => OpResult::Completed,
        Err(e) if e.kind() == StoreErrorKind::Timeout => OpResult::NoReply,
        _ => OpResult::Error,
    }
}

fn transition(r: &Result<Transition, StoreError>) -> OpResult {
    match r {
        Ok(Transition::Done) => OpResult::Done,
        Ok(Transition::Lost) => OpResult::Lost,
        Err(e) if e.kind() == StoreErrorKind::Timeout => OpResult::NoReply,
        // A corrupt record, an error: nothing the checker counts as a transition.
        _ => OpResult::Error,
    }
}

impl Store for Recorded {
    fn acquire<'a>(&'a self, r: AcquireRequest<'a>) -> StoreFuture<'a, Result<AcquireOutcome, StoreError>> {
        StoreFuture::new(async move {
            let (key, owner) = (r.key, r.owner);
            self.sent(OpKind::Acquire, key, owner, self.inner.acquire(r), acquired).await
        })
    }

    fn acquire_many<'a>(
        &'a self,
        requests: &'a [AcquireRequest<'a>],
    ) -> StoreFuture<'a, Vec<Result<AcquireOutcome, StoreError>>> {
        StoreFuture::new(async move {
            let items: Vec<(&str, &str)> = requests.iter().map(|r| (r.key, r.owner)).collect();
            self.sent_many(|_| OpKind::Acquire, &items, self.inner.acquire_many(requests), acquired).await
        })
    }

    fn commit_many<'a>(
        &'a self,
        requests: &'a [CommitRequest<'a>],
    ) -> StoreFuture<'a, Vec<Result<Transition, StoreError>>> {
        StoreFuture::new(async move {
            let items: Vec<(&str, &str)> = requests.iter().map(|r| (r.key, r.owner)).collect();
            self.sent_many(|_| OpKind::Commit, &items, self.inner.commit_many(requests), transition).await
        })
    }

    fn release_many<'a>(
        &'a self,
        releases: &'a [(&'a str, &'a str)],
    ) -> StoreFuture<'a, Vec<Result<Transition, StoreError>>> {
        StoreFuture::new(async move {
            self.sent_many(|_| OpKind::Release, releases, self.inner.release_many(releases), transition).await
        })
    }

    fn fail_many<'a>(
        &'a self,
        requests: &'a [FailRequest<'a>],
    ) -> StoreFuture<'a, Vec<Result<Transition, StoreError>>> {
        StoreFuture::new(async move {
            let items: Vec<(&str, &str)> = requests.iter().map(|r| (r.key, r.owner)).collect();
            let kind = |i: usize| if requests[i].give_up { OpKind::GiveUp } else { OpKind::Fail };
            self.sent_many(kind, &items, self.inner.fail_many(requests), transition).await
        })
    }

    fn fence<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, Result<Option<u64>, StoreError>> {
        StoreFuture::new(async move {
            self.sent(OpKind::Fence, key, owner, self.inner.fence(key, owner), |out| match out {
                Ok(Some(fence)) => OpResult::Fence { fence: *fence },
                Ok(None) => OpResult::Lost,
                Err(e) if e.kind() == StoreErrorKind::Timeout => OpResult::NoReply,
                Err(_) => OpResult::Error,
            })
            .await
        })
    }

    fn renew<'a>(&'a self, leases: &'a [Lease<'a>]) -> StoreFuture<'a, Result<Vec<bool>, StoreError>> {
        StoreFuture::new(async move {
            if self.is_dead() {
                return self.gone();
            }
            self.inner.renew(leases).await
        })
    }

    fn commit<'a>(&'a self, r: CommitRequest<'a>) -> StoreFuture<'a, Result<Transition, StoreError>> {
        StoreFuture::new(async move {
            let (key, owner) = (r.key, r.owner);
            self.sent(OpKind::Commit, key, owner, self.inner.commit(r), transition).await
        })
    }

    fn release<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, Result<Transition, StoreError>> {
        StoreFuture::new(async move {
            self.sent(OpKind::Release, key, owner, self.inner.release(key, owner), transition).await
        })
    }

    fn keeps_attempts(&self) -> bool {
        self.inner.keeps_attempts()
    }

    fn fail<'a>(&'a self, r: FailRequest<'a>) -> StoreFuture<'a, Result<Transition, StoreError>> {
        StoreFuture::new(async move {
            let (key, owner) = (r.key, r.owner);
            let kind = if r.give_up { OpKind::GiveUp } else { OpKind::Fail };
            self.sent(kind, key, owner, self.inner.fail(r), transition).await
        })
    }

    /// An operator's: not a process's command.
    fn resolve<'a>(
        &'a self,
        key: &'a str,
        holder: Option<&'a str>,
        resolution: Resolution<'a>,
    ) -> StoreFuture<'a, Result<Resolved, StoreError>> {
        self.inner.resolve(key, holder, resolution)
    }

    fn watch<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<Watcher, StoreError>> {
        StoreFuture::new(async move {
            if self.is_dead() {
                return self.gone();
            }
            self.inner.watch(key).await
        })
    }

    /// The real store's own abandon (after what was sent for the owner, retried), recorded as a
    /// release sent now whose answer nobody hears.
    fn abandon(self: Arc<Self>, key: &str, owner: &str, lease: Duration) {
        if self.is_dead() {
            return;
        }
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        self.history.record(Event::OpSent {
            proc: self.proc,
            id,
            kind: OpKind::Release,
            key: key.to_owned(),
            owner: owner.to_owned(),
        });
        self.inner.clone().abandon(key, owner, lease);
    }

    fn inspect<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<Inspected, StoreError>> {
        self.inner.inspect(key)
    }

    fn forget<'a>(&'a self, key: &'a str, force: bool) -> StoreFuture<'a, Result<Forgotten, StoreError>> {
        self.inner.forget(key, force)
    }

    fn scan<'a>(
        &'a self,
        prefix: &'a str,
        cursor: Option<&'a str>,
        count: usize,
    ) -> StoreFuture<'a, Result<ScanPage, StoreError>> {
        self.inner.scan(prefix, cursor, count)
    }

    fn follow_purges(&self, handler: PurgeHandler) -> StoreFuture<'_, Result<bool, StoreError>> {
        let (proc, history, dead) = (self.proc, self.history.clone(), self.dead.clone());
        let relay: PurgeHandler = Arc::new(move |event| {
            if dead.load(Ordering::SeqCst) {
                return;
            }
            if let PurgeEvent::Forgotten(key) = &event {
                history.record(Event::PurgeDelivered { proc, key: (*key).to_owned() });
            }
            handler(event);
        });
        self.inner.follow_purges(relay)
    }

    fn token_secrets(&self) -> Vec<Vec<u8>> {
        self.inner.token_secrets()
    }

    fn call_timeout(&self) -> Option<Duration> {
        self.inner.call_timeout()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch's transitions go to the store's own batch path, as one command per item sent
    /// together (both sent before either is answered), not one transition after the other.
    #[tokio::test]
    async fn a_batch_reaches_the_stores_batch_path_each_item_recorded() {
        let history = History::new();
        let store = Recorded::new(0, Arc::new(idempotency::MemoryStore::new()), history.clone());
        let request = |key| AcquireRequest {
            key,
            owner: "o1",
            lease: Duration::from_secs(5),
            fingerprint: None,
            will_wait: false,
            report_ttl: false,
            fence_now: false,
            lapse: idempotency::store::Lapse::Free,
            keep: Duration::from_secs(5),
        };
        let found = store.acquire_many(&[request("s:a"), request("s:b")]).await;
        assert!(found.iter().all(|f| matches!(f, Ok(AcquireOutcome::Acquired { .. }))), "{found:?}");
        let order: Vec<&str> = history
            .events()
            .iter()
            .map(|(_, e)| match e {
                Event::OpSent { .. } => "sent",
                Event::OpAnswered { .. } => "answered",
                _ => "other",
            })
            .collect();
        assert_eq!(order, ["sent", "sent", "answered", "answered"]);
    }
}
