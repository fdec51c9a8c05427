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
//!   of their own, every process is partitioned instead);
//! - a record lost → Redis and Valkey are killed (`SIGKILL`) and started again empty, without
//!   their scripts (every record is lost, as the history says); the Cluster loses the record
//!   (`DEL` on its node); PostgreSQL is crashed and restarted (`-m immediate`), which loses
//!   nothing, so the history says nothing is lost;
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

use idempotency::{Idempotency, PgStore, RedisStore, Store};
use idempotent_explore::check::check;
use idempotent_explore::history::{Event, History, Returned};
use idempotent_explore::recorded::Recorded;
use idempotent_explore::run::{full_key, one_call, probe_every_key, PLANNED_PANIC};
use idempotent_explore::schedule::{server_schedule, Crash, FaultKind, Schedule};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use support::postgres::PgCluster;
use support::proxy::{Direction, Proxy};
use support::{RedisCluster, RedisServer};
use tokio::sync::watch;
use tokio::time::Instant;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The longest server stop: below the Cluster's node timeout (1 s), so that no failover starts.
const LONGEST_STOP_MS: u64 = 700;

/// The servers a run plays on.
enum Server {
    Redis(Mutex<RedisServer>),
    Cluster(&'static RedisCluster),
    Postgres(Mutex<PgCluster>),
}

impl Server {
    fn name(&self, valkey: bool) -> &'static str {
        match self {
            Server::Redis(_) if valkey => "valkey",
            Server::Redis(_) => "redis",
            Server::Cluster(_) => "cluster",
            Server::Postgres(_) => "postgres",
        }
    }

    /// The port processes reach the server on (through their relays), if there is one.
    fn port(&self) -> Option<u16> {
        match self {
            Server::Redis(s) => Some(lock(s).port()),
            Server::Cluster(_) => None,
            Server::Postgres(c) => Some(lock(c).base_url().rsplit(':').next()?.parse().ok()?),
        }
    }

    /// A store for one schedule (`n` names its records), through `relay` where there is one.
    async fn store(&self, n: u64, relay: Option<&Proxy>, timeout: Duration, first: bool) -> Arc<dyn Store> {
        self.connect(n, relay, timeout, first).await.0
    }

    /// The store, and the `RedisStore` it is on Redis (for record keys).
    async fn connect(
        &self,
        n: u64,
        relay: Option<&Proxy>,
        timeout: Duration,
        first: bool,
    ) -> (Arc<dyn Store>, Option<RedisStore>) {
        let port = relay.map(|r| r.url().rsplit(':').next().unwrap().to_owned());
        match self {
            Server::Redis(_) | Server::Cluster(_) => {
                let url = match (self, port) {
                    (Server::Cluster(c), _) => c.url(),
                    (_, Some(p)) => format!("redis://127.0.0.1:{p}"),
                    (_, None) => format!("redis://127.0.0.1:{}", self.port().unwrap()),
                };
                let store = RedisStore::builder(&url).prefix(format!("ex{n}")).timeout(timeout).connect().await;
                let store = store.unwrap_or_else(|e| panic!("connect to {url}: {e}"));
                (Arc::new(store.clone()), Some(store))
            }
            Server::Postgres(_) => {
                let p = port.unwrap_or_else(|| self.port().unwrap().to_string());
                let url = format!("postgres://postgres@127.0.0.1:{p}/postgres");
                let mut builder = PgStore::builder(&url).schema(format!("ex{n}")).pool_size(4).timeout(timeout);
                if first {
                    builder = builder.migrate();
                }
                (Arc::new(builder.connect().await.unwrap_or_else(|e| panic!("connect to {url}: {e}"))), None)
            }
        }
    }
}

