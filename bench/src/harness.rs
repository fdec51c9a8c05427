//! The harness every row shares: a counting allocator (heap bytes per call in flight), a row of
//! the table, `measure` (tasks calling an operation for a while), `Bench` (cases, their
//! counters and ratios), each case's median round, the table, and the process's CPU time.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::counters::{Counters, PgCounters};

/// Counts the bytes this process holds on the heap, for memory per call in flight.
pub struct Counting;

pub static HELD: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

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
pub static ALLOCATOR: Counting = Counting;

#[derive(Debug, Clone, Default, Serialize)]
pub struct Row {
    pub case: String,
    pub store: &'static str,
    pub concurrency: usize,
    pub ops_per_sec: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub round_trips_per_op: Option<f64>,
    pub commands_per_op: Option<f64>,
    /// CPU microseconds the Redis server spent per op (user plus system: commands, scripts,
    /// reading and writing the connection).
    pub server_us_per_op: Option<f64>,
    /// CPU microseconds this process (the client: runtime, fred, the benchmark's tasks) spent
    /// per op. With client and Redis on the same two cores, the two together bound the rate.
    pub client_us_per_op: f64,
    pub baseline: Option<String>,
    pub ratio: Option<f64>,
    /// How the row's commits ran on its server (`SET IFEQ` or `script`), for rows that commit.
    pub commit: Option<&'static str>,
    pub failures: u64,
    /// Rounds the case ran; the row is the median one.
    pub rounds: usize,
}

/// Runs `op` from `concurrency` tasks for `secs`; each call gets (task, sequence number) and
/// says whether it went as expected.
pub async fn measure<F, Fut>(concurrency: usize, dur: Duration, op: F) -> (u64, u64, Vec<u32>, Duration)
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

pub fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize] as f64
}

pub struct Bench {
    /// Each Redis-protocol server's counters, by the rows' store label (`redis`, `valkey`).
    pub counters: Vec<(&'static str, Counters)>,
    pub pg: Option<PgCounters>,
    pub rows: Vec<Row>,
    pub secs: Duration,
    /// Round trips per call of each path on each server (store label, path, count, target),
    /// counted exactly beforehand (slow log).
    pub exact: Vec<(&'static str, &'static str, f64, f64)>,
}

impl Bench {
    /// The exact round trips of the path a case measures ("first, store alone" is a first
    /// execution).
    pub fn exact_round_trips(&self, store: &str, case: &str) -> f64 {
        if case.contains("cached") {
            return 0.0;
        }
        let path = if case.starts_with("first") { "first execution" } else { case };
        self.exact.iter().find(|(s, p, _, _)| *s == store && *p == path).map_or(f64::NAN, |e| e.2)
    }

    pub fn counters(&self, store: &str) -> Option<&Counters> {
        self.counters.iter().find(|(label, _)| *label == store).map(|(_, c)| c)
    }

    pub async fn case<F, Fut>(&mut self, case: &str, store: &'static str, concurrency: usize, op: F) -> usize
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

    pub fn ratio(&mut self, row: usize, baseline: usize) {
        let r = self.rows[row].ops_per_sec / self.rows[baseline].ops_per_sec;
        let name = self.rows[baseline].case.clone();
        self.rows[row].baseline = Some(name);
        self.rows[row].ratio = Some(r);
    }
}

/// Each case's median round (by ops/s), in first-seen order, its ratio recomputed against its
/// baseline's median.
pub fn medians(rows: Vec<Row>) -> Vec<Row> {
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

pub fn print_table(rows: &[Row]) {
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

pub fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, r)| r.split_whitespace().collect()).unwrap_or_default();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15 of /proc/self/stat: 11 and 12 after the ')'.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}
