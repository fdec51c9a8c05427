//! Plays a schedule on tokio's paused clock (a current-thread runtime whose clock jumps to the
//! next timer whenever every task waits: seconds of schedule in microseconds of CPU, the same
//! way every time): one `Idempotency` per simulated process, each on its own [`Faulty`] store
//! over one shared backend, an operator's runtime straight on the backend for purges, and the
//! calls at their times. Once the schedule and its faults are over and every lease has had time
//! to run out, every key is probed from every process (I5). Everything lands in a [`History`].

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use idempotency::{Call, CallContext, Force, Idempotency, MemoryStore, OnConflict, OnCrash, OnDuplicate, Settled};
use tokio::time::Instant;

use crate::faults::Faulty;
use crate::history::{BodyEnd, CallId, Event, History, OpKind, OpResult, Returned};
use crate::model::{Backend, ModelStore};
use crate::schedule::{CallSpec, End, Schedule};

/// Which store the processes share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// `MemoryStore`.
    Memory,
    /// The model of the Redis store's record semantics.
    Model,
}

/// The scope of the schedule's guarded calls.
const SCOPE: &str = "x";

/// The payload of a planned panic (kept out of the output by the explorer's panic hook).
pub const PLANNED_PANIC: &str = "explorer: planned panic";

/// Keeps planned panics (part of the schedules) out of the output; any other panic is printed as
/// before. Once per process: the hook it installs stays.
pub fn quiet_planned_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let planned = info.payload().downcast_ref::<String>().is_some_and(|s| s == PLANNED_PANIC)
                || info.payload().downcast_ref::<&str>().is_some_and(|s| *s == PLANNED_PANIC);
            if !planned {
                default_hook(info);
            }
        }));
    });
}

/// A simulated process's runtime on `store`: waiters recheck every 50 ms, and with `cache`, a
/// replay cache of 1,000 entries. Both layers build their processes with it.
pub fn process_runtime(store: Arc<dyn idempotency::Store>, cache: bool) -> Idempotency {
    let builder = Idempotency::builder_shared(store).wait_recheck(ms(50));
    if cache { builder.replay_cache(1000) } else { builder }.build()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The full key of key `k` of a schedule, for a call or a lock (a token call's history names its
/// key `token:k<k>`).
pub fn full_key(k: usize, lock: bool) -> String {
    if lock {
        format!("{}:k{k}", idempotency::LOCK_SCOPE)
    } else {
        format!("{SCOPE}:k{k}")
    }
}

/// The history's name for the key of `spec`.
fn key_of(spec: &CallSpec) -> String {
    if spec.token && !spec.lock {
        format!("token:k{}", spec.key)
    } else {
        full_key(spec.key, spec.lock)
    }
}

/// Whether `spec` asks for a duration no store can hold.
fn unholdable(spec: &CallSpec) -> bool {
    let over = |v: u64| ms(v) > idempotency::MAX_DURATION;
    over(spec.ttl_ms) || (!spec.lock && over(spec.keep_ms))
}

/// The error of the explorer's bodies.
#[derive(Debug)]
pub enum AppError {
    Lib(idempotency::Error),
    Body,
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppError::Lib(e) => e.fmt(f),
            AppError::Body => f.write_str("the body failed"),
        }
    }
}

impl From<idempotency::Error> for AppError {
    fn from(e: idempotency::Error) -> Self {
        AppError::Lib(e)
    }
}

/// The variant's name of a library error: `Conflict`, `LeaseLost`, ...
fn error_name(e: &idempotency::Error) -> String {
    let text = format!("{e:?}");
    text.split(|c: char| !c.is_alphanumeric()).next().unwrap_or("").to_owned()
}

/// Added to a process's number, the number under which its transactions' commits are recorded.
const TX_COMMITS: usize = 1000;

/// A body of the explorer's, boxed.
pub type BoxedBody<'a> = std::pin::Pin<Box<dyn Future<Output = Result<String, AppError>> + Send + 'a>>;

/// Runs a batch's bodies with their effects in one transaction committed with their records, where
/// the store has such transactions: the layer on real servers gives PostgreSQL's
/// (`PgStore::run_batch_in_transaction`) to the calls whose spec says `in_transaction`.
pub trait InTransaction: Send + Sync {
    /// Runs the batch (of one), its one body `body`, and answers its item.
    fn run_one<'a>(
        &'a self,
        batch: idempotency::Batch<String>,
        body: BoxedBody<'a>,
    ) -> std::pin::Pin<Box<dyn Future<Output = Settled<String, AppError>> + Send + 'a>>;
}