/// The standalone server of a Redis or Valkey run.
fn redis(server: &Server) -> std::sync::MutexGuard<'_, RedisServer> {
    match server {
        Server::Redis(s) => lock(s),
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
    let name = server.name(valkey);
    // Planned panics are part of the schedules: keep them out of the output.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let planned = info.payload().downcast_ref::<String>().is_some_and(|s| s == PLANNED_PANIC)
            || info.payload().downcast_ref::<&str>().is_some_and(|s| *s == PLANNED_PANIC);
        if !planned {
            default_hook(info);
        }
    }));
    println!("explore on {name}: seeds from {seed} on, for {limit:?}");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let server = Arc::new(server);
    let mut stats = Stats::default();
    let started = std::time::Instant::now();
    for i in 0.. {
        if started.elapsed() >= limit || schedules.is_some_and(|n| i >= n) {
            break;
        }
        let seed = seed.wrapping_add(i);
        let (schedule, crashes) = generate(seed);
        let history = rt.block_on(play(&server, seed, &schedule, &crashes, &mut stats));
        stats.schedules += 1;
        stats.calls += schedule.calls.len() as u64;
        let events = history.events();
        let report = check(&events);
        for (name, n) in &report.exceptions {
            *stats.exceptions.entry(name).or_default() += n;
        }
        let counted = |v: &&idempotent_explore::check::Violation| {
            only.is_empty() || only.iter().any(|i| v.to_string().contains(i.as_str()))
        };
        if let Some(v) = report.violations.iter().find(counted) {
            stats.violations += 1;
            println!("\nVIOLATION seed {seed} store {name}: {v}");
            println!("schedule:\n{schedule}");
            for c in &crashes {
                println!("  crash p{} at {}ms, back {}ms later", c.proc, c.at_ms, c.down_ms);
            }
            println!("its history (us):");
            for (t, e) in &events {
                println!("  {t:>9} {e:?}");
            }
            println!(
                "again: EXPLORE_SEED={seed} bash scripts/explore.sh --store {name} --schedules 1 (real servers do not replay exactly)"
            );
        }
    }
    let faults: u64 = stats.faults.values().sum();
    let kinds: Vec<String> = stats.faults.iter().map(|(k, n)| format!("{k} {n}")).collect();
    println!("faults on {name} by kind: {}", kinds.join(", "));
    let named: Vec<String> = stats.exceptions.iter().map(|(k, n)| format!("{k}: {n}")).collect();
    println!(
        "documented exceptions met on {name}: {}",
        if named.is_empty() { "none".into() } else { named.join(", ") }
    );
    println!(
        "explored on {name}: {} schedules, {} calls, {faults} faults, {} violations",
        stats.schedules, stats.calls, stats.violations
    );
    assert_eq!(stats.violations, 0, "the explorer found violations on {name} (above)");
}

