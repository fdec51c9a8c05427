//! `MemoryStore`: the state machine in this process's memory, for one process, examples and
//! tests. Same semantics as the Redis store, lease and keep expiry included.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::channels::Channels;
use super::expiry::Expiries;
use super::{AcquireOutcome, AcquireRequest, BoxFuture, CommitRequest, Lease, Mode, Store, Transition, Watcher};
use crate::error::StoreError;

/// How many expired records a write removes at most, besides its own key.
const EXPIRE_PER_WRITE: usize = 32;

/// The fewest records that trigger a full sweep.
const SWEEP_FLOOR: usize = 1024;

/// A store in this process's memory.
///
/// Keys expire like in Redis (a lease, `keep`, a token's lifetime), so everything a
/// [`RedisStore`](super::redis::RedisStore) does can be tried without one. It only protects
/// calls made within this process.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use idempotent_core::{Call, Error, Idempotency, MemoryStore};
///
/// let idem = Idempotency::new(MemoryStore::new());
/// let first: Result<u32, Error> = idem.run(Call::new("job:1"), || async { Ok(7) }).await;
/// let again: Result<u32, Error> = idem.run(Call::new("job:1"), || async { Ok(8) }).await;
/// assert_eq!((first.unwrap(), again.unwrap()), (7, 7)); // the second call replays
/// # }
/// ```
#[derive(Default)]
pub struct MemoryStore {
    state: Mutex<State>,
    watchers: Channels,
}

#[derive(Default)]
struct State {
    records: HashMap<String, Record>,
    /// Which records are due to expire (completed records and tokens; see `expiry`).
    expiries: Expiries,
    /// Past this many records, sweep every expired one (in-progress records are not queued).
    sweep_at: usize,
    last_fence: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Issued,
    InProgress,
    Completed,
}

struct Record {
    phase: Phase,
    owner: Option<String>,
    fingerprint: Option<String>,
    fence: u64,
    /// Completed: the result, `None` when not replayable.
    result: Option<Vec<u8>>,
    /// Token records: when the token expires.
    token_expiry: Option<Instant>,
    /// Token records while in progress: when the lease ends.
    lease_until: Option<Instant>,
    /// When the whole record disappears.
    expires_at: Instant,
    /// A caller waits for this key to change.
    watched: bool,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of live (unexpired) records.
    pub fn len(&self) -> usize {
        let now = Instant::now();
        self.lock().records.values().filter(|r| r.expires_at > now).count()
    }