/// Plays `schedule` on `store` and returns its history.
pub fn play(schedule: &Schedule, store: Store) -> History {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_time().start_paused(true);
    // `select!` picks its first branch at random; with a fixed seed (tokio's unstable API,
    // which scripts/explore.sh turns on) a schedule plays the same way every time.
    #[cfg(tokio_unstable)]
    builder.rng_seed(tokio::runtime::RngSeed::from_bytes(b"explore"));
    let rt = builder.build().expect("a paused current-thread runtime");
    let history = rt.block_on(play_in(schedule, store));
    // Background tasks (watchdogs, background commits and releases) go with the runtime.
    drop(rt);
    history
}

async fn play_in(schedule: &Schedule, store: Store) -> History {
    let history = History::new();
    let start = Instant::now();
    let backend = match store {
        Store::Memory => Backend::Memory(Arc::new(MemoryStore::new())),
        Store::Model => Backend::Model(Arc::new(ModelStore::default())),
    };
    let stores: Vec<Arc<Faulty>> = (0..schedule.caches.len())
        .map(|p| {
            let timeout = ms(schedule.timeouts_ms[p]);
            Arc::new(Faulty::new(p, backend.clone(), &schedule.faults, start, history.clone(), timeout))
        })
        .collect();
    let longest_timeout = ms(schedule.timeouts_ms.iter().copied().max().unwrap_or(0));
    let idems: Vec<Idempotency> =
        stores.iter().zip(&schedule.caches).map(|(s, &cache)| process_runtime(s.clone(), cache)).collect();
    let admin = Idempotency::builder_shared(backend.store()).build();

    // Tokens issued by process 0 for each key: every process must take them (they share the
    // store's token secret), for their whole life (a minute, past the schedule's end).
    let tokens: Arc<Vec<String>> =
        Arc::new((0..schedule.keys()).map(|_| idems[0].issue_token(TOKEN_LIFE).expect("a token")).collect());
    let mut tasks = tokio::task::JoinSet::new();
    for p in &schedule.purges {
        let (admin, h, key) = (admin.clone(), history.clone(), full_key(p.key, false));
        let (at, force) = (start + ms(p.at_ms), p.force);
        tasks.spawn(async move {
            tokio::time::sleep_until(at).await;
            let sent = h.now();
            let mode = if force { Force::InProgress } else { Force::CompletedOnly };
            let forgotten = admin.forget("", &key, mode).await;
            let deleted = matches!(forgotten, Ok(idempotency::store::Forgotten::Deleted(_)));
            h.record(Event::Purge { key, force, sent, deleted });
        });
    }
    for l in &schedule.losses {
        let (backend, h, at, key) = (backend.clone(), history.clone(), start + ms(l.at_ms), full_key(l.key, false));
        tasks.spawn(async move {
            tokio::time::sleep_until(at).await;
            backend.lose(&key);
            h.record(Event::Lose { key });
        });
    }
    for (i, r) in schedule.resolutions.iter().enumerate() {
        let (admin, h, at) = (admin.clone(), history.clone(), start + ms(r.at_ms));
        let (key, completed) = (full_key(r.key, false), r.completed);
        tasks.spawn(async move {
            tokio::time::sleep_until(at).await;
            resolve(&admin, &h, key, completed, i).await;
        });
    }
    for group in schedule.groups() {
        let group: Vec<(CallId, CallSpec)> = group.into_iter().map(|id| (id, schedule.calls[id].clone())).collect();
        let spec = &group[0].1;
        let (idem, h, at) = (idems[spec.proc].clone(), history.clone(), start + ms(spec.at_ms));
        let timeout = ms(schedule.timeouts_ms[spec.proc]);
        let tokens = tokens.clone();
        tasks.spawn(async move {
            tokio::time::sleep_until(at).await;
            match &group[..] {
                [(id, spec)] => _ = one_call(&idem, &h, *id, spec, timeout, false, &tokens, None).await,
                _ => one_batch(&idem, &h, &group, timeout, &tokens).await,
            }
        });
    }
    // Every call ends within its bound (I6 says how long); a minute of schedule time is far past it.
    let _ = tokio::time::timeout(Duration::from_secs(60), async { while tasks.join_next().await.is_some() {} }).await;

    // Once every fault has ended: every lease may run out, every background commit and release
    // may land. Then every key must be free or completed (I5).
    let longest_ttl = schedule.calls.iter().map(|c| c.ttl_ms).filter(|t| *t <= 60_000).max().unwrap_or(0);
    let settled = start + ms(schedule.faults_end_ms()) + ms(longest_ttl) + 10 * longest_timeout;
    tokio::time::sleep_until(settled.max(Instant::now() + 10 * longest_timeout)).await;
    probe_every_key(schedule, &idems, &history, &tokens).await;
    drop(idems);
    drop(admin);
    history
}

