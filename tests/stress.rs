//! A randomized stress run against a real Redis, bounded in time: many workers over few keys,
//! most of them through a fault-injecting proxy (latency, dropped and cut connections, black
//! holes), with random body durations, errors, panics and cancellations, checked by an invariant
//! checker. `IDEM_STRESS_SECS` sets the duration (default 45 s), `IDEM_STRESS_SEED` replays a
//! run's random choices (the seed is printed).

mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotency::store::{AcquireOutcome, AcquireRequest};
use idempotency::{Call, CallContext, Error, Idempotency, MemoryStore, OnConflict, RedisStore, Store};
use support::proxy::{Direction, Proxy};
use support::{ms, AppError, RedisServer, R};
use tokio::time::Instant;

/// xorshift64*: small, seedable, good enough to pick faults.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }
}

fn seed() -> u64 {
    match std::env::var("IDEM_STRESS_SEED") {
        Ok(s) => s.trim().parse().expect("IDEM_STRESS_SEED is not a u64"),
        Err(_) => {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
            t.as_nanos() as u64 ^ u64::from(std::process::id()) << 32
        }
    }
}

fn run_time() -> Duration {
    let secs = std::env::var("IDEM_STRESS_SECS").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(45);
    Duration::from_secs(secs)
}

/// Planned panics say so, and are not printed.
const PLANNED: &str = "stress: planned panic";

fn quiet_planned_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !is_planned(info.payload()) {
                default(info)
            }
        }));
    });
}

fn is_planned(payload: &(dyn std::any::Any + Send)) -> bool {
    payload.downcast_ref::<&str>() == Some(&PLANNED) || payload.downcast_ref::<String>().is_some_and(|s| s == PLANNED)
}

/// The invariant checker: which bodies run on which key with which lease, the values bodies
/// produced and the values callers got as replays.
#[derive(Default)]
struct Checker {
    active: Mutex<HashMap<String, Vec<(u64, CallContext)>>>,
    next_id: AtomicU64,
    /// Values bodies produced, per key (whether or not they were stored).
    produced: Mutex<HashMap<String, HashSet<String>>>,
    /// Values callers got without their body running, per key.
    replays: Mutex<HashMap<String, HashSet<String>>>,
    keys: Mutex<HashSet<String>>,
    violations: Mutex<Vec<String>>,
    executions: AtomicUsize,
    lease_losses: AtomicUsize,
    overlaps_checked: AtomicUsize,
}

/// A body in progress; leaves the checker when dropped (ended, panicked or cancelled).
struct Active {
    checker: Arc<Checker>,
    key: String,
    id: u64,
    context: CallContext,
}

impl Checker {
    fn violation(&self, what: String) {
        self.violations.lock().unwrap().push(what);
    }

    /// A body starts on `key`: every other body still running on it must know its lease is
    /// lost, or two bodies overlap while both hold valid leases.
    fn enter(self: &Arc<Self>, key: &str, context: CallContext) -> Active {
        let id = self.next_id.fetch_add(1, SeqCst);
        self.executions.fetch_add(1, SeqCst);
        let mut active = self.active.lock().unwrap();
        let here = active.entry(key.to_owned()).or_default();
        for (other, ctx) in here.iter() {
            self.overlaps_checked.fetch_add(1, SeqCst);
            if !ctx.is_lease_lost() {
                self.violation(format!(
                    "{key}: body {id} (owner {}) started while body {other} (owner {}) still held a valid lease",
                    context.owner(),
                    ctx.owner()
                ));
            }
        }
        here.push((id, context.clone()));
        Active { checker: self.clone(), key: key.to_owned(), id, context }
    }

    fn produced(&self, key: &str, value: &str) {
        self.produced.lock().unwrap().entry(key.to_owned()).or_default().insert(value.to_owned());
    }

    fn replayed(&self, key: &str, value: String) {
        self.replays.lock().unwrap().entry(key.to_owned()).or_default().insert(value);
    }

