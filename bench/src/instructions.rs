//! The client's own CPU per call, as instructions (`scripts/instructions.sh` runs this under
//! `valgrind --tool=callgrind`, which counts instructions, not time, so the count repeats on a
//! noisy machine): `--instructions PATH --ops N --redis URL` runs `N` calls of one path one after
//! the other on a current-thread runtime (no cross-thread wake-ups to vary between runs), then
//! exits. The script runs each path twice, with two values of `N`, and divides the difference by
//! the difference of `N`: what connecting and preparing cost cancels out.
//!
//! Paths: ours (`first`, `replay`, `conflict`, `first-fenced`: a body that reads its fence;
//! `first-telemetry`: `first` with the benchmark's subscriber and recorder on, as a service would
//! install them;
//! `memory-first`: a first execution on `MemoryStore`, the runtime's cost without a client's), the
//! naive baseline (`naive-first`: `SET NX` then `SET`; `naive-replay`: `SET NX` then `GET`) and
//! the floors (`get`: one bare command; `evalsha`: one script call of `return 1`; `hand-replay`:
//! the least a replay in one command can cost, our acquire's `SET ... NX PX GET` and the stored
//! result's decoding written by hand), all through the same fred client.

use std::time::Duration;

use idempotency::store::redis::fred::prelude::*;
use idempotency::store::{AcquireOutcome, AcquireRequest};
use idempotency::{Call, CallContext, Error, Idempotency, MemoryStore, RedisStore, Store};

use crate::ops::{receipt, Receipt, R};

/// Every path this mode knows, in the order the script prints them.
pub const PATHS: &[&str] = &[
    "get",
    "evalsha",
    "naive-first",
    "naive-replay",
    "hand-replay",
    "first",
    "replay",
    "conflict",
    "first-fenced",
    "first-telemetry",
    "batch",
    "naive-batch",
    "memory-first",
];

/// The messages of one op of the `batch` and `naive-batch` paths.
const BATCH: u64 = 100;