/// An operator's resolution of `key`'s unknown outcome (the `i`-th of the schedule): completed
/// with a value of its own (`r<i>`), or not done; recorded with what the store said.
pub async fn resolve(admin: &Idempotency, h: &History, key: String, completed: bool, i: usize) {
    let sent = h.now();
    let value = completed.then(|| format!("r{i}"));
    let how = match &value {
        Some(v) => idempotency::Resolve::completed(v).expect("a string is JSON"),
        None => idempotency::Resolve::NotDone,
    };
    let done = matches!(admin.resolve("", &key, how).await, Ok(idempotency::store::Resolved::Done));
    h.record(Event::Resolve { key, sent, value, done });
}

/// How many times a probe that failed with a store error is made, [`PROBE_PAUSE`] apart: a store
/// error on a healthy server is a call that lost a race with a short store timeout on a loaded
/// machine, not a stuck key; a key every try of which fails is one (I5).
pub const PROBE_TRIES: usize = 5;
/// A probe's lease.
pub const PROBE_TTL_MS: u64 = 1000;
/// The pause between two tries of a probe: past the lease of the try that failed, which may have
/// left its own key held (its release did not land, or its acquire landed unanswered).
pub const PROBE_PAUSE: Duration = Duration::from_millis(PROBE_TTL_MS + 200);
/// How long the schedules' tokens are issued for.
pub const TOKEN_LIFE: Duration = Duration::from_secs(60);

/// Probes every key of `schedule` from every process, once faults and leases are over (I5): the
/// probes are numbered after the schedule's calls.
pub async fn probe_every_key(schedule: &Schedule, idems: &[Idempotency], history: &History, tokens: &[String]) {
    let mut id = schedule.calls.len();
    let mut keys: Vec<(usize, bool, bool)> =
        schedule.calls.iter().map(|c| (c.key, c.lock, c.token && !c.lock)).collect();
    keys.sort_unstable();
    keys.dedup();
    for (key, lock, token) in keys {
        for (proc, idem) in idems.iter().enumerate() {
            let probe = CallSpec {
                at_ms: 0,
                proc,
                key,
                lock,
                batch: false,
                in_transaction: false,
                with_previous: false,
                token,
                ttl_ms: PROBE_TTL_MS,
                keep_ms: 1000,
                wait_ms: None,
                reject_duplicates: false,
                abort_on_lease_lost: false,
                renew: true,
                fence_ms: Some(0),
                steps_ms: Vec::new(),
                end: End::Ok,
                cancel_ms: None,
                hold: false,
                give_up: None,
            };
            for _ in 0..PROBE_TRIES {
                let timeout = ms(schedule.timeouts_ms[proc]);
                let returned = one_call(idem, history, id, &probe, timeout, true, tokens, None).await;
                id += 1;
                if !matches!(returned, Returned::Err(e) if e == "Store") {
                    break;
                }
                tokio::time::sleep(PROBE_PAUSE).await;
            }
        }
    }
}

