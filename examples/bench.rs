//! The benchmark: our paths against the Redis floor and a naive baseline, measured in one run on
//! one Redis, with round trips and Redis commands per operation read from Redis itself
//! (`INFO commandstats` deltas).
//!
//! ```text
//! cargo run --release --example bench                 # full run, starts its own redis-server
//! cargo run --release --example bench -- --short      # about a minute
//! cargo run --release --example bench -- --check      # exact round-trip counts only (CI smoke test)
//! cargo run --release --example bench -- --redis redis://127.0.0.1:6379 --json
//! cargo run --release --example bench -- --no-postgres                     # Redis and memory rows only
//! ```
//!
//! Baselines, through the same fred client as the store:
//! - floor: `EVALSHA` of `return 1`, one round trip, nothing else;
//! - naive first execution: `SET key 1 NX EX 30`, then `SET key <result> EX 86400` (no owner,
//!   no Lua, no watchdog), two round trips;
//! - naive replay: `SET key 1 NX EX 30` finds the key, then `GET key`, two round trips.
//!
//! And on PostgreSQL (a cluster the benchmark starts itself with `initdb`, `pg_stat_statements`
//! loaded; or `--postgres URL`), through the same sqlx pool settings as the store, statements and
//! round trips per operation counted by the server (`pg_stat_statements` deltas):
//! - naive first execution: `INSERT ... ON CONFLICT DO NOTHING`, then `UPDATE` with the result;
//! - naive replay: the same `INSERT` finds the key, then `SELECT` of the result;
//! - naive transactional first: `BEGIN`, the `INSERT`, the body's own insert, the `UPDATE`,
//!   `COMMIT`: what the transactional mode does, without owner, lease or fence.

#[path = "../tests/support/mod.rs"]
#[allow(unused_imports)]
mod support;

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idempotency::store::postgres::sqlx::{self, Row as _};
use idempotency::store::redis::fred::prelude::*;
use idempotency::store::redis::CommitPath;
use idempotency::store::{AcquireOutcome, AcquireRequest, CommitRequest, Transition};
use idempotency::{Call, CallContext, Error, Idempotency, MemoryStore, PgStore, RedisStore, Store};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// Counts the bytes this process holds on the heap, for memory per call in flight.
struct Counting;

static HELD: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        HELD.fetch_add(layout.size(), Ordering::Relaxed);
        std::alloc::System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
        std::alloc::System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        HELD.fetch_add(new, Ordering::Relaxed);
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
        std::alloc::System.realloc(ptr, layout, new)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    id: u64,
    amount_cents: i64,
    currency: String,
}

fn receipt(id: u64) -> Receipt {
    Receipt { id, amount_cents: 1999, currency: "EUR".into() }
}

struct Options {
    redis: Option<String>,
    valkey: Option<String>,
    no_valkey: bool,
    chart: String,
    /// Only draw the chart, from the table a full run printed (saved to this file).
    chart_from: Option<String>,
    postgres: Option<String>,
    no_postgres: bool,
    short: bool,
    check: bool,
    json: bool,
}

fn options() -> Options {
    let mut o = Options {
        redis: None,
        valkey: None,
        no_valkey: false,
        chart: "target/bench.svg".into(),
        chart_from: None,
        postgres: None,
        no_postgres: false,
        short: false,
        check: false,
        json: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--redis" => o.redis = args.next(),
            "--valkey" => o.valkey = args.next(),
            "--no-valkey" => o.no_valkey = true,
            "--chart" => o.chart = args.next().unwrap_or_default(),
            "--chart-from" => o.chart_from = args.next(),
            "--postgres" => o.postgres = args.next(),
            "--no-postgres" => o.no_postgres = true,
            "--short" => o.short = true,
            "--check" => o.check = true,
            "--json" => o.json = true,
            "-h" | "--help" => {
                println!(
                    "usage: bench [--short] [--check] [--json] [--chart FILE.svg] [--redis URL] \
                     [--valkey URL | --no-valkey] [--postgres URL | --no-postgres]\n       \
                     bench --chart-from TABLE.txt [--chart FILE.svg]   (the chart of a saved run's table)"
                );
                std::process::exit(0);
            }
            other => {
                eprintln!("unknown argument {other:?} (try --help)");
                std::process::exit(2);
            }
        }
    }
    o
}

/// Reads Redis's own counters of commands executed (`INFO commandstats`).
struct Counters {
    client: Client,
}

#[derive(Default, Clone, Copy, Debug)]
struct Counts {
    /// Script calls (EVALSHA, EVAL): each a round trip of ours.
    scripts: u64,
    /// SET and GET: the naive baseline's round trips (our scripts run them inside, too).
    plain: u64,
    /// Every command executed, inside scripts too (INFO itself excluded).
    commands: u64,
    /// EVAL fallbacks after NOSCRIPT.
    evals: u64,
    /// CPU seconds the server used (`INFO cpu`, user plus system).
    cpu_secs: f64,
}

impl Counters {
    async fn read(&self) -> Counts {
        let info: String = self.client.info(Some(fred::types::InfoKind::CommandStats)).await.expect("INFO");
        let mut c = Counts::default();
        for line in info.lines() {
            let Some((name, rest)) = line.strip_prefix("cmdstat_").and_then(|l| l.split_once(':')) else { continue };
            let calls: u64 =
                rest.split(',').find_map(|f| f.strip_prefix("calls=")).and_then(|n| n.parse().ok()).unwrap_or(0);
            if name == "info" {
                continue;
            }
            c.commands += calls;
            match name {
                "evalsha" => c.scripts += calls,
                "eval" => {
                    c.scripts += calls;
                    c.evals += calls;
                }
                "set" | "get" => c.plain += calls,
                _ => {}
            }
        }
        let cpu: String = self.client.info(Some(fred::types::InfoKind::Cpu)).await.expect("INFO cpu");
        c.cpu_secs = cpu
            .lines()
            .filter_map(|l| l.strip_prefix("used_cpu_user:").or_else(|| l.strip_prefix("used_cpu_sys:")))
            .filter_map(|v| v.trim().parse::<f64>().ok())
            .sum();
        c
    }
}

impl std::ops::Sub for Counts {
    type Output = Counts;
    fn sub(self, o: Counts) -> Counts {
        Counts {
            scripts: self.scripts - o.scripts,
            plain: self.plain - o.plain,
            commands: self.commands - o.commands,
            evals: self.evals - o.evals,
            cpu_secs: self.cpu_secs - o.cpu_secs,
        }
    }
}

/// Reads PostgreSQL's own counters (`pg_stat_statements`, top-level statements of the benchmark's
/// database, the counting's own left out) and, for a cluster of the benchmark's own, the CPU time
/// of its processes.
struct PgCounters {
    pool: sqlx::PgPool,
    /// The postmaster of a cluster of our own (its processes' CPU time is the server's).
    postmaster: Option<u32>,
}

impl PgCounters {
    async fn read(&self) -> Counts {
        // Statements, and the `SET LOCAL statement_timeout` a transactional body's `BEGIN` carries
        // in the same message: a statement, not a round trip.
        let row = sqlx::query(
            "SELECT coalesce(sum(calls), 0)::bigint, \
                    coalesce(sum(calls) FILTER (WHERE query ILIKE 'SET LOCAL statement_timeout%'), 0)::bigint \
             FROM pg_stat_statements \
             WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
               AND query NOT ILIKE '%pg_stat_statements%'",
        )
        .fetch_one(&self.pool)
        .await
        .expect("read pg_stat_statements");
        let (statements, piggybacked): (i64, i64) = (row.get(0), row.get(1));
        Counts {
            scripts: 0,
            plain: (statements - piggybacked) as u64,
            commands: statements as u64,
            evals: 0,
            cpu_secs: self.postmaster.map_or(0.0, |pid| tree_cpu(pid).as_secs_f64()),
        }
    }
}

