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
    AcquireOutcome, AcquireRequest, CommitRequest, FailRequest, Forgotten, Inspected, Lease, Resolution, Resolved,
    StoreFuture, Transition, Watcher,
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
    /// The owners that acquired a key since the last reset: a command of an owner from before it
    /// (a background commit or release of an earlier scenario) finds its key taken, so that it
    /// cannot write into the next scenario's records.
    owners: std::sync::Mutex<std::collections::HashSet<String>>,
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
            owners: std::sync::Mutex::default(),
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

    /// Starts afresh: no records, there, letting commits through; the commands of owners from
    /// before (background work of an earlier call) find their keys taken. Between scenarios.
    pub fn reset(&self) {
        *self.inner.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(MemoryStore::new());
        self.owners.lock().unwrap_or_else(|e| e.into_inner()).clear();
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

    /// Whether `owner` acquired a key since the last reset.
    fn current(&self, owner: &str) -> bool {
        self.owners.lock().unwrap_or_else(|e| e.into_inner()).contains(owner)
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
        StoreFuture::new(async move {
            let outcome = records.acquire(request).await;
            if let Ok(AcquireOutcome::Acquired { .. }) = &outcome {
                self.owners.lock().unwrap_or_else(|e| e.into_inner()).insert(request.owner.to_owned());
            }
            outcome
        })
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
            if !self.current(request.owner) {
                return Ok(Transition::Lost);
            }
            self.commits.fetch_add(1, Ordering::SeqCst);
            records.commit(request).await
        })
    }

    fn release<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, Result<Transition, StoreError>> {
        let records = match self.records() {
            Ok(records) => records,
            Err(e) => return StoreFuture::ready(Err(e)),
        };
        if !self.current(owner) {
            return StoreFuture::ready(Ok(Transition::Lost));
        }
        self.releases.fetch_add(1, Ordering::SeqCst);
        StoreFuture::new(async move { records.release(key, owner).await })
    }

    fn keeps_attempts(&self) -> bool {
        true
    }

    /// A failure is a release that keeps the count (counted with the releases).
    fn fail<'a>(&'a self, request: FailRequest<'a>) -> StoreFuture<'a, Result<Transition, StoreError>> {
        let records = match self.records() {
            Ok(records) => records,
            Err(e) => return StoreFuture::ready(Err(e)),
        };
        if !self.current(request.owner) {
            return StoreFuture::ready(Ok(Transition::Lost));
        }
        self.releases.fetch_add(1, Ordering::SeqCst);
        StoreFuture::new(async move { records.fail(request).await })
    }

    fn resolve<'a>(
        &'a self,
        key: &'a str,
        holder: Option<&'a str>,
        resolution: Resolution<'a>,
    ) -> StoreFuture<'a, Result<Resolved, StoreError>> {
        match self.records() {
            Ok(records) => StoreFuture::new(async move { records.resolve(key, holder, resolution).await }),
            Err(e) => StoreFuture::ready(Err(e)),
        }
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn acquire(owner: &str) -> AcquireRequest<'_> {
        AcquireRequest {
            key: "k",
            owner,
            lease: Duration::from_secs(5),
            fingerprint: None,
            will_wait: false,
            report_ttl: false,
            fence_now: false,
            lapse: crate::store::Lapse::Free,
            keep: Duration::ZERO,
        }
    }

    fn commit(owner: &str) -> CommitRequest<'_> {
        CommitRequest {
            key: "k",
            owner,
            fence: 0,
            keep: Duration::from_secs(60),
            result: Some(b"1"),
            fingerprint: None,
            lease_in_record: false,
        }
    }

    /// A commit or release left over from before a reset (an earlier scenario's background work)
    /// never writes into the records after it.
    #[tokio::test]
    async fn commands_from_before_a_reset_find_their_keys_taken() {
        let store = TestStore::new();
        assert!(matches!(store.acquire(acquire("a")).await.unwrap(), AcquireOutcome::Acquired { .. }));
        store.reset();
        assert_eq!(store.commit(commit("a")).await.unwrap(), Transition::Lost);
        assert_eq!(store.release("k", "a").await.unwrap(), Transition::Lost);
        assert!(
            matches!(store.acquire(acquire("b")).await.unwrap(), AcquireOutcome::Acquired { .. }),
            "the key is free"
        );
        assert_eq!(store.commit(commit("b")).await.unwrap(), Transition::Done);
        assert_eq!(store.commands(), (2, 1, 0));
    }
}
