//! The explorer's layer on real servers: the deterministic layer's schedules (calls with their
//! policies, bodies, errors, panics, cancellations; faults; purges; record losses), played in
//! real time by three processes (each its own `Idempotency` with its own connections, through a
//! relay of its own) on a Redis 7.0, a Valkey 8.1, a Redis Cluster or a PostgreSQL started here,
//! with the faults put in from outside, and every history read by the same checker
//! (`idempotent_explore::check`, the invariants of `docs/guarantees.md`).
//!
//! What a schedule's faults become here:
//! - commands or replies late → the process's relay delays that direction;
//! - replies lost, pub/sub down → the relay drops every connection of the process at once (what
//!   was in flight may have landed; the client reconnects);
//! - commands refused → a partition: the relay swallows everything, then drops the connections;
//! - a split acquire → the server is stopped (`SIGSTOP`, `SIGCONT` up to 700 ms later; on the
//!   Cluster the primary of the schedule's first key; on PostgreSQL, whose backends are processes
//!   of their own, every process is partitioned instead, or, one time in two, the schedule's table
//!   is locked by a session of the harness for as long: statements wait on the server, whose
//!   `statement_timeout` cancels those that wait past it, and the client's grace
//!   (`store/postgres/pools.rs`) decides whether that cancel or the client's own bound answers
//!   the call);
//! - a record lost → Redis and Valkey are killed (`SIGKILL`) and started again empty, without
//!   their scripts (every record is lost, as the history says); the Cluster loses the record
//!   (`DEL` on its node) or, one time in three, fails over (the key's primary killed, its
//!   replica promoted, the old primary started again as a replica; with no replica to promote,
//!   the record is lost instead); PostgreSQL is crashed and restarted (`-m immediate`), which
//!   loses nothing, so the history says nothing is lost, and is slow to take connections from
//!   then on, probes included (each process's relay holds each new connection 150 to 250 ms,
//!   past the 100 ms store timeout some processes have: only the pools' refill,
//!   `store/postgres/pools.rs`, gets a call past it);
//! - and, here only, processes crash: nothing more leaves them, their calls are gone, and a new
//!   runtime takes their place after a while.
//!
//! Each test runs for `EXPLORE_SECONDS` (default 15) from seed `EXPLORE_SEED` (default: from the
//! clock, printed), and prints `explored on <store>: <schedules> schedules, <calls> calls,
//! <faults> faults, <violations> violations`; `scripts/explore.sh --store redis|valkey|cluster|
//! postgres|servers|all` runs them and adds the figures up. Real servers do not replay exactly:
//! a violation prints its seed (which makes the same schedule again), the schedule and the
//! history it produced.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotency::{Batch, Idempotency, PgStore, RedisStore, Settled, Store};
use idempotent_explore::check::check;
use idempotent_explore::history::{Event, History, OpResult, Returned};
use idempotent_explore::recorded::Recorded;
use idempotent_explore::run::{
    full_key, one_batch, one_call, probe_every_key, process_runtime, quiet_planned_panics, AppError, BoxedBody,
    InTransaction,
};
use idempotent_explore::schedule::{server_schedule, CallSpec, Crash, FaultKind, Schedule};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use std::future::Future;
use std::pin::Pin;
use support::postgres::PgCluster;
use support::proxy::{Direction, Proxy};
use support::{RedisCluster, RedisServer};
use tokio::sync::watch;
use tokio::time::Instant;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Schedules played on one server at once, each under a prefix (or schema) of its own.
const AT_ONCE: usize = 3;

/// The longest server stop: below the Cluster's node timeout (1 s), so that no failover starts.
const LONGEST_STOP_MS: u64 = 700;
/// After a PostgreSQL restart, each new connection is held this long at least (up to 100 ms
/// more) for the rest of the schedule, probes included: opening one takes longer than a 100 ms
/// store timeout lets a call wait, which only the pools' refill gets past.
const SLOW_CONNECT_MS: u64 = 150;

/// The servers a run plays on.
enum Kind {
    Redis(Mutex<RedisServer>),
    Cluster(Mutex<RedisCluster>),
    Postgres(Mutex<PgCluster>),
}

