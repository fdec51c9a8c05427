//! The benchmark: our paths against the Redis floor and a naive baseline, measured in one run on
//! one Redis, with round trips and Redis commands per operation read from Redis itself
//! (`INFO commandstats` deltas).
//!
//! ```text
//! cargo run --release -p idempotent-bench                 # full run, starts its own redis-server
//! cargo run --release -p idempotent-bench -- --short      # about a minute
//! cargo run --release -p idempotent-bench -- --check      # exact round-trip counts only (CI smoke test)
//! cargo run --release -p idempotent-bench -- --redis redis://127.0.0.1:6379 --json
//! cargo run --release -p idempotent-bench -- --no-postgres                     # Redis and memory rows only
//! cargo run --release -p idempotent-bench -- --batches    # only the batch rows (queue consumers)
//! bash scripts/instructions.sh     # client instructions per call (callgrind), ours against the baselines
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
//!
//! Its rooms: [`harness`] (rows, timing, the table), [`counters`] (what the servers count),
//! [`ops`] (the operations timed), [`telemetry`], [`checks`] (the exact counts), [`redis_rows`],
//! [`mod@pg_rows`], [`batch_rows`], [`chart`], [`instructions`] (one path's calls, for callgrind
//! to count).

#[path = "../../tests/support/mod.rs"]
#[allow(unused_imports)]
mod support;

mod batch_rows;
mod chart;
mod checks;
mod counters;
mod harness;
mod instructions;
mod ops;
mod pg_rows;
mod redis_rows;
mod telemetry;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idempotency::store::redis::fred::prelude::*;
use idempotency::store::redis::CommitPath;
use idempotency::{Call, Idempotency, MemoryStore, RedisStore};

