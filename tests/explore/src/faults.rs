//! The store a simulated process talks through: the shared [`Backend`] behind one connection
//! that lands commands in the order they were sent and answers in that order, as a Redis
//! connection does, and a pub/sub connection of its own for purges and change notifications.
//! The schedule's faults act on them while they last: commands that land late, replies that come
//! late or never (the command did land), commands refused before they land, a plain acquire split
//! across a stall, notifications late or missed. Every call is bounded by the store's timeout, as
//! `RedisStore`'s are; a command whose caller gave up still lands. A release for a caller that
//! gave up ([`Store::abandon`]) goes through the same connection, behind what the owner sent. Half
//! the batches' commands (`acquire_many`, `commit_many`, `release_many`, `fail_many`) go as one
//! command that lands whole and is answered by one reply, late or lost as a whole, as a script
//! call is; the other half item by item, so that a batch's items can come back mixed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotency::store::{
    AcquireOutcome, AcquireRequest, CommitRequest, FailRequest, Lapse, Lease, PurgeEvent, PurgeHandler, Resolution,
    Resolved, StoreFuture, Transition, Watcher,
};
use idempotency::{Store, StoreError, StoreErrorKind};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::history::{Event, History, OpKind, OpResult};
use crate::model::Backend;
use crate::schedule::{Fault, FaultKind};

/// A command, owned: it may land after its caller is gone.
enum Req {
    Acquire {
        key: String,
        owner: String,
        lease: Duration,
        fingerprint: Option<String>,
        will_wait: bool,
        report_ttl: bool,
        fence_now: bool,
        lapse: Lapse,
        keep: Duration,
    },
    Renew(Vec<(String, String, Duration)>),
    Commit {
        key: String,
        owner: String,
        fence: u64,
        keep: Duration,
        result: Option<Vec<u8>>,
        fingerprint: Option<String>,
        lease_in_record: bool,
    },
    Release {
        key: String,
        owner: String,
    },
    Fence {
        key: String,
        owner: String,
    },
    Fail {
        key: String,
        owner: String,
        attempt: u32,
        error: String,
        keep: Duration,
        give_up: bool,
        fingerprint: Option<String>,
    },
    /// A batch's commands (`acquire_many`, `commit_many`...): sent as one, landing one after the
    /// other at once, answered by one reply, late or lost as a whole (a script call per batch).
    Many(Vec<Req>),
}

enum Rep {
    Acquire(Result<AcquireOutcome, StoreError>),
    Fence(Result<Option<u64>, StoreError>),
    Renew(Result<Vec<bool>, StoreError>),
    Transition(Result<Transition, StoreError>),
    Many(Vec<Rep>),
}

struct Job {
    land_at: Instant,
    req: Req,
    reply: Option<oneshot::Sender<Rep>>,
}

/// The faults of one process, with the run's start to read their windows by.
#[derive(Clone)]
struct Faults {
    start: Instant,
    list: Arc<Vec<Fault>>,
}

impl Faults {
    fn active(&self, at: Instant) -> impl Iterator<Item = FaultKind> + '_ {
        let ms = at.saturating_duration_since(self.start).as_millis() as u64;
        self.list.iter().filter(move |f| f.from_ms <= ms && ms < f.from_ms + f.len_ms).map(|f| f.kind)
    }

    fn sum(&self, at: Instant, pick: impl Fn(FaultKind) -> Option<u64>) -> Duration {
        Duration::from_millis(self.active(at).filter_map(pick).sum())
    }

    fn any(&self, at: Instant, kind: FaultKind) -> bool {
        self.active(at).any(|k| k == kind)
    }

    /// When the refusal active at `at` ends (the client reconnects), if one is.
    fn refused_until(&self, at: Instant) -> Option<Instant> {
        let ms = at.saturating_duration_since(self.start).as_millis() as u64;
        self.list
            .iter()
            .filter(|f| f.kind == FaultKind::Refuse && f.from_ms <= ms && ms < f.from_ms + f.len_ms)
            .map(|f| self.start + Duration::from_millis(f.from_ms + f.len_ms))
            .max()
    }
}