    /// Whether there are no live records.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops the record of `key` (its full key, scope included), whatever its state: an
    /// operator's tool, and a way for tests to take a lease away. Returns whether there was one.
    pub fn remove(&self, key: &str) -> bool {
        self.lock().records.remove(key).is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a record half-written (every write is a
        // single assignment), so a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn acquire_now(&self, req: AcquireRequest<'_>) -> AcquireOutcome {
        let now = Instant::now();
        let mut st = self.lock();
        st.tick(now);
        let fence = st.last_fence + 1;
        let Some(rec) = st.live(req.key, now) else {
            if req.mode == Mode::Token {
                return AcquireOutcome::InvalidToken;
            }
            st.last_fence = fence;
            st.insert_unqueued(
                req.key,
                Record {
                    phase: Phase::InProgress,
                    owner: Some(req.owner.to_owned()),
                    fingerprint: req.fingerprint.map(str::to_owned),
                    fence,
                    result: None,
                    token_expiry: None,
                    lease_until: None,
                    expires_at: now + req.lease,
                    watched: false,
                },
            );
            return AcquireOutcome::Acquired { fence };
        };
        match rec.phase {
            Phase::InProgress if rec.owner.as_deref() == Some(req.owner) => {
                return AcquireOutcome::Acquired { fence: rec.fence }
            }
            Phase::Completed => {
                return AcquireOutcome::Completed {
                    fingerprint: rec.fingerprint.clone(),
                    result: rec.result.clone(),
                    kept_for: rec.expires_at.saturating_duration_since(now),
                }
            }
            Phase::InProgress => {
                let until = rec.lease_until.unwrap_or(rec.expires_at);
                // A token whose holder's lease ran out is ISSUED again.
                if !(rec.token_expiry.is_some() && until <= now) {
                    rec.watched |= req.will_wait;
                    return AcquireOutcome::InProgress {
                        fingerprint: rec.fingerprint.clone(),
                        lease_left: until.saturating_duration_since(now),
                    };
                }
            }
            Phase::Issued => {}
        }
        if req.mode != Mode::Token {
            return AcquireOutcome::Corrupt {
                reason: "holds an issued token, but the call is in parameter mode".into(),
            };
        }
        let token_expiry = rec.token_expiry.unwrap_or(now);
        let lease_until = now + req.lease;
        rec.phase = Phase::InProgress;
        rec.owner = Some(req.owner.to_owned());
        rec.fingerprint = req.fingerprint.map(str::to_owned);
        rec.fence = fence;
        rec.lease_until = Some(lease_until);
        rec.expires_at = token_expiry.max(lease_until);
        st.last_fence = fence;
        AcquireOutcome::Acquired { fence }
    }

    fn renew_now(&self, leases: &[Lease<'_>]) -> Vec<bool> {
        let now = Instant::now();
        let mut st = self.lock();
        leases
            .iter()
            .map(|l| match st.live(l.key, now) {
                Some(rec) if rec.phase == Phase::InProgress && rec.owner.as_deref() == Some(l.owner) => {
                    match (rec.token_expiry, rec.lease_until) {
                        (Some(_), Some(until)) if until <= now => false,
                        (Some(te), _) => {
                            rec.lease_until = Some(now + l.lease);
                            rec.expires_at = te.max(now + l.lease);
                            true
                        }
                        (None, _) => {
                            rec.expires_at = now + l.lease;
                            true
                        }
                    }
                }
                _ => false,
            })
            .collect()
    }

    fn commit_now(&self, req: CommitRequest<'_>) -> Transition {
        let now = Instant::now();
        let watched = {
            let mut st = self.lock();
            st.tick(now);
            let watched = match st.live(req.key, now) {
                None => false,
                // Completed by this acquisition (same fence): a repeated commit.
                Some(rec) if rec.phase == Phase::Completed => {
                    return if rec.fence == req.fence { Transition::Done } else { Transition::Lost };
                }
                Some(rec) if rec.phase == Phase::Issued || rec.owner.as_deref() != Some(req.owner) => {
                    return Transition::Lost
                }
                Some(rec) => rec.watched,
            };
            if req.keep.is_zero() {
                st.records.remove(req.key);
            } else {
                st.insert(
                    req.key,
                    Record {
                        phase: Phase::Completed,
                        owner: None,
                        fingerprint: req.fingerprint.map(str::to_owned),
                        fence: req.fence,
                        result: req.result.map(<[u8]>::to_vec),
                        token_expiry: None,
                        lease_until: None,
                        expires_at: now + req.keep,
                        watched: false,
                    },
                    req.keep,
                );
            }
            watched
        };
        if watched {
            self.watchers.notify(req.key);
        }
        Transition::Done
    }

    fn release_now(&self, key: &str, owner: &str) -> Transition {
        let now = Instant::now();
        let watched = {
            let mut st = self.lock();
            st.tick(now);
            let Some(rec) = st.live(key, now) else { return Transition::Done };
            match rec.phase {
                Phase::Issued => return Transition::Done,
                Phase::InProgress if rec.owner.as_deref() == Some(owner) => {}
                _ => return Transition::Lost,
            }
            let watched = rec.watched;
            match rec.token_expiry {
                Some(te) if te > now => {
                    rec.phase = Phase::Issued;
                    rec.owner = None;
                    rec.fingerprint = None;
                    rec.lease_until = None;
                    rec.watched = false;
                    rec.expires_at = te;
                    st.expiries.at(key, te);
                }
                _ => {
                    st.records.remove(key);
                }
            }
            watched
        };
        if watched {
            self.watchers.notify(key);
        }
        Transition::Done
    }

    fn issue_now(&self, key: &str, ttl: Duration) -> bool {
        let now = Instant::now();
        let mut st = self.lock();
        st.tick(now);
        if st.live(key, now).is_some() {
            return false;
        }
        st.insert(
            key,
            Record {
                phase: Phase::Issued,
                owner: None,
                fingerprint: None,
                fence: 0,
                result: None,
                token_expiry: Some(now + ttl),
                lease_until: None,
                expires_at: now + ttl,
                watched: false,
            },
            ttl,
        );
        true
    }

    fn watch_now(&self, key: &str) -> Watcher {
        self.watchers.watch(key, |_| {}).0
    }
}

impl State {
    /// The record at `key` unless it has expired (an expired one is removed).
    fn live(&mut self, key: &str, now: Instant) -> Option<&mut Record> {
        if self.records.get(key).is_some_and(|r| r.expires_at <= now) {
            self.records.remove(key);
        }
        self.records.get_mut(key)
    }

    /// Drops a few expired records (amortized: each write pays for a bounded number), and all
    /// of them once the store has doubled since the last full sweep.
    fn tick(&mut self, now: Instant) {
        let records = &mut self.records;
        let mut later = Vec::new();
        self.expiries.due(now, EXPIRE_PER_WRITE, |key| match records.get(&key).map(|r| r.expires_at) {
            Some(at) if at <= now => {
                records.remove(&key);
            }
            Some(at) => later.push((key, at)),
            None => {}
        });
        for (key, at) in later {
            self.expiries.at(&key, at);
        }
        if self.records.len() > self.sweep_at {
            self.records.retain(|_, r| r.expires_at > now);
            self.sweep_at = 2 * self.records.len().max(SWEEP_FLOOR);
        }
    }

    /// Stores a record living `lifetime` from now and queues its expiry.
    fn insert(&mut self, key: &str, record: Record, lifetime: Duration) {
        self.expiries.after(key, lifetime, record.expires_at);
        self.insert_unqueued(key, record);
    }

    /// Stores an in-progress record: its holder commits or releases it.
    fn insert_unqueued(&mut self, key: &str, record: Record) {
        self.records.insert(key.to_owned(), record);
    }
}

impl Store for MemoryStore {
    fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> BoxFuture<'a, Result<AcquireOutcome, StoreError>> {
        Box::pin(std::future::ready(Ok(self.acquire_now(request))))
    }

    fn renew<'a>(&'a self, leases: &'a [Lease<'a>]) -> BoxFuture<'a, Result<Vec<bool>, StoreError>> {
        Box::pin(std::future::ready(Ok(self.renew_now(leases))))
    }

    fn commit<'a>(&'a self, request: CommitRequest<'a>) -> BoxFuture<'a, Result<Transition, StoreError>> {
        Box::pin(std::future::ready(Ok(self.commit_now(request))))
    }

    fn release<'a>(&'a self, key: &'a str, owner: &'a str) -> BoxFuture<'a, Result<Transition, StoreError>> {
        Box::pin(std::future::ready(Ok(self.release_now(key, owner))))
    }

    fn issue_token<'a>(&'a self, key: &'a str, ttl: Duration) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(std::future::ready(Ok(self.issue_now(key, ttl))))
    }

    fn watch<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Watcher, StoreError>> {
        Box::pin(std::future::ready(Ok(self.watch_now(key))))
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore").field("records", &self.lock().records.len()).finish()
    }
}