/// CPU time of process `pid`, its live children and the children it has reaped.
fn tree_cpu(pid: u32) -> Duration {
    let stat = |path: String| -> Vec<u64> {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let fields: Vec<&str> = text.rsplit_once(')').map(|(_, r)| r.split_whitespace().collect()).unwrap_or_default();
        fields.iter().map(|f| f.parse().unwrap_or(0)).collect()
    };
    // After the ')': state ppid ... utime (11) stime (12) cutime (13) cstime (14).
    let own = stat(format!("/proc/{pid}/stat"));
    let mut ticks = own.get(11..15).map_or(0, |f| f.iter().sum());
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(child) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let f = stat(format!("/proc/{child}/stat"));
        if f.get(1) == Some(&u64::from(pid)) {
            ticks += f.get(11..13).map_or(0, |f| f.iter().sum::<u64>());
        }
    }
    Duration::from_millis(ticks * 10)
}

#[derive(Debug, Clone, Default, Serialize)]
struct Row {
    case: String,
    store: &'static str,
    concurrency: usize,
    ops_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    round_trips_per_op: Option<f64>,
    commands_per_op: Option<f64>,
    /// CPU microseconds the Redis server spent per op (user plus system: commands, scripts,
    /// reading and writing the connection).
    server_us_per_op: Option<f64>,
    /// CPU microseconds this process (the client: runtime, fred, the benchmark's tasks) spent
    /// per op. With client and Redis on the same two cores, the two together bound the rate.
    client_us_per_op: f64,
    baseline: Option<String>,
    ratio: Option<f64>,
    /// How the row's commits ran on its server (`SET IFEQ` or `script`), for rows that commit.
    commit: Option<&'static str>,
    failures: u64,
    /// Rounds the case ran; the row is the median one.
    rounds: usize,
}

/// Runs `op` from `concurrency` tasks for `secs`; each call gets (task, sequence number) and
/// says whether it went as expected.
async fn measure<F, Fut>(concurrency: usize, dur: Duration, op: F) -> (u64, u64, Vec<u32>, Duration)
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = bool> + Send,
{
    let op = Arc::new(op);
    let started = Instant::now();
    let deadline = started + dur;
    let tasks: Vec<_> = (0..concurrency)
        .map(|t| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut lat = Vec::with_capacity(4096);
                let (mut ok, mut failed, mut i) = (0u64, 0u64, 0u64);
                while Instant::now() < deadline {
                    let t0 = Instant::now();
                    if op(t, i).await {
                        ok += 1;
                    } else {
                        failed += 1;
                    }
                    lat.push(t0.elapsed().as_micros().min(u32::MAX as u128) as u32);
                    i += 1;
                }
                (ok, failed, lat)
            })
        })
        .collect();
    let (mut ok, mut failed, mut lat) = (0, 0, Vec::new());
    for t in tasks {
        let (o, f, l) = t.await.expect("bench task");
        ok += o;
        failed += f;
        lat.extend(l);
    }
    (ok, failed, lat, started.elapsed())
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize] as f64
}

struct Bench {
    /// Each Redis-protocol server's counters, by the rows' store label (`redis`, `valkey`).
    counters: Vec<(&'static str, Counters)>,
    pg: Option<PgCounters>,
    rows: Vec<Row>,
    secs: Duration,
    /// Round trips per call of each path on each server (store label, path, count, target),
    /// counted exactly beforehand (slow log).
    exact: Vec<(&'static str, &'static str, f64, f64)>,
}

impl Bench {
    /// The exact round trips of the path a case measures ("first, store alone" is a first
    /// execution).
    fn exact_round_trips(&self, store: &str, case: &str) -> f64 {
        if case.contains("cached") {
            return 0.0;
        }
        let path = if case.starts_with("first") { "first execution" } else { case };
        self.exact.iter().find(|(s, p, _, _)| *s == store && *p == path).map_or(f64::NAN, |e| e.2)
    }

    fn counters(&self, store: &str) -> Option<&Counters> {
        self.counters.iter().find(|(label, _)| *label == store).map(|(_, c)| c)
    }

    async fn case<F, Fut>(&mut self, case: &str, store: &'static str, concurrency: usize, op: F) -> usize
    where
        F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = bool> + Send,
    {
        let before = match (self.counters(store), &self.pg) {
            (Some(c), _) => Some(c.read().await),
            (_, Some(pg)) if store == "pg" => Some(pg.read().await),
            _ => None,
        };
        let cpu_before = cpu_time();
        let (ok, failed, mut lat, took) = measure(concurrency, self.secs, op).await;
        let client_cpu = cpu_time() - cpu_before;
        let after = match (self.counters(store), &self.pg, before) {
            (Some(c), _, Some(b)) => Some(c.read().await - b),
            (_, Some(pg), Some(b)) if store == "pg" => Some(pg.read().await - b),
            _ => None,
        };
        lat.sort_unstable();
        let ops = (ok + failed).max(1) as f64;
        let naive = case.starts_with("naive");
        self.rows.push(Row {
            case: case.into(),
            store,
            concurrency,
            ops_per_sec: ops / took.as_secs_f64(),
            p50_us: percentile(&lat, 0.5),
            p99_us: percentile(&lat, 0.99),
            // The naive baseline's round trips are its SETs and GETs, the floor's its script
            // calls. Ours mix scripts and plain SETs, and a script's own SETs count in the same
            // commandstats line, so ours come from the exact count made beforehand.
            // On PostgreSQL every round trip is counted by the server: statements, less those sent
            // in one message with another.
            round_trips_per_op: after.map(|d| match case {
                _ if naive || store == "pg" => d.plain as f64 / ops,
                _ if case.starts_with("fred") => d.scripts as f64 / ops,
                _ => self.exact_round_trips(store, case),
            }),
            commands_per_op: after.map(|d| d.commands as f64 / ops),
            server_us_per_op: after.filter(|d| d.cpu_secs > 0.0).map(|d| d.cpu_secs * 1e6 / ops),
            client_us_per_op: client_cpu.as_secs_f64() * 1e6 / ops,
            baseline: None,
            ratio: None,
            commit: None,
            failures: failed,
            rounds: 1,
        });
        self.rows.len() - 1
    }

    fn ratio(&mut self, row: usize, baseline: usize) {
        let r = self.rows[row].ops_per_sec / self.rows[baseline].ops_per_sec;
        let name = self.rows[baseline].case.clone();
        self.rows[row].baseline = Some(name);
        self.rows[row].ratio = Some(r);
    }
}

type R<T> = Result<T, Error>;

/// A subscriber and a recorder as a service would install them (`fmt` at `INFO`, a line per
/// closed span, written to a sink; the Prometheus recorder, its upkeep run every 5 s), switched
/// on for the "+ telemetry" cases only. Off, the subscriber's level filter is `OFF` (every
/// callsite disabled, as with no subscriber) and the recorder hands out no-op handles (as with
/// no recorder).
struct Telemetry {
    level: tracing_subscriber::reload::Handle<tracing_subscriber::filter::LevelFilter, tracing_subscriber::Registry>,
    metrics: Arc<AtomicBool>,
}

/// The Prometheus recorder, or no-op handles while off.
struct Toggled {
    on: Arc<AtomicBool>,
    inner: metrics_exporter_prometheus::PrometheusRecorder,
}

impl metrics::Recorder for Toggled {
    fn describe_counter(&self, key: metrics::KeyName, unit: Option<metrics::Unit>, text: metrics::SharedString) {
        self.inner.describe_counter(key, unit, text)
    }
    fn describe_gauge(&self, key: metrics::KeyName, unit: Option<metrics::Unit>, text: metrics::SharedString) {
        self.inner.describe_gauge(key, unit, text)
    }
    fn describe_histogram(&self, key: metrics::KeyName, unit: Option<metrics::Unit>, text: metrics::SharedString) {
        self.inner.describe_histogram(key, unit, text)
    }
    fn register_counter(&self, key: &metrics::Key, meta: &metrics::Metadata<'_>) -> metrics::Counter {
        if self.on.load(Ordering::Relaxed) {
            self.inner.register_counter(key, meta)
        } else {
            metrics::Counter::noop()
        }
    }
    fn register_gauge(&self, key: &metrics::Key, meta: &metrics::Metadata<'_>) -> metrics::Gauge {
        if self.on.load(Ordering::Relaxed) {
            self.inner.register_gauge(key, meta)
        } else {
            metrics::Gauge::noop()
        }
    }
    fn register_histogram(&self, key: &metrics::Key, meta: &metrics::Metadata<'_>) -> metrics::Histogram {
        if self.on.load(Ordering::Relaxed) {
            self.inner.register_histogram(key, meta)
        } else {
            metrics::Histogram::noop()
        }
    }
}

impl Telemetry {
    fn install() -> Telemetry {
        use tracing_subscriber::layer::SubscriberExt;
        let (level, handle) = tracing_subscriber::reload::Layer::new(tracing_subscriber::filter::LevelFilter::OFF);
        let fmt = tracing_subscriber::fmt::layer()
            .with_writer(std::io::sink)
            .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE);
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(level).with(fmt))
            .expect("the only subscriber");
        let on = Arc::new(AtomicBool::new(false));
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let upkeep = recorder.handle();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                upkeep.run_upkeep();
            }
        });
        metrics::set_global_recorder(Toggled { on: on.clone(), inner: recorder }).expect("the only recorder");
        idempotency::telemetry::describe_metrics();
        Telemetry { level: handle, metrics: on }
    }

    fn set(&self, on: bool) {
        let level = if on {
            tracing_subscriber::filter::LevelFilter::INFO
        } else {
            tracing_subscriber::filter::LevelFilter::OFF
        };
        self.level.reload(level).expect("the subscriber is alive");
        self.metrics.store(on, Ordering::Relaxed);
    }
}