/// One simulated process's store.
pub struct Faulty {
    proc: usize,
    backend: Backend,
    faults: Faults,
    history: History,
    timeout: Duration,
    conn: mpsc::UnboundedSender<Job>,
    ids: AtomicU64,
    tasks: Tasks,
}

/// Background tasks of a process's store, aborted with it.
type Tasks = Arc<Mutex<Vec<tokio::task::AbortHandle>>>;

impl Drop for Faulty {
    fn drop(&mut self) {
        for t in self.tasks.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            t.abort();
        }
    }
}

impl Faulty {
    /// Process `proc`'s store on `backend`, with the faults of the schedule that are its own;
    /// `start` is when the run started. Its connection is a task of the current runtime.
    pub fn new(
        proc: usize,
        backend: Backend,
        faults: &[Fault],
        start: Instant,
        history: History,
        timeout: Duration,
    ) -> Self {
        let faults = Faults { start, list: Arc::new(faults.iter().filter(|f| f.proc == proc).copied().collect()) };
        let (conn, jobs) = mpsc::unbounded_channel();
        let task = tokio::spawn(connection(backend.clone(), faults.clone(), jobs));
        Faulty {
            proc,
            backend,
            faults,
            history,
            timeout,
            conn,
            ids: AtomicU64::new(0),
            tasks: Arc::new(Mutex::new(vec![task.abort_handle()])),
        }
    }

    /// Sends `req`: it lands after what was sent before, delayed by the faults active now; the
    /// caller waits for the reply up to the store's timeout.
    async fn send(&self, kind: OpKind, key: &str, owner: &str, req: Req) -> Result<Rep, StoreError> {
        let mut reps = self.send_many(vec![(kind, key, owner, req)]).await?;
        Ok(reps.pop().expect("one reply for one command"))
    }

    /// Sends `items` as one command ([`send`](Self::send) for one), each recorded as an operation
    /// of its own: they land together, and one reply answers them all, or none.
    async fn send_many(&self, items: Vec<(OpKind, &str, &str, Req)>) -> Result<Vec<Rep>, StoreError> {
        let mut ids = Vec::with_capacity(items.len());
        let mut reqs = Vec::with_capacity(items.len());
        for (kind, key, owner, req) in items {
            let id = self.ids.fetch_add(1, Ordering::Relaxed);
            let logged = !matches!(kind, OpKind::Renew);
            if logged {
                self.history.record(Event::OpSent {
                    proc: self.proc,
                    id,
                    kind,
                    key: key.to_owned(),
                    owner: owner.to_owned(),
                });
            }
            ids.push(logged.then_some(id));
            reqs.push(req);
        }
        let answered = |results: &mut dyn Iterator<Item = OpResult>| {
            for (id, result) in ids.iter().zip(results) {
                if let Some(id) = *id {
                    self.history.record(Event::OpAnswered { proc: self.proc, id, result });
                }
            }
        };
        let now = Instant::now();
        if self.faults.any(now, FaultKind::Refuse) {
            answered(&mut std::iter::repeat(OpResult::Error));
            return Err(StoreError::new(StoreErrorKind::Unavailable, "connection refused (explorer fault)"));
        }
        let land_at = now + self.faults.sum(now, |k| if let FaultKind::DelayUp(d) = k { Some(d) } else { None });
        let (tx, rx) = oneshot::channel();
        let req = if reqs.len() == 1 { reqs.pop().expect("one") } else { Req::Many(reqs) };
        let _ = self.conn.send(Job { land_at, req, reply: Some(tx) });
        let reply = async {
            match rx.await {
                Ok(rep) => rep,
                // The reply was lost: the caller hears nothing until its timeout.
                Err(_) => std::future::pending().await,
            }
        };
        match tokio::time::timeout(self.timeout, reply).await {
            Ok(Rep::Many(reps)) => {
                answered(&mut reps.iter().map(summary));
                Ok(reps)
            }
            Ok(rep) => {
                answered(&mut std::iter::once(summary(&rep)));
                Ok(vec![rep])
            }
            Err(_) => {
                answered(&mut std::iter::repeat(OpResult::NoReply));
                Err(StoreError::new(
                    StoreErrorKind::Timeout,
                    format!("no reply within {:?} (explorer fault)", self.timeout),
                ))
            }
        }
    }

