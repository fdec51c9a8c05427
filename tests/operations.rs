//! Operations: records inspected, forgotten and scanned on every store (a 3+3 cluster with keys
//! on every primary among them), replay caches following a purge made by another process within
//! a second, and configuration from the environment failing at start-up, not at a request.

#[macro_use]
mod support;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use idempotency::store::{Forgotten, Inspected, RecordState, RecordView};
use idempotency::{Call, CallContext, Force, Idempotency, RedisStore, RedisStoreBuilder, ScanFilter, StoreErrorKind};
use support::{Backend, Fixture, RedisServer, R};
use tokio::time::Instant;

all_stores!(records_are_inspected_forgotten_and_scanned);

fn record(inspected: Inspected) -> RecordView {
    match inspected {
        Inspected::Record(view) => view,
        other => panic!("expected a record, got {other:?}"),
    }
}

/// Every record under `filter.prefix`, page by page (`count` keys examined a page).
async fn scan_all(idem: &Idempotency, filter: &ScanFilter, count: usize) -> (Vec<RecordView>, Vec<(String, String)>) {
    let (mut records, mut foreign, mut cursor) = (Vec::new(), Vec::new(), None::<String>);
    for _ in 0..10_000 {
        let page = idem.scan(filter, cursor.as_deref(), count).await.unwrap();
        records.extend(page.records);
        foreign.extend(page.foreign);
        match page.next {
            Some(next) => cursor = Some(next),
            None => return (records, foreign),
        }
    }
    panic!("the scan never ended");
}

async fn records_are_inspected_forgotten_and_scanned(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let now_ms = || SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_millis() as u64;
    let done: R<u32> = idem
        .run(Call::new("a").scope("ops").keep(Duration::from_secs(600)).fingerprint(&1), || async {
            // Read, so that the completed record carries it (a body that never reads it leaves 0).
            CallContext::current().unwrap().fence().await?;
            Ok(7)
        })
        .await;
    assert_eq!(done.unwrap(), 7);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let holder = tokio::spawn({
        let idem = idem.clone();
        async move {
            idem.run(Call::new("b").scope("ops").ttl(Duration::from_secs(30)), || async move {
                let _ = tx.send(());
                tokio::time::sleep(Duration::from_secs(3600)).await;
                R::Ok(0u32)
            })
            .await
        }
    });
    rx.await.unwrap();
    let other: R<u32> = idem.run(Call::new("c").scope("other"), || async { Ok(1) }).await;
    other.unwrap();

    // inspect: a completed record, one in progress, one absent.
    let a = record(idem.inspect("ops", "a").await.unwrap());
    assert_eq!((a.key.as_str(), a.state), ("ops:a", RecordState::Completed));
    assert!(a.fence.is_some() && a.replayable && a.fingerprint.is_some() && a.owner.is_none());
    assert_eq!(a.result_json(), Some(serde_json::json!(7)));
    assert!(a.stored_ms.unwrap().abs_diff(now_ms()) < 5_000, "{a:?}");
    assert!(a.ttl.unwrap() <= Duration::from_secs(600) && a.ttl.unwrap() > Duration::from_secs(590), "{a:?}");
    let b = record(idem.inspect("ops", "b").await.unwrap());
    assert_eq!(b.state, RecordState::InProgress);
    assert!(b.owner.is_some() && b.result.is_none() && !b.replayable);
    assert!(b.started_ms.unwrap().abs_diff(now_ms()) < 5_000, "{b:?}");
    assert!(b.ttl.unwrap() <= Duration::from_secs(30), "{b:?}");
    assert_eq!(idem.inspect("ops", "none").await.unwrap(), Inspected::Absent);

    // scan: by prefix, page by page (two keys a page), with filters.
    let (found, foreign) = scan_all(&idem, &ScanFilter::prefix("ops:"), 2).await;
    let keys: BTreeSet<&str> = found.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, BTreeSet::from(["ops:a", "ops:b"]), "{found:?}");
    assert!(foreign.is_empty());
    let (completed, _) = scan_all(&idem, &ScanFilter::prefix("ops:").state(RecordState::Completed), 10).await;
    assert_eq!(completed.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(), ["ops:a"]);
    let (fingerprinted, _) = scan_all(&idem, &ScanFilter::prefix("").fingerprinted(true), 10).await;
    assert_eq!(fingerprinted.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(), ["ops:a"]);
    let (old, _) = scan_all(&idem, &ScanFilter::prefix("ops:").older_than(Duration::from_secs(3600)), 10).await;
    assert!(old.is_empty(), "{old:?}");

    // forget: an in-progress record only when forced; a completed one runs again after.
    assert_eq!(idem.forget("ops", "b", Force::CompletedOnly).await.unwrap(), Forgotten::InProgress);
    assert_eq!(
        idem.forget("ops", "a", Force::CompletedOnly).await.unwrap(),
        Forgotten::Deleted(RecordState::Completed)
    );
    let again: R<u32> = idem.run(Call::new("a").scope("ops").fingerprint(&2), || async { Ok(8) }).await;
    assert_eq!(again.unwrap(), 8, "a forgotten key did not run again");
    assert_eq!(idem.forget("ops", "b", Force::InProgress).await.unwrap(), Forgotten::Deleted(RecordState::InProgress));
    assert_eq!(idem.forget("ops", "none", Force::InProgress).await.unwrap(), Forgotten::Absent);
    holder.abort();

    if fx.is_redis() {
        // A value that is not a record: named, never deleted. (A PostgreSQL table holds nothing
        // but records: its rows are typed and checked.)
        let record_key = fx.redis_store(0).record_key("ops:foreign");
        fx.raw_command(&["SET", &record_key, "someone else's"]).unwrap();
        assert!(matches!(idem.inspect("ops", "foreign").await.unwrap(), Inspected::Foreign { .. }));
        assert!(matches!(idem.forget("ops", "foreign", Force::InProgress).await.unwrap(), Forgotten::Foreign { .. }));
        let (_, foreign) = scan_all(&idem, &ScanFilter::prefix("ops:"), 10).await;
        assert_eq!(foreign.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["ops:foreign"]);
        fx.raw_command(&["DEL", &record_key]).unwrap();
    }

    // Many keys: a scan finds every one, wherever it lives (every primary of a cluster).
    for i in 0..60 {
        let r: R<u32> = idem.run(Call::new(format!("{i}")).scope("spread"), || async move { Ok(i) }).await;
        r.unwrap();
    }
    let (spread, _) = scan_all(&idem, &ScanFilter::prefix("spread:"), 7).await;
    assert_eq!(spread.len(), 60);
    if backend == Backend::Cluster {
        let cluster = support::RedisCluster::shared();
        let primaries: BTreeSet<u16> =
            spread.iter().map(|r| cluster.primary_for_key(&fx.redis_store(0).record_key(&r.key))).collect();
        assert_eq!(primaries.len(), 3, "the keys found are not on every primary");
    }
}