/// Replays of the 1,000 keys `replay:{i}` completed beforehand: true when the stored value came
/// back.
fn replay_op(idem: Idempotency) -> impl Fn(usize, u64) -> std::pin::Pin<Box<dyn Future<Output = bool> + Send>> {
    move |_, i| {
        let idem = idem.clone();
        Box::pin(async move {
            let r: R<Receipt> = idem.run(Call::new(format!("replay:{}", i % 1000)), || async { Ok(receipt(0)) }).await;
            r.is_ok_and(|v| v.id == i % 1000)
        })
    }
}

/// First executions of fresh keys `{prefix}:{task}:{i}`: true when the body's value came back.
fn first_op(
    idem: Idempotency,
    prefix: String,
) -> impl Fn(usize, u64) -> std::pin::Pin<Box<dyn Future<Output = bool> + Send>> {
    move |t, i| {
        let (idem, key) = (idem.clone(), format!("{prefix}:{t}:{i}"));
        Box::pin(async move {
            let r: R<Receipt> = idem.run(Call::new(key), || async move { Ok(receipt(i)) }).await;
            r.is_ok()
        })
    }
}

/// Calls of the 64 keys `held:{i}` held in progress elsewhere: true on `Conflict`.
fn conflict_op(idem: Idempotency) -> impl Fn(usize, u64) -> std::pin::Pin<Box<dyn Future<Output = bool> + Send>> {
    move |_, i| {
        let idem = idem.clone();
        Box::pin(async move {
            let r: R<()> = idem.run(Call::new(format!("held:{}", i % 64)), || async { Ok(()) }).await;
            matches!(r, Err(Error::Conflict { .. }))
        })
    }
}

/// Completes `n` keys named `{prefix}{i}` so replays have something to find.
async fn complete_keys(idem: &Idempotency, prefix: &str, n: u64) {
    for i in 0..n {
        let _: R<Receipt> = idem.run(Call::new(format!("{prefix}{i}")), || async move { Ok(receipt(i)) }).await;
    }
}

/// The least an in-process first execution costs: the same key and encoded result as ours,
/// inserted in a plain map under a lock, its expiry queued, due records reaped. No owner, lease,
/// fence, watchdog or context: the baseline of the memory store's first execution.
fn floor_op(keep: Duration) -> impl Fn(usize, u64) -> std::future::Ready<bool> {
    type Floor = (HashMap<String, (Vec<u8>, Instant)>, VecDeque<(Instant, String)>);
    let floor: Arc<std::sync::Mutex<Floor>> = Arc::default();
    move |_, i| {
        let key = format!("first:{i}");
        let Ok(result) = serde_json::to_vec(&receipt(i)) else { return std::future::ready(false) };
        let now = Instant::now();
        let mut guard = floor.lock().unwrap_or_else(|p| p.into_inner());
        let (map, queue) = &mut *guard;
        let fresh = map.insert(key.clone(), (result, now + keep)).is_none();
        queue.push_back((now + keep, key));
        while queue.front().is_some_and(|(at, _)| *at <= now) {
            if let Some((_, due)) = queue.pop_front() {
                if map.get(&due).is_some_and(|(_, at)| *at <= now) {
                    map.remove(&due);
                }
            }
        }
        std::future::ready(fresh)
    }
}

/// Holds `n` keys named `{prefix}{i}` in progress until `release` is set.
fn hold_keys(idem: &Idempotency, prefix: &str, n: u64, release: Arc<AtomicBool>) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|i| {
            let (idem, key, release) = (idem.clone(), format!("{prefix}{i}"), release.clone());
            tokio::spawn(async move {
                let _: R<()> = idem
                    .run(Call::new(key), || async move {
                        while !release.load(Ordering::Relaxed) {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Ok(())
                    })
                    .await;
            })
        })
        .collect()
}

/// Each case's median round (by ops/s), in first-seen order, its ratio recomputed against its
/// baseline's median.
fn medians(rows: Vec<Row>) -> Vec<Row> {
    let mut groups: Vec<Vec<Row>> = Vec::new();
    for row in rows {
        let same = |g: &&mut Vec<Row>| {
            let first = &g[0];
            (first.case.as_str(), first.store, first.concurrency) == (row.case.as_str(), row.store, row.concurrency)
        };
        match groups.iter_mut().find(same) {
            Some(group) => group.push(row),
            None => groups.push(vec![row]),
        }
    }
    let mut out: Vec<Row> = groups
        .into_iter()
        .map(|mut group| {
            group.sort_by(|a, b| a.ops_per_sec.total_cmp(&b.ops_per_sec));
            let rounds = group.len();
            let failures = group.iter().map(|r| r.failures).sum();
            let mut median = group.swap_remove(rounds / 2);
            median.rounds = rounds;
            // Every round's, so that the check after the runs sees them all.
            median.failures = failures;
            median
        })
        .collect();
    for i in 0..out.len() {
        let Some(baseline) = out[i].baseline.clone() else { continue };
        let base =
            out.iter().find(|r| r.case == baseline && r.store == out[i].store && r.concurrency == out[i].concurrency);
        out[i].ratio = base.map(|b| out[i].ops_per_sec / b.ops_per_sec);
    }
    out
}

fn print_table(rows: &[Row]) {
    println!(
        "| {:<26} | {:<6} | {:<8} | {:>4} | {:>11} | {:>7} | {:>7} | {:>5} | {:>7} | {:>11} | {:>12} | {:<25} | {:>6} |",
        "case",
        "store",
        "commit",
        "conc",
        "ops/s",
        "p50 µs",
        "p99 µs",
        "rt/op",
        "cmds/op",
        "server µs/op",
        "client µs/op",
        "ratio to",
        "ratio"
    );
    let widths = [28, 8, 10, 6, 13, 9, 9, 7, 9, 13, 14, 27, 8];
    println!("|{}|", widths.map(|w| "-".repeat(w)).join("|"));
    for r in rows {
        let opt = |v: Option<f64>, digits: usize| v.map_or("-".into(), |v| format!("{v:.digits$}"));
        println!(
            "| {:<26} | {:<6} | {:<8} | {:>4} | {:>11.0} | {:>7.0} | {:>7.0} | {:>5} | {:>7} | {:>11} | {:>12} | {:<25} | {:>6} |",
            r.case,
            r.store,
            r.commit.unwrap_or("-"),
            r.concurrency,
            r.ops_per_sec,
            r.p50_us,
            r.p99_us,
            opt(r.round_trips_per_op, 2),
            opt(r.commands_per_op, 2),
            opt(r.server_us_per_op, 2),
            format!("{:.2}", r.client_us_per_op),
            r.baseline.clone().unwrap_or_else(|| "-".into()),
            opt(r.ratio, 2),
        );
    }
}