/// A server and the schedules playing on it at once (each under a key prefix, or a schema, of
/// its own).
struct Server {
    kind: Kind,
    /// The schedules playing now, by number: their histories and keys, so that a restart that
    /// empties the server is recorded in each.
    running: Mutex<BTreeMap<u64, (History, Vec<String>)>>,
    /// Held to read by a schedule probing its keys, to write by a fault that stops or restarts
    /// the server: a schedule's probes come after its own faults, and not in another's.
    quiet: tokio::sync::RwLock<()>,
    /// When the last stop or restart is over, clients reconnected included: another schedule's
    /// probes wait for it, as its own wait for the end of its own faults.
    calm_from: Mutex<Instant>,
}

/// How long after a stop or a restart clients may still be reconnecting.
const RECOVERY: Duration = Duration::from_secs(3);

impl Server {
    fn new(kind: Kind) -> Self {
        Server {
            kind,
            running: Mutex::default(),
            quiet: tokio::sync::RwLock::new(()),
            calm_from: Mutex::new(Instant::now()),
        }
    }

    /// Records in every schedule playing on the server that each of its records is lost (a
    /// restart that empties the server, a failover).
    fn lose_everything(&self) {
        for (h, keys) in lock(&self.running).values() {
            for k in keys {
                h.record(Event::Lose { key: k.clone() });
            }
        }
    }

    /// Takes the server for a stop or a restart, until the guard goes (plus [`RECOVERY`]).
    async fn upset(&self) -> Upset<'_> {
        Upset { server: self, _quiet: self.quiet.write().await }
    }

    /// Waits until no stop or restart is on or recent, and holds off new ones until the guard
    /// goes.
    async fn calm(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        loop {
            let quiet = self.quiet.read().await;
            let from = *lock(&self.calm_from);
            if Instant::now() >= from {
                return quiet;
            }
            drop(quiet);
            tokio::time::sleep_until(from).await;
        }
    }

    fn name(&self, valkey: bool) -> &'static str {
        match &self.kind {
            Kind::Redis(_) if valkey => "valkey",
            Kind::Redis(_) => "redis",
            Kind::Cluster(_) => "cluster",
            Kind::Postgres(_) => "postgres",
        }
    }

    /// The port processes reach the server on (through their relays), if there is one.
    fn port(&self) -> Option<u16> {
        match &self.kind {
            Kind::Redis(s) => Some(lock(s).port()),
            Kind::Cluster(_) => None,
            Kind::Postgres(c) => Some(lock(c).base_url().rsplit(':').next()?.parse().ok()?),
        }
    }

    /// A store for one schedule (`n` names its records), through `relay` where there is one.
    async fn store(&self, n: u64, relay: Option<&Proxy>, timeout: Duration, first: bool) -> Connected {
        self.connect(n, relay, timeout, first).await
    }

    /// The store, and the `RedisStore` it is on Redis (for record keys). Connecting is tried
    /// again for a while: another schedule's fault may have the server stopped or restarting,
    /// and a PostgreSQL pool opens its connections within 0.8 of the store's timeout (80 ms for
    /// the short one), which a backend started right after a crash-restart on a loaded machine
    /// can miss. A schedule that cannot start is no finding.
    async fn connect(&self, n: u64, relay: Option<&Proxy>, timeout: Duration, first: bool) -> Connected {
        let mut tries = 0;
        loop {
            match self.try_connect(n, relay, timeout, first).await {
                Ok(connected) => return connected,
                Err(e) if tries >= 50 => panic!("{e}"),
                Err(_) => tries += 1,
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn try_connect(
        &self,
        n: u64,
        relay: Option<&Proxy>,
        timeout: Duration,
        first: bool,
    ) -> Result<Connected, String> {
        let port = relay.map(|r| r.url().rsplit(':').next().unwrap().to_owned());
        match &self.kind {
            Kind::Redis(_) | Kind::Cluster(_) => {
                let url = match (&self.kind, port) {
                    (Kind::Cluster(c), _) => lock(c).url(),
                    (_, Some(p)) => format!("redis://127.0.0.1:{p}"),
                    (_, None) => format!("redis://127.0.0.1:{}", self.port().unwrap()),
                };
                let store = RedisStore::builder(&url).prefix(format!("ex{n}")).timeout(timeout).connect().await;
                let store = store.map_err(|e| format!("connect to {url}: {e}"))?;
                Ok(Connected { store: Arc::new(store.clone()), redis: Some(store), pg: None, in_transaction: None })
            }
            Kind::Postgres(_) => {
                let p = port.unwrap_or_else(|| self.port().unwrap().to_string());
                let url = format!("postgres://postgres@127.0.0.1:{p}/postgres");
                let mut builder = PgStore::builder(&url).schema(format!("ex{n}")).pool_size(4).timeout(timeout);
                if first {
                    builder = builder.migrate();
                }
                let store = builder.connect().await.map_err(|e| format!("connect to {url}: {e}"))?;
                let in_transaction: Arc<dyn InTransaction> = Arc::new(PgInTransaction(store.clone()));
                let pg = Some(store.clone());
                Ok(Connected { store: Arc::new(store), redis: None, pg, in_transaction: Some(in_transaction) })
            }
        }
    }
}

/// A process's connection to the server: the store, the `RedisStore` it is on Redis (for record
/// keys), and on PostgreSQL its batches in one transaction with their records.
struct Connected {
    store: Arc<dyn Store>,
    redis: Option<RedisStore>,
    pg: Option<PgStore>,
    in_transaction: Option<Arc<dyn InTransaction>>,
}

/// PostgreSQL's inbox pattern (`PgStore::run_batch_in_transaction`) for the calls that ask for it.
struct PgInTransaction(PgStore);

impl InTransaction for PgInTransaction {
    fn run_one<'a>(
        &'a self,
        batch: Batch<String>,
        body: BoxedBody<'a>,
    ) -> Pin<Box<dyn Future<Output = Settled<String, AppError>> + Send + 'a>> {
        Box::pin(async move {
            let mut body = Some(body);
            let settled = self
                .0
                .run_batch_in_transaction(batch, move |tx, _, _| {
                    let body = body.take().expect("a batch of one runs one body");
                    async move { (tx, body.await) }
                })
                .await;
            settled.into_iter().next().expect("a batch of one settles one item")
        })
    }
}