/// Runs `n` calls of `path` against the server at `url`.
pub fn run(path: &str, n: u64, url: &str) {
    if !PATHS.contains(&path) {
        eprintln!("unknown path {path:?}: one of {PATHS:?}");
        std::process::exit(2);
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    rt.block_on(async {
        let store = RedisStore::connect(url).await.unwrap_or_else(|e| panic!("connect to {url}: {e}"));
        let client = store.pool().next().clone();
        let idem = Idempotency::new(store.clone());
        let memory = Idempotency::new(MemoryStore::new());
        let floor = fred::types::scripts::Script::from_lua("return 1");
        floor.load(&client).await.expect("load the floor script");
        // What the paths read: the same keys at every N, so that preparing cancels out.
        for i in 0..64u64 {
            let _: R<Receipt> = idem.run(Call::new(format!("ins:replay:{i}")), || async move { Ok(receipt(i)) }).await;
            let _: () = client.set(format!("ins:naive:replay:{i}"), "{\"id\":1}", None, None, false).await.unwrap();
            let stored = serde_json::to_string(&receipt(i)).unwrap();
            let _: () = client.set(format!("ins:hand:replay:{i}"), stored, None, None, false).await.unwrap();
        }
        let held = AcquireRequest {
            key: "ins:held",
            owner: "elsewhere",
            lease: Duration::from_secs(600),
            fingerprint: None,
            will_wait: false,
            report_ttl: false,
            fence_now: false,
            lapse: idempotency::store::Lapse::Free,
            keep: Duration::ZERO,
        };
        if !matches!(store.acquire(held).await, Ok(AcquireOutcome::Acquired { .. } | AcquireOutcome::InProgress { .. }))
        {
            panic!("could not hold ins:held");
        }
        if path == "first-telemetry" {
            // Installed for the process, which runs this one path.
            crate::telemetry::Telemetry::install().set(true);
        }
        // A fresh namespace for first executions at every run: the server is not flushed.
        let run_id = std::process::id();
        for i in 0..n {
            let ok = match path {
                "get" => client.get::<Option<String>, _>(format!("ins:naive:replay:{}", i % 64)).await.is_ok(),
                "evalsha" => client
                    .evalsha::<i64, _, _, _>(floor.sha1().clone(), Vec::<String>::new(), Vec::<String>::new())
                    .await
                    .is_ok(),
                "naive-first" => {
                    let key = format!("ins:naive:first:{run_id}:{i}");
                    let _: Option<String> = client
                        .set(&key, "1", Some(Expiration::EX(30)), Some(SetOptions::NX), false)
                        .await
                        .ok()
                        .flatten();
                    let body = serde_json::to_string(&receipt(i)).unwrap();
                    client.set::<(), _, _>(&key, body, Some(Expiration::EX(86_400)), None, false).await.is_ok()
                }
                "naive-replay" => {
                    let key = format!("ins:naive:replay:{}", i % 64);
                    let _: Option<String> = client
                        .set(&key, "1", Some(Expiration::EX(30)), Some(SetOptions::NX), false)
                        .await
                        .ok()
                        .flatten();
                    client.get::<Option<String>, _>(&key).await.is_ok()
                }
                // The least a replay in one command can cost through this client: our acquire's own
                // `SET key <pending record> NX PX <lease> GET` (the same seven arguments), and the
                // stored result decoded as the type, with nothing else around it.
                "hand-replay" => {
                    let key = format!("ins:hand:replay:{}", i % 64);
                    let pending = "P|0|0123456789abcdefghijkl||||";
                    let got: Option<String> = client
                        .set(&key, pending, Some(Expiration::PX(30_000)), Some(SetOptions::NX), true)
                        .await
                        .unwrap();
                    got.is_some_and(|json| serde_json::from_str::<Receipt>(&json).is_ok())
                }
                "first" | "first-telemetry" => {
                    let key = format!("ins:first:{run_id}:{i}");
                    let r: R<Receipt> = idem.run(Call::new(key), || async move { Ok(receipt(i)) }).await;
                    r.is_ok()
                }
                "first-fenced" => {
                    let key = format!("ins:fenced:{run_id}:{i}");
                    let r: R<u64> = idem
                        .run(Call::new(key), || async { CallContext::current().expect("in a call").fence().await })
                        .await;
                    r.is_ok()
                }
                "replay" => {
                    let r: R<Receipt> =
                        idem.run(Call::new(format!("ins:replay:{}", i % 64)), || async { Ok(receipt(0)) }).await;
                    r.is_ok()
                }
                "conflict" => {
                    let r: R<()> = idem.run(Call::new("ins:held"), || async { Ok(()) }).await;
                    matches!(r, Err(Error::Conflict { .. }))
                }
                // A first execution on the in-memory store: the runtime's own cost, no client's.
                "memory-first" => {
                    let r: R<Receipt> =
                        memory.run(Call::new(format!("first:{i}")), || async move { Ok(receipt(i)) }).await;
                    r.is_ok()
                }
                // One op: a batch of 100 fresh keys claimed, run (an empty body) and committed.
                "batch" => {
                    let calls = (0..BATCH).map(|j| Call::new(format!("ins:batch:{run_id}:{i}:{j}")));
                    let batch = idem.claim::<Receipt>(calls).await;
                    let settled = batch.run(1, |j, _| async move { Ok::<_, &str>(receipt(j as u64)) }).await;
                    settled.iter().all(|s| matches!(s, idempotency::Settled::Executed { stored: true, .. }))
                }
                // One op: `SET NX` for 100 fresh keys in one pipeline, then `SET` for each in another.
                "naive-batch" => {
                    let keys: Vec<String> = (0..BATCH).map(|j| format!("ins:naive:batch:{run_id}:{i}:{j}")).collect();
                    let claims = client.pipeline();
                    for k in &keys {
                        let _: Result<(), _> =
                            claims.set(k, "1", Some(Expiration::EX(30)), Some(SetOptions::NX), false).await;
                    }
                    let taken: Vec<Value> = claims.all().await.unwrap();
                    let commits = client.pipeline();
                    for (j, k) in keys.iter().enumerate() {
                        let body = serde_json::to_string(&receipt(j as u64)).unwrap();
                        let _: Result<(), _> = commits.set(k, body, Some(Expiration::EX(86_400)), None, false).await;
                    }
                    let done: Vec<Value> = commits.all().await.unwrap();
                    taken.iter().all(|t| !t.is_null()) && done.len() == keys.len()
                }
                _ => unreachable!("checked above"),
            };
            assert!(ok, "{path} call {i} did not do what it should");
        }
    });
}
