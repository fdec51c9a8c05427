//! The pass-through runtime, for unit tests that test a body and not its idempotency: every call
//! runs its body, nothing is kept, no store is needed. Explicit by design: a runtime that
//! silently did nothing in production would be the worst kind of bug, so this one lives behind
//! the `testing` feature and says what it is in its name.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::watch;

use crate::error::StoreError;
use crate::runtime::Idempotency;
use crate::store::{AcquireOutcome, AcquireRequest, CommitRequest, Lease, StoreFuture, Transition, Watcher};
use crate::Store;

/// A runtime whose every call runs its body: each acquire is granted, each commit and release
/// is done and keeps nothing. For unit tests of what a body does; the test kit
/// ([`Kit`](crate::testing::Kit)) is for what the runtime does.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use idempotency::{Call, Error};
///
/// let idem = idempotency::testing::pass_through();
/// for run in 1..=3 {
///     let got = idem.run(Call::new("same-key"), || async move { Ok::<_, Error>(run) }).await.unwrap();
///     assert_eq!(got, run, "the body runs every time");
/// }
/// # }
/// ```
pub fn pass_through() -> Idempotency {
    Idempotency::builder_shared(Arc::new(PassThroughStore::default())).build()
}

/// The store under [`pass_through`]: grants every acquire, keeps nothing.
#[derive(Debug)]
pub struct PassThroughStore {
    fences: AtomicU64,
    /// Never changes: nobody waits on a pass-through key.
    changes: watch::Sender<u64>,
}

impl Default for PassThroughStore {
    fn default() -> Self {
        PassThroughStore { fences: AtomicU64::new(0), changes: watch::channel(0).0 }
    }
}

impl Store for PassThroughStore {
    fn acquire<'a>(&'a self, _: AcquireRequest<'a>) -> StoreFuture<'a, Result<AcquireOutcome, StoreError>> {
        let fence = self.fences.fetch_add(1, Ordering::Relaxed) + 1;
        StoreFuture::ready(Ok(AcquireOutcome::Acquired { fence, attempt: 1 }))
    }

    fn renew<'a>(&'a self, leases: &'a [Lease<'a>]) -> StoreFuture<'a, Result<Vec<bool>, StoreError>> {
        StoreFuture::ready(Ok(vec![true; leases.len()]))
    }

    fn commit<'a>(&'a self, _: CommitRequest<'a>) -> StoreFuture<'a, Result<Transition, StoreError>> {
        StoreFuture::ready(Ok(Transition::Done))
    }

    fn release<'a>(&'a self, _: &'a str, _: &'a str) -> StoreFuture<'a, Result<Transition, StoreError>> {
        StoreFuture::ready(Ok(Transition::Done))
    }

    fn watch<'a>(&'a self, _: &'a str) -> StoreFuture<'a, Result<Watcher, StoreError>> {
        StoreFuture::ready(Ok(Watcher::new(self.changes.subscribe())))
    }
}
