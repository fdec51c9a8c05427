//! Redis-only behaviour: a crashed holder, a server killed, restarted, paused or with its script
//! cache flushed, connections killed, foreign values at our keys, and the record as an operator
//! sees it. Each test starts its own `redis-server`.

#[macro_use]
mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use idempotency::{Call, CallContext, Error, Idempotency, RedisStore, StoreErrorKind};
use support::{eventually, ms, AppError, RedisServer, R};
use tokio::time::Instant;

async fn store(server: &RedisServer, timeout: Duration) -> RedisStore {
    RedisStore::builder(&server.url()).timeout(timeout).connect().await.expect("connect")
}

const CRASH_KEY: &str = "crash-me";
const CRASH_LEASE: Duration = Duration::from_millis(1500);

/// Not a test: the child process of `crashed_holder_frees_the_key_after_its_lease_not_before`.
/// It takes the key, says so with its fencing token, and hangs in the body until it is killed.
/// A call that fails before its body is said on stdout too, for the parent's message.
#[test]
#[ignore = "child process of another test"]
fn crash_child() {
    let Ok(url) = std::env::var("IDEM_CRASH_URL") else { return };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let idem = Idempotency::new(RedisStore::connect(&url).await.unwrap());
        let failed = idem
            .run(Call::new(CRASH_KEY).ttl(CRASH_LEASE), || async {
                println!("ACQUIRED {}", CallContext::current().unwrap().fence().await.unwrap());
                tokio::time::sleep(Duration::from_secs(3600)).await;
                R::Ok(())
            })
            .await;
        println!("FAILED {failed:?}");
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_holder_frees_the_key_after_its_lease_not_before() {
    let server = RedisServer::start();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["crash_child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env("IDEM_CRASH_URL", server.url())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the child");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut said = Vec::new();
    let child_fence: Option<u64> = lines.find_map(|l| {
        let l = l.ok()?;
        let fence = l.split_once("ACQUIRED ").and_then(|(_, f)| f.trim().parse().ok());
        said.push(l);
        fence
    });
    let child_fence = child_fence.unwrap_or_else(|| panic!("the child never acquired the key; it said {said:?}"));
    // Let the child's watchdog renew a few times: the lease now counts from its last renewal.
    tokio::time::sleep(ms(1200)).await;
    child.kill().unwrap(); // SIGKILL: nothing is released
    child.wait().unwrap();
    let killed = Instant::now();

    let idem = Idempotency::new(store(&server, Duration::from_secs(2)).await);
    let runs = Arc::new(AtomicUsize::new(0));
    let fence = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let attempt = || {
        let (runs, fence) = (runs.clone(), fence.clone());
        idem.run(Call::new(CRASH_KEY).ttl(CRASH_LEASE), || async move {
            runs.fetch_add(1, SeqCst);
            fence.store(CallContext::current().unwrap().fence().await?, SeqCst);
            R::Ok(())
        })
    };
    // Not before its lease: the last renewal was at most a third of a lease before the kill.
    let early = attempt().await;
    assert!(
        matches!(early, Err(AppError::Idem(Error::Conflict { .. }))),
        "acquired before the lease ran out: {early:?}"
    );
    let freed = eventually(Duration::from_secs(5), "the crashed holder's key to be free", || async {
        match attempt().await {
            Ok(()) => Some(killed.elapsed()),
            Err(AppError::Idem(Error::Conflict { .. })) => None,
            Err(e) => panic!("{e:?}"),
        }
    })
    .await;
    assert_eq!(runs.load(SeqCst), 1);
    assert!(freed <= CRASH_LEASE + ms(500), "the key stayed held {freed:?} after the crash, past its lease");
    // Two processes, each stamping tokens from its own estimate of Redis's clock: the taker's is
    // still the larger, by about the time between the two acquisitions.
    let fence = fence.load(SeqCst);
    assert!(fence > child_fence, "fencing token went back: the crashed holder had {child_fence}, the next {fence}");
    println!(
        "crashed holder: key acquirable {freed:?} after SIGKILL (lease {CRASH_LEASE:?}); fence {child_fence} -> {fence} (+{} ms)",
        (fence - child_fence) / 1000
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_and_restarted_mid_call() {
    let mut server = RedisServer::start();
    let holder = Idempotency::new(store(&server, ms(500)).await);
    let other = Idempotency::new(store(&server, ms(500)).await);
    let call = || Call::new("outage").ttl(Duration::from_secs(3));
    let held = tokio::spawn({
        let holder = holder.clone();
        async move {
            holder
                .run(call(), || async {
                    tokio::time::sleep(ms(2000)).await;
                    R::Ok(String::from("survived"))
                })
                .await
        }
    });
    tokio::time::sleep(ms(300)).await;
    server.kill();
    // While Redis is down, a call fails promptly with a store error instead of hanging.
    let started = Instant::now();
    let down = tokio::time::timeout(Duration::from_secs(10), other.run(call(), || async { R::Ok(String::new()) }))
        .await
        .expect("a call hung while Redis was down");
    match down {
        Err(AppError::Idem(Error::Store { ref source, .. })) => {
            assert!(matches!(source.kind(), StoreErrorKind::Timeout | StoreErrorKind::Unavailable), "{source}")
        }
        other => panic!("expected a store error while Redis is down, got {other:?}"),
    }
    println!("call while Redis was down failed after {:?}", started.elapsed());
    server.restart();
    // The body ran through the outage; its result is committed on the restarted server.
    assert_eq!(held.await.unwrap().unwrap(), "survived");
    let replay = other.run(call(), || async { R::Ok(String::from("ran again")) }).await;
    assert_eq!(replay.unwrap(), "survived");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_redis_is_a_prompt_error_then_recovers() {
    let mut server = RedisServer::start();
    let idem = Idempotency::new(store(&server, ms(400)).await);
    assert_eq!(idem.run(Call::new("before"), || async { R::Ok(1u8) }).await.unwrap(), 1);
    server.kill();
    for key in ["a", "b", "c"] {
        let got = tokio::time::timeout(Duration::from_secs(10), idem.run(Call::new(key), || async { R::Ok(2u8) }))
            .await
            .expect("hung while Redis was down");
        assert!(matches!(got, Err(AppError::Idem(Error::Store { .. }))), "{got:?}");
    }
    // Tokens are signed, not stored: issuing one needs no store.
    let token = idem.issue_token(Duration::from_secs(60)).expect("issued without Redis");
    let used = tokio::time::timeout(Duration::from_secs(10), idem.run(Call::token(&token), || async { R::Ok(4u8) }))
        .await
        .expect("hung while Redis was down");
    assert!(matches!(used, Err(AppError::Idem(Error::Store { .. }))), "{used:?}");
    server.restart();
    let back = eventually(Duration::from_secs(10), "the store to reconnect", || async {
        idem.run(Call::new("after"), || async { R::Ok(3u8) }).await.ok()
    })
    .await;
    assert_eq!(back, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_is_transparent() {
    let server = RedisServer::start();
    let idem = Idempotency::new(store(&server, Duration::from_secs(2)).await);
    assert_eq!(idem.run(Call::new("one"), || async { R::Ok(1u8) }).await.unwrap(), 1);
    assert_eq!(server.command(&["SCRIPT", "FLUSH"]).unwrap(), "OK");
    // EVALSHA meets NOSCRIPT and falls back to EVAL, which caches the script again.
    assert_eq!(idem.run(Call::new("one"), || async { R::Ok(9u8) }).await.unwrap(), 1);
    assert_eq!(idem.run(Call::new("two"), || async { R::Ok(2u8) }).await.unwrap(), 2);
    let token = idem.issue_token(Duration::from_secs(5)).unwrap();
    assert_eq!(server.command(&["SCRIPT", "FLUSH"]).unwrap(), "OK");
    assert_eq!(idem.run(Call::token(&token), || async { R::Ok(3u8) }).await.unwrap(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_kill_is_transparent_and_keeps_leases() {
    let server = RedisServer::start();
    let idem = Idempotency::new(store(&server, Duration::from_secs(2)).await);
    let lost = Arc::new(AtomicBool::new(true));
    let l = lost.clone();
    // A body outliving several lease periods while its connections are killed under it.
    let held = tokio::spawn({
        let idem = idem.clone();
        async move {
            idem.run(Call::new("killed-conns").ttl(ms(900)), || async move {
                tokio::time::sleep(ms(2500)).await;
                l.store(idempotency::CallContext::current().unwrap().is_lease_lost(), SeqCst);
                R::Ok(7u8)
            })
            .await
        }
    });
    for _ in 0..4 {
        tokio::time::sleep(ms(450)).await;
        server.command(&["CLIENT", "KILL", "TYPE", "normal"]).unwrap();
    }
    assert_eq!(held.await.unwrap().unwrap(), 7);
    assert!(!lost.load(SeqCst), "the lease was lost across reconnections");
    server.command(&["CLIENT", "KILL", "TYPE", "normal"]).unwrap();
    let replay = idem.run(Call::new("killed-conns"), || async { R::Ok(0u8) }).await;
    assert_eq!(replay.unwrap(), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_redis_loses_the_lease_locally() {
    let server = RedisServer::start();
    let idem = Idempotency::new(store(&server, ms(300)).await);
    let finished = Arc::new(AtomicBool::new(false));
    let f = finished.clone();
    let run = tokio::spawn({
        let idem = idem.clone();
        async move {
            idem.run(Call::new("frozen").ttl(ms(1000)).abort_on_lease_lost(true), || async move {
                tokio::time::sleep(Duration::from_secs(6)).await;
                f.store(true, SeqCst);
                R::Ok(())
            })
            .await
        }
    });
    tokio::time::sleep(ms(100)).await;
    server.pause();
    let paused = Instant::now();
    // Redis says nothing while frozen: only the local deadline can tell the lease is gone.
    let got = tokio::time::timeout(Duration::from_secs(5), run).await;
    let noticed = paused.elapsed();
    server.resume();
    let got = got.expect("lease loss not noticed while Redis was frozen").unwrap();
    assert!(matches!(got, Err(AppError::Idem(Error::LeaseLost { .. }))), "{got:?}");
    assert!(!finished.load(SeqCst));
    println!("frozen Redis: lease loss noticed locally {noticed:?} after the freeze (lease 1 s)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_values_are_corrupt_and_left_alone() {
    let server = RedisServer::start();
    let store = store(&server, Duration::from_secs(2)).await;
    let idem = Idempotency::new(store.clone());
    let runs = Arc::new(AtomicUsize::new(0));
    let body = || {
        let runs = runs.clone();
        move || async move {
            runs.fetch_add(1, SeqCst);
            R::Ok(())
        }
    };
    let string_key = store.record_key("taken-by-a-string");
    server.command(&["SET", &string_key, "not ours"]).unwrap();
    let hash_key = store.record_key("taken-by-a-hash");
    server.command(&["HSET", &hash_key, "name", "someone else's"]).unwrap();
    let list_key = store.record_key("taken-by-a-list");
    server.command(&["RPUSH", &list_key, "x"]).unwrap();
    for (key, what) in [("taken-by-a-string", "string"), ("taken-by-a-hash", "hash"), ("taken-by-a-list", "list")] {
        match idem.run(Call::new(key), body()).await {
            Err(AppError::Idem(e @ Error::Corrupt { .. })) => {
                let msg = e.to_string();
                assert!(msg.contains(key) && msg.contains(what), "{msg}");
            }
            other => panic!("{key}: expected Corrupt, got {other:?}"),
        }
    }
    assert_eq!(runs.load(SeqCst), 0);
    assert_eq!(server.command(&["GET", &string_key]).unwrap(), "not ours", "a foreign value was changed");
    assert_eq!(server.command(&["HGETALL", &hash_key]).unwrap(), "name\nsomeone else's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_is_readable_with_redis_cli() {
    let server = RedisServer::start();
    let store = store(&server, Duration::from_secs(2)).await;
    let idem = Idempotency::new(store.clone());
    let call = Call::new("42").scope("orders").keep(Duration::from_secs(3600));
    let out = idem
        .run(call, || async {
            CallContext::current().unwrap().fence().await?;
            R::Ok(vec![String::from("widget")])
        })
        .await;
    assert_eq!(out.unwrap(), vec!["widget"]);
    let key = store.record_key("orders:42");
    assert!(key.starts_with("idem:{") && key.ends_with("}:orders:42"), "{key}");
    // s|n|o|f|t|w|r: completed, the fence its body read, the owner that completed it, no
    // fingerprint, when it was stored (unix ms, by the committing client's clock), not watched,
    // the JSON result; how long it lives is the key's own expiry.
    let record = server.command(&["GET", &key]).unwrap();
    let fields: Vec<&str> = record.splitn(7, '|').collect();
    assert_eq!(fields.len(), 7, "{record}");
    assert_eq!(fields[0], "C", "{record}");
    let fence: u64 = fields[1].parse().unwrap();
    assert_eq!(fields[2].len(), 22, "not an owner id: {record}");
    assert_eq!(fields[3], "", "{record}");
    let stored_ms: u64 = fields[4].parse().unwrap();
    assert_eq!(fields[5], "", "{record}");
    assert_eq!(fields[6], r#"["widget"]"#);
    let time = server.command(&["TIME"]).unwrap();
    let redis_secs: u64 = time.lines().next().unwrap().trim().parse().unwrap();
    assert!((stored_ms / 1000).abs_diff(redis_secs) <= 2, "stored at {stored_ms}, Redis time {redis_secs}");
    // The fence is Redis's time of the acquisition, in µs.
    assert!((fence / 1_000_000).abs_diff(redis_secs) <= 2, "fence {fence}, Redis time {redis_secs}");
    let ttl: i64 = server.command(&["TTL", &key]).unwrap().parse().unwrap();
    assert!((3500..=3600).contains(&ttl), "completed record TTL {ttl}");
}

/// Replica acknowledgement: with no replica, an acquire gives the key back and fails before
/// the body runs; with a replica, calls run; with the replica frozen during the body, the
/// commit fails with a clear error and the record stays on the primary for a retry to replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_acknowledgement_is_required_when_asked_for() {
    let primary = RedisServer::start();
    let strict = |url: String| async move {
        RedisStore::builder(&url).replica_acks(1, ms(300)).connect().await.expect("connect")
    };
    let idem = Idempotency::new(strict(primary.url()).await);
    let runs = Arc::new(AtomicUsize::new(0));
    let body = |runs: Arc<AtomicUsize>| {
        move || async move {
            runs.fetch_add(1, SeqCst);
            tokio::time::sleep(ms(300)).await;
            R::Ok(String::from("durable"))
        }
    };
    let alone = idem.run(Call::new("acked"), body(runs.clone())).await;
    match alone {
        Err(AppError::Idem(Error::Store { ref source, .. })) => {
            assert_eq!(source.kind(), StoreErrorKind::Replication, "{source}");
            assert!(source.to_string().contains("0 of 1 replicas"), "{source}");
        }
        other => panic!("expected a replication error without replicas, got {other:?}"),
    }
    assert_eq!(runs.load(SeqCst), 0, "the body ran without the required acknowledgement");
    let key = RedisStore::connect(&primary.url()).await.unwrap().record_key("acked");
    assert_eq!(primary.command(&["EXISTS", &key]).unwrap(), "0", "the unacknowledged acquire kept the key");

    let replica = RedisServer::start();
    replica.command(&["REPLICAOF", "127.0.0.1", &primary.port().to_string()]).unwrap();
    eventually(Duration::from_secs(10), "the replica to sync", || async {
        primary.command(&["INFO", "replication"]).ok().filter(|i| i.contains("state=online")).map(|_| ())
    })
    .await;
    assert_eq!(idem.run(Call::new("acked"), body(runs.clone())).await.unwrap(), "durable");
    assert_eq!(runs.load(SeqCst), 1);

    // Frozen replica while the body runs: the acquire was acknowledged, the commit is not.
    let idem2 = idem.clone();
    let late = tokio::spawn(async move { idem2.run(Call::new("late-ack"), body(Arc::new(AtomicUsize::new(0)))).await });
    tokio::time::sleep(ms(100)).await;
    replica.pause();
    let got = late.await.unwrap();
    replica.resume();
    match got {
        // The body ran: not "the store failed", but "stored, not confirmed durable".
        Err(AppError::Idem(Error::Unconfirmed { ref source, .. })) => {
            assert_eq!(source.kind(), StoreErrorKind::Replication)
        }
        other => panic!("expected an unconfirmed result at commit, got {other:?}"),
    }
    let replay = idem.run(Call::new("late-ack"), || async { R::Ok(String::from("ran again")) }).await;
    assert_eq!(replay.unwrap(), "durable", "the committed record was not kept on the primary");
}