use crate::batch_rows::{against_per_message, batch_cases, BatchTarget, NaiveOn};
use crate::checks::{
    check_batch_round_trips, check_lock_handovers, check_pg_batch_round_trips, check_pg_round_trips, check_round_trips,
};
use crate::counters::{Counters, PgCounters};
use crate::harness::{medians, print_table, Bench};
use crate::ops::{complete_keys, floor_op, receipt, replay_op, Receipt, R};
use crate::pg_rows::{pg_rows, pg_setup};
use crate::redis_rows::{in_flight, record_memory, server_cases, wait_latency, Target};
use crate::telemetry::Telemetry;

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
    /// Only the batch rows.
    batches: bool,
    json: bool,
    /// `--instructions PATH --ops N`: only run N calls of PATH (see `instructions`).
    instructions: Option<String>,
    ops: u64,
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
        batches: false,
        json: false,
        instructions: None,
        ops: 1000,
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
            "--batches" => o.batches = true,
            "--json" => o.json = true,
            "--instructions" => o.instructions = args.next(),
            "--ops" => {
                o.ops = args.next().and_then(|n| n.parse().ok()).unwrap_or_else(|| {
                    eprintln!("--ops takes a number of calls");
                    std::process::exit(2);
                })
            }
            "-h" | "--help" => {
                println!(
                    "usage: bench [--short] [--check | --batches] [--json] [--chart FILE.svg] [--redis URL] \
                     [--valkey URL | --no-valkey] [--postgres URL | --no-postgres]\n       \
                     bench --chart-from TABLE.txt [--chart FILE.svg]   (the chart of a saved run's table)\n       \
                     bench --instructions PATH --ops N --redis URL      (N calls of one path, for callgrind)"
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

fn main() {
    let o = options();
    if let Some(path) = &o.instructions {
        let url = o.redis.as_deref().unwrap_or_else(|| {
            eprintln!("--instructions needs --redis URL");
            std::process::exit(2);
        });
        instructions::run(path, o.ops, url);
        return;
    }
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
                None => format!("commands, {} ({}, commits: {}), {path}", t.label, t.server, t.store.commit_path()),
            };
            println!("{what}: {got:.2} per call (target {want}) {verdict}");
            checks.push((t.label, path, got, want));
        }
        let compare_and_set = t.store.commit_path() == idempotency::store::redis::CommitPath::CompareAndSet;
        for (path, got, want) in check_batch_round_trips(&t.idem, &t.client, compare_and_set).await {
            let verdict = if (got - want).abs() < 1e-9 { "ok" } else { "WRONG" };
            if verdict == "WRONG" {
                wrong += 1;
            }
            println!("commands, {}, {path}: {got:.2} per batch (target {want}) {verdict}", t.label);
            checks.push((t.label, path, got, want));
        }
        for (path, got, most) in check_lock_handovers(&t.store).await {
            let verdict = if got <= most { "ok" } else { "WRONG" };
            if verdict == "WRONG" {
                wrong += 1;
            }
            println!("{path}, {}: {got:.2} (target at most {most}) {verdict}", t.label);
        }
        let fallbacks = Counters { client: t.client.clone() }.read().await.evals;
        println!(
            "EVAL fallbacks after NOSCRIPT on {}: {fallbacks} (the store loads its scripts when it connects)",
            t.label
        );
    }
    let pg = if o.no_postgres { None } else { Some(pg_setup(o.postgres.as_deref()).await) };
    if let Some(pg) = &pg {
        for (path, got, want) in check_pg_round_trips(pg).await {
            let verdict = if (got - want).abs() < 1e-9 { "ok" } else { "WRONG" };
            if verdict == "WRONG" {
                wrong += 1;
            }
            println!("round trips, pg, {path}: {got:.2} per call (target {want}) {verdict}");
        }
        for (path, got, want) in check_pg_batch_round_trips(pg).await {
            let verdict = if (got - want).abs() < 1e-9 { "ok" } else { "WRONG" };
            if verdict == "WRONG" {
                wrong += 1;
            }
            println!("round trips, pg, {path}: {got:.2} per batch (target {want}) {verdict}");
        }
    }
    if o.check {
        if wrong > 0 {
            eprintln!("round-trip counts differ from the targets");
            std::process::exit(1);
        }
        return;
    }

    if o.batches {
        return batch_run(&o, &targets, pg.as_ref(), &checks).await;
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

/// `--batches`: the batch rows alone, on every server, each size in turn within every round.
async fn batch_run(
    o: &Options,
    targets: &[Target],
    pg: Option<&pg_rows::Pg>,
    checks: &[(&'static str, &'static str, f64, f64)],
) {
    let rounds = if o.short { 1 } else { 3 };
    let mut bench = Bench {
        counters: targets.iter().map(|t| (t.label, Counters { client: t.client.clone() })).collect(),
        pg: pg.map(|pg| PgCounters { pool: pg.counters.pool.clone(), postmaster: pg.counters.postmaster }),
        rows: Vec::new(),
        secs: Duration::from_millis(if o.short { 1000 } else { 2000 }),
        exact: checks.to_vec(),
    };
    let mut servers: Vec<BatchTarget> = targets
        .iter()
        .map(|t| BatchTarget {
            label: t.label,
            idem: &t.idem,
            naive: NaiveOn::Redis(t.client.clone()),
            round_trips: Some((checks::BATCH_ROUND_TRIPS, 2.0)),
        })
        .collect();
    if let Some(pg) = pg {
        servers.push(BatchTarget {
            label: "pg",
            idem: &pg.idem,
            naive: NaiveOn::Pg(pg.store.pool().clone()),
            round_trips: None,
        });
    }
    for round in 0..rounds {
        for t in &servers {
            batch_cases(&mut bench, t, round).await;
        }
    }
    bench.rows = medians(std::mem::take(&mut bench.rows));
    if let Some(r) = bench.rows.iter().find(|r| r.failures > 0) {
        eprintln!("{} batches of '{}' did not go as expected", r.failures, r.case);
        std::process::exit(1);
    }
    if o.json {
        println!("{}", serde_json::to_string_pretty(&bench.rows).unwrap());
        return;
    }
    println!();
    println!(
        "Batch rows, one task, the median of {rounds} round(s) of {:?} each: ops/s are messages per second \
         (a batch's messages over its time), p50/p99 and rt/op per batch, CPU per message.",
        bench.secs
    );
    print_table(&bench.rows);
    println!();
    for line in against_per_message(&bench.rows) {
        println!("{line}");
    }
}