    /// A batch of `items`, each reply read by `read`. Half the batches (by their keys, so a seed
    /// replays the same) go as one command, which fails each item with its error if it fails as a
    /// whole (a script call, a pipeline on one connection); the others item by item, one after the
    /// other, so that one batch's items can come back mixed (a store's batch split over hash
    /// slots and connections: some acquired and some not, some committed and some not).
    async fn batch<T>(
        &self,
        items: Vec<(OpKind, &str, &str, Req)>,
        read: impl Fn(Rep) -> Result<T, StoreError>,
    ) -> Vec<Result<T, StoreError>> {
        let n = items.len();
        if !sent_whole(items.iter().map(|(_, key, _, _)| *key)) {
            let mut out = Vec::with_capacity(n);
            for (kind, key, owner, req) in items {
                out.push(self.send(kind, key, owner, req).await.and_then(&read));
            }
            return out;
        }
        match self.send_many(items).await {
            Ok(reps) => reps.into_iter().map(read).collect(),
            Err(e) => (0..n).map(|_| Err(e.copied())).collect(),
        }
    }
}

/// Delivers `what` on a process's pub/sub connection: late by the delay active now, or lost while
/// it is down.
fn deliver_later(faults: &Faults, tasks: &Tasks, what: impl FnOnce() + Send + 'static) {
    let now = Instant::now();
    if faults.any(now, FaultKind::PubsubDown) {
        return;
    }
    let delay = faults.sum(now, |k| if let FaultKind::PubsubDelay(d) = k { Some(d) } else { None });
    if delay.is_zero() {
        what();
    } else {
        let task = tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            what();
        });
        tasks.lock().unwrap_or_else(|p| p.into_inner()).push(task.abort_handle());
    }
}

fn summary(rep: &Rep) -> OpResult {
    match rep {
        Rep::Acquire(Ok(AcquireOutcome::Acquired { fence, .. })) => OpResult::Acquired { fence: *fence },
        Rep::Acquire(Ok(AcquireOutcome::InProgress { .. })) => OpResult::InProgress,
        Rep::Acquire(Ok(AcquireOutcome::Completed { .. })) => OpResult::Completed,
        Rep::Fence(Ok(Some(fence))) => OpResult::Fence { fence: *fence },
        Rep::Fence(Ok(None)) => OpResult::Lost,
        Rep::Transition(Ok(Transition::Done)) => OpResult::Done,
        Rep::Transition(Ok(Transition::Lost)) => OpResult::Lost,
        Rep::Renew(Ok(_)) => OpResult::Done,
        _ => OpResult::Error,
    }
}

/// The connection: lands each command at its time, in order, then sends its reply back, late or
/// never as the faults active when it landed say, and in order.
async fn connection(backend: Backend, faults: Faults, mut jobs: mpsc::UnboundedReceiver<Job>) {
    let mut last_reply = Instant::now();
    while let Some(job) = jobs.recv().await {
        tokio::time::sleep_until(job.land_at).await;
        let now = Instant::now();
        let split = faults.sum(now, |k| if let FaultKind::Split(d) = k { Some(d) } else { None });
        let rep = match job.req {
            Req::Many(reqs) => {
                let mut reps = Vec::with_capacity(reqs.len());
                for req in reqs {
                    reps.push(apply(&backend, req, split).await);
                }
                Rep::Many(reps)
            }
            req => apply(&backend, req, split).await,
        };
        let Some(reply) = job.reply else { continue };
        let now = Instant::now();
        if faults.any(now, FaultKind::LoseReplies) {
            continue;
        }
        let down = faults.sum(now, |k| if let FaultKind::DelayDown(d) = k { Some(d) } else { None });
        last_reply = last_reply.max(now + down);
        let at = last_reply;
        tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            let _ = reply.send(rep);
        });
    }
}