/// A stop or restart of the server going on.
struct Upset<'a> {
    server: &'a Server,
    _quiet: tokio::sync::RwLockWriteGuard<'a, ()>,
}

impl Drop for Upset<'_> {
    fn drop(&mut self) {
        *lock(&self.server.calm_from) = Instant::now() + RECOVERY;
    }
}

/// The Cluster of a Cluster run.
fn cluster(server: &Server) -> std::sync::MutexGuard<'_, RedisCluster> {
    match &server.kind {
        Kind::Cluster(c) => lock(c),
        _ => panic!("not a cluster"),
    }
}

/// The standalone server of a Redis or Valkey run.
fn redis(server: &Server) -> std::sync::MutexGuard<'_, RedisServer> {
    match &server.kind {
        Kind::Redis(s) => lock(s),
        _ => panic!("not a standalone server"),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A process: its runtime now, its recorded store, and the signal its calls watch for a crash.
struct Life {
    idem: Option<Idempotency>,
    recorded: Arc<Recorded>,
    crashed: watch::Sender<bool>,
}

/// What the schedules played so far held.
#[derive(Default)]
struct Stats {
    schedules: u64,
    calls: u64,
    faults: BTreeMap<&'static str, u64>,
    /// Documented exceptions the checker met (a record the server lost, a forced purge, ...).
    exceptions: BTreeMap<&'static str, usize>,
    violations: u64,
    /// Batches of one run in a transaction with their records (PostgreSQL), and how many of them
    /// committed.
    in_transaction: (u64, u64),
    /// Batches of several calls (`CallSpec::with_previous`), and the calls in them.
    batches: (u64, u64),
}

/// What a run is asked for: how long, how many schedules at most, from which seed, and which
/// invariants count (all when empty).
struct Settings {
    limit: Duration,
    schedules: Option<u64>,
    seed: u64,
    only: Vec<String>,
}

fn settings() -> Settings {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let seconds = var("EXPLORE_SECONDS").and_then(|s| s.parse().ok()).unwrap_or(15.0);
    let seed = var("EXPLORE_SEED").and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
            % 1_000_000_000
    });
    Settings {
        limit: Duration::from_secs_f64(seconds),
        schedules: var("EXPLORE_SCHEDULES").and_then(|s| s.parse().ok()),
        seed,
        only: var("EXPLORE_INVARIANT").map(|v| v.split(',').map(str::to_owned).collect()).unwrap_or_default(),
    }
}