/// Plays one schedule; returns its history.
async fn play(server: &Arc<Server>, n: u64, schedule: &Schedule, crashes: &[Crash], stats: &mut Stats) -> History {
    let history = History::new();
    let procs = schedule.caches.len();
    let relays: Vec<Option<Proxy>> = (0..procs).map(|_| server.port().map(Proxy::start)).collect();
    let mut inner: Vec<Arc<dyn Store>> = Vec::new();
    for (p, relay) in relays.iter().enumerate() {
        inner.push(server.store(n, relay.as_ref(), ms(schedule.timeouts_ms[p]), p == 0).await);
    }
    let (admin_store, admin_redis) = server.connect(n, None, Duration::from_secs(2), false).await;
    let runtime = |p: usize, recorded: Arc<Recorded>| {
        let builder = Idempotency::builder_shared(recorded).wait_recheck(ms(50));
        if schedule.caches[p] { builder.replay_cache(1000) } else { builder }.build()
    };
    let lives: Vec<Arc<Mutex<Life>>> = (0..procs)
        .map(|p| {
            let recorded = Arc::new(Recorded::new(p, inner[p].clone(), history.clone()));
            let idem = runtime(p, recorded.clone());
            Arc::new(Mutex::new(Life { idem: Some(idem), recorded, crashed: watch::channel(false).0 }))
        })
        .collect();
    let admin = Idempotency::builder_shared(admin_store.clone()).build();
    let first = lock(&lives[0]).idem.clone().expect("process 0 runs");
    let tokens: Arc<Vec<String>> =
        Arc::new((0..schedule.keys()).map(|_| first.issue_token(Duration::from_secs(60)).expect("a token")).collect());
    let start = Instant::now();
    let relays = Arc::new(relays);
    let mut tasks = tokio::task::JoinSet::new();
    let mut count = |kind: &'static str| *stats.faults.entry(kind).or_default() += 1;

    let record_key = |key: &str| admin_redis.as_ref().map(|r| r.record_key(key)).unwrap_or_default();
    for f in &schedule.faults {
        let (relays, server, f) = (relays.clone(), server.clone(), *f);
        let first_record = record_key(&full_key(0, false));
        let (from, until) = (start + ms(f.from_ms), start + ms(f.from_ms + f.len_ms));
        count(match (f.kind, server.as_ref()) {
            (FaultKind::Split(_), Server::Postgres(_)) => "partition of every process",
            (FaultKind::Split(_), _) => "server stopped",
            (_, Server::Cluster(_)) => continue,
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
                    match server.as_ref() {
                        Server::Postgres(_) => {
                            relays.iter().flatten().for_each(Proxy::black_hole);
                            tokio::time::sleep(stop).await;
                            relays.iter().flatten().for_each(Proxy::heal);
                        }
                        Server::Redis(_) => {
                            let srv = server.clone();
                            off_runtime(move || redis(&srv).pause()).await;
                            tokio::time::sleep(stop).await;
                            let srv = server.clone();
                            off_runtime(move || redis(&srv).resume()).await;
                        }
                        &Server::Cluster(c) => {
                            let port = off_runtime(move || c.primary_for_key(&first_record)).await;
                            c.node(port).pause();
                            tokio::time::sleep(stop).await;
                            c.node(port).resume();
                        }
                    }
                }
            }
        });
    }
    for l in &schedule.losses {
        let (server, h, at, key) = (server.clone(), history.clone(), start + ms(l.at_ms), full_key(l.key, false));
        let every_key = all_keys(schedule);
        let record = record_key(&key);
        count(match server.as_ref() {
            Server::Redis(_) => "server killed and restarted empty",
            Server::Cluster(_) => "record lost",
            Server::Postgres(_) => "server crashed and restarted",
        });
        tasks.spawn(async move {
            tokio::time::sleep_until(at).await;
            let srv = server.clone();
            match server.as_ref() {
                Server::Redis(_) => {
                    off_runtime(move || {
                        let mut s = redis(&srv);
                        s.kill();
                        for k in every_key {
                            h.record(Event::Lose { key: k });
                        }
                        s.restart();
                    })
                    .await;
                }
                &Server::Cluster(c) => {
                    let _ = off_runtime(move || c.command(&["DEL", &record])).await;
                    h.record(Event::Lose { key });
                }
                Server::Postgres(_) => {
                    off_runtime(move || {
                        let Server::Postgres(c) = srv.as_ref() else { unreachable!() };
                        lock(c).restart_immediate();
                    })
                    .await;
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
    for c in crashes {
        let (lives, c) = (lives.clone(), *c);
        let cache = schedule.caches[c.proc];
        count("process crashed");
        tasks.spawn(async move {
            tokio::time::sleep_until(start + ms(c.at_ms)).await;
            let life = lives[c.proc].clone();
            {
                let mut l = lock(&life);
                l.recorded.crash();
                l.idem = None;
                let _ = l.crashed.send(true);
            }
            tokio::time::sleep(ms(c.down_ms)).await;
            let recorded = Arc::new(lock(&life).recorded.successor());
            let builder = Idempotency::builder_shared(recorded.clone()).wait_recheck(ms(50));
            let idem = if cache { builder.replay_cache(1000) } else { builder }.build();
            let mut l = lock(&life);
            *l = Life { idem: Some(idem), recorded, crashed: watch::channel(false).0 };
        });
    }
    for (id, spec) in schedule.calls.iter().enumerate() {
        let (life, h, spec, at) = (lives[spec.proc].clone(), history.clone(), spec.clone(), start + ms(spec.at_ms));
        let (timeout, tokens) = (ms(schedule.timeouts_ms[spec.proc]), tokens.clone());
        tasks.spawn(async move {
            tokio::time::sleep_until(at).await;
            let (idem, mut crashed) = {
                let l = lock(&life);
                let Some(idem) = l.idem.clone() else { return };
                (idem, l.crashed.subscribe())
            };
            tokio::select! {
                () = one_call(&idem, &h, id, &spec, timeout, false, &tokens) => {}
                _ = crashed.wait_for(|c| *c) => h.record(Event::Return { call: id, returned: Returned::Cancelled }),
            }
        });
    }
    let _ = tokio::time::timeout(Duration::from_secs(120), async { while tasks.join_next().await.is_some() {} }).await;
    for relay in relays.iter().flatten() {
        relay.heal();
    }
    if let Server::Redis(_) = server.as_ref() {
        let srv = server.clone();
        off_runtime(move || redis(&srv).resume()).await;
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
    probe_every_key(schedule, &idems, &history, &tokens).await;
    history
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
    explore(Server::Redis(Mutex::new(RedisServer::start())), false);
}

#[test]
fn explore_valkey() {
    let valkey = support::valkey_server_binary();
    explore(Server::Redis(Mutex::new(RedisServer::start_binary(&valkey))), true);
}

#[test]
fn explore_cluster() {
    explore(Server::Cluster(RedisCluster::shared()), false);
}

#[test]
fn explore_postgres() {
    explore(Server::Postgres(Mutex::new(PgCluster::start())), false);
}
