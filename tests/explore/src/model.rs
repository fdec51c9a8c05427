//! A model of the Redis store's record semantics, as `RedisStore` and `lua/` use them, on
//! tokio's clock: a server clock for fences that only moves forward (Redis `TIME`), keys that
//! expire by themselves, owner-checked transitions like the scripts', waiters woken by a
//! published change, purges published to every follower, and the plain parameter-mode acquire
//! as the three commands it is (`SET NX GET`, `TIME`, `PTTL`), which a stalled connection can
//! split: [`ModelStore::acquire_split`]. Records that keep their lease's end (attempts counted,
//! outcomes held: `lapse`), the records of failed attempts (`fail.lua`) and resolutions
//! (`resolve.lua`) decide by the same server clock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotency::store::{
    AcquireOutcome, AcquireRequest, CommitRequest, FailRequest, Forgotten, Lapse, Lease, PurgeEvent, PurgeHandler,
    RecordState, Resolution, Resolved, StoreFuture, Transition, Watcher,
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
        attempt: u32,
        /// Where the record keeps its lease's end (and outlives it by `after`): that end, and
        /// whether the key is held (unknown) once it has passed.
        lease_end: Option<(Instant, bool)>,
        after: Duration,
    },
    /// `owner`: the attempt that completed it (a repeated commit knows itself by it; none for a
    /// resolution's).
    Completed { owner: String, fingerprint: Option<String>, result: Option<Vec<u8>> },
    /// Failed attempts (`gave_up`: the key given up), by `owner`'s failure.
    Failed { owner: String, fingerprint: Option<String>, attempts: u32, error: String, gave_up: bool },
}

