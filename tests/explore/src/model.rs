//! A model of the Redis store's record semantics, as `RedisStore` and `lua/` use them, on
//! tokio's clock: a server clock for fences that only moves forward (Redis `TIME`), keys that
//! expire by themselves, owner-checked transitions like the scripts', waiters woken by a
//! published change, purges published to every follower, and the plain parameter-mode acquire
//! as the three commands it is (`SET NX GET`, `TIME`, `PTTL`), which a stalled connection can
//! split: [`ModelStore::acquire_split`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotency::store::{
    AcquireOutcome, AcquireRequest, CommitRequest, Forgotten, Lease, PurgeEvent, PurgeHandler, RecordState,
    StoreFuture, Transition, Watcher,
};
use idempotency::{Store, StoreError};
use tokio::sync::watch;
use tokio::time::Instant;

#[derive(Debug, Clone)]
enum Val {
    Pending {
        owner: String,
        fingerprint: Option<String>,
        watched: bool,
    },
    /// `owner`: the attempt that completed it (a repeated commit knows itself by it).
    Completed {
        owner: String,
        fingerprint: Option<String>,
        result: Option<Vec<u8>>,
    },
}

#[derive(Debug, Clone)]
struct Rec {
    val: Val,
    expires: Instant,
}

struct State {
    recs: HashMap<String, Rec>,
    /// The last `TIME` the server gave, in microseconds.
    clock_us: u64,
    start: Instant,
}

impl State {
    /// The live record at `key` (an expired one is gone).
    fn live(&mut self, key: &str) -> Option<&mut Rec> {
        let now = Instant::now();
        if self.recs.get(key).is_some_and(|r| r.expires <= now) {
            self.recs.remove(key);
        }
        self.recs.get_mut(key)
    }

    /// `TIME`: the server's clock, which never goes back nor repeats.
    fn time_us(&mut self) -> u64 {
        let now = 1_700_000_000_000_000 + self.start.elapsed().as_micros() as u64;
        self.clock_us = now.max(self.clock_us + 1);
        self.clock_us
    }
}

/// The model store.
pub struct ModelStore {
    /// The token secret every runtime on the store shares (as `RedisStore` reads it at connect).
    secret: Vec<u8>,
    state: Mutex<State>,
    watchers: Mutex<HashMap<String, watch::Sender<u64>>>,
    purges: Mutex<Vec<PurgeHandler>>,
}