/// Counts the commands clients send, not those scripts run, from the server's `MONITOR` stream
/// (`support::Monitor`, a connection of its own): commands a script runs are shown there as
/// `[0 lua]`, on Redis and Valkey alike (their slow logs differ: Valkey logs a script's commands
/// with its caller's address).
struct TopLevel {
    host: String,
    port: u16,
}

/// A command fred has no feature of ours for.
async fn raw(client: &Client, name: &'static str, args: &[&str]) -> Value {
    let cmd = fred::types::CustomCommand::new_static(name, fred::types::ClusterHash::Random, false);
    client.custom(cmd, args.iter().map(|a| a.to_string()).collect::<Vec<_>>()).await.expect(name)
}

impl TopLevel {
    fn of(client: &Client) -> TopLevel {
        let server = client.active_connections().into_iter().next().expect("a connected client");
        TopLevel { host: server.host.to_string(), port: server.port }
    }

    /// Top-level commands about idempotency records (`keys` is their Redis key prefix) sent
    /// while `f` ran, and how many of them were script calls. Other commands (the counting's
    /// own, `TIME`, which names no key) are left out.
    async fn count<Fut: Future<Output = ()>>(&self, keys: &str, f: Fut) -> (u64, u64) {
        let monitor = support::Monitor::start_at(&self.host, self.port);
        f.await;
        let commands = tokio::task::block_in_place(|| monitor.client_commands(keys));
        let scripts = commands
            .iter()
            .filter(|l| l.split_once("] \"").is_some_and(|(_, c)| c.to_ascii_uppercase().starts_with("EVAL")))
            .count();
        (commands.len() as u64, scripts as u64)
    }
}

/// Sequential, exact: the round trips each path costs, counted by Redis (top-level commands),
/// and, as `"<path>: scripts"`, how many of them are script calls (the rest are plain commands:
/// a parameter-mode acquire is a `SET NX GET`, so a replay or a conflict runs no script; a
/// commit is a `SET IFEQ` where the server has it). `scripts_first`: the script calls a first
/// execution should make on this server.
async fn check_round_trips(idem: &Idempotency, client: &Client, scripts_first: f64) -> Vec<(&'static str, f64, f64)> {
    const N: u64 = 200;
    let per = |n: u64| n as f64 / N as f64;
    // Warm the script cache so no NOSCRIPT fallback is counted.
    complete_keys(idem, "warm:", 1).await;
    let _: R<()> = idem
        .run(Call::new("warm:err"), || async { Err(Error::Conflict { key: String::new(), retry_after: None }) })
        .await;
    let top = TopLevel::of(client);
    let records = format!("{}:", idempotency::store::redis::DEFAULT_PREFIX);
    let mut out = Vec::new();

    let (n, scripts) = top.count(&records, complete_keys(idem, "rt-first:", N)).await;
    out.push(("first execution", per(n), 2.0));
    out.push(("first execution: scripts", per(scripts), scripts_first));

    let (n, scripts) = top.count(&records, complete_keys(idem, "rt-first:", N)).await;
    out.push(("replay", per(n), 1.0));
    out.push(("replay: scripts", per(scripts), 0.0));

    let release = Arc::new(AtomicBool::new(false));
    let holders = hold_keys(idem, "rt-held:", 1, release.clone());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (n, scripts) = top
        .count(&records, async {
            for _ in 0..N {
                let r: R<()> = idem.run(Call::new("rt-held:0"), || async { Ok(()) }).await;
                assert!(matches!(r, Err(Error::Conflict { .. })), "{r:?}");
            }
        })
        .await;
    out.push(("conflict", per(n), 1.0));
    out.push(("conflict: scripts", per(scripts), 0.0));
    release.store(true, Ordering::Relaxed);
    for h in holders {
        h.await.unwrap();
    }

    let (n, scripts) = top
        .count(&records, async {
            for i in 0..N {
                let _: R<()> = idem
                    .run(Call::new(format!("rt-err:{i}")), || async {
                        Err(Error::Conflict { key: String::new(), retry_after: None })
                    })
                    .await;
            }
        })
        .await;
    // Acquire plus release: the release itself costs one less (and is the script).
    out.push(("release after an error", per(n) - 1.0, 1.0));
    out.push(("release after an error: scripts", per(scripts), 1.0));
    out
}

/// Many calls in flight at once: script calls per second spent on their leases, and the
/// process's memory and CPU per call.
async fn in_flight(idem: &Idempotency, counters: Option<&Counters>, n: u64, lease: Duration, hold: Duration) -> String {
    let heap0 = HELD.load(Ordering::Relaxed);
    let cpu0 = cpu_time();
    let release = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (idem, release) = (idem.clone(), release.clone());
            tokio::spawn(async move {
                let _: R<()> = idem
                    .run(Call::new(format!("inflight:{i}")).ttl(lease), || async move {
                        while !release.load(Ordering::Relaxed) {
                            tokio::time::sleep(Duration::from_millis(250)).await;
                        }
                        Ok(())
                    })
                    .await;
            })
        })
        .collect();
    // All acquired once every key exists; from then on, only renewals reach Redis.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let window_start = Instant::now();
    let b = match counters {
        Some(c) => Some(c.read().await),
        None => None,
    };
    let cpu1 = cpu_time();
    let heap1 = HELD.load(Ordering::Relaxed);
    let window = hold.saturating_sub(started.elapsed());
    tokio::time::sleep(window).await;
    let scripts = match (counters, b) {
        (Some(c), Some(b)) => Some((c.read().await - b).scripts),
        _ => None,
    };
    let cpu2 = cpu_time();
    let took = window_start.elapsed().as_secs_f64();
    release.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let per_call = heap1.saturating_sub(heap0) as f64 / n as f64;
    let cpu = (cpu2 - cpu1).as_secs_f64() / took * 100.0;
    let setup_cpu = (cpu1 - cpu0).as_secs_f64();
    match scripts {
        Some(s) => format!(
            "{n} calls in flight, lease {lease:?}, held {took:.1} s: {:.1} renewal script calls/s ({s} in all), \
             {per_call:.0} heap bytes per call, {cpu:.1}% of a core while holding, {setup_cpu:.2} s CPU to start them",
            s as f64 / took
        ),
        None => format!(
            "{n} calls in flight (memory store), lease {lease:?}: {per_call:.0} heap bytes per call, \
             {cpu:.1}% of a core while holding, {setup_cpu:.2} s CPU to start them"
        ),
    }
}

fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, r)| r.split_whitespace().collect()).unwrap_or_default();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15 of /proc/self/stat: 11 and 12 after the ')'.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

