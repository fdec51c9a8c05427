//! A process that dies, for a suite: a store that forwards every command to a real one until
//! [`Dying::die`], and from then on sends nothing (every command fails as an unreachable store's,
//! and a caller's abandon sends no release), as a SIGKILLed process leaves its records to their
//! leases. In-process, so that one suite runs on every store.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idempotency::store::{
    AcquireOutcome, AcquireRequest, CommitRequest, FailRequest, Lease, StoreFuture, Transition, Watcher,
};
use idempotency::{Idempotency, Store, StoreError, StoreErrorKind};

/// A store that forwards to another until it dies.
pub struct Dying {
    inner: Arc<dyn Store>,
    dead: AtomicBool,
}

impl Dying {
    /// A runtime on `inner` through a dying store, and the store, to kill.
    pub fn runtime(inner: Arc<dyn Store>) -> (Idempotency, Arc<Dying>) {
        let dying = Arc::new(Dying { inner, dead: AtomicBool::new(false) });
        (Idempotency::builder_shared(dying.clone()).build(), dying)
    }

    /// From now on nothing leaves the process.
    pub fn die(&self) {
        self.dead.store(true, Ordering::SeqCst);
    }

    fn alive<'a, T>(
        &'a self,
        f: impl FnOnce() -> StoreFuture<'a, Result<T, StoreError>>,
    ) -> StoreFuture<'a, Result<T, StoreError>> {
        if self.dead.load(Ordering::SeqCst) {
            StoreFuture::ready(Err(StoreError::new(StoreErrorKind::Unavailable, "the process died")))
        } else {
            f()
        }
    }
}

impl Store for Dying {
    fn acquire<'a>(&'a self, r: AcquireRequest<'a>) -> StoreFuture<'a, Result<AcquireOutcome, StoreError>> {
        self.alive(|| self.inner.acquire(r))
    }

    fn fence<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, Result<Option<u64>, StoreError>> {
        self.alive(|| self.inner.fence(key, owner))
    }

    fn renew<'a>(&'a self, leases: &'a [Lease<'a>]) -> StoreFuture<'a, Result<Vec<bool>, StoreError>> {
        self.alive(|| self.inner.renew(leases))
    }

    fn commit<'a>(&'a self, r: CommitRequest<'a>) -> StoreFuture<'a, Result<Transition, StoreError>> {
        self.alive(|| self.inner.commit(r))
    }

    fn release<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, Result<Transition, StoreError>> {
        self.alive(|| self.inner.release(key, owner))
    }

    fn keeps_attempts(&self) -> bool {
        self.inner.keeps_attempts()
    }

    fn fail<'a>(&'a self, r: FailRequest<'a>) -> StoreFuture<'a, Result<Transition, StoreError>> {
        self.alive(|| self.inner.fail(r))
    }

    fn watch<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<Watcher, StoreError>> {
        self.alive(|| self.inner.watch(key))
    }

    fn abandon(self: Arc<Self>, key: &str, owner: &str, lease: Duration) {
        if !self.dead.load(Ordering::SeqCst) {
            self.inner.clone().abandon(key, owner, lease);
        }
    }

    fn call_timeout(&self) -> Option<Duration> {
        self.inner.call_timeout()
    }

    fn token_secrets(&self) -> Vec<Vec<u8>> {
        self.inner.token_secrets()
    }
}