/// Lands one command on the backend (`split`: the stall a plain acquire is split across).
async fn apply(backend: &Backend, req: Req, split: Duration) -> Rep {
    let store = backend.store();
    match req {
        Req::Many(_) => unreachable!("a batch is not nested"),
        Req::Acquire { key, owner, lease, fingerprint, will_wait, report_ttl, fence_now, lapse, keep } => {
            let req = AcquireRequest {
                key: &key,
                owner: &owner,
                lease,
                fingerprint: fingerprint.as_deref(),
                will_wait,
                report_ttl,
                fence_now,
                lapse,
                keep,
            };
            Rep::Acquire(backend.acquire(req, split).await)
        }
        Req::Renew(leases) => {
            let leases: Vec<Lease<'_>> = leases.iter().map(|(k, o, l)| Lease { key: k, owner: o, lease: *l }).collect();
            Rep::Renew(store.renew(&leases).await)
        }
        Req::Commit { key, owner, fence, keep, result, fingerprint, lease_in_record } => {
            let req = CommitRequest {
                key: &key,
                owner: &owner,
                fence,
                keep,
                result: result.as_deref(),
                fingerprint: fingerprint.as_deref(),
                lease_in_record,
            };
            Rep::Transition(store.commit(req).await)
        }
        Req::Release { key, owner } => Rep::Transition(store.release(&key, &owner).await),
        Req::Fence { key, owner } => Rep::Fence(store.fence(&key, &owner).await),
        Req::Fail { key, owner, attempt, error, keep, give_up, fingerprint } => {
            let req = FailRequest {
                key: &key,
                owner: &owner,
                attempt,
                error: &error,
                keep,
                give_up,
                fingerprint: fingerprint.as_deref(),
            };
            Rep::Transition(store.fail(req).await)
        }
    }
}

/// Whether the batch of `keys` goes as one command (see `Faulty::batch`): by a hash of its keys,
/// the same in every run.
fn sent_whole<'a>(keys: impl Iterator<Item = &'a str>) -> bool {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for k in keys {
        k.hash(&mut h);
    }
    h.finish() % 2 == 0
}

/// An acquire, owned.
fn acquire_req(r: &AcquireRequest<'_>) -> Req {
    Req::Acquire {
        key: r.key.to_owned(),
        owner: r.owner.to_owned(),
        lease: r.lease,
        fingerprint: r.fingerprint.map(str::to_owned),
        will_wait: r.will_wait,
        report_ttl: r.report_ttl,
        fence_now: r.fence_now,
        lapse: r.lapse,
        keep: r.keep,
    }
}

/// A commit, owned.
fn commit_req(r: &CommitRequest<'_>) -> Req {
    Req::Commit {
        key: r.key.to_owned(),
        owner: r.owner.to_owned(),
        fence: r.fence,
        keep: r.keep,
        result: r.result.map(<[u8]>::to_vec),
        fingerprint: r.fingerprint.map(str::to_owned),
        lease_in_record: r.lease_in_record,
    }
}

fn release_req(key: &str, owner: &str) -> Req {
    Req::Release { key: key.to_owned(), owner: owner.to_owned() }
}

/// A failure, owned.
fn fail_req(r: &FailRequest<'_>) -> Req {
    Req::Fail {
        key: r.key.to_owned(),
        owner: r.owner.to_owned(),
        attempt: r.attempt,
        error: r.error.to_owned(),
        keep: r.keep,
        give_up: r.give_up,
        fingerprint: r.fingerprint.map(str::to_owned),
    }
}

fn fail_kind(r: &FailRequest<'_>) -> OpKind {
    if r.give_up {
        OpKind::GiveUp
    } else {
        OpKind::Fail
    }
}

fn read_acquire(rep: Rep) -> Result<AcquireOutcome, StoreError> {
    match rep {
        Rep::Acquire(out) => out,
        _ => unreachable!("an acquire answers an acquire"),
    }
}