    /// After the run, once every lease has run out: each key is free or completed, each
    /// completed key holds a value a body produced, and every replay of a key gave that value.
    async fn final_check(&self, store: &dyn Store) -> BTreeMap<&'static str, usize> {
        let mut states = BTreeMap::new();
        let keys: Vec<String> = self.keys.lock().unwrap().iter().cloned().collect();
        for key in keys {
            let req = AcquireRequest {
                key: &key,
                owner: "final-check",
                lease: Duration::from_secs(10),
                fingerprint: None,
                will_wait: false,
                report_ttl: false,
                fence_now: false,
                lapse: idempotency::store::Lapse::Free,
                keep: Duration::ZERO,
            };
            let replays = self.replays.lock().unwrap().get(&key).cloned().unwrap_or_default();
            let produced = self.produced.lock().unwrap().get(&key).cloned().unwrap_or_default();
            if replays.len() > 1 {
                self.violation(format!("{key}: replays gave different values {replays:?}"));
            }
            match store.acquire(req).await {
                Ok(AcquireOutcome::Acquired { .. }) => {
                    *states.entry("free").or_default() += 1;
                    let _ = store.release(&key, "final-check").await;
                    if !replays.is_empty() {
                        self.violation(format!("{key}: replayed {replays:?}, but its record is gone"));
                    }
                }
                Ok(AcquireOutcome::Completed { .. }) if is_mutex(&key) => {
                    *states.entry("completed mutex").or_default() += 1;
                    self.violation(format!("{key}: a mutex key (keep 0) kept a completed record"));
                }
                Ok(AcquireOutcome::Completed { result: Some(bytes), .. }) => {
                    *states.entry("completed").or_default() += 1;
                    let value: String = serde_json::from_slice(&bytes).expect("a stored string");
                    if !produced.contains(&value) {
                        self.violation(format!("{key}: holds {value:?}, which no body produced"));
                    }
                    if replays.iter().any(|r| *r != value) {
                        self.violation(format!("{key}: holds {value:?} but replayed {replays:?}"));
                    }
                }
                other => {
                    *states.entry("held or other").or_default() += 1;
                    self.violation(format!("{key}: after every lease ran out the key is {other:?}"));
                }
            }
        }
        states
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        if self.context.is_lease_lost() {
            self.checker.lease_losses.fetch_add(1, SeqCst);
        }
        let mut active = self.checker.active.lock().unwrap();
        if let Some(here) = active.get_mut(&self.key) {
            here.retain(|(id, _)| *id != self.id);
        }
    }
}

/// What callers saw.
#[derive(Default)]
struct Counts {
    replays: AtomicUsize,
    conflicts: AtomicUsize,
    lease_lost_aborts: AtomicUsize,
    body_errors: AtomicUsize,
    panics: AtomicUsize,
    cancellations: AtomicUsize,
    store_errors: AtomicUsize,
    wait_timeouts: AtomicUsize,
    oks: AtomicUsize,
}

enum Ending {
    Value,
    Error,
    Panic,
}

/// One random call, its outcome counted.
async fn one_call(rng: &mut Rng, idem: &Idempotency, key: String, checker: &Arc<Checker>, counts: &Counts) {
    // At least 800 ms: a holder is told of a lost lease a tenth of the lease before Redis
    // frees the key, and that tenth must cover the watchdog's timer on a loaded machine.
    let ttl = ms(rng.range(800, 1500));
    let length = ms(match rng.below(20) {
        0..=11 => rng.range(0, 50),
        12..=16 => rng.range(50, 400),
        _ => rng.range(400, 2500),
    });
    let ending = match rng.below(100) {
        0..=79 => Ending::Value,
        80..=94 => Ending::Error,
        _ => Ending::Panic,
    };
    let cancel_after = rng.percent(10).then(|| ms(rng.range(0, length.as_millis() as u64 + 100)));
    // Mutex keys keep nothing (every call may run the body); the others keep their result.
    let keep = if is_mutex(&key) { Duration::ZERO } else { Duration::from_secs(3600) };
    let mut call = Call::new(key.clone()).ttl(ttl).keep(keep).abort_on_lease_lost(rng.percent(50));
    if rng.percent(20) {
        call = call.on_conflict(OnConflict::Wait(ms(rng.range(50, 1500))));
    }
    checker.keys.lock().unwrap().insert(key.clone());
    let ran = Arc::new(AtomicBool::new(false));
    let (idem, checker_in, ran_in, key_in) = (idem.clone(), checker.clone(), ran.clone(), key.clone());
    let task = tokio::spawn(async move {
        let body = move || async move {
            ran_in.store(true, SeqCst);
            let context = CallContext::current().expect("inside the call");
            // Read from the store on Redis (the acquisition leaves it unread): the read is part of
            // what the stress puts under faults.
            let fence = context.fence().await.map_err(AppError::Idem)?;
            let _active = checker_in.enter(&key_in, context);
            tokio::time::sleep(length).await;
            match ending {
                Ending::Value => {
                    let value = format!("{key_in} by fence {fence}");
                    checker_in.produced(&key_in, &value);
                    R::Ok(value)
                }
                Ending::Error => Err(AppError::Failed("stress: planned error")),
                Ending::Panic => std::panic::panic_any(PLANNED),
            }
        };
        let run = idem.run(call, body);
        match cancel_after {
            Some(after) => tokio::time::timeout(after, run).await.ok(),
            None => Some(run.await),
        }
    });
    match task.await {
        Err(join) => match join.try_into_panic() {
            Ok(payload) if is_planned(&*payload) => counts.panics.fetch_add(1, SeqCst),
            Ok(payload) => std::panic::resume_unwind(payload),
            Err(e) => panic!("{e}"),
        },
        Ok(None) => counts.cancellations.fetch_add(1, SeqCst),
        Ok(Some(Ok(value))) => {
            if !ran.load(SeqCst) {
                checker.replayed(&key, value);
                counts.replays.fetch_add(1, SeqCst)
            } else {
                counts.oks.fetch_add(1, SeqCst)
            }
        }
        Ok(Some(Err(e))) => match e {
            AppError::Idem(Error::Conflict { .. }) => counts.conflicts.fetch_add(1, SeqCst),
            AppError::Idem(Error::LeaseLost { .. }) => counts.lease_lost_aborts.fetch_add(1, SeqCst),
            AppError::Idem(Error::Store { .. }) => counts.store_errors.fetch_add(1, SeqCst),
            AppError::Idem(Error::Timeout { .. }) => counts.wait_timeouts.fetch_add(1, SeqCst),
            AppError::Failed(_) => counts.body_errors.fetch_add(1, SeqCst),
            other => {
                checker.violation(format!("{key}: unexpected error {other:?}"));
                0
            }
        },
    };
}