/// Makes one call (or takes one lock) as `spec` says, records what happened, and returns it.
#[allow(clippy::too_many_arguments)]
pub async fn one_call(
    idem: &Idempotency,
    h: &History,
    id: CallId,
    spec: &CallSpec,
    timeout: Duration,
    probe: bool,
    tokens: &[String],
    tx: Option<&dyn InTransaction>,
) -> Returned {
    // A batch in a transaction where the layer has one; else as the spec says otherwise.
    let tx = tx.filter(|_| spec.batch && spec.in_transaction && !spec.lock);
    invoke(h, id, spec, timeout, probe, tx.is_some(), Duration::ZERO);
    let work = async {
        if spec.lock {
            take_lock(idem, h, id, spec).await
        } else {
            guarded(idem, h, id, spec, tokens, tx).await
        }
    };
    let caught = caught(work);
    let returned = match spec.cancel_ms {
        Some(after) => tokio::time::timeout(ms(after), caught).await.unwrap_or(Err(Returned::Cancelled)),
        None => caught.await,
    };
    let returned = returned.unwrap_or_else(|r| r);
    h.record(Event::Return { call: id, returned: returned.clone() });
    returned
}

/// Records the call `id` invoked as `spec` says; `others` is how long the bodies of the calls
/// claimed in the same batch may take besides its own (its items settle together).
fn invoke(
    h: &History,
    id: CallId,
    spec: &CallSpec,
    timeout: Duration,
    probe: bool,
    transactional: bool,
    others: Duration,
) {
    let patience = spec.wait_ms.map_or(Duration::ZERO, ms);
    // Acquiring: each acquire (and the watch) within the store's timeout, after the patience; the
    // commit within its deadline (twice the timeout); a release within the timeout.
    let bound = patience + 6 * timeout + ms(20) + others;
    h.record(Event::Invoke {
        call: id,
        proc: spec.proc,
        key: key_of(spec),
        // A used token's record is kept until the token expires and the clock skew allowed
        // after it, whatever `keep` says: at most its life and the skew.
        keep: if spec.token && !spec.lock { TOKEN_LIFE + idempotency::DEFAULT_TOKEN_SKEW } else { ms(spec.keep_ms) },
        lock: spec.lock,
        // A lock guard is not aborted: its holder selects on `lost()` itself.
        abort: spec.abort_on_lease_lost && !spec.lock,
        bound,
        probe,
        unholdable: unholdable(spec),
        token: spec.token && !spec.lock,
        transactional,
        ttl: ms(spec.ttl_ms),
        hold: spec.hold && !spec.lock,
        give_up: spec.give_up.filter(|_| !spec.lock),
    });
}

/// `fut`'s output, or `Returned::Panicked` if polling it panicked.
async fn caught<T>(fut: impl Future<Output = T>) -> Result<T, Returned> {
    let mut fut = pin!(fut);
    std::future::poll_fn(|cx| match catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
        Ok(Poll::Pending) => Poll::Pending,
        Ok(Poll::Ready(r)) => Poll::Ready(Ok(r)),
        Err(_) => Poll::Ready(Err(Returned::Panicked)),
    })
    .await
}

/// The call `spec` makes.
fn call_of(spec: &CallSpec, tokens: &[String]) -> Call {
    let call = if spec.token {
        Call::token(tokens[spec.key].as_str())
    } else {
        Call::new(format!("k{}", spec.key)).scope(SCOPE)
    };
    let call = call
        .ttl(ms(spec.ttl_ms))
        .keep(ms(spec.keep_ms))
        .on_conflict(spec.wait_ms.map_or(OnConflict::Reject, |w| OnConflict::Wait(ms(w))))
        .on_duplicate(if spec.reject_duplicates { OnDuplicate::Reject } else { OnDuplicate::Replay })
        .abort_on_lease_lost(spec.abort_on_lease_lost)
        .renew(spec.renew)
        .on_crash(if spec.hold { OnCrash::Hold } else { OnCrash::Rerun });
    match spec.give_up {
        Some(n) => call.give_up_after(n),
        None => call,
    }
}