/// MEMORY USAGE of completed records, against the size of their stored result: a few sizes,
/// then the mean and worst over a sweep (the allocator's size classes make it vary).
async fn record_memory(idem: &Idempotency, store: &RedisStore, client: &Client) -> Vec<String> {
    async fn usage(idem: &Idempotency, store: &RedisStore, client: &Client, size: usize) -> i64 {
        let key = format!("mem:{size}");
        let value = "x".repeat(size.saturating_sub(2)); // JSON adds two quotes
        let _: R<String> = idem.run(Call::new(&key), || async move { Ok(value) }).await;
        let record = store.record_key(&key);
        let usage = raw(client, "MEMORY", &["USAGE", &record, "SAMPLES", "0"]).await.as_i64().unwrap_or(-1);
        usage - size as i64
    }
    /// The same for the bare result under a key as long, set with a plain SET and an expiry: what
    /// Redis itself spends on any key, for comparison.
    async fn plain(store: &RedisStore, client: &Client, size: usize) -> i64 {
        let key = store.record_key(&format!("mem:{size}")).replace("idem:", "pln:");
        let value = "x".repeat(size);
        let _: () = client.set(&key, value, Some(Expiration::EX(3600)), None, false).await.unwrap();
        let usage = raw(client, "MEMORY", &["USAGE", &key, "SAMPLES", "0"]).await.as_i64().unwrap_or(-1);
        usage - size as i64
    }
    let mut out = Vec::new();
    for size in [16usize, 100, 1000] {
        let over = usage(idem, store, client, size).await;
        out.push(format!("completed record with a {size}-byte result: MEMORY USAGE = result + {over} bytes"));
    }
    let (mut overs, mut plains) = (Vec::new(), Vec::new());
    for size in (2..=4096).step_by(31) {
        overs.push(usage(idem, store, client, size).await);
        plains.push(plain(store, client, size).await);
    }
    let mean = |v: &[i64]| v.iter().sum::<i64>() as f64 / v.len() as f64;
    let max = overs.iter().max().copied().unwrap_or(0);
    let within = overs.iter().filter(|o| **o <= 150).count();
    out.push(format!(
        "over {} result sizes from 2 to 4096 bytes: record = result + {:.0} bytes on average (+ {max} at worst, \
         {within} of {} within + 150); a plain SET of the bare result under as long a key: + {:.0} on average \
         (the difference is our fields; the rest is Redis's per-key cost and the allocator's size classes)",
        overs.len(),
        mean(&overs),
        overs.len(),
        mean(&plains)
    ));
    out
}