impl Default for ModelStore {
    fn default() -> Self {
        ModelStore {
            secret: (0..32u8).map(|i| i.wrapping_mul(97).wrapping_add(13)).collect(),
            state: Mutex::new(State { recs: HashMap::new(), clock_us: 0, start: Instant::now() }),
            watchers: Mutex::default(),
            purges: Mutex::default(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ModelStore {
    /// Drops the record of `key` (the store lost it: a failover, a restart).
    pub fn lose(&self, key: &str) {
        lock(&self.state).recs.remove(key);
    }

    /// A `PUBLISH` on the key's own channel, for its waiters.
    fn notify(&self, key: &str) {
        if let Some(tx) = lock(&self.watchers).get(key) {
            tx.send_modify(|n| *n += 1);
        }
    }

    /// A parameter-mode acquire as `RedisStore` sends it. Without waiting: `SET NX GET`, the
    /// fencing token left unread (`fence.lua` reads it if the body asks), or, for a caller that
    /// wants it now (`fence_now`, a lock), `TIME` landing `split` after the `SET` (zero on a
    /// healthy connection). A caller that waits or needs the record's lifetime takes the script:
    /// one step.
    pub async fn acquire_split(&self, req: AcquireRequest<'_>, split: Duration) -> AcquireOutcome {
        if req.will_wait || req.report_ttl {
            return self.acquire_script(&req);
        }
        let got = {
            let mut st = lock(&self.state);
            match st.live(req.key) {
                Some(rec) => Some(rec.val.clone()),
                None => {
                    let val = Val::Pending {
                        owner: req.owner.to_owned(),
                        fingerprint: req.fingerprint.map(str::to_owned),
                        watched: false,
                    };
                    st.recs.insert(req.key.to_owned(), Rec { val, expires: Instant::now() + req.lease });
                    None
                }
            }
        };
        let fence = if req.fence_now {
            if !split.is_zero() {
                tokio::time::sleep(split).await;
            }
            lock(&self.state).time_us()
        } else {
            0
        };
        match got {
            None => AcquireOutcome::Acquired { fence },
            Some(Val::Pending { owner, .. }) if owner == req.owner => AcquireOutcome::Acquired { fence },
            Some(Val::Pending { fingerprint, .. }) => {
                AcquireOutcome::InProgress { fingerprint, lease_left: Duration::ZERO }
            }
            Some(Val::Completed { fingerprint, result, .. }) => {
                AcquireOutcome::Completed { fingerprint, result, kept_for: Duration::ZERO }
            }
        }
    }

    /// `acquire.lua`.
    fn acquire_script(&self, req: &AcquireRequest<'_>) -> AcquireOutcome {
        let mut st = lock(&self.state);
        let now = Instant::now();
        let Some(rec) = st.live(req.key) else {
            let val = Val::Pending {
                owner: req.owner.to_owned(),
                fingerprint: req.fingerprint.map(str::to_owned),
                watched: false,
            };
            st.recs.insert(req.key.to_owned(), Rec { val, expires: now + req.lease });
            return AcquireOutcome::Acquired { fence: st.time_us() };
        };
        let left = rec.expires.saturating_duration_since(now);
        match &mut rec.val {
            Val::Pending { owner, .. } if owner == req.owner => AcquireOutcome::Acquired { fence: st.time_us() },
            Val::Completed { fingerprint, result, .. } => AcquireOutcome::Completed {
                fingerprint: fingerprint.clone(),
                result: result.clone(),
                kept_for: if req.report_ttl { left } else { Duration::ZERO },
            },
            Val::Pending { fingerprint, watched, .. } => {
                *watched |= req.will_wait;
                AcquireOutcome::InProgress {
                    fingerprint: fingerprint.clone(),
                    lease_left: if req.report_ttl { left } else { Duration::ZERO },
                }
            }
        }
    }

    /// `fence.lua`: the server's clock while `owner` holds the key.
    fn fence_now(&self, key: &str, owner: &str) -> Option<u64> {
        let mut st = lock(&self.state);
        match st.live(key).map(|r| &r.val) {
            Some(Val::Pending { owner: o, .. }) if o == owner => Some(st.time_us()),
            _ => None,
        }
    }

    /// `renew.lua`.
    fn renew_now(&self, leases: &[Lease<'_>]) -> Vec<bool> {
        let mut st = lock(&self.state);
        let now = Instant::now();
        leases
            .iter()
            .map(|l| match st.live(l.key) {
                Some(rec) if matches!(&rec.val, Val::Pending { owner, .. } if owner == l.owner) => {
                    rec.expires = now + l.lease;
                    true
                }
                _ => false,
            })
            .collect()
    }

    /// `commit.lua` (and `SET IFEQ`, which decides alike).
    fn commit_now(&self, req: &CommitRequest<'_>) -> Transition {
        let notify = {
            let mut st = lock(&self.state);
            let now = Instant::now();
            let watched = match st.live(req.key).map(|r| &r.val) {
                Some(Val::Completed { owner, .. }) => {
                    return if owner == req.owner { Transition::Done } else { Transition::Lost };
                }
                Some(Val::Pending { owner, .. }) if owner != req.owner => return Transition::Lost,
                Some(Val::Pending { watched, .. }) => *watched,
                None => false,
            };
            if req.keep.is_zero() {
                st.recs.remove(req.key);
            } else {
                let val = Val::Completed {
                    owner: req.owner.to_owned(),
                    fingerprint: req.fingerprint.map(str::to_owned),
                    result: req.result.map(<[u8]>::to_vec),
                };
                st.recs.insert(req.key.to_owned(), Rec { val, expires: now + req.keep });
            }
            watched
        };
        if notify {
            self.notify(req.key);
        }
        Transition::Done
    }

    /// `release.lua`.
    fn release_now(&self, key: &str, owner: &str) -> Transition {
        let notify = {
            let mut st = lock(&self.state);
            match st.live(key).map(|r| &r.val) {
                None => return Transition::Done,
                Some(Val::Pending { owner: o, watched, .. }) if o == owner => {
                    let watched = *watched;
                    st.recs.remove(key);
                    watched
                }
                Some(_) => return Transition::Lost,
            }
        };
        if notify {
            self.notify(key);
        }
        Transition::Done
    }

    /// `forget.lua`: deletes, wakes waiters, publishes the purge.
    fn forget_now(&self, key: &str, force: bool) -> Forgotten {
        let state = {
            let mut st = lock(&self.state);
            let state = match st.live(key).map(|r| &r.val) {
                None => return Forgotten::Absent,
                Some(Val::Pending { .. }) if !force => return Forgotten::InProgress,
                Some(Val::Pending { .. }) => RecordState::InProgress,
                Some(Val::Completed { .. }) => RecordState::Completed,
            };
            st.recs.remove(key);
            state
        };
        self.notify(key);
        for handler in lock(&self.purges).iter() {
            handler(PurgeEvent::Forgotten(key));
        }
        Forgotten::Deleted(state)
    }
}

impl Store for ModelStore {
    fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> StoreFuture<'a, Result<AcquireOutcome, StoreError>> {
        StoreFuture::new(async move { Ok(self.acquire_split(request, Duration::ZERO).await) })
    }

    fn fence<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, Result<Option<u64>, StoreError>> {
        StoreFuture::ready(Ok(self.fence_now(key, owner)))
    }

    fn renew<'a>(&'a self, leases: &'a [Lease<'a>]) -> StoreFuture<'a, Result<Vec<bool>, StoreError>> {
        StoreFuture::ready(Ok(self.renew_now(leases)))
    }

    fn commit<'a>(&'a self, request: CommitRequest<'a>) -> StoreFuture<'a, Result<Transition, StoreError>> {
        StoreFuture::ready(Ok(self.commit_now(&request)))
    }

    fn release<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, Result<Transition, StoreError>> {
        StoreFuture::ready(Ok(self.release_now(key, owner)))
    }

    fn watch<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<Watcher, StoreError>> {
        let rx = lock(&self.watchers).entry(key.to_owned()).or_insert_with(|| watch::channel(0).0).subscribe();
        StoreFuture::ready(Ok(Watcher::new(rx)))
    }

    fn forget<'a>(&'a self, key: &'a str, force: bool) -> StoreFuture<'a, Result<Forgotten, StoreError>> {
        StoreFuture::ready(Ok(self.forget_now(key, force)))
    }

    fn follow_purges(&self, handler: PurgeHandler) -> StoreFuture<'_, Result<bool, StoreError>> {
        handler(PurgeEvent::Following);
        lock(&self.purges).push(handler);
        StoreFuture::ready(Ok(true))
    }

    fn token_secrets(&self) -> Vec<Vec<u8>> {
        vec![self.secret.clone()]
    }
}

/// The store every process of a run shares: the memory store, or the model of Redis.
#[derive(Clone)]
pub enum Backend {
    Memory(Arc<idempotency::MemoryStore>),
    Model(Arc<ModelStore>),
}

impl Backend {
    /// The backend as a store.
    pub fn store(&self) -> Arc<dyn Store> {
        match self {
            Backend::Memory(m) => m.clone(),
            Backend::Model(m) => m.clone(),
        }
    }

    /// An acquire, split as a stalled connection would split it (the model only: the memory
    /// store's acquire is one step).
    pub async fn acquire(&self, req: AcquireRequest<'_>, split: Duration) -> Result<AcquireOutcome, StoreError> {
        match self {
            Backend::Memory(m) => m.acquire(req).await,
            Backend::Model(m) => Ok(m.acquire_split(req, split).await),
        }
    }

    /// The store loses `key`'s record.
    pub fn lose(&self, key: &str) {
        match self {
            Backend::Memory(m) => {
                m.remove(key);
            }
            Backend::Model(m) => m.lose(key),
        }
    }
}
