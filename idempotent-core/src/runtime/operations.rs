//! The operator's API: read a record whole, forget it, scan a prefix.

use std::time::Duration;

use crate::error::Error;
use crate::store::{Forgotten, Inspected, RecordState, ScanPage};

use super::Idempotency;

impl Idempotency {
    /// Reads the record of `key` in `scope` whole, for operators: its state, fence, owner, how
    /// long it has left, fingerprint, and result (see [`RecordView`](crate::store::RecordView)).
    /// An empty `scope` reads `key` as a full key.
    pub async fn inspect(&self, scope: &str, key: &str) -> Result<Inspected, Error> {
        let key = full_key(scope, key);
        self.inner.store.inspect(&key).await.map_err(|source| Error::Store { key, source })
    }

    /// Deletes the record of `key` in `scope` (an empty scope: `key` is a full key): a completed
    /// one, so that the next call runs the body again (after a bug fix, say), or an in-progress
    /// one with [`Force::InProgress`], which means a second body may start while the first still
    /// runs (the first learns its lease is lost at its next renewal). Waiters are woken, and every
    /// process whose replay cache follows purges drops its copy.
    pub async fn forget(&self, scope: &str, key: &str, force: Force) -> Result<Forgotten, Error> {
        let key = full_key(scope, key);
        let forgotten = self.inner.store.forget(&key, force == Force::InProgress).await;
        if let (Ok(Forgotten::Deleted(_)), Some(cache)) = (&forgotten, &self.inner.cache) {
            cache.forget(&key);
        }
        forgotten.map_err(|source| Error::Store { key, source })
    }

    /// One page of the records whose full keys start with `filter.prefix` and pass its filters
    /// (state, age, fingerprint), from `cursor` (`None`: the first page), about `count` keys
    /// examined; on Redis a `SCAN` (every primary of a cluster), which never blocks the server.
    pub async fn scan(&self, filter: &ScanFilter, cursor: Option<&str>, count: usize) -> Result<ScanPage, Error> {
        let mut page = self
            .inner
            .store
            .scan(&filter.prefix, cursor, count.max(1))
            .await
            .map_err(|source| Error::Store { key: filter.prefix.clone(), source })?;
        let now = std::time::SystemTime::now();
        page.records.retain(|r| filter.matches(r, now));
        Ok(page)
    }
}

/// The full key of `key` in `scope` (`key` alone when `scope` is empty).
pub(super) fn full_key(scope: &str, key: &str) -> String {
    if scope.is_empty() {
        key.to_owned()
    } else {
        format!("{scope}:{key}")
    }
}

/// Whether [`Idempotency::forget`] may delete a record in progress.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use idempotency::store::{Forgotten, RecordState};
/// use idempotency::{Call, Error, Force, Idempotency, MemoryStore};
///
/// let idem = Idempotency::new(MemoryStore::new());
/// let _: Result<u8, Error> = idem.run(Call::new("7").scope("invoices"), || async { Ok(1) }).await;
/// // After a bug fix: run invoice 7 again.
/// let forgotten = idem.forget("invoices", "7", Force::CompletedOnly).await.unwrap();
/// assert_eq!(forgotten, Forgotten::Deleted(RecordState::Completed));
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Force {
    /// Only a completed record is deleted; an in-progress one is left (`Forgotten::InProgress`).
    #[default]
    CompletedOnly,
    /// An in-progress record is deleted too: a second body may start while the first runs.
    InProgress,
}

/// Which records a [`Idempotency::scan`] returns.
///
/// ```
/// use std::time::Duration;
/// use idempotency::store::RecordState;
/// use idempotency::ScanFilter;
///
/// // Payments stuck in progress for more than ten minutes.
/// let stuck = ScanFilter::prefix("payments::").state(RecordState::InProgress).older_than(Duration::from_secs(600));
/// ```
#[derive(Debug, Clone, Default)]
pub struct ScanFilter {
    /// The start of the full keys (a scope and `:`, say); empty for every record.
    pub prefix: String,
    /// Only records in this state.
    pub state: Option<RecordState>,
    /// Only records older than this (see [`RecordView::age`](crate::store::RecordView::age));
    /// records of unknown age are left out.
    pub older_than: Option<Duration>,
    /// Only records with (`true`) or without (`false`) a fingerprint.
    pub fingerprinted: Option<bool>,
}

impl ScanFilter {
    /// Every record whose full key starts with `prefix`.
    pub fn prefix(prefix: impl Into<String>) -> Self {
        ScanFilter { prefix: prefix.into(), ..Self::default() }
    }

    /// Only records in `state`.
    pub fn state(mut self, state: RecordState) -> Self {
        self.state = Some(state);
        self
    }

    /// Only records older than `age`.
    pub fn older_than(mut self, age: Duration) -> Self {
        self.older_than = Some(age);
        self
    }

    /// Only records with (`true`) or without (`false`) a fingerprint.
    pub fn fingerprinted(mut self, present: bool) -> Self {
        self.fingerprinted = Some(present);
        self
    }

    /// Whether `record` passes, at `now`.
    pub fn matches(&self, record: &crate::store::RecordView, now: std::time::SystemTime) -> bool {
        self.state.is_none_or(|s| record.state == s)
            && self.fingerprinted.is_none_or(|f| record.fingerprint.is_some() == f)
            && self.older_than.is_none_or(|min| record.age(now).is_some_and(|age| age > min))
    }
}