/// The schedule and crashes seed `seed` makes (the same on every machine).
fn generate(seed: u64) -> (Schedule, Vec<Crash>) {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &bytes);
    let mut runner = TestRunner::new_with_rng(Config::default(), rng);
    server_schedule().new_tree(&mut runner).expect("a schedule").current()
}

/// Runs schedules on `server` for the configured time and fails on any violation.
fn explore(server: Server, valkey: bool) {
    let Settings { limit, schedules, seed, only } = settings();
    // EXPLORE_SHOW=1: every schedule and its history, violation or not (to study a seed).
    let show = std::env::var("EXPLORE_SHOW").is_ok_and(|v| v == "1");
    let name = server.name(valkey);
    quiet_planned_panics();
    println!("explore on {name}: seeds from {seed} on, for {limit:?}");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let server = Arc::new(server);
    let mut stats = Stats::default();
    let started = std::time::Instant::now();
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async {
        let mut playing = tokio::task::JoinSet::new();
        let mut next = 0u64;
        loop {
            while playing.len() < AT_ONCE
                && started.elapsed() < limit
                && schedules.is_none_or(|n| next < n)
            {
                let (server, n) = (server.clone(), seed.wrapping_add(next));
                next += 1;
                // On this thread (the plays are not `Send`); what they spawn runs on the runtime.
                playing.spawn_local(async move {
                    let (schedule, crashes) = generate(n);
                    let (history, faults) = play(&server, n, &schedule, &crashes).await;
                    (n, schedule, crashes, history, faults)
                });
            }
            let Some(done) = playing.join_next().await else { break };
            let (seed, schedule, crashes, history, faults) = done.expect("a schedule's play");
            for (kind, n) in faults {
                *stats.faults.entry(kind).or_default() += n;
            }
            stats.schedules += 1;
            stats.calls += schedule.calls.len() as u64;
            for group in schedule.groups().iter().filter(|g| g.len() > 1) {
                stats.batches.0 += 1;
                stats.batches.1 += group.len() as u64;
            }
            let events = history.events();
            for (_, e) in &events {
                match e {
                    Event::Invoke { transactional: true, .. } => stats.in_transaction.0 += 1,
                    Event::OpAnswered { proc, result: OpResult::Done, .. } if *proc >= 1000 => stats.in_transaction.1 += 1,
                    _ => {}
                }
            }
            let report = check(&events);
            for (name, n) in &report.exceptions {
                *stats.exceptions.entry(name).or_default() += n;
            }
            let counted = |v: &&idempotent_explore::check::Violation| {
                only.is_empty() || only.iter().any(|i| v.to_string().contains(i.as_str()))
            };
            match report.violations.iter().find(counted) {
                Some(v) => {
                    stats.violations += 1;
                    println!("\nVIOLATION seed {seed} store {name}: {v}");
                }
                None if show => println!("\nseed {seed} store {name}: no violation"),
                None => continue,
            }
            println!("schedule:\n{schedule}");
            for c in &crashes {
                println!("  crash p{} at {}ms, back {}ms later", c.proc, c.at_ms, c.down_ms);
            }
            println!("its history (us):");
            for (t, e) in &events {
                println!("  {t:>9} {e:?}");
            }
            println!(
                "again: bash scripts/explore.sh --store {name} --seed {seed} --schedules 1 (real servers do not replay exactly)"
            );
        }
    });
    let faults: u64 = stats.faults.values().sum();
    let kinds: Vec<String> = stats.faults.iter().map(|(k, n)| format!("{k} {n}")).collect();
    println!("faults on {name} by kind: {}", kinds.join(", "));
    let named: Vec<String> = stats.exceptions.iter().map(|(k, n)| format!("{k}: {n}")).collect();
    println!(
        "documented exceptions met on {name}: {}",
        if named.is_empty() { "none".into() } else { named.join(", ") }
    );
    println!("batches of several calls on {name}: {} ({} calls)", stats.batches.0, stats.batches.1);
    if stats.in_transaction.0 > 0 {
        let (calls, committed) = stats.in_transaction;
        println!("batches in one transaction with their records on {name}: {calls} calls, {committed} committed");
    }
    println!(
        "explored on {name}: {} schedules, {} calls, {faults} faults, {} violations",
        stats.schedules, stats.calls, stats.violations
    );
    assert_eq!(stats.violations, 0, "the explorer found violations on {name} (above)");
}