fn read_transition(rep: Rep) -> Result<Transition, StoreError> {
    match rep {
        Rep::Transition(out) => out,
        _ => unreachable!("a transition answers a transition"),
    }
}

/// Stops a forwarding task when the watcher it feeds goes.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Store for Faulty {
    fn acquire<'a>(&'a self, r: AcquireRequest<'a>) -> StoreFuture<'a, Result<AcquireOutcome, StoreError>> {
        StoreFuture::new(
            async move { read_acquire(self.send(OpKind::Acquire, r.key, r.owner, acquire_req(&r)).await?) },
        )
    }

    fn acquire_many<'a>(
        &'a self,
        requests: &'a [AcquireRequest<'a>],
    ) -> StoreFuture<'a, Vec<Result<AcquireOutcome, StoreError>>> {
        StoreFuture::new(async move {
            let items = requests.iter().map(|r| (OpKind::Acquire, r.key, r.owner, acquire_req(r))).collect();
            self.batch(items, read_acquire).await
        })
    }

    fn fence<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, Result<Option<u64>, StoreError>> {
        StoreFuture::new(async move {
            let req = Req::Fence { key: key.to_owned(), owner: owner.to_owned() };
            match self.send(OpKind::Fence, key, owner, req).await? {
                Rep::Fence(out) => out,
                _ => unreachable!("a fence read answers a fence read"),
            }
        })
    }

    fn renew<'a>(&'a self, leases: &'a [Lease<'a>]) -> StoreFuture<'a, Result<Vec<bool>, StoreError>> {
        StoreFuture::new(async move {
            let req = Req::Renew(leases.iter().map(|l| (l.key.to_owned(), l.owner.to_owned(), l.lease)).collect());
            match self.send(OpKind::Renew, "", "", req).await? {
                Rep::Renew(out) => out,
                _ => unreachable!("a renewal answers a renewal"),
            }
        })
    }

    fn commit<'a>(&'a self, r: CommitRequest<'a>) -> StoreFuture<'a, Result<Transition, StoreError>> {
        StoreFuture::new(
            async move { read_transition(self.send(OpKind::Commit, r.key, r.owner, commit_req(&r)).await?) },
        )
    }

    fn commit_many<'a>(
        &'a self,
        requests: &'a [CommitRequest<'a>],
    ) -> StoreFuture<'a, Vec<Result<Transition, StoreError>>> {
        StoreFuture::new(async move {
            let items = requests.iter().map(|r| (OpKind::Commit, r.key, r.owner, commit_req(r))).collect();
            self.batch(items, read_transition).await
        })
    }

    fn release<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, Result<Transition, StoreError>> {
        StoreFuture::new(async move {
            read_transition(self.send(OpKind::Release, key, owner, release_req(key, owner)).await?)
        })
    }

    fn release_many<'a>(
        &'a self,
        releases: &'a [(&'a str, &'a str)],
    ) -> StoreFuture<'a, Vec<Result<Transition, StoreError>>> {
        StoreFuture::new(async move {
            let items = releases.iter().map(|&(k, o)| (OpKind::Release, k, o, release_req(k, o))).collect();
            self.batch(items, read_transition).await
        })
    }

    fn keeps_attempts(&self) -> bool {
        self.backend.store().keeps_attempts()
    }

    fn fail<'a>(&'a self, r: FailRequest<'a>) -> StoreFuture<'a, Result<Transition, StoreError>> {
        StoreFuture::new(async move { read_transition(self.send(fail_kind(&r), r.key, r.owner, fail_req(&r)).await?) })
    }

    fn fail_many<'a>(
        &'a self,
        requests: &'a [FailRequest<'a>],
    ) -> StoreFuture<'a, Vec<Result<Transition, StoreError>>> {
        StoreFuture::new(async move {
            let items = requests.iter().map(|r| (fail_kind(r), r.key, r.owner, fail_req(r))).collect();
            self.batch(items, read_transition).await
        })
    }

    /// An operator's: straight to the store, as the CLI's would go.
    fn resolve<'a>(
        &'a self,
        key: &'a str,
        holder: Option<&'a str>,
        resolution: Resolution<'a>,
    ) -> StoreFuture<'a, Result<Resolved, StoreError>> {
        StoreFuture::new(async move { self.backend.store().resolve(key, holder, resolution).await })
    }

    fn watch<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<Watcher, StoreError>> {
        StoreFuture::new(async move {
            let mut inner = self.backend.store().watch(key).await?;
            let (tx, rx) = watch::channel(0u64);
            let faults = self.faults.clone();
            let forward = tokio::spawn(async move {
                loop {
                    inner.changed().await;
                    let now = Instant::now();
                    if faults.any(now, FaultKind::PubsubDown) {
                        continue;
                    }
                    let delay = faults.sum(now, |k| if let FaultKind::PubsubDelay(d) = k { Some(d) } else { None });
                    tokio::time::sleep(delay).await;
                    tx.send_modify(|n| *n += 1);
                }
            });
            Ok(Watcher::new(rx).with_guard(AbortOnDrop(forward.abort_handle())))
        })
    }

    /// The release goes behind everything this process sent, and lands once the connection is
    /// back if it is refused now (the client queues it).
    fn abandon(self: Arc<Self>, key: &str, owner: &str, _lease: Duration) {
        let now = Instant::now();
        let up = self.faults.sum(now, |k| if let FaultKind::DelayUp(d) = k { Some(d) } else { None });
        let land_at = self.faults.refused_until(now).unwrap_or(now).max(now + up);
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        self.history.record(Event::OpSent {
            proc: self.proc,
            id,
            kind: OpKind::Release,
            key: key.to_owned(),
            owner: owner.to_owned(),
        });
        let _ = self.conn.send(Job { land_at, req: release_req(key, owner), reply: None });
    }

    fn follow_purges(&self, handler: PurgeHandler) -> StoreFuture<'_, Result<bool, StoreError>> {
        StoreFuture::new(async move {
            // Told when the pub/sub connection drops and comes back.
            for f in self.faults.list.iter().filter(|f| f.kind == FaultKind::PubsubDown) {
                let (from, to) = (
                    self.faults.start + Duration::from_millis(f.from_ms),
                    self.faults.start + Duration::from_millis(f.from_ms + f.len_ms),
                );
                let h = handler.clone();
                let task = tokio::spawn(async move {
                    tokio::time::sleep_until(from).await;
                    h(PurgeEvent::Missed);
                    tokio::time::sleep_until(to).await;
                    h(PurgeEvent::Following);
                });
                self.tasks.lock().unwrap_or_else(|p| p.into_inner()).push(task.abort_handle());
            }
            let me = PurgeRelay {
                proc: self.proc,
                history: self.history.clone(),
                faults: self.faults.clone(),
                tasks: self.tasks.clone(),
                handler,
            };
            let relay: PurgeHandler = Arc::new(move |event| me.relay(event));
            self.backend.store().follow_purges(relay).await
        })
    }

    fn call_timeout(&self) -> Option<Duration> {
        Some(self.timeout)
    }

    fn token_secrets(&self) -> Vec<Vec<u8>> {
        self.backend.store().token_secrets()
    }
}

/// Relays the backend's purge events to one process's handler through its pub/sub connection.
struct PurgeRelay {
    proc: usize,
    history: History,
    faults: Faults,
    tasks: Tasks,
    handler: PurgeHandler,
}

impl PurgeRelay {
    fn relay(&self, event: PurgeEvent<'_>) {
        let PurgeEvent::Forgotten(key) = event else {
            (self.handler)(event);
            return;
        };
        let (handler, key, history, proc) = (self.handler.clone(), key.to_owned(), self.history.clone(), self.proc);
        deliver_later(&self.faults, &self.tasks, move || {
            history.record(Event::PurgeDelivered { proc, key: key.clone() });
            handler(PurgeEvent::Forgotten(&key));
        });
    }
}