fn is_mutex(key: &str) -> bool {
    key.contains(":mutex:")
}

/// What the fault injector did.
#[derive(Debug, Default)]
struct Faults {
    latency_changes: usize,
    drops: usize,
    connections_dropped: usize,
    cuts: usize,
    black_holes: usize,
    heals: usize,
}

async fn inject_faults(proxy: Arc<Proxy>, mut rng: Rng, until: Instant) -> Faults {
    let mut f = Faults::default();
    while Instant::now() < until {
        tokio::time::sleep(ms(rng.range(200, 900))).await;
        match rng.below(11) {
            0..=2 => {
                proxy.set_latency(Direction::Up, ms(rng.range(0, 40)));
                proxy.set_latency(Direction::Down, ms(rng.range(0, 40)));
                f.latency_changes += 1;
            }
            3..=4 => {
                f.connections_dropped += proxy.drop_all();
                f.drops += 1;
            }
            5..=6 => {
                let dir = if rng.percent(50) { Direction::Up } else { Direction::Down };
                proxy.cut_after(dir, rng.range(1, 3000) as usize);
                f.cuts += 1;
            }
            7..=8 => {
                proxy.black_hole();
                tokio::time::sleep(ms(rng.range(300, 2000))).await;
                proxy.heal();
                f.black_holes += 1;
            }
            _ => {
                proxy.heal();
                f.heals += 1;
            }
        }
    }
    proxy.heal();
    f
}

