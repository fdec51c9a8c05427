//! `RedisStore` through Redis Sentinel (1 primary, 2 replicas, 3 sentinels) the tests start
//! themselves: the store finds the primary through the sentinels, and after the primary is
//! killed and a replica promoted, calls recover with no duplicate execution among completed calls.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use idempotency::{Call, Idempotency, RedisStore};
use support::sentinel::SentinelGroup;
use support::{churn_key, churn_through_fault, command_at, ms, unique_prefix, R};

async fn store(group: &SentinelGroup, prefix: &str, timeout: Duration) -> RedisStore {
    let url = group.url();
    assert!(url.starts_with("redis-sentinel://"), "{url}");
    RedisStore::builder(&url).prefix(prefix).timeout(timeout).connect().await.expect("connect through sentinel")
}

/// The store connects by the sentinels' addresses alone, writes its records on the primary they
/// name, and the records reach both replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_finds_the_primary_through_the_sentinels() {
    let group = tokio::task::block_in_place(SentinelGroup::shared);
    let prefix = unique_prefix("found");
    let store = store(group, &prefix, Duration::from_secs(2)).await;
    let idem = Idempotency::new(store.clone());
    let runs = Arc::new(AtomicUsize::new(0));
    for _ in 0..3 {
        let r = runs.clone();
        let got = idem.run(Call::new("invoice:1"), || async move {
            r.fetch_add(1, SeqCst);
            R::Ok(String::from("sent"))
        });
        assert_eq!(got.await.unwrap(), "sent");
    }
    assert_eq!(runs.load(SeqCst), 1);
    let primary = group.primary_port();
    assert!(!group.url().contains(&primary.to_string()), "the URL names a data node, not only sentinels");
    let record = store.record_key("invoice:1");
    let on_primary = command_at(primary, &["GET", &record]).unwrap();
    assert!(on_primary.starts_with("C|") && on_primary.ends_with("\"sent\""), "{on_primary}");
    tokio::task::block_in_place(|| group.wait_replicated(Duration::from_secs(10)));
    let replicas = command_at(primary, &["INFO", "replication"]).unwrap();
    let ports: Vec<u16> = replicas
        .lines()
        .filter(|l| l.starts_with("slave"))
        .filter_map(|l| l.split(',').find_map(|f| f.strip_prefix("port="))?.parse().ok())
        .collect();
    assert_eq!(ports.len(), 2, "{replicas}");
    for port in ports {
        assert_eq!(command_at(port, &["GET", &record]).unwrap(), on_primary, "replica {port} lacks the record");
    }
}

/// The primary is killed mid-run: the sentinels promote a replica, the store follows it, calls
/// recover (times printed), and no key ran twice unless its first run was in flight during the
/// failover; every error is a store error during the failover; no key is held past its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_killed_failover_and_calls_recover() {
    let mut group = tokio::task::block_in_place(SentinelGroup::start);
    let prefix = unique_prefix("failover");
    // Longer than the failover (about 3.5 s), so a body finishing in it has its commit retried
    // until the new primary takes it (docs/guarantees.md: choose ttl longer than the failover).
    const LEASE: Duration = Duration::from_secs(6);
    let mut clients = Vec::new();
    for _ in 0..2 {
        clients.push(Idempotency::new(store(&group, &prefix, Duration::from_secs(1)).await));
    }
    let run = churn_through_fault(
        &clients,
        10,
        LEASE,
        |_| true,
        Duration::from_secs(30),
        300,
        || {
            let old = group.kill_primary();
            (old, group.wait_for_new_primary(old, Duration::from_secs(30)))
        },
    )
    .await;
    let (old, new) = run.fault;
    // The records after the failover are on the new primary.
    let last = run.result.used - 1;
    let record = command_at(new, &["GET", &store(&group, &prefix, ms(500)).await.record_key(&churn_key(last))]);
    assert!(record.as_deref().is_ok_and(|r| r.starts_with("C|")), "{record:?}");
    println!(
        "sentinel failover: primary {old} killed, sentinels agreed on {new} after {:?}, calls worked again after {:?}",
        run.repaired - run.broken,
        run.recovered - run.broken
    );
}