impl Val {
    /// In progress past the lease's end it keeps, at `now`: `Some(held)`.
    fn lapsed(&self, now: Instant) -> Option<bool> {
        match self {
            Val::Pending { lease_end: Some((end, hold)), .. } if *end <= now => Some(*hold),
            _ => None,
        }
    }
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

/// The in-progress record `req` writes as `attempt`, keeping its lease's end when `keeps_end`.
fn pending(req: &AcquireRequest<'_>, attempt: u32, keeps_end: bool) -> Val {
    Val::Pending {
        owner: req.owner.to_owned(),
        fingerprint: req.fingerprint.map(str::to_owned),
        watched: false,
        attempt,
        lease_end: keeps_end.then(|| (Instant::now() + req.lease, req.lapse == Lapse::Hold)),
        after: req.keep,
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
        if req.will_wait || req.report_ttl || req.lapse != Lapse::Free {
            return self.acquire_script(&req);
        }
        let got = {
            let mut st = lock(&self.state);
            match st.live(req.key) {
                Some(rec) => Some(rec.val.clone()),
                None => {
                    let val = pending(&req, 1, false);
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
            None => AcquireOutcome::Acquired { fence, attempt: 1 },
            Some(Val::Pending { owner, attempt, .. }) if owner == req.owner => {
                AcquireOutcome::Acquired { fence, attempt }
            }
            // The SET found a record only the script decides on: the store asks it, a command more.
            Some(Val::Pending { lease_end: Some(_), .. } | Val::Failed { gave_up: false, .. }) => {
                self.acquire_script(&req)
            }
            Some(Val::Pending { fingerprint, .. }) => {
                AcquireOutcome::InProgress { fingerprint, lease_left: Duration::ZERO }
            }
            Some(Val::Completed { fingerprint, result, .. }) => {
                AcquireOutcome::Completed { fingerprint, result, kept_for: Duration::ZERO }
            }
            Some(Val::Failed { fingerprint, attempts, error, .. }) => {
                AcquireOutcome::GaveUp { fingerprint, attempts, last_error: error }
            }
        }
    }

    /// `acquire.lua`.
    fn acquire_script(&self, req: &AcquireRequest<'_>) -> AcquireOutcome {
        let mut st = lock(&self.state);
        let now = Instant::now();
        let start = st.start;
        let before = match st.live(req.key).map(|r| &r.val) {
            None => Some(0),
            Some(Val::Pending { owner, attempt, .. }) if owner == req.owner => {
                let attempt = *attempt;
                return AcquireOutcome::Acquired { fence: st.time_us(), attempt };
            }
            Some(Val::Failed { gave_up: false, attempts, .. }) => Some(*attempts),
            Some(v @ Val::Pending { attempt, .. }) => match v.lapsed(now) {
                Some(true) => {
                    let Val::Pending { fingerprint, owner, lease_end, .. } = v else { unreachable!() };
                    let ended = lease_end.map_or(now, |(end, _)| end);
                    let lease_ended_ms = 1_700_000_000_000 + ended.saturating_duration_since(start).as_millis() as u64;
                    return AcquireOutcome::Unknown {
                        fingerprint: fingerprint.clone(),
                        owner: owner.clone(),
                        lease_ended_ms,
                        attempt: *attempt,
                    };
                }
                Some(false) => Some(*attempt),
                None => None,
            },
            Some(_) => None,
        };
        if let Some(before) = before {
            let attempt = before + 1;
            let watched = matches!(st.live(req.key).map(|r| &r.val), Some(Val::Pending { watched: true, .. }));
            let keeps_end = req.lapse.keeps_lease_end(attempt);
            let val = pending(req, attempt, keeps_end);
            let val = match val {
                Val::Pending { owner, fingerprint, attempt, lease_end, after, .. } => {
                    Val::Pending { owner, fingerprint, watched, attempt, lease_end, after }
                }
                other => other,
            };
            let expires = now + req.lease + if keeps_end { req.keep } else { Duration::ZERO };
            st.recs.insert(req.key.to_owned(), Rec { val, expires });
            return AcquireOutcome::Acquired { fence: st.time_us(), attempt };
        }
        let rec = st.live(req.key).expect("a live record");
        let left = rec.expires.saturating_duration_since(now);
        match &mut rec.val {
            Val::Completed { fingerprint, result, .. } => AcquireOutcome::Completed {
                fingerprint: fingerprint.clone(),
                result: result.clone(),
                kept_for: if req.report_ttl { left } else { Duration::ZERO },
            },
            Val::Failed { fingerprint, attempts, error, .. } => AcquireOutcome::GaveUp {
                fingerprint: fingerprint.clone(),
                attempts: *attempts,
                last_error: error.clone(),
            },
            Val::Pending { fingerprint, watched, lease_end, .. } => {
                *watched |= req.will_wait;
                let left = lease_end.map_or(left, |(end, _)| end.saturating_duration_since(now));
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
        let now = Instant::now();
        match st.live(key).map(|r| &r.val) {
            Some(v @ Val::Pending { owner: o, .. }) if o == owner && v.lapsed(now).is_none() => Some(st.time_us()),
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
                    if rec.val.lapsed(now).is_some() {
                        return false;
                    }
                    match &mut rec.val {
                        Val::Pending { lease_end: Some((end, _)), after, .. } => {
                            *end = now + l.lease;
                            rec.expires = now + l.lease + *after;
                        }
                        _ => rec.expires = now + l.lease,
                    }
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
                Some(Val::Failed { gave_up: true, .. }) => return Transition::Lost,
                // Released by a later attempt that failed: recorded anyway, as on an absent key.
                Some(Val::Failed { .. }) | None => false,
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

    /// `release.lua`: a record that counts attempts before this one keeps them.
    fn release_now(&self, key: &str, owner: &str) -> Transition {
        let notify = {
            let mut st = lock(&self.state);
            let now = Instant::now();
            match st.live(key).map(|r| &r.val) {
                None => return Transition::Done,
                Some(Val::Failed { owner: o, gave_up: false, .. }) if o == owner => return Transition::Done,
                Some(Val::Pending { owner: o, watched, attempt, lease_end, after, .. }) if o == owner => {
                    let watched = *watched;
                    if lease_end.is_some() && *attempt > 1 && !after.is_zero() {
                        let val = Val::Failed {
                            owner: owner.to_owned(),
                            fingerprint: None,
                            attempts: attempt - 1,
                            error: String::new(),
                            gave_up: false,
                        };
                        let expires = now + *after;
                        st.recs.insert(key.to_owned(), Rec { val, expires });
                    } else {
                        st.recs.remove(key);
                    }
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

    /// `fail.lua`.
    fn fail_now(&self, req: &FailRequest<'_>) -> Transition {
        let notify = {
            let mut st = lock(&self.state);
            let now = Instant::now();
            let watched = match st.live(req.key).map(|r| &r.val) {
                // Its attempt resolved as not done by an operator: its own give-up still counts.
                Some(Val::Failed { owner, gave_up: false, .. }) if owner == req.owner && req.give_up => false,
                Some(Val::Failed { owner, .. }) if owner == req.owner => return Transition::Done,
                Some(Val::Pending { owner, watched, .. }) if owner == req.owner => *watched,
                None => false,
                Some(_) => return Transition::Lost,
            };
            if req.keep.is_zero() {
                st.recs.remove(req.key);
            } else {
                let val = Val::Failed {
                    owner: req.owner.to_owned(),
                    fingerprint: req.fingerprint.filter(|_| req.give_up).map(str::to_owned),
                    attempts: req.attempt,
                    error: req.error.to_owned(),
                    gave_up: req.give_up,
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

    /// `resolve.lua`.
    fn resolve_now(&self, key: &str, holder: Option<&str>, resolution: Resolution<'_>) -> Resolved {
        let notify = {
            let mut st = lock(&self.state);
            let now = Instant::now();
            let Some(rec) = st.live(key) else { return Resolved::Absent };
            let (owner, fingerprint, attempt, after, watched) = match &rec.val {
                Val::Completed { .. } => return Resolved::NotUnknown(RecordState::Completed),
                Val::Failed { gave_up: true, .. } => return Resolved::NotUnknown(RecordState::Failed),
                Val::Failed { .. } => return Resolved::NotUnknown(RecordState::Released),
                Val::Pending { owner, fingerprint, attempt, after, watched, lease_end, .. } => {
                    let theirs = holder.is_some_and(|h| h != owner);
                    match rec.val.lapsed(now) {
                        None if lease_end.is_some_and(|(_, hold)| hold) && !theirs => return Resolved::Running,
                        None => return Resolved::NotUnknown(RecordState::InProgress),
                        Some(false) => return Resolved::NotUnknown(RecordState::Released),
                        Some(true) if theirs => return Resolved::NotUnknown(RecordState::Unknown),
                        Some(true) => (owner.clone(), fingerprint.clone(), *attempt, *after, *watched),
                    }
                }
            };
            let val = match resolution {
                Resolution::Completed(result) => {
                    Val::Completed { owner: String::new(), fingerprint, result: result.map(<[u8]>::to_vec) }
                }
                Resolution::Release => Val::Failed {
                    owner,
                    fingerprint: None,
                    attempts: attempt,
                    error: idempotency::store::RESOLVED_RELEASED.to_owned(),
                    gave_up: false,
                },
            };
            if after.is_zero() {
                st.recs.remove(key);
            } else {
                st.recs.insert(key.to_owned(), Rec { val, expires: now + after });
            }
            watched
        };
        if notify {
            self.notify(key);
        }
        Resolved::Done
    }

    /// `forget.lua`: deletes, wakes waiters, publishes the purge.
    fn forget_now(&self, key: &str, force: bool) -> Forgotten {
        let state = {
            let mut st = lock(&self.state);
            let now = Instant::now();
            let state = match st.live(key).map(|r| &r.val) {
                None => return Forgotten::Absent,
                Some(v @ Val::Pending { .. }) => match v.lapsed(now) {
                    Some(true) => RecordState::Unknown,
                    Some(false) => RecordState::Released,
                    None if !force => return Forgotten::InProgress,
                    None => RecordState::InProgress,
                },
                Some(Val::Completed { .. }) => RecordState::Completed,
                Some(Val::Failed { gave_up: true, .. }) => RecordState::Failed,
                Some(Val::Failed { .. }) => RecordState::Released,
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

    fn keeps_attempts(&self) -> bool {
        true
    }

    fn fail<'a>(&'a self, request: FailRequest<'a>) -> StoreFuture<'a, Result<Transition, StoreError>> {
        StoreFuture::ready(Ok(self.fail_now(&request)))
    }

    fn resolve<'a>(
        &'a self,
        key: &'a str,
        holder: Option<&'a str>,
        resolution: Resolution<'a>,
    ) -> StoreFuture<'a, Result<Resolved, StoreError>> {
        StoreFuture::ready(Ok(self.resolve_now(key, holder, resolution)))
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