/// The other process of `a_purge_reaches_every_replay_cache_within_a_second`: forgets one key.
#[test]
#[ignore = "child process of another test"]
fn forget_child() {
    let Ok(url) = std::env::var("IDEM_FORGET_URL") else { return };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let idem = Idempotency::new(RedisStore::connect(&url).await.unwrap());
        let forgotten = idem.forget("purge", "k", Force::CompletedOnly).await.unwrap();
        println!("FORGOTTEN {forgotten:?}");
    });
}

/// A reader with a replay cache answers a key from memory; another process forgets the key and a
/// third runtime runs it again. Within a second of the forget the reader answers the new result,
/// not its cached copy of the old one (its `keep` is an hour).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_reaches_every_replay_cache_within_a_second() {
    let server = RedisServer::start();
    let connect =
        || async { RedisStore::builder(&server.url()).timeout(Duration::from_secs(2)).connect().await.unwrap() };
    let reader = Idempotency::builder(connect().await).replay_cache(100).build();
    let writer = Idempotency::new(connect().await);
    let call = || Call::new("k").scope("purge").keep(Duration::from_secs(3600));
    let first: R<String> = reader.run(call(), || async { Ok("first".to_owned()) }).await;
    assert_eq!(first.unwrap(), "first");
    // Replayed from the store, then from the cache (once the cache follows purges).
    support::eventually(Duration::from_secs(5), "the reader to answer from its cache", || async {
        let replay: R<String> = reader.run(call(), || async { Ok("reader ran".to_owned()) }).await;
        assert_eq!(replay.unwrap(), "first");
        let sets = || {
            let info = server.command(&["INFO", "commandstats"]).unwrap();
            support::info_field(&info, "cmdstat_set").unwrap_or_default()
        };
        let before = sets();
        let replay: R<String> = reader.run(call(), || async { Ok("reader ran".to_owned()) }).await;
        assert_eq!(replay.unwrap(), "first");
        (sets() == before).then_some(())
    })
    .await;

    let out = tokio::task::block_in_place(|| {
        Command::new(std::env::current_exe().unwrap())
            .args(["forget_child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env("IDEM_FORGET_URL", server.url())
            .stderr(Stdio::null())
            .output()
            .unwrap()
    });
    let line = BufReader::new(&out.stdout[..]).lines().map_while(Result::ok).find(|l| l.contains("FORGOTTEN"));
    assert!(line.as_deref().is_some_and(|l| l.contains("Deleted(Completed)")), "the other process: {line:?}");
    let forgotten = Instant::now();
    let second: R<String> = writer.run(call(), || async { Ok("second".to_owned()) }).await;
    assert_eq!(second.unwrap(), "second");
    let seen = support::eventually(Duration::from_secs(1), "the reader to drop its cached copy", || async {
        let got: R<String> = reader.run(call(), || async { Ok("reader ran".to_owned()) }).await;
        (got.unwrap() == "second").then(|| forgotten.elapsed())
    })
    .await;
    println!("the reader answered the new result {seen:?} after the other process forgot the key");
}

/// A store user who may not subscribe to the purge channel (the documented user without its
/// channel rule): the replay cache stays off, since a purge by another process could not reach it;
/// it never replays a result that was forgotten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_cache_stays_off_when_purges_cannot_be_followed() {
    let server = RedisServer::start();
    let rules = support::ACL_RULES.replace(" &idem:*", "");
    assert_ne!(rules, support::ACL_RULES);
    support::create_acl_user(server.port(), &rules);
    let user = format!("redis://idem:s3cret@127.0.0.1:{}", server.port());
    let reader = Idempotency::builder(RedisStore::connect(&user).await.unwrap()).replay_cache(100).build();
    let admin = Idempotency::new(RedisStore::connect(&server.url()).await.unwrap());
    let call = || Call::new("k").scope("purge").keep(Duration::from_secs(3600));
    let first: R<String> = reader.run(call(), || async { Ok("first".to_owned()) }).await;
    assert_eq!(first.unwrap(), "first");
    // Replays for half a second: time enough for a cache that would follow purges to go live.
    for _ in 0..10 {
        let replay: R<String> = reader.run(call(), || async { Ok("reader ran".to_owned()) }).await;
        assert_eq!(replay.unwrap(), "first");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        admin.forget("purge", "k", Force::CompletedOnly).await.unwrap(),
        Forgotten::Deleted(RecordState::Completed)
    );
    let second: R<String> = admin.run(call(), || async { Ok("second".to_owned()) }).await;
    assert_eq!(second.unwrap(), "second");
    let got: R<String> = reader.run(call(), || async { Ok("reader ran".to_owned()) }).await;
    assert_eq!(got.unwrap(), "second", "the reader replayed a forgotten result from its cache");
}