/// The stress run: prints its seed first, then counts; fails on any invariant violation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomized_stress_run() {
    quiet_planned_panics();
    let seed = seed();
    let duration = run_time();
    println!("stress seed {seed} (replay its choices with IDEM_STRESS_SEED={seed}), running {duration:?}");
    let server = RedisServer::start();
    let proxy = Arc::new(Proxy::start(server.port()));
    let direct_store = RedisStore::builder(&server.url()).timeout(Duration::from_secs(2)).connect().await.unwrap();
    let mut clients = vec![Idempotency::new(direct_store.clone())];
    for _ in 0..3 {
        let store = RedisStore::builder(&proxy.url()).timeout(Duration::from_secs(1)).connect().await.unwrap();
        clients.push(Idempotency::new(store));
    }
    let checker = Arc::new(Checker::default());
    let counts = Arc::new(Counts::default());
    let started = Instant::now();
    let until = started + duration;
    const WORKERS: u64 = 16;
    const KEYS: u64 = 2;
    const GENERATION_MS: u128 = 1000;
    let faults = tokio::spawn(inject_faults(proxy.clone(), Rng::new(seed ^ 0xFA17), until));
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let (clients, checker, counts) = (clients.clone(), checker.clone(), counts.clone());
        workers.push(tokio::spawn(async move {
            let mut rng = Rng::new(seed.wrapping_add(w + 1));
            while Instant::now() < until {
                // Few keys at a time: two mutex keys (nothing kept) for the whole run, and two
                // keys that keep their result, a new generation of them every second.
                let generation = started.elapsed().as_millis() / GENERATION_MS;
                let key = if rng.percent(50) {
                    format!("stress:mutex:{}", rng.below(KEYS))
                } else {
                    format!("stress:g{generation}:k{}", rng.below(KEYS))
                };
                let idem = &clients[rng.below(clients.len() as u64) as usize];
                one_call(&mut rng, idem, key, &checker, &counts).await;
                tokio::time::sleep(ms(rng.range(0, 30))).await;
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    let faults = faults.await.unwrap();
    let proxy_stats = proxy.stats();
    proxy.heal();
    // Every client is connected again and has sent what it queued (releases behind cancelled
    // calls, re-sent commands), then every lease taken has run out.
    for (i, idem) in clients.iter().enumerate() {
        let mut attempt = 0;
        support::eventually(Duration::from_secs(15), "a client to work again after the faults", || {
            attempt += 1;
            let call = Call::new(format!("flush:{i}:{attempt}"));
            async move { idem.run(call, || async { R::Ok(()) }).await.ok() }
        })
        .await;
    }
    tokio::time::sleep(ms(1500 + 300)).await;
    let states = checker.final_check(&direct_store).await;

    let c = &counts;
    let n = |a: &AtomicUsize| a.load(SeqCst);
    println!(
        "stress ({:?}, seed {seed}): {} executions, {} replays, {} conflicts, {} lease losses ({} aborted with \
         LeaseLost), {} body errors, {} panics, {} cancellations, {} store errors, {} wait timeouts, {} ok",
        started.elapsed(),
        n(&checker.executions),
        n(&c.replays),
        n(&c.conflicts),
        n(&checker.lease_losses),
        n(&c.lease_lost_aborts),
        n(&c.body_errors),
        n(&c.panics),
        n(&c.cancellations),
        n(&c.store_errors),
        n(&c.wait_timeouts),
        n(&c.oks)
    );
    println!(
        "faults injected: {faults:?}; proxy {proxy_stats:?}; {} overlap checks; keys at the end: {states:?}",
        n(&checker.overlaps_checked)
    );
    let violations = checker.violations.lock().unwrap();
    assert!(violations.is_empty(), "seed {seed}: {} violations:\n{}", violations.len(), violations.join("\n"));
    assert!(
        n(&checker.executions) > 100 && n(&c.replays) > 100,
        "seed {seed}: the run did too little to mean anything"
    );
    assert!(faults.drops + faults.cuts + faults.black_holes > 0, "seed {seed}: no fault was injected");
}

/// The checker itself can fail: a record deleted under a running body lets a second body start
/// while the first still believes its lease valid (an overlap), and a key held by a crashed
/// holder with a long lease is reported as held at the final check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checker_catches_overlaps_and_held_keys() {
    let memory = Arc::new(MemoryStore::new());
    let idem = Idempotency::builder_shared(memory.clone()).build();
    let checker = Arc::new(Checker::default());
    let body = |checker: Arc<Checker>, length: Duration| {
        move || async move {
            let _active = checker.enter("overlap", CallContext::current().unwrap());
            tokio::time::sleep(length).await;
            R::Ok(String::from("v"))
        }
    };
    let first = tokio::spawn({
        let (idem, checker) = (idem.clone(), checker.clone());
        async move { idem.run(Call::new("overlap").ttl(Duration::from_secs(30)), body(checker, ms(500))).await }
    });
    tokio::time::sleep(ms(100)).await;
    memory.remove("overlap");
    idem.run(Call::new("overlap"), body(checker.clone(), ms(10))).await.unwrap();
    first.await.unwrap().unwrap();
    assert_eq!(checker.violations.lock().unwrap().len(), 1, "the overlap was not caught");

    let crashed = AcquireRequest {
        key: "held",
        owner: "crashed",
        lease: Duration::from_secs(30),
        fingerprint: None,
        will_wait: false,
        report_ttl: false,
        fence_now: false,
        lapse: idempotency::store::Lapse::Free,
        keep: Duration::ZERO,
    };
    assert!(matches!(memory.acquire(crashed).await.unwrap(), AcquireOutcome::Acquired { .. }));
    checker.keys.lock().unwrap().insert("held".into());
    checker.violations.lock().unwrap().clear();
    let states = checker.final_check(&*memory).await;
    let violations = checker.violations.lock().unwrap();
    assert!(
        violations.iter().any(|v| v.starts_with("held:")),
        "the held key was not caught: {states:?} {violations:?}"
    );
}