/// Plays one schedule; returns its history and the faults it put in, by kind.
async fn play(
    server: &Arc<Server>,
    n: u64,
    schedule: &Schedule,
    crashes: &[Crash],
) -> (History, BTreeMap<&'static str, u64>) {
    let history = History::new();
    lock(&server.running).insert(n, (history.clone(), all_keys(schedule)));
    let mut faults = BTreeMap::new();
    let procs = schedule.caches.len();
    let relays: Vec<Option<Proxy>> = (0..procs).map(|_| server.port().map(Proxy::start)).collect();
    // Connected while no other schedule stops or restarts the server.
    let quiet = server.quiet.read().await;
    let mut inner: Vec<Arc<dyn Store>> = Vec::new();
    let mut in_transaction: Vec<Option<Arc<dyn InTransaction>>> = Vec::new();
    for (p, relay) in relays.iter().enumerate() {
        let connected = server.store(n, relay.as_ref(), ms(schedule.timeouts_ms[p]), p == 0).await;
        inner.push(connected.store);
        in_transaction.push(connected.in_transaction);
    }
    let admin = server.connect(n, None, Duration::from_secs(2), false).await;
    let (admin_store, admin_redis, admin_pg) = (admin.store, admin.redis, admin.pg);
    drop(quiet);
    let lives: Vec<Arc<Mutex<Life>>> = (0..procs)
        .map(|p| {
            let recorded = Arc::new(Recorded::new(p, inner[p].clone(), history.clone()));
            let idem = process_runtime(recorded.clone(), schedule.caches[p]);
            Arc::new(Mutex::new(Life { idem: Some(idem), recorded, crashed: watch::channel(false).0 }))
        })
        .collect();
    let admin = Idempotency::builder_shared(admin_store.clone()).build();
    let first = lock(&lives[0]).idem.clone().expect("process 0 runs");
    let tokens: Arc<Vec<String>> = Arc::new(
        (0..schedule.keys())
            .map(|_| first.issue_token(idempotent_explore::run::TOKEN_LIFE).expect("a token"))
            .collect(),
    );
    let start = Instant::now();
    let relays = Arc::new(relays);
    let mut tasks = tokio::task::JoinSet::new();
    let mut count = |kind: &'static str| *faults.entry(kind).or_default() += 1;

    let record_key = |key: &str| admin_redis.as_ref().map(|r| r.record_key(key)).unwrap_or_default();
    for f in &schedule.faults {
        let (relays, server, f, admin_pg) = (relays.clone(), server.clone(), *f, admin_pg.clone());
        let first_record = record_key(&full_key(0, false));
        let (from, until) = (start + ms(f.from_ms), start + ms(f.from_ms + f.len_ms));
        count(match (f.kind, &server.kind) {
            (FaultKind::Split(d), Kind::Postgres(_)) if stalls(d) => "table locked",
            (FaultKind::Split(_), Kind::Postgres(_)) => "partition of every process",
            (FaultKind::Split(_), _) => "server stopped",
            (_, Kind::Cluster(_)) => continue,
            (FaultKind::DelayUp(_), _) => "commands late",
            (FaultKind::DelayDown(_) | FaultKind::PubsubDelay(_), _) => "replies late",
            (FaultKind::LoseReplies | FaultKind::PubsubDown, _) => "connections dropped",
            (FaultKind::Refuse, _) => "partition",
        });
        tasks.spawn(async move {
            tokio::time::sleep_until(from).await;
            let relay = || relays[f.proc].as_ref();
            match f.kind {
                FaultKind::DelayUp(d) | FaultKind::DelayDown(d) | FaultKind::PubsubDelay(d) => {
                    let dir = if matches!(f.kind, FaultKind::DelayUp(_)) { Direction::Up } else { Direction::Down };
                    relay().expect("a relay").set_latency(dir, ms(d));
                    tokio::time::sleep_until(until).await;
                    relay().expect("a relay").set_latency(dir, Duration::ZERO);
                }
                FaultKind::LoseReplies | FaultKind::PubsubDown => {
                    relay().expect("a relay").drop_all();
                }
                FaultKind::Refuse => {
                    relay().expect("a relay").black_hole();
                    tokio::time::sleep_until(until).await;
                    relay().expect("a relay").heal();
                }
                FaultKind::Split(d) => {
                    let stop = ms(d.min(LONGEST_STOP_MS));
                    let _upset = server.upset().await;
                    match &server.kind {
                        Kind::Postgres(_) if stalls(d) => {
                            let pg = admin_pg.as_ref().expect("the harness's store on PostgreSQL");
                            lock_table(pg, stop).await;
                        }
                        Kind::Postgres(_) => {
                            relays.iter().flatten().for_each(Proxy::black_hole);
                            tokio::time::sleep(stop).await;
                            relays.iter().flatten().for_each(Proxy::heal);
                        }
                        Kind::Redis(_) => {
                            let srv = server.clone();
                            off_runtime(move || redis(&srv).pause()).await;
                            tokio::time::sleep(stop).await;
                            let srv = server.clone();
                            off_runtime(move || redis(&srv).resume()).await;
                        }
                        Kind::Cluster(_) => {
                            let srv = server.clone();
                            let port = off_runtime(move || {
                                let c = cluster(&srv);
                                let port = c.primary_for_key(&first_record);
                                c.node(port).pause();
                                port
                            })
                            .await;
                            tokio::time::sleep(stop).await;
                            let srv = server.clone();
                            off_runtime(move || cluster(&srv).node(port).resume()).await;
                        }
                    }
                }
            }
        });
    }
    // Failovers that found no replica to promote and lost the record instead.
    let no_replica = Arc::new(std::sync::atomic::AtomicU64::new(0));
    // How long a new connection takes since PostgreSQL last restarted, in ms (0: no restart).
    let slow = Arc::new(std::sync::atomic::AtomicU64::new(0));
    for l in &schedule.losses {
        let (server, h, at, key) = (server.clone(), history.clone(), start + ms(l.at_ms), full_key(l.key, false));
        let (relays, no_replica, slow) = (relays.clone(), no_replica.clone(), slow.clone());
        let slow_connects = ms(SLOW_CONNECT_MS + (l.at_ms % 3) * 50);
        let record = record_key(&key);
        // A third of the Cluster's losses are failovers: the key's primary killed, its replica
        // promoted (writes it had not replicated are lost), the old primary back as a replica.
        let failover = l.at_ms % 3 == 0;
        count(match &server.kind {
            Kind::Redis(_) => "server killed and restarted empty",
            Kind::Cluster(_) if failover => "primary killed, replica promoted",
            Kind::Cluster(_) => "record lost",
            Kind::Postgres(_) => "server crashed and restarted, then slow to take connections",
        });
        tasks.spawn(async move {
            tokio::time::sleep_until(at).await;
            let srv = server.clone();
            let _upset = server.upset().await;
            match &server.kind {
                Kind::Redis(_) => {
                    off_runtime(move || {
                        let mut s = redis(&srv);
                        s.kill();
                        srv.lose_everything();
                        s.restart();
                    })
                    .await;
                }
                Kind::Cluster(_) if failover => {
                    off_runtime(move || {
                        let mut c = cluster(&srv);
                        let primary = c.primary_for_key(&record);
                        let Some(replica) = c.try_replica_of(primary) else {
                            // No replica to promote (the old primary of an earlier failover has
                            // not rejoined yet): the record is lost instead, as below.
                            no_replica.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            // Before the DEL is sent and after it is answered: it lands somewhere
                            // in between, perhaps after an acquisition that followed the first.
                            h.record(Event::Lose { key: key.clone() });
                            let _ = c.command(&["DEL", &record]);
                            h.record(Event::Lose { key });
                            return;
                        };
                        c.kill(primary);
                        // What the primary had not replicated is lost at the promotion: every
                        // record of every schedule on it may be (the history says so before and
                        // after, so that no window misses the loss).
                        srv.lose_everything();
                        c.wait_for_promotion(replica, Duration::from_secs(30));
                        srv.lose_everything();
                        c.restart_node(primary);
                        c.wait_healthy(Duration::from_secs(30));
                    })
                    .await;
                }
                Kind::Cluster(_) => {
                    // Recorded before the DEL is sent (an acquisition may follow it at once) and
                    // after it is answered: it lands somewhere in between, perhaps after an
                    // acquisition that followed the first record (seed 934219946 of the 60-minute
                    // run on f1b9438: an acquire sent 0.2 ms after the first record was deleted by
                    // the DEL, which the checker took for the record of an earlier holder).
                    h.record(Event::Lose { key: key.clone() });
                    let _ = off_runtime(move || cluster(&srv).command(&["DEL", &record])).await;
                    h.record(Event::Lose { key });
                }
                Kind::Postgres(_) => {
                    off_runtime(move || {
                        let Kind::Postgres(c) = &srv.kind else { unreachable!() };
                        lock(c).restart_immediate();
                    })
                    .await;
                    // Back, but slow to take connections from now on, probes included.
                    relays.iter().flatten().for_each(|r| r.set_connect_delay(slow_connects));
                    slow.store(slow_connects.as_millis() as u64, std::sync::atomic::Ordering::Relaxed);
                }
            }
        });
    }
    for p in &schedule.purges {
        let (admin, h, key) = (admin.clone(), history.clone(), full_key(p.key, false));
        let (at, force) = (start + ms(p.at_ms), p.force);
        count("purge");
        tasks.spawn(async move {
            tokio::time::sleep_until(at).await;
            let sent = h.now();
            let mode = if force { idempotency::Force::InProgress } else { idempotency::Force::CompletedOnly };
            let forgotten = admin.forget("", &key, mode).await;
            let deleted = matches!(forgotten, Ok(idempotency::store::Forgotten::Deleted(_)));
            h.record(Event::Purge { key, force, sent, deleted });
        });
    }
    for (i, r) in schedule.resolutions.iter().enumerate() {
        let (admin, h, key, completed) = (admin.clone(), history.clone(), full_key(r.key, false), r.completed);
        let at = start + ms(r.at_ms);
        count("resolution");
        tasks.spawn(async move {
            tokio::time::sleep_until(at).await;
            idempotent_explore::run::resolve(&admin, &h, key, completed, i).await;
        });
    }
    for c in crashes {
        let (lives, c, h) = (lives.clone(), *c, history.clone());
        let cache = schedule.caches[c.proc];
        count("process crashed");
        tasks.spawn(async move {
            tokio::time::sleep_until(start + ms(c.at_ms)).await;
            let life = lives[c.proc].clone();
            {
                let mut l = lock(&life);
                h.record(Event::Crash { proc: c.proc });
                l.recorded.crash();
                l.idem = None;
                let _ = l.crashed.send(true);
            }
            tokio::time::sleep(ms(c.down_ms)).await;
            let recorded = Arc::new(lock(&life).recorded.successor());
            let idem = process_runtime(recorded.clone(), cache);
            let mut l = lock(&life);
            *l = Life { idem: Some(idem), recorded, crashed: watch::channel(false).0 };
        });
    }
    for group in schedule.groups() {
        let group: Vec<(usize, CallSpec)> = group.into_iter().map(|id| (id, schedule.calls[id].clone())).collect();
        let spec = &group[0].1;
        let (life, h, at) = (lives[spec.proc].clone(), history.clone(), start + ms(spec.at_ms));
        let (timeout, tokens) = (ms(schedule.timeouts_ms[spec.proc]), tokens.clone());
        let tx = in_transaction[spec.proc].clone();
        tasks.spawn(async move {
            tokio::time::sleep_until(at).await;
            let (idem, mut crashed) = {
                let l = lock(&life);
                let Some(idem) = l.idem.clone() else { return };
                (idem, l.crashed.subscribe())
            };
            let calls = async {
                match &group[..] {
                    [(id, spec)] => _ = one_call(&idem, &h, *id, spec, timeout, false, &tokens, tx.as_deref()).await,
                    _ => one_batch(&idem, &h, &group, timeout, &tokens).await,
                }
            };
            tokio::select! {
                _ = calls => {}
                _ = crashed.wait_for(|c| *c) => {
                    for (id, _) in &group {
                        h.record(Event::Return { call: *id, returned: Returned::Cancelled });
                    }
                }
            }
        });
    }
    let _ = tokio::time::timeout(Duration::from_secs(120), async { while tasks.join_next().await.is_some() {} }).await;
    // Healed, but a restarted PostgreSQL stays slow to take connections: that is no fault to wait
    // out (it answers statements at once), and the probes must get past it.
    let slow = ms(slow.load(std::sync::atomic::Ordering::Relaxed));
    for relay in relays.iter().flatten() {
        relay.heal();
        relay.set_connect_delay(slow);
    }
    let no_replica = no_replica.load(std::sync::atomic::Ordering::Relaxed);
    if no_replica > 0 {
        *faults.entry("primary killed, replica promoted").or_default() -= no_replica;
        *faults.entry("record lost").or_default() += no_replica;
    }

    // Once every fault has ended: every lease may run out, every background commit and release
    // may land. Then every key must be free or completed (I5).
    let longest_ttl = schedule.calls.iter().map(|c| c.ttl_ms).filter(|t| *t <= 60_000).max().unwrap_or(0);
    let longest_timeout = ms(schedule.timeouts_ms.iter().copied().max().unwrap_or(0));
    let faults_end = crashes.iter().map(|c| c.at_ms + c.down_ms).max().unwrap_or(0).max(schedule.faults_end_ms());
    // (Three store timeouts, not the deterministic layer's ten: here they are real seconds, and
    // a commit or release left after the faults lands at its next attempt.)
    let settled = start + ms(faults_end) + ms(longest_ttl) + 3 * longest_timeout;
    tokio::time::sleep_until(settled.max(Instant::now() + 3 * longest_timeout)).await;
    let idems: Vec<Idempotency> = lives.iter().map(|l| lock(l).idem.clone().expect("every process is back")).collect();
    {
        let _calm = server.calm().await;
        probe_every_key(schedule, &idems, &history, &tokens).await;
    }
    lock(&server.running).remove(&n);
    (history, faults)
}

