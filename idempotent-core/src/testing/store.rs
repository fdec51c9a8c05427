//! `TestStore`: the in-memory store with the faults the test kit puts into a call's windows.
//! It can go away (every command fails as an unreachable store does) and come back, hold
//! commits until told to let them through (so that a caller can be cancelled, or the store taken
//! away, between a body's effect and its commit), and start afresh between scenarios.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use tokio::sync::watch;

use crate::error::{StoreError, StoreErrorKind};
use crate::store::memory::MemoryStore;
use crate::store::{
    AcquireOutcome, AcquireRequest, CommitRequest, Forgotten, Inspected, Lease, StoreFuture, Transition, Watcher,
};
use crate::Store;

/// A [`MemoryStore`] that the test kit can take away, hold commits on, and empty.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::sync::Arc;
/// use idempotency::testing::TestStore;
/// use idempotency::{Call, Error, Idempotency};
///
/// let store = Arc::new(TestStore::new());
/// let idem = Idempotency::builder_shared(store.clone()).build();
/// store.go_away();
/// let r = idem.run(Call::new("k"), || async { Ok::<_, Error>(1) }).await;
/// assert!(matches!(r, Err(Error::Store { .. })), "nothing runs while the store is away");
/// store.come_back();
/// assert_eq!(idem.run(Call::new("k"), || async { Ok::<_, Error>(1) }).await.unwrap(), 1);
/// # }
/// ```
pub struct TestStore {
    inner: RwLock<Arc<MemoryStore>>,
    away: AtomicBool,
    /// `true` while commits wait.
    holding: watch::Sender<bool>,
    acquires: AtomicUsize,
    commits: AtomicUsize,
    releases: AtomicUsize,
}

impl Default for TestStore {
    fn default() -> Self {
        TestStore::new()
    }
}

impl std::fmt::Debug for TestStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestStore")
            .field("away", &self.away.load(Ordering::SeqCst))
            .field("holding_commits", &*self.holding.borrow())
            .finish_non_exhaustive()
    }
}

impl TestStore {
    /// An empty store, there and letting commits through.
    pub fn new() -> Self {
        TestStore {
            inner: RwLock::new(Arc::new(MemoryStore::new())),
            away: AtomicBool::new(false),
            holding: watch::channel(false).0,
            acquires: AtomicUsize::new(0),
            commits: AtomicUsize::new(0),
            releases: AtomicUsize::new(0),
        }
    }

    /// From now on every command fails with [`StoreErrorKind::Unavailable`], as when the store's
    /// server is unreachable; records are kept (a pause or a network cut, not a restart).
    pub fn go_away(&self) {
        self.away.store(true, Ordering::SeqCst);
    }

    /// Commands reach the records again.
    pub fn come_back(&self) {
        self.away.store(false, Ordering::SeqCst);
    }

    /// Whether the store is away.
    pub fn is_away(&self) -> bool {
        self.away.load(Ordering::SeqCst)
    }

    /// Commits wait from now on, until [`let_commits_through`](Self::let_commits_through); a
    /// waiting commit dropped by its caller never lands.
    pub fn hold_commits(&self) {
        self.holding.send_replace(true);
    }

    /// Held commits go on, and later ones are not held.
    pub fn let_commits_through(&self) {
        self.holding.send_replace(false);
    }

    /// Starts afresh: no records, there, letting commits through. Between scenarios, with no
    /// call in flight.
    pub fn reset(&self) {
        *self.inner.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(MemoryStore::new());
        self.come_back();
        self.let_commits_through();
    }

    /// Acquires, commits and releases that reached the records so far: `(acquires, commits,
    /// releases)`.
    pub fn commands(&self) -> (usize, usize, usize) {
        (
            self.acquires.load(Ordering::SeqCst),
            self.commits.load(Ordering::SeqCst),
            self.releases.load(Ordering::SeqCst),
        )
    }

    fn records(&self) -> Result<Arc<MemoryStore>, StoreError> {
        if self.is_away() {
            return Err(StoreError::new(StoreErrorKind::Unavailable, "the test kit took the store away"));
        }
        Ok(self.inner.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

impl Store for TestStore {
    fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> StoreFuture<'a, Result<AcquireOutcome, StoreError>> {
        let records = match self.records() {
            Ok(records) => records,
            Err(e) => return StoreFuture::ready(Err(e)),
        };
        self.acquires.fetch_add(1, Ordering::SeqCst);
        StoreFuture::new(async move { records.acquire(request).await })
    }

    fn fence<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, Result<Option<u64>, StoreError>> {
        match self.records() {
            Ok(records) => StoreFuture::new(async move { records.fence(key, owner).await }),
            Err(e) => StoreFuture::ready(Err(e)),
        }
    }

    fn renew<'a>(&'a self, leases: &'a [Lease<'a>]) -> StoreFuture<'a, Result<Vec<bool>, StoreError>> {
        match self.records() {
            Ok(records) => StoreFuture::new(async move { records.renew(leases).await }),
            Err(e) => StoreFuture::ready(Err(e)),
        }
    }

    fn commit<'a>(&'a self, request: CommitRequest<'a>) -> StoreFuture<'a, Result<Transition, StoreError>> {
        let mut holding = self.holding.subscribe();
        StoreFuture::new(async move {
            // Held: wait here; a caller that drops this future leaves the record as it was.
            let _ = holding.wait_for(|held| !held).await;
            let records = self.records()?;
            self.commits.fetch_add(1, Ordering::SeqCst);
            records.commit(request).await
        })
    }

    fn release<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, Result<Transition, StoreError>> {
        let records = match self.records() {
            Ok(records) => records,
            Err(e) => return StoreFuture::ready(Err(e)),
        };
        self.releases.fetch_add(1, Ordering::SeqCst);
        StoreFuture::new(async move { records.release(key, owner).await })
    }

    fn watch<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<Watcher, StoreError>> {
        match self.records() {
            Ok(records) => StoreFuture::new(async move { records.watch(key).await }),
            Err(e) => StoreFuture::ready(Err(e)),
        }
    }

    fn inspect<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<Inspected, StoreError>> {
        match self.records() {
            Ok(records) => StoreFuture::new(async move { records.inspect(key).await }),
            Err(e) => StoreFuture::ready(Err(e)),
        }
    }

    fn forget<'a>(&'a self, key: &'a str, force: bool) -> StoreFuture<'a, Result<Forgotten, StoreError>> {
        match self.records() {
            Ok(records) => StoreFuture::new(async move { records.forget(key, force).await }),
            Err(e) => StoreFuture::ready(Err(e)),
        }
    }
}
