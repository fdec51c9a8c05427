//! The rows on Redis and Valkey: each server the benchmark measures (`Target`), one round of its
//! cases against the naive baseline and the EVALSHA floor, and the single measurements (calls in
//! flight, a record's memory, the wait path's latency).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idempotency::store::redis::fred::prelude::*;
use idempotency::store::{AcquireOutcome, AcquireRequest, CommitRequest, Transition};
use idempotency::{Call, Idempotency, RedisStore, Store};
use tokio::time::Instant;

use crate::counters::{raw, Counters};
use crate::harness::{cpu_time, percentile, Bench, HELD};
use crate::ops::{complete_keys, conflict_op, first_op, hold_keys, receipt, replay_op, Receipt, R};
use crate::support;
use crate::telemetry::Telemetry;

/// Many calls in flight at once: script calls per second spent on their leases, and the
/// process's memory and CPU per call.
pub async fn in_flight(
    idem: &Idempotency,
    counters: Option<&Counters>,
    n: u64,
    lease: Duration,
    hold: Duration,
) -> String {
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

/// MEMORY USAGE of completed records, against the size of their stored result: a few sizes,
/// then the mean and worst over a sweep (the allocator's size classes make it vary).
pub async fn record_memory(idem: &Idempotency, store: &RedisStore, client: &Client) -> Vec<String> {
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

pub async fn wait_latency(holder: &Idempotency, waiter: &Idempotency, rounds: u32) -> String {
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

/// A Redis-protocol server the benchmark measures: one it starts itself (`binary`), or the one
/// at `url`; flushed.
pub struct Target {
    /// The rows' store label: `redis` or `valkey`.
    pub label: &'static str,
    /// What the store found at connect, e.g. `valkey 8.1.1`.
    pub server: String,
    pub _process: Option<support::RedisServer>,
    pub url: String,
    pub store: RedisStore,
    pub client: Client,
    pub idem: Idempotency,
    /// With a replay cache, filled by `prepare`.
    pub cached: Idempotency,
    /// `return 1`: the floor of a script call.
    pub floor: fred::types::scripts::Script,
}

impl Target {
    pub async fn start(label: &'static str, url: Option<String>, binary: fn() -> String) -> Target {
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
    pub async fn prepare(&mut self, release: Arc<AtomicBool>) -> Vec<tokio::task::JoinHandle<()>> {
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
pub async fn server_cases(bench: &mut Bench, t: &Target, telemetry: &Telemetry, round: usize, c: usize) {
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
                    fence_now: false,
                    lapse: idempotency::store::Lapse::Free,
                    keep: Duration::ZERO,
                };
                let Ok(AcquireOutcome::Acquired { fence, .. }) = st.acquire(acquire).await else { return false };
                let result = serde_json::to_vec(&receipt(i)).unwrap();
                let commit = CommitRequest {
                    key: &key,
                    owner: &owner,
                    fence,
                    keep: Duration::from_secs(86_400),
                    result: Some(&result),
                    fingerprint: None,
                    lease_in_record: false,
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
pub async fn replays_and_conflicts(
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