/// The settings of the environment: every variable read, a bad one named in the error (never a
/// secret's value), and a store that cannot be reached failing `init_from_env` at start-up.
#[tokio::test]
async fn configuration_from_the_environment() {
    let vars = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| (*v).to_owned())
    };
    let good = vars(&[
        ("IDEMPOTENCY_REDIS_URL", "redis://127.0.0.1:1"),
        ("IDEMPOTENCY_PREFIX", "svc"),
        ("IDEMPOTENCY_TIMEOUT", "500ms"),
        ("IDEMPOTENCY_CONNECT_TIMEOUT", "1s"),
        ("IDEMPOTENCY_POOL_SIZE", "2"),
        ("IDEMPOTENCY_REPLICA_ACKS", "1/250ms"),
    ]);
    let builder = RedisStoreBuilder::from_vars(&good).unwrap();
    let shown = format!("{builder:?}");
    assert!(shown.contains("svc") && shown.contains("500ms") && shown.contains("pool_size: 2"), "{shown}");
    for (bad, name) in [
        (vars(&[("IDEMPOTENCY_REDIS_URL", "redis://h"), ("IDEMPOTENCY_TIMEOUT", "soon")]), "IDEMPOTENCY_TIMEOUT"),
        (vars(&[("IDEMPOTENCY_REDIS_URL", "redis://h"), ("IDEMPOTENCY_POOL_SIZE", "many")]), "IDEMPOTENCY_POOL_SIZE"),
        (vars(&[]), "IDEMPOTENCY_REDIS_URL"),
    ] {
        let e = RedisStoreBuilder::from_vars(&bad).expect_err(name);
        assert_eq!(e.kind(), StoreErrorKind::Config);
        assert!(e.to_string().contains(name), "{e}");
    }
    let runtime = idempotency::MemoryStore::new();
    let bad_key = vars(&[("IDEMPOTENCY_TOKEN_KEY", "too-short-secret")]);
    let Err(e) = Idempotency::builder(runtime).with_vars(&bad_key) else { panic!("a short token key was taken") };
    assert!(e.to_string().contains("IDEMPOTENCY_TOKEN_KEY") && !e.to_string().contains("too-short-secret"), "{e}");
    let fine = vars(&[("IDEMPOTENCY_TTL", "10s"), ("IDEMPOTENCY_KEEP", "1h"), ("IDEMPOTENCY_REPLAY_CACHE", "100")]);
    let idem = Idempotency::builder(idempotency::MemoryStore::new()).with_vars(&fine).unwrap().build();
    assert!(format!("{idem:?}").contains("10s"), "{idem:?}");

    // At start-up, in a process of its own: an unreachable store fails init_from_env.
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["init_child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env("IDEM_INIT_CHILD", "1")
        .env("IDEMPOTENCY_REDIS_URL", format!("redis://127.0.0.1:{}", support::free_port()))
        .env("IDEMPOTENCY_CONNECT_TIMEOUT", "1s")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("INIT FAILED") && stdout.contains("IDEMPOTENCY_REDIS_URL"), "{stdout}");
}

/// The other process of `configuration_from_the_environment`.
#[test]
#[ignore = "child process of another test"]
fn init_child() {
    if std::env::var("IDEM_INIT_CHILD").is_err() {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    match rt.block_on(idempotency::init_from_env()) {
        Ok(()) => println!("INIT OK"),
        Err(e) => println!("INIT FAILED: {e}"),
    }
}
