//! A lock handed from waiter to waiter, its acquires counted: `tests/lock.rs` asserts the count,
//! the benchmark prints it as a row (`acquires per lock hand-over`).

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotency::store::{AcquireOutcome, AcquireRequest, CommitRequest, Lease, StoreFuture, Transition, Watcher};
use idempotency::{Idempotency, Store, StoreError};

/// A store that counts the acquires sent to another.
pub struct CountingAcquires(pub Arc<dyn Store>, pub AtomicUsize);

impl Store for CountingAcquires {
    fn acquire<'a>(&'a self, r: AcquireRequest<'a>) -> StoreFuture<'a, Result<AcquireOutcome, StoreError>> {
        self.1.fetch_add(1, SeqCst);
        self.0.acquire(r)
    }
    fn fence<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, Result<Option<u64>, StoreError>> {
        self.0.fence(key, owner)
    }
    fn renew<'a>(&'a self, leases: &'a [Lease<'a>]) -> StoreFuture<'a, Result<Vec<bool>, StoreError>> {
        self.0.renew(leases)
    }
    fn commit<'a>(&'a self, r: CommitRequest<'a>) -> StoreFuture<'a, Result<Transition, StoreError>> {
        self.0.commit(r)
    }
    fn release<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, Result<Transition, StoreError>> {
        self.0.release(key, owner)
    }
    fn watch<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<Watcher, StoreError>> {
        self.0.watch(key)
    }
    fn call_timeout(&self) -> Option<Duration> {
        self.0.call_timeout()
    }
}

/// What [`hand_over`] saw: `n` waiters make `n` hand-overs.
#[derive(Debug)]
pub struct HandOvers {
    /// Acquires sent, the first holder's included.
    pub acquires: usize,
    /// The waiters, in the order they got the lock.
    pub order: Vec<usize>,
}

/// A first holder takes `key`'s lock; `n` callers of one runtime on `store` then wait for it,
/// one after the other (each started, and 2 ms given to reach its place in line, before the
/// next comes); the holder lets it go, and each
/// waiter takes it in turn, holds it 2 ms and lets it go: by hand (even waiters) or by dropping
/// its guard (odd ones).
pub async fn hand_over(store: Arc<dyn Store>, key: &str, n: usize) -> HandOvers {
    let counting = Arc::new(CountingAcquires(store, AtomicUsize::new(0)));
    let idem = Idempotency::builder_shared(counting.clone()).build();
    let lease = Duration::from_secs(10);
    let first = idem.lock(key.to_owned()).ttl(lease).acquire().await.expect("the first holder takes the lock");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..n {
        let (idem, key, order) = (idem.clone(), key.to_owned(), order.clone());
        let (started, running) = tokio::sync::oneshot::channel();
        waiters.push(tokio::spawn(async move {
            let _ = started.send(());
            // From here to its place in line the waiter runs no await that could yield.
            let guard = idem.lock(key).ttl(lease).wait(Duration::from_secs(60)).await.expect("a waiter's turn");
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(2)).await;
            if i % 2 == 0 {
                guard.release().await.expect("released");
            } else {
                drop(guard);
            }
        }));
        // In line before the next comes: the task has started (a task of a multi-threaded
        // runtime may start late), and it reaches its place in line within microseconds.
        running.await.expect("the waiter started");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    first.release().await.expect("the first holder lets the lock go");
    for w in waiters {
        w.await.expect("a waiter panicked");
    }
    let order = order.lock().unwrap().clone();
    HandOvers { acquires: counting.1.load(SeqCst), order }
}