/// Whether a split acquire on PostgreSQL locks the table (one time in two) rather than
/// partitioning every process.
fn stalls(split_ms: u64) -> bool {
    (split_ms / 10) % 2 == 0
}

/// Locks `store`'s table for `stop` from a session of the harness (`ACCESS EXCLUSIVE`, without a
/// statement timeout of its own), then rolls back: every statement on the table waits on the
/// server meanwhile. A lock not taken (the server restarting, say) is no fault: skipped.
async fn lock_table(store: &PgStore, stop: Duration) {
    use idempotency::store::postgres::sqlx;
    let Ok(mut tx) = store.pool().begin().await else { return };
    let taken = async {
        sqlx::query("SET LOCAL statement_timeout = 0").execute(&mut *tx).await?;
        sqlx::query(&format!("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE", store.table())).execute(&mut *tx).await
    };
    if taken.await.is_ok() {
        tokio::time::sleep(stop).await;
    }
    let _ = tx.rollback().await;
}

/// Every key the schedule's calls use, as the history names them.
fn all_keys(schedule: &Schedule) -> Vec<String> {
    let mut keys: Vec<String> = schedule
        .calls
        .iter()
        .map(|c| if c.token && !c.lock { format!("token:k{}", c.key) } else { full_key(c.key, c.lock) })
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// Runs `f` (a signal, a command to a server, a restart) off the processes' runtime: blocking it
/// would stall every process past its leases' safety margin.
async fn off_runtime<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("a server operation")
}

#[test]
fn explore_redis() {
    explore(Server::new(Kind::Redis(Mutex::new(RedisServer::start()))), false);
}

#[test]
fn explore_valkey() {
    let valkey = support::valkey_server_binary();
    explore(Server::new(Kind::Redis(Mutex::new(RedisServer::start_binary(&valkey)))), true);
}

#[test]
fn explore_cluster() {
    explore(Server::new(Kind::Cluster(Mutex::new(RedisCluster::start()))), false);
}

#[test]
fn explore_postgres() {
    explore(Server::new(Kind::Postgres(Mutex::new(PgCluster::start()))), false);
}