async fn wait_latency(holder: &Idempotency, waiter: &Idempotency, rounds: u32) -> String {
    let mut lat = Vec::new();
    for i in 0..rounds {
        let key = format!("wait:{i}");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let h = holder.clone();
        let k = key.clone();
        let held = tokio::spawn(async move {
            let _: R<u32> = h
                .run(Call::new(k), || async move {
                    let _ = rx.await;
                    Ok(i)
                })
                .await;
            Instant::now()
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        let w = waiter.clone();
        let waiting = tokio::spawn(async move {
            let r: R<u32> = w
                .run(Call::new(key).on_conflict(idempotency::OnConflict::Wait(Duration::from_secs(5))), || async {
                    Ok(0)
                })
                .await;
            (r, Instant::now())
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        tx.send(()).unwrap();
        let committed = held.await.unwrap();
        let (r, woke) = waiting.await.unwrap();
        assert_eq!(r.unwrap(), i);
        lat.push(woke.saturating_duration_since(committed).as_micros() as u32);
    }
    lat.sort_unstable();
    format!(
        "wait path: waiter woken {:.0} µs (p50) / {:.0} µs (p99) after the holder's commit returned, {rounds} rounds",
        percentile(&lat, 0.5),
        percentile(&lat, 0.99)
    )
}

/// PostgreSQL: a cluster of the benchmark's own with `pg_stat_statements` loaded (or the server at
/// `--postgres`), the store on it, and the naive baseline's tables beside the store's.
struct Pg {
    _cluster: Option<support::postgres::PgCluster>,
    store: PgStore,
    idem: Idempotency,
    counters: PgCounters,
}

async fn pg_setup(o: &Options) -> Pg {
    let (cluster, url) = match &o.postgres {
        Some(url) => (None, url.clone()),
        None => {
            let settings = ["shared_preload_libraries=pg_stat_statements", "pg_stat_statements.track_utility=on"];
            let cluster = tokio::task::block_in_place(|| support::postgres::PgCluster::start_with(&settings));
            let url = cluster.url("postgres");
            (Some(cluster), url)
        }
    };
    // The reaper off: its statements would count as the cases'.
    let store = PgStore::builder(&url)
        .schema("bench")
        .pool_size(40)
        .reap(Duration::ZERO, 1)
        .migrate()
        .connect()
        .await
        .expect("connect to PostgreSQL");
    sqlx::raw_sql(
        "CREATE EXTENSION IF NOT EXISTS pg_stat_statements;
         CREATE TABLE IF NOT EXISTS bench.naive (key text PRIMARY KEY, result bytea, expires_at timestamptz NOT NULL);
         CREATE TABLE IF NOT EXISTS bench.effects (key text NOT NULL, fence bigint NOT NULL);
         TRUNCATE bench.naive, bench.effects, bench.idempotency;",
    )
    .execute(store.pool())
    .await
    .expect("set up the benchmark's tables (and pg_stat_statements)");
    let counters = PgCounters { pool: store.pool().clone(), postmaster: cluster.as_ref().map(|c| c.pid()) };
    Pg { _cluster: cluster, idem: Idempotency::new(store.clone()), store, counters }
}

const NAIVE_INSERT: &str =
    "INSERT INTO bench.naive (key, expires_at) VALUES ($1, now() + interval '30 seconds') ON CONFLICT DO NOTHING";
const NAIVE_UPDATE: &str = "UPDATE bench.naive SET result = $2, expires_at = now() + interval '1 day' WHERE key = $1";
const EFFECT_INSERT: &str = "INSERT INTO bench.effects (key, fence) VALUES ($1, $2)";

/// A transactional first execution of `key`: the body inserts its effect row.
async fn pg_tx_first(pg: &PgStore, idem: &Idempotency, key: String, i: u64) -> bool {
    let r: R<Receipt> = pg
        .run_in_transaction(idem, Call::new(key), |tx| {
            Box::pin(async move {
                let ctx = CallContext::current().expect("in a call");
                sqlx::query(EFFECT_INSERT)
                    .bind(ctx.key())
                    .bind(ctx.fence() as i64)
                    .execute(&mut **tx)
                    .await
                    .map_err(|e| Error::InvalidCall { key: String::new(), reason: e.to_string() })?;
                Ok(receipt(i))
            })
        })
        .await;
    r.is_ok()
}

/// The naive transactional baseline: the body's insert and the record in one transaction, with no
/// owner, lease or fence.
async fn naive_tx_first(pool: &sqlx::PgPool, key: String, i: u64) -> bool {
    let Ok(mut tx) = pool.begin().await else { return false };
    let result = serde_json::to_vec(&receipt(i)).unwrap();
    let ok = sqlx::query(NAIVE_INSERT).bind(&key).execute(&mut *tx).await.is_ok()
        && sqlx::query(EFFECT_INSERT).bind(&key).bind(i as i64).execute(&mut *tx).await.is_ok()
        && sqlx::query(NAIVE_UPDATE).bind(&key).bind(result).execute(&mut *tx).await.is_ok();
    ok && tx.commit().await.is_ok()
}

/// The round trips the server counted while `f` ran.
async fn pg_count(counters: &PgCounters, f: impl Future<Output = ()>) -> u64 {
    let before = counters.read().await;
    f.await;
    (counters.read().await - before).plain
}

/// Sequential, exact: the round trips each PostgreSQL path costs, counted by the server
/// (`pg_stat_statements`: statements, less the `SET LOCAL` sent in one message with `BEGIN`).
async fn check_pg_round_trips(pg: &Pg) -> Vec<(&'static str, f64, f64)> {
    const N: u64 = 200;
    let per = |n: u64| n as f64 / N as f64;
    // Each connection prepares a statement the first time it runs it (not a counted call).
    complete_keys(&pg.idem, "warm:", 50).await;
    let mut out = Vec::new();
    let n = pg_count(&pg.counters, complete_keys(&pg.idem, "rt-first:", N)).await;
    out.push(("pg first execution", per(n), 2.0));
    let n = pg_count(&pg.counters, complete_keys(&pg.idem, "rt-first:", N)).await;
    out.push(("pg replay", per(n), 1.0));
    let release = Arc::new(AtomicBool::new(false));
    let holders = hold_keys(&pg.idem, "rt-held:", 1, release.clone());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let n = pg_count(&pg.counters, async {
        for _ in 0..N {
            let r: R<()> = pg.idem.run(Call::new("rt-held:0"), || async { Ok(()) }).await;
            assert!(matches!(r, Err(Error::Conflict { .. })), "{r:?}");
        }
    })
    .await;
    out.push(("pg conflict", per(n), 1.0));
    release.store(true, Ordering::Relaxed);
    for h in holders {
        h.await.unwrap();
    }
    let n = pg_count(&pg.counters, async {
        for i in 0..N {
            let _: R<()> = pg
                .idem
                .run(Call::new(format!("rt-err:{i}")), || async {
                    Err(Error::Conflict { key: String::new(), retry_after: None })
                })
                .await;
        }
    })
    .await;
    out.push(("pg release after an error", per(n) - 1.0, 1.0));
    for i in 0..20 {
        pg_tx_first(&pg.store, &pg.idem, format!("warm-tx:{i}"), i).await;
    }
    let n = pg_count(&pg.counters, async {
        for i in 0..N {
            assert!(pg_tx_first(&pg.store, &pg.idem, format!("rt-tx:{i}"), i).await);
        }
    })
    .await;
    // acquire; BEGIN (with its SET LOCAL); the body's INSERT; the record's UPDATE; COMMIT.
    out.push(("pg transactional first execution", per(n), 5.0));
    let n = pg_count(&pg.counters, async {
        for i in 0..N {
            assert!(pg_tx_first(&pg.store, &pg.idem, format!("rt-tx:{i}"), i).await);
        }
    })
    .await;
    out.push(("pg transactional replay", per(n), 1.0));
    out
}

/// The PostgreSQL rows: ours against the naive baselines, every case in turn within each round.
async fn pg_rows(bench: &mut Bench, pg: &Pg, rounds: usize, concurrencies: &[usize]) {
    let pool = pg.store.pool().clone();
    complete_keys(&pg.idem, "replay:", 1000).await;
    for i in 0..1000u64 {
        sqlx::query(NAIVE_INSERT).bind(format!("naive:replay:{i}")).execute(&pool).await.unwrap();
        sqlx::query(NAIVE_UPDATE)
            .bind(format!("naive:replay:{i}"))
            .bind(b"{\"id\":1}".as_slice())
            .execute(&pool)
            .await
            .unwrap();
    }
    let release = Arc::new(AtomicBool::new(false));
    let holders = hold_keys(&pg.idem, "held:", 64, release.clone());
    tokio::time::sleep(Duration::from_millis(200)).await;
    for (round, &c) in (0..rounds).flat_map(|r| concurrencies.iter().map(move |c| (r, c))) {
        let p = pool.clone();
        let naive_first = bench
            .case("naive first (INS+UPD)", "pg", c, move |t, i| {
                let p = p.clone();
                async move {
                    let key = format!("naive:first:{round}:{c}:{t}:{i}");
                    let result = serde_json::to_vec(&receipt(i)).unwrap();
                    sqlx::query(NAIVE_INSERT).bind(&key).execute(&p).await.is_ok()
                        && sqlx::query(NAIVE_UPDATE).bind(&key).bind(result).execute(&p).await.is_ok()
                }
            })
            .await;
        let first =
            bench.case("first execution", "pg", c, first_op(pg.idem.clone(), format!("first:{round}:{c}"))).await;
        bench.ratio(first, naive_first);
        let p = pool.clone();
        let naive_replay = bench
            .case("naive replay (INS+SELECT)", "pg", c, move |_, i| {
                let p = p.clone();
                async move {
                    let key = format!("naive:replay:{}", i % 1000);
                    let _ = sqlx::query(NAIVE_INSERT).bind(&key).execute(&p).await;
                    let row =
                        sqlx::query("SELECT result FROM bench.naive WHERE key = $1").bind(&key).fetch_one(&p).await;
                    row.is_ok_and(|r| r.get::<Option<Vec<u8>>, _>(0).is_some())
                }
            })
            .await;
        let replay = bench.case("replay", "pg", c, replay_op(pg.idem.clone())).await;
        bench.ratio(replay, naive_replay);
        let conflict = bench.case("conflict", "pg", c, conflict_op(pg.idem.clone())).await;
        bench.ratio(conflict, naive_replay);
        let p = pool.clone();
        let naive_tx = bench
            .case("naive tx (BEGIN..COMMIT)", "pg", c, move |t, i| {
                let p = p.clone();
                async move { naive_tx_first(&p, format!("naive:tx:{round}:{c}:{t}:{i}"), i).await }
            })
            .await;
        let (st, idem) = (pg.store.clone(), pg.idem.clone());
        let tx = bench
            .case("transactional first", "pg", c, move |t, i| {
                let (st, idem) = (st.clone(), idem.clone());
                async move { pg_tx_first(&st, &idem, format!("tx:{round}:{c}:{t}:{i}"), i).await }
            })
            .await;
        bench.ratio(tx, naive_tx);
    }
    release.store(true, Ordering::Relaxed);
    for h in holders {
        h.await.unwrap();
    }
}

/// A Redis-protocol server the benchmark measures: one it starts itself (`binary`), or the one
/// at `url`; flushed.
struct Target {
    /// The rows' store label: `redis` or `valkey`.
    label: &'static str,
    /// What the store found at connect, e.g. `valkey 8.1.1`.
    server: String,
    _process: Option<support::RedisServer>,
    url: String,
    store: RedisStore,
    client: Client,
    idem: Idempotency,
    /// With a replay cache, filled by `prepare`.
    cached: Idempotency,
    /// `return 1`: the floor of a script call.
    floor: fred::types::scripts::Script,
}

impl Target {
    async fn start(label: &'static str, url: Option<String>, binary: fn() -> String) -> Target {
        let process = match &url {
            Some(_) => None,
            None => Some(support::RedisServer::start_binary(&binary())),
        };
        let url = url.unwrap_or_else(|| process.as_ref().unwrap().url());
        let store = RedisStore::connect(&url).await.unwrap_or_else(|e| panic!("connect to {label}: {e}"));
        let client = store.pool().next().clone();
        let _ = client.flushall::<()>(false).await;
        Target {
            label,
            server: store.server(),
            _process: process,
            url,
            idem: Idempotency::new(store.clone()),
            cached: Idempotency::builder(store.clone()).replay_cache(10_000).build(),
            client,
            store,
            floor: fred::types::scripts::Script::from_lua("return 1"),
        }
    }

    /// The records and keys the cases read, and 64 keys held for the conflict case (until
    /// `release`).
    async fn prepare(&mut self, release: Arc<AtomicBool>) -> Vec<tokio::task::JoinHandle<()>> {
        let _ = self.floor.load(&self.client).await;
        complete_keys(&self.idem, "replay:", 1000).await;
        complete_keys(&self.cached, "replay:", 1000).await; // fills the cache from the store
        for i in 0..1000u64 {
            let _: () = self.client.set(format!("naive:replay:{i}"), "{\"id\":1}", None, None, false).await.unwrap();
        }
        hold_keys(&self.idem, "held:", 64, release)
    }
}

/// One round of the cases on one Redis-protocol server at `c` tasks. The telemetry rows and the
/// store alone run on the first server (Redis) only: they measure our code, not the server.
async fn server_cases(bench: &mut Bench, t: &Target, telemetry: &Telemetry, round: usize, c: usize) {
    let (label, client, redis, store) = (t.label, &t.client, &t.idem, &t.store);
    let primary = label == "redis";
    let commit_path = store.commit_path().as_str();
    let cl = client.clone();
    let sha = t.floor.sha1().clone();
    let floor_row = bench
        .case("fred EVALSHA floor", label, c, move |_, _| {
            let (cl, sha) = (cl.clone(), sha.clone());
            async move { cl.evalsha::<i64, _, _, _>(sha, Vec::<String>::new(), Vec::<String>::new()).await.is_ok() }
        })
        .await;
    let cl = client.clone();
    let naive_first = bench
        .case("naive first (SET NX+SET)", label, c, move |t, i| {
            let cl = cl.clone();
            async move {
                let key = format!("naive:first:{round}:{c}:{t}:{i}");
                let _: Option<String> =
                    cl.set(&key, "1", Some(Expiration::EX(30)), Some(SetOptions::NX), false).await.ok().flatten();
                let body = serde_json::to_string(&receipt(i)).unwrap();
                cl.set::<(), _, _>(&key, body, Some(Expiration::EX(86_400)), None, false).await.is_ok()
            }
        })
        .await;
    let first = bench.case("first execution", label, c, first_op(redis.clone(), format!("first:{round}:{c}"))).await;
    bench.ratio(first, naive_first);
    bench.rows[first].commit = Some(commit_path);
    if !primary {
        return replays_and_conflicts(bench, t, c, floor_row, None).await;
    }
    telemetry.set(true);
    let idem = redis.clone();
    let observed = bench
        .case("first execution + telemetry", label, c, move |t, i| {
            let idem = idem.clone();
            async move {
                let r: R<Receipt> = idem
                    .run(Call::new(format!("observed:{round}:{c}:{t}:{i}")), || async move { Ok(receipt(i)) })
                    .await;
                r.is_ok()
            }
        })
        .await;
    telemetry.set(false);
    bench.ratio(observed, first);
    // The same two transitions through the store alone, without the runtime around them:
    // what the runtime itself costs.
    let st = store.clone();
    let direct = bench
        .case("first, store alone", label, c, move |t, i| {
            let st = st.clone();
            async move {
                let (key, owner) = (format!("direct:{round}:{c}:{t}:{i}"), format!("bench-{t}"));
                let acquire = AcquireRequest {
                    key: &key,
                    owner: &owner,
                    lease: Duration::from_secs(30),
                    fingerprint: None,
                    will_wait: false,
                    report_ttl: false,
                };
                let Ok(AcquireOutcome::Acquired { fence }) = st.acquire(acquire).await else { return false };
                let result = serde_json::to_vec(&receipt(i)).unwrap();
                let commit = CommitRequest {
                    key: &key,
                    owner: &owner,
                    fence,
                    keep: Duration::from_secs(86_400),
                    result: Some(&result),
                    fingerprint: None,
                };
                matches!(st.commit(commit).await, Ok(Transition::Done))
            }
        })
        .await;
    bench.ratio(direct, naive_first);
    bench.rows[direct].commit = Some(commit_path);
    replays_and_conflicts(bench, t, c, floor_row, Some(telemetry)).await;
}

/// The replay and conflict cases of one round on one server (`floor_row`: its EVALSHA floor).
/// With telemetry on the first server (Redis) only.
async fn replays_and_conflicts(
    bench: &mut Bench,
    t: &Target,
    c: usize,
    floor_row: usize,
    telemetry: Option<&Telemetry>,
) {
    let (label, client, redis, cached) = (t.label, &t.client, &t.idem, &t.cached);
    let cl = client.clone();
    let naive_replay = bench
        .case("naive replay (SET NX+GET)", label, c, move |_, i| {
            let cl = cl.clone();
            async move {
                let key = format!("naive:replay:{}", i % 1000);
                let _: Option<String> =
                    cl.set(&key, "1", Some(Expiration::EX(30)), Some(SetOptions::NX), false).await.ok().flatten();
                cl.get::<Option<String>, _>(&key).await.is_ok()
            }
        })
        .await;
    let replay = bench.case("replay", label, c, replay_op(redis.clone())).await;
    bench.ratio(replay, naive_replay);
    let hot = bench.case("replay, cached", label, c, replay_op(cached.clone())).await;
    bench.ratio(hot, naive_replay);
    if let Some(telemetry) = telemetry {
        telemetry.set(true);
        let observed = bench.case("replay, cached + telemetry", label, c, replay_op(cached.clone())).await;
        telemetry.set(false);
        bench.ratio(observed, hot);
    }
    let conflict = bench.case("conflict", label, c, conflict_op(redis.clone())).await;
    bench.ratio(conflict, floor_row);
}

fn main() {
    let o = options();
    if let Some(table) = &o.chart_from {
        let text = std::fs::read_to_string(table).unwrap_or_else(|e| panic!("{table}: {e}"));
        chart::write(&o.chart, &chart::rows_of_table(&text)).expect("write the chart");
        eprintln!("chart written to {}", o.chart);
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(run(o));
}

async fn run(o: Options) {
    let mut targets = vec![Target::start("redis", o.redis.clone(), support::redis_server_binary).await];
    if !o.no_valkey {
        targets.push(Target::start("valkey", o.valkey.clone(), support::valkey_server_binary).await);
    }

    let mut checks = Vec::new();
    let mut wrong = 0;
    for t in &targets {
        let scripts_first = if t.store.commit_path() == CommitPath::CompareAndSet { 0.0 } else { 1.0 };
        for (path, got, want) in check_round_trips(&t.idem, &t.client, scripts_first).await {
            let verdict = if (got - want).abs() < 1e-9 { "ok" } else { "WRONG" };
            if verdict == "WRONG" {
                wrong += 1;
            }
            let what = match path.split_once(": ") {
                Some((path, _)) => format!("  of which script calls, {path}"),
                None => format!("round trips, {} ({}, commits: {}), {path}", t.label, t.server, t.store.commit_path()),
            };
            println!("{what}: {got:.2} per call (target {want}) {verdict}");
            checks.push((t.label, path, got, want));
        }
        let fallbacks = Counters { client: t.client.clone() }.read().await.evals;
        println!(
            "EVAL fallbacks after NOSCRIPT on {}: {fallbacks} (the store loads its scripts when it connects)",
            t.label
        );
    }
    let pg = if o.no_postgres { None } else { Some(pg_setup(&o).await) };
    if let Some(pg) = &pg {
        for (path, got, want) in check_pg_round_trips(pg).await {
            let verdict = if (got - want).abs() < 1e-9 { "ok" } else { "WRONG" };
            if verdict == "WRONG" {
                wrong += 1;
            }
            println!("round trips, pg, {path}: {got:.2} per call (target {want}) {verdict}");
        }
    }
    if o.check {
        if wrong > 0 {
            eprintln!("round-trip counts differ from the targets");
            std::process::exit(1);
        }
        return;
    }

    let telemetry = Telemetry::install();
    let secs = Duration::from_millis(if o.short { 1000 } else { 2000 });
    let concurrencies: &[usize] = if o.short { &[1, 32] } else { &[1, 32, 256] };
    // Client and servers share two cores with whatever else the machine runs: every case on a
    // server runs in several rounds, each round all cases in turn, and the table shows each
    // case's median round (ratios between medians), so one noisy second moves no ratio.
    let rounds = if o.short { 1 } else { 5 };
    let mut bench = Bench {
        counters: targets.iter().map(|t| (t.label, Counters { client: t.client.clone() })).collect(),
        pg: None,
        rows: Vec::new(),
        secs,
        exact: checks.clone(),
    };
    let release = Arc::new(AtomicBool::new(false));
    let mut holders = Vec::new();
    for t in &mut targets {
        holders.extend(t.prepare(release.clone()).await);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    for (round, &c) in (0..rounds).flat_map(|r| concurrencies.iter().map(move |c| (r, c))) {
        for t in &targets {
            server_cases(&mut bench, t, &telemetry, round, c).await;
        }
    }
    if let Some(pg) = &pg {
        bench.pg = Some(PgCounters { pool: pg.counters.pool.clone(), postmaster: pg.counters.postmaster });
        let pg_concurrencies: &[usize] = &[1, 32];
        pg_rows(&mut bench, pg, rounds, pg_concurrencies).await;
    }
    bench.rows = medians(std::mem::take(&mut bench.rows));
    release.store(true, Ordering::Relaxed);
    for h in holders {
        h.await.unwrap();
    }
    // The rest runs on the first server (Redis).
    let t = &targets[0];
    let (redis, store, client, cached, url) = (&t.idem, &t.store, &t.client, &t.cached, &t.url);

    // The in-process store, one task: first execution and replay on one core. Records are kept
    // 1 s (the store then holds a steady 500,000 or so, far more than the CPU caches) and 10 ms
    // (a few thousand, which fit), each against the in-process floor with the same keep.
    let memory = Idempotency::new(MemoryStore::new());
    for (label, keep) in [("1 s", Duration::from_secs(1)), ("10 ms", Duration::from_millis(10))] {
        let floor = bench.case(&format!("map floor, keep {label}"), "memory", 1, floor_op(keep)).await;
        let m = Idempotency::new(MemoryStore::new());
        let ours = bench
            .case(&format!("first, keep {label}"), "memory", 1, move |_, i| {
                let m = m.clone();
                async move {
                    let call = Call::new(format!("first:{i}")).keep(keep);
                    let r: R<Receipt> = m.run(call, || async move { Ok(receipt(i)) }).await;
                    r.is_ok()
                }
            })
            .await;
        bench.ratio(ours, floor);
    }
    complete_keys(&memory, "replay:", 1000).await;
    bench.case("replay", "memory", 1, replay_op(memory.clone())).await;
    bench.case("replay, cached", "cache", 1, replay_op(cached.clone())).await;
    // A call that did not go as its case expects would count toward the rate all the same.
    if let Some(r) = bench.rows.iter().find(|r| r.failures > 0) {
        eprintln!("{} calls of '{}' ({} tasks) did not go as expected", r.failures, r.case, r.concurrency);
        std::process::exit(1);
    }

    let waiter = Idempotency::new(RedisStore::connect(url).await.expect("second client"));
    let wait = wait_latency(redis, &waiter, if o.short { 50 } else { 200 }).await;
    let _ = client.flushall::<()>(false).await;
    let (lease, hold) = if o.short {
        (Duration::from_secs(3), Duration::from_secs(4))
    } else {
        (Duration::from_secs(30), Duration::from_secs(40))
    };
    let inflight_redis = in_flight(redis, bench.counters("redis"), 10_000, lease, hold).await;
    let inflight_memory = in_flight(&memory, None, 10_000, lease, Duration::from_secs(2)).await;
    let memory_lines = record_memory(redis, store, client).await;
    if !o.chart.is_empty() {
        match chart::write(&o.chart, &bench.rows) {
            Ok(()) => eprintln!("chart written to {}", o.chart),
            Err(e) => eprintln!("chart not written to {}: {e}", o.chart),
        }
    }

    if o.json {
        let doc = serde_json::json!({
            "rows": bench.rows,
            "round_trips": checks
                .iter()
                .map(|(s, p, g, w)| serde_json::json!({"server": s, "path": p, "per_call": g, "target": w}))
                .collect::<Vec<_>>(),
            "wait": wait,
            "in_flight": [inflight_redis, inflight_memory],
            "record_memory": memory_lines,
        });
        println!("{}", serde_json::to_string_pretty(&doc).unwrap());
    } else {
        println!();
        println!(
            "Rows on servers (redis: {}; valkey: {}; pg): the median of {rounds} round(s) of {:?} each, all \
             cases in turn in every round; ratios are between medians, each against a baseline on the \
             same server. `commit`: how the row's commits ran.",
            targets[0].server,
            targets.get(1).map_or("not run", |t| t.server.as_str()),
            secs
        );
        print_table(&bench.rows);
        println!();
        println!("{wait}");
        println!("{inflight_redis}");
        println!("{inflight_memory}");
        for l in memory_lines {
            println!("{l}");
        }
    }
}

/// The chart next to the table: ops/s of every case, one group of bars per case, a bar per
/// store/server and concurrency (log scale: the rates span four orders of magnitude).
mod chart {
    use plotters::prelude::*;

    use super::Row;

    /// Bars for the cases people compare: ours, and every naive baseline (rows whose case starts
    /// with `naive`).
    const CASES: [&str; 5] = ["first execution", "replay", "replay, cached", "conflict", "transactional first"];

    /// The rows of a table the benchmark printed (case, store, commit, tasks, ops/s, ...).
    /// Where the rate axis starts: every rate is far above it.
    const FLOOR: f64 = 1000.0;

    pub fn rows_of_table(text: &str) -> Vec<Row> {
        text.lines()
            .filter_map(|line| {
                let cells: Vec<&str> = line.split('|').map(str::trim).collect();
                let (case, store, concurrency, ops) = (cells.get(1)?, cells.get(2)?, cells.get(4)?, cells.get(5)?);
                Some(Row {
                    case: case.to_string(),
                    store: Box::leak(store.to_string().into_boxed_str()),
                    concurrency: concurrency.parse().ok()?,
                    ops_per_sec: ops.parse().ok()?,
                    ..Row::default()
                })
            })
            .collect()
    }

    pub fn write(path: &str, rows: &[Row]) -> Result<(), Box<dyn std::error::Error>> {
        if let Some(dir) = std::path::Path::new(path).parent() {
            std::fs::create_dir_all(dir)?;
        }
        // The cases and the (store, tasks) series shown, in the table's order.
        let (mut cases, mut series): (Vec<&str>, Vec<(&'static str, usize)>) = (Vec::new(), Vec::new());
        for r in rows.iter().filter(|r| CASES.contains(&r.case.as_str()) || r.case.starts_with("naive")) {
            if !cases.contains(&r.case.as_str()) {
                cases.push(r.case.as_str());
            }
            if !series.contains(&(r.store, r.concurrency)) {
                series.push((r.store, r.concurrency));
            }
        }
        let top = rows.iter().map(|r| r.ops_per_sec).fold(1.0, f64::max) * 2.0;
        let slot = series.len().max(1) as f64 + 1.0;
        let height = 80 + cases.len() as u32 * (series.len() as u32 * 7 + 14);
        let root = SVGBackend::new(path, (1200, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let (plot, legend) = root.split_horizontally(1000);
        // Cases top to bottom, as in the table; bars grow to the right.
        let at = |i: usize| (cases.len() - 1 - i) as f64;
        let mut chart = ChartBuilder::on(&plot)
            .caption("ops/s by case, store/server and tasks (log scale; longer is better)", ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(190)
            .build_cartesian_2d((FLOOR..top).log_scale(), 0.0..cases.len() as f64)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(cases.len() * 2 + 1)
            .y_label_formatter(&|y| {
                let i = (y - 0.5).round();
                if (y - 0.5 - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < cases.len() {
                    cases[cases.len() - 1 - i as usize].to_string()
                } else {
                    String::new()
                }
            })
            .y_label_style(("sans-serif", 13))
            .x_desc("ops/s")
            .x_label_formatter(&|v| format!("{v:.0}"))
            .draw()?;
        let color = |i: usize| Palette99::pick(i).to_rgba();
        for (s, (store, concurrency)) in series.iter().enumerate() {
            let bars = cases.iter().enumerate().filter_map(|(ci, case)| {
                let row =
                    rows.iter().find(|r| r.case == *case && r.store == *store && r.concurrency == *concurrency)?;
                // The first series on top within its case.
                let y1 = at(ci) + 1.0 - (s as f64 + 0.5) / slot;
                let y0 = y1 - 1.0 / slot;
                Some(Rectangle::new([(FLOOR, y0), (row.ops_per_sec.max(FLOOR), y1)], color(s).filled()))
            });
            chart.draw_series(bars)?;
        }
        for (s, (store, concurrency)) in series.iter().enumerate() {
            let y = 40 + s as i32 * 22;
            legend.draw(&Rectangle::new([(10, y), (26, y + 14)], color(s).filled()))?;
            let tasks = if *concurrency == 1 { "task" } else { "tasks" };
            legend.draw(&Text::new(format!("{store}, {concurrency} {tasks}"), (32, y), ("sans-serif", 13)))?;
        }
        root.present()?;
        Ok(())
    }
}