/// The body of the call `id`, as `spec` says, under the context of its call.
async fn body(h: &History, id: CallId, spec: &CallSpec) -> Result<String, AppError> {
    let ctx = CallContext::current().expect("a guarded body has its context");
    let mut ended = Ending { h, call: id, done: false };
    h.record(Event::BodyStart {
        call: id,
        owner: ctx.owner().to_owned(),
        fence: None,
        attempt: ctx.attempt(),
        lost: ctx.is_lease_lost(),
    });
    // The fence, if the body asks for it, while its steps go on: read from the store on
    // Redis (the acquisition left it unread), at any point of the lease.
    let fence_read = async {
        if let Some(after) = spec.fence_ms {
            tokio::time::sleep(ms(after)).await;
            let fence = ctx.fence().await.ok();
            h.record(Event::FenceRead { call: id, fence });
        }
    };
    steps(h, id, &spec.steps_ms, || ctx.is_lease_lost(), [ctx.lost()], fence_read).await;
    ended.done = true;
    let value = format!("v{id}");
    match spec.end {
        End::Ok => {
            h.record(Event::BodyEnd { call: id, end: BodyEnd::Ok(value.clone()) });
            Ok(value)
        }
        End::Err => {
            h.record(Event::BodyEnd { call: id, end: BodyEnd::Failed });
            Err(AppError::Body)
        }
        End::Panic => {
            h.record(Event::BodyEnd { call: id, end: BodyEnd::Panicked });
            panic!("{PLANNED_PANIC}");
        }
    }
}

/// What a batch's item settled as, as the call returns it.
fn returned_of(settled: Settled<String, AppError>) -> Returned {
    match settled {
        Settled::Executed { value, stored } => Returned::Ok { value, replayed: false, cached: false, stored },
        Settled::Replayed(Ok(value)) => Returned::Ok { value, replayed: true, cached: false, stored: true },
        Settled::Failed(AppError::Body) | Settled::GaveUp { error: AppError::Body, .. } => Returned::BodyErr,
        Settled::Failed(AppError::Lib(e)) | Settled::GaveUp { error: AppError::Lib(e), .. } => {
            Returned::Err(error_name(&e))
        }
        // As one call that does not wait is told.
        Settled::InProgress => Returned::Err("Conflict".into()),
        Settled::Replayed(Err(e)) | Settled::Refused(e) | Settled::Unavailable(e) | Settled::Held(e) => {
            Returned::Err(error_name(&e))
        }
    }
}

/// Makes the calls of one batch of several (`CallSpec::with_previous`) as their specs say,
/// claimed together and their bodies run at once, and records each as a call of its own: its
/// invocation (its bound counting the others' bodies too: the items settle together) and what
/// it returned.
pub async fn one_batch(
    idem: &Idempotency,
    h: &History,
    group: &[(CallId, CallSpec)],
    timeout: Duration,
    tokens: &[String],
) {
    // A body takes its steps, and alongside them a fence read that starts `fence_ms` in and
    // takes at most the store's timeout.
    let longest = |spec: &CallSpec| ms(spec.steps_ms.iter().sum::<u64>().max(spec.fence_ms.unwrap_or(0))) + timeout;
    let all: Duration = group.iter().map(|(_, spec)| longest(spec)).sum();
    for (id, spec) in group {
        invoke(h, *id, spec, timeout, false, false, all - longest(spec));
    }
    let work = async {
        let batch = idem.claim::<String>(group.iter().map(|(_, spec)| call_of(spec, tokens))).await;
        batch.run(group.len(), |i, _| body(h, group[i].0, &group[i].1)).await
    };
    let mut settled = caught(work).await.ok().map(|items| items.into_iter());
    for (id, _) in group {
        let returned = settled.as_mut().and_then(Iterator::next).map_or(Returned::Panicked, returned_of);
        h.record(Event::Return { call: *id, returned });
    }
}

async fn guarded(
    idem: &Idempotency,
    h: &History,
    id: CallId,
    spec: &CallSpec,
    tokens: &[String],
    tx: Option<&dyn InTransaction>,
) -> Returned {
    let call = call_of(spec, tokens);
    let body = || body(h, id, spec);
    if spec.batch {
        let batch = idem.claim::<String>([call]).await;
        let settled = match tx {
            Some(tx) => {
                // The transaction's commit does not pass the store's boundary, where the history
                // records commands: it is recorded here, sent once the body returned its value
                // (the commit follows it), answered when the batch has settled the item.
                let commit = (spec.proc + TX_COMMITS, id as u64);
                let body = async {
                    let out = body().await;
                    if out.is_ok() {
                        let ctx = CallContext::current().expect("a batch's body has its context");
                        let (key, owner) = (ctx.key().to_owned(), ctx.owner().to_owned());
                        h.record(Event::OpSent { proc: commit.0, id: commit.1, kind: OpKind::Commit, key, owner });
                    }
                    out
                };
                let settled = tx.run_one(batch, Box::pin(body)).await;
                let sent = h
                    .events()
                    .iter()
                    .any(|(_, e)| matches!(e, Event::OpSent { proc, id, .. } if (*proc, *id) == commit));
                if sent {
                    let result = match &settled {
                        Settled::Executed { stored: true, .. } => OpResult::Done,
                        Settled::Unavailable(idempotency::Error::LeaseLost { .. }) => OpResult::Lost,
                        _ => OpResult::Error,
                    };
                    h.record(Event::OpAnswered { proc: commit.0, id: commit.1, result });
                }
                settled
            }
            None => {
                let settled = batch.run(1, |_, _| body()).await;
                settled.into_iter().next().expect("a batch of one settles one item")
            }
        };
        return returned_of(settled);
    }
    match idem.run_with_outcome(call, body).await {
        Ok((value, outcome)) => {
            Returned::Ok { value, replayed: outcome.replayed, cached: outcome.attempts == 0, stored: outcome.stored }
        }
        Err(AppError::Lib(e)) => Returned::Err(error_name(&e)),
        Err(AppError::Body) => Returned::BodyErr,
    }
}

async fn take_lock(idem: &Idempotency, h: &History, id: CallId, spec: &CallSpec) -> Returned {
    let request = idem.lock(format!("k{}", spec.key)).ttl(ms(spec.ttl_ms));
    let taken = match spec.wait_ms {
        Some(w) => request.wait(ms(w)).await,
        None => request.acquire().await,
    };
    let guard = match taken {
        Ok(guard) => guard,
        Err(e) => return Returned::Err(error_name(&e)),
    };
    let mut ended = Ending { h, call: id, done: false };
    h.record(Event::BodyStart {
        call: id,
        owner: String::new(),
        fence: Some(guard.fence()),
        attempt: 0,
        lost: guard.is_lost(),
    });
    // Two tasks' worth of waiters on `lost()`: every one must resolve.
    steps(h, id, &spec.steps_ms, || guard.is_lost(), [guard.lost(), guard.lost()], async {}).await;
    ended.done = true;
    h.record(Event::BodyEnd { call: id, end: BodyEnd::Ok(String::new()) });
    if guard.is_lost() {
        let woken =
            h.events().iter().filter(|(_, e)| matches!(e, Event::Told { call, .. } if *call == id)).count() as u8;
        h.record(Event::LockLost { call: id, woken });
    }
    match guard.release().await {
        Ok(()) => Returned::Ok { value: String::new(), replayed: false, cached: false, stored: true },
        Err(e) => Returned::Err(error_name(&e)),
    }
}

/// A body's steps: it sleeps each and records an effect after each, and runs `alongside` (a
/// fence read) meanwhile, while every future of `lost` (the lease known lost) is watched and
/// recorded as a `Told` when it resolves, until both are done.
async fn steps<const N: usize>(
    h: &History,
    id: CallId,
    steps_ms: &[u64],
    is_lost: impl Fn() -> bool,
    lost: [impl Future<Output = &'static str>; N],
    alongside: impl Future<Output = ()>,
) {
    // What the body does besides its steps (a fence read) runs while the watchers listen too.
    let work = async {
        let stepping = async {
            for &step in steps_ms {
                tokio::time::sleep(ms(step)).await;
                h.record(Event::Effect { call: id, lost: is_lost() });
            }
        };
        tokio::join!(stepping, alongside);
    };
    let mut watchers: Vec<_> = lost
        .into_iter()
        .enumerate()
        .map(|(which, fut)| {
            Box::pin(async move {
                fut.await;
                h.record(Event::Told { call: id, which: which as u8 });
                std::future::pending::<()>().await;
            })
        })
        .collect();
    let mut work = pin!(work);
    std::future::poll_fn(|cx| {
        // The watchers first: a loss that is known when a step wakes is recorded before it.
        for w in &mut watchers {
            let _ = w.as_mut().poll(cx);
        }
        work.as_mut().poll(cx)
    })
    .await
}

/// Records a body dropped before it finished.
struct Ending<'a> {
    h: &'a History,
    call: CallId,
    done: bool,
}

impl Drop for Ending<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.h.record(Event::BodyEnd { call: self.call, end: BodyEnd::Dropped });
        }
    }
}
