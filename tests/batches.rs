//! Batches (`Idempotency::claim`, `Batch::run`) on every store: each item answered as one call
//! would be, each key's body run once across concurrent batches, leases renewed while a batch
//! runs, a dropped batch's keys released and its results stored, and the round trips a batch
//! costs on Redis.

#[macro_use]
mod support;

use std::collections::HashMap;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotency::store::AcquireRequest;
use idempotency::{Ack, AckPlan, Call, Error, Idempotency, Settled};
use support::{counter, eventually, ms, AppError, Backend, Fixture, R};

all_stores!(
    each_item_is_answered_as_one_call_would_be,
    concurrent_batches_run_each_key_once,
    leases_are_renewed_while_the_batch_runs,
    a_dropped_batch_releases_its_keys_and_stores_its_results,
    a_panicking_body_unwinds_and_the_batch_cleans_up,
    a_claim_dropped_in_flight_releases_what_it_took,
    fences_of_batch_items_are_their_own,
    the_first_copy_of_a_key_in_a_batch_is_the_one_that_runs,
);

fn order(id: &str) -> Call {
    Call::new(id).scope("orders").ttl(Duration::from_secs(30))
}

/// A batch with every kind of item: new keys (one body fails), a key completed before, a key
/// held by another caller, a key reused with another payload, an invalid key, and a key twice.
/// Each gets what `run` would have given it, and the plan says what to do with its delivery.
async fn each_item_is_answered_as_one_call_would_be(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let done: R<u32> = idem.run(order("done"), || async { R::Ok(7) }).await;
    assert_eq!(done.unwrap(), 7);
    let reused: R<u32> = idem.run(order("reused").fingerprint("payload A"), || async { R::Ok(8) }).await;
    assert_eq!(reused.unwrap(), 8);
    // Held by another caller for the whole test.
    let busy = AcquireRequest {
        key: "orders:busy",
        owner: "someone-else",
        lease: Duration::from_secs(30),
        fingerprint: None,
        will_wait: false,
        report_ttl: false,
        fence_now: false,
        lapse: idempotency::store::Lapse::Free,
        keep: Duration::ZERO,
    };
    let store = fx.store(0);
    assert!(matches!(store.acquire(busy).await.unwrap(), idempotency::store::AcquireOutcome::Acquired { .. }));

    let calls = vec![
        order("new-1"),
        order("new-2"),
        order("done"),
        order("busy"),
        order("reused").fingerprint("payload B"),
        order(""),
        order("new-1"),
    ];
    let batch = idem.claim::<u32>(calls).await;
    assert_eq!((batch.len(), batch.to_run()), (7, 2));
    assert!(batch.context(0).is_some() && batch.context(1).is_some() && batch.context(2).is_none());
    let runs = counter();
    let r = runs.clone();
    let settled = batch
        .run(1, move |i, context| {
            let r = r.clone();
            async move {
                r.fetch_add(1, SeqCst);
                assert_eq!(idempotency::CallContext::current().unwrap().key(), context.key());
                match i {
                    0 => R::Ok(100),
                    _ => Err(AppError::Failed("declined")),
                }
            }
        })
        .await;
    assert_eq!(runs.load(SeqCst), 2, "{settled:?}");
    assert!(matches!(settled[0], Settled::Executed { value: 100, stored: true }), "{:?}", settled[0]);
    assert!(matches!(settled[1], Settled::Failed(AppError::Failed("declined"))), "{:?}", settled[1]);
    assert!(matches!(settled[2], Settled::Replayed(Ok(7))), "{:?}", settled[2]);
    assert!(matches!(settled[3], Settled::InProgress), "{:?}", settled[3]);
    assert!(
        matches!(settled[4], Settled::Refused(Error::KeyReused { ref key }) if key == "orders:reused"),
        "{:?}",
        settled[4]
    );
    assert!(matches!(settled[5], Settled::Refused(Error::InvalidKey { .. })), "{:?}", settled[5]);
    assert!(matches!(settled[6], Settled::InProgress), "{:?}", settled[6]);
    let plan = AckPlan::of(&settled);
    assert_eq!(plan.ack, vec![0, 2]);
    assert_eq!(plan.requeue, vec![1, 3, 6]);
    assert_eq!(plan.dead_letter, vec![4, 5]);
    assert_eq!(settled[5].ack(), Ack::DeadLetter);

    // What the store kept: new-1 replays, new-2 was released and runs again, busy is still held.
    let replayed: R<u32> = idem.run(order("new-1"), || async { R::Ok(0) }).await;
    assert_eq!(replayed.unwrap(), 100);
    let rerun: R<u32> = idem.run(order("new-2"), || async { R::Ok(2) }).await;
    assert_eq!(rerun.unwrap(), 2);
    let held: R<u32> = idem.run(order("busy"), || async { R::Ok(3) }).await;
    assert!(matches!(held, Err(AppError::Idem(Error::Conflict { .. }))), "{held:?}");
}

/// A batch holding each of ten keys five times, each copy with a payload of its own (a producer
/// that re-used its ids): the first copy of each key is the one that runs, as it would had the
/// copies come one call after the other, whether the key was new or a crashed holder's; the
/// later ones are refused as re-used keys.
async fn the_first_copy_of_a_key_in_a_batch_is_the_one_that_runs(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    // Half the keys were held by a caller whose lease ran out: the batch takes them over.
    for k in 0..5 {
        let key = format!("orders:copy-{k}");
        let crashed = AcquireRequest {
            key: &key,
            owner: "crashed",
            lease: ms(50),
            fingerprint: None,
            will_wait: false,
            report_ttl: false,
            fence_now: false,
            lapse: idempotency::store::Lapse::Free,
            keep: Duration::ZERO,
        };
        fx.store(0).acquire(crashed).await.unwrap();
    }
    tokio::time::sleep(ms(150)).await;
    let calls = (0..50).map(|i| order(&format!("copy-{}", i % 10)).fingerprint(&i));
    let batch = idem.claim::<u32>(calls).await;
    let won: Vec<usize> = (0..50).filter(|&i| batch.context(i).is_some()).collect();
    assert_eq!(won, (0..10).collect::<Vec<_>>(), "the first copies run");
    let settled = batch.run(4, |i, _| async move { R::Ok(i as u32) }).await;
    for (i, item) in settled.iter().enumerate().skip(10) {
        assert!(matches!(item, Settled::Refused(Error::KeyReused { .. })), "item {i}: {item:?}");
    }
    for k in 0..10 {
        let replayed: R<u32> = idem.run(order(&format!("copy-{k}")).fingerprint(&k), || async { R::Ok(99) }).await;
        assert_eq!(replayed.unwrap(), k, "copy-{k} stored the first copy's result");
    }
}

/// Eight batches on four clients claim the same 40 keys in different orders, at once, their
/// bodies several at a time: every key's body runs exactly once, and every item of every batch
/// is executed, replayed or in progress.
async fn concurrent_batches_run_each_key_once(backend: Backend) {
    let fx = Fixture::new(backend, 4).await;
    let runs: Arc<Mutex<HashMap<usize, usize>>> = Arc::default();
    let barrier = Arc::new(tokio::sync::Barrier::new(8));
    let mut tasks = Vec::new();
    for b in 0..8usize {
        let (idem, runs, barrier) = (fx.idem(b % 4), runs.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let ids: Vec<usize> = (0..40).map(|i| (i * 7 + b * 13) % 40).collect();
            barrier.wait().await;
            let batch = idem.claim::<usize>(ids.iter().map(|id| order(&format!("race-{id}")))).await;
            let settled = batch
                .run(4, |i, _| {
                    let (runs, id) = (runs.clone(), ids[i]);
                    async move {
                        *runs.lock().unwrap().entry(id).or_default() += 1;
                        tokio::time::sleep(ms(20)).await;
                        R::Ok(id)
                    }
                })
                .await;
            for (i, item) in settled.iter().enumerate() {
                match item {
                    Settled::Executed { value, stored: true } | Settled::Replayed(Ok(value)) => {
                        assert_eq!(*value, ids[i])
                    }
                    Settled::InProgress => {}
                    other => panic!("item {i}: {other:?}"),
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let runs = runs.lock().unwrap();
    assert_eq!(runs.len(), 40, "some keys never ran: {runs:?}");
    assert!(runs.values().all(|&n| n == 1), "a key ran twice: {runs:?}");
}

/// Lease 400 ms, five bodies of 250 ms in order (1.25 s): while the batch runs, a duplicate of
/// its first item (done, waiting for the batch's commit) and of its last (not started) finds the
/// key in progress every time: the watchdog renews every item's lease, not only the running one's.
async fn leases_are_renewed_while_the_batch_runs(backend: Backend) {
    let fx = Fixture::new(backend, 2).await;
    let idem = fx.idem(0);
    let other = fx.idem(1);
    let call = |i: usize| Call::new(format!("slow-{i}")).ttl(ms(400));
    let batch = idem.claim::<usize>((0..5).map(call)).await;
    assert_eq!(batch.to_run(), 5);
    let running = tokio::spawn(batch.run(1, |i, _| async move {
        tokio::time::sleep(ms(250)).await;
        R::Ok(i)
    }));
    let duplicates = counter();
    for _ in 0..10 {
        tokio::time::sleep(ms(100)).await;
        if running.is_finished() {
            break;
        }
        for i in [0, 4] {
            let d = duplicates.clone();
            let dup: R<usize> = other
                .run(call(i), || async move {
                    d.fetch_add(1, SeqCst);
                    R::Ok(99)
                })
                .await;
            assert!(matches!(dup, Err(AppError::Idem(Error::Conflict { .. })) | Ok(_)), "item {i}: {dup:?}");
        }
    }
    let settled = running.await.unwrap();
    assert_eq!(duplicates.load(SeqCst), 0, "a duplicate ran while the batch held its key");
    for (i, item) in settled.iter().enumerate() {
        assert!(matches!(item, Settled::Executed { value, stored: true } if *value == i), "{item:?}");
    }
}

/// A batch dropped mid-run (a consumer cancelled): the item whose body returned is stored, the
/// running one and the one never started are released, all in the background.
async fn a_dropped_batch_releases_its_keys_and_stores_its_results(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let batch = idem.claim::<u32>((0..3).map(|i| order(&format!("dropped-{i}")))).await;
    assert_eq!(batch.to_run(), 3);
    let cancelled = tokio::time::timeout(
        ms(300),
        batch.run(1, |i, _| async move {
            if i > 0 {
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
            R::Ok(10 + i as u32)
        }),
    )
    .await;
    assert!(cancelled.is_err(), "the batch was not cancelled");
    // Leases are 30 s: each answer within a few seconds proves the background work.
    first_stored_then_released(&idem, "dropped").await;
}

/// A claim dropped while its round trip is in flight (a consumer cancelled, a timeout around the
/// claim): whatever it took is released in the background, as one call's acquire is, so the keys
/// are free again well before their 30 s lease ends and each body runs once, later.
async fn a_claim_dropped_in_flight_releases_what_it_took(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let keys: Vec<String> = (0..5).map(|i| format!("claim-dropped-{i}")).collect();
    // Polled once (the claim sent), then dropped.
    let dropped = tokio::time::timeout(Duration::ZERO, idem.claim::<u32>(keys.iter().map(|k| order(k)))).await;
    // The memory store answers on the first poll: then the batch itself is dropped unrun.
    drop(dropped);
    let runs = counter();
    for key in &keys {
        let value = eventually(Duration::from_secs(5), "the dropped claim's keys", || {
            let (runs, idem) = (runs.clone(), idem.clone());
            async move {
                let got = idem
                    .run(order(key), || async move {
                        runs.fetch_add(1, SeqCst);
                        R::Ok(5)
                    })
                    .await;
                match got {
                    Ok(v) => Some(v),
                    Err(AppError::Idem(Error::Conflict { .. })) => None,
                    Err(e) => panic!("{key}: {e:?}"),
                }
            }
        })
        .await;
        assert_eq!(value, 5, "{key}");
    }
    assert_eq!(runs.load(SeqCst), keys.len(), "each key's body ran once, after the dropped claim");
}

/// Item 0 of the batch `prefix-{0,1,2}` was stored with 10; items 1 and 2 were released, so a
/// later call runs them (20 + i), once the batch's background work is done.
async fn first_stored_then_released(idem: &Idempotency, prefix: &str) {
    for (i, expected) in [(0, 10), (1, 21), (2, 22)] {
        let value = eventually(Duration::from_secs(5), "the batch's keys", || async {
            match idem.run(order(&format!("{prefix}-{i}")), || async { R::Ok(20 + i) }).await {
                Ok(v) => Some(v),
                Err(AppError::Idem(Error::Conflict { .. })) => None,
                Err(e) => panic!("{e:?}"),
            }
        })
        .await;
        assert_eq!(value, expected, "{prefix} item {i}");
    }
}

/// A body that panics: the panic reaches the caller; the item before it is stored and the one
/// after it (never started) released, in the background.
async fn a_panicking_body_unwinds_and_the_batch_cleans_up(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let i2 = idem.clone();
    let joined = tokio::spawn(async move {
        let batch = i2.claim::<u32>((0..3).map(|i| order(&format!("panics-{i}")))).await;
        batch
            .run(1, |i, _| async move {
                if i == 1 && std::hint::black_box(true) {
                    panic!("boom in item 1");
                }
                R::Ok(10 + i as u32)
            })
            .await
    })
    .await;
    let panic = joined.expect_err("the panic did not reach the caller").into_panic();
    assert_eq!(panic.downcast_ref::<&str>(), Some(&"boom in item 1"));
    first_stored_then_released(&idem, "panics").await;
}

/// Every item's fence is its own and read as one call's is; a batch claiming a key again after
/// it was released gets a larger fence.
async fn fences_of_batch_items_are_their_own(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let fences = |idem: Idempotency| async move {
        let batch = idem.claim::<u64>((0..3).map(|i| order(&format!("fenced-{i}")))).await;
        let settled: Vec<Settled<u64, AppError>> =
            batch.run(3, |_, context| async move { Err(AppError::Failed(leak(context.fence().await.unwrap()))) }).await;
        settled
            .into_iter()
            .map(|s| match s {
                Settled::Failed(AppError::Failed(f)) => f.parse::<u64>().unwrap(),
                other => panic!("{other:?}"),
            })
            .collect::<Vec<u64>>()
    };
    let first = fences(idem.clone()).await;
    let second = fences(idem.clone()).await;
    for i in 0..3 {
        assert!(first[i] > 0 && second[i] > first[i], "fences {first:?} then {second:?}");
    }
}

/// A fence as the `&'static str` an `AppError::Failed` carries.
fn leak(fence: u64) -> &'static str {
    Box::leak(fence.to_string().into_boxed_str())
}

/// On a standalone Redis server (one connection): a batch of 100 new keys is claimed in one
/// pipeline of plain `SET NX GET`s (one round trip) and committed in one script call (Redis 7) or
/// one pipeline of `SET IFEQ`s (Valkey 8.1); one whose bodies all fail is released in one script
/// call. On a cluster, one script call per hash slot: 100 keys under one hash tag are one command.
mod round_trips {
    use super::*;

    /// The commands the server ran while 100 new keys were claimed and committed, then 100 more
    /// claimed and released: (name, calls) sorted, the server's own `INFO` left out. Commands a
    /// script runs count as the server's too.
    async fn counted(fx: &Fixture, keys: impl Fn(usize) -> String) -> Vec<(String, u64)> {
        let idem = fx.idem(0);
        let server = fx.server.as_ref().expect("a server of the test's own");
        let before = server.command_calls();
        let batch = idem.claim::<usize>((0..100).map(|i| Call::new(keys(i)))).await;
        assert_eq!(batch.to_run(), 100);
        let settled = batch.run(8, |i, _| async move { R::Ok(i) }).await;
        assert!(settled.iter().all(|s| matches!(s, Settled::Executed { stored: true, .. })));
        let batch = idem.claim::<usize>((100..200).map(|i| Call::new(keys(i)))).await;
        let settled = batch.run(8, |_, _| async { R::<usize>::Err(AppError::Failed("no")) }).await;
        assert!(settled.iter().all(|s| s.ack() == Ack::Requeue));
        let after = server.command_calls();
        let mut ran: Vec<(String, u64)> = after
            .into_iter()
            .map(|(name, n)| {
                let was = before.get(&name).copied().unwrap_or(0);
                (name, n - was)
            })
            .filter(|(name, n)| *n > 0 && name != "info")
            .collect();
        ran.sort();
        ran
    }

    /// A batch's claim is the plain `SET NX GET` per key: a key holding something other than a
    /// string is asked again through acquire.lua and refused as corrupt, naming what is there,
    /// while the other items run; with a replay cache the claim reads the records' lifetimes
    /// (acquire.lua per key) and a completed item is replayed from the batch and then from the
    /// cache.
    #[tokio::test]
    async fn a_claim_reads_what_the_keys_hold_as_one_acquire_would() {
        let fx = Fixture::new(Backend::Redis, 1).await;
        let idem = fx.idem(0);
        let listed = fx.redis_store(0).record_key("odd-1");
        fx.raw_command(&["RPUSH", &listed, "x"]).unwrap();
        let batch = idem.claim::<usize>((0..3).map(|i| Call::new(format!("odd-{i}")))).await;
        let settled = batch.run(1, |i, _| async move { R::Ok(i) }).await;
        match &settled[1] {
            Settled::Refused(Error::Corrupt { key, reason }) => {
                assert_eq!(key, "odd-1");
                assert!(reason.contains("list"), "{reason}");
            }
            other => panic!("item 1: {other:?}"),
        }
        assert!(matches!(settled[0], Settled::Executed { value: 0, .. }), "{:?}", settled[0]);
        assert!(matches!(settled[2], Settled::Executed { value: 2, .. }), "{:?}", settled[2]);

        let cached = fx.idem_with(0, |b| b.replay_cache(100));
        let scripts = || fx.server.as_ref().unwrap().command_calls().get("evalsha").copied().unwrap_or(0);
        let batch = cached.claim::<usize>([Call::new("odd-0"), Call::new("odd-3")]).await;
        let settled = batch.run(1, |_, _| async move { R::Ok(30) }).await;
        assert!(matches!(settled[0], Settled::Replayed(Ok(0))), "{:?}", settled[0]);
        assert!(matches!(settled[1], Settled::Executed { value: 30, .. }), "{:?}", settled[1]);
        // The cache fills once it follows the store's purges (a subscription of its own, in the
        // background): from then on both items are replayed from it, nothing sent.
        let mut sent = u64::MAX;
        for _ in 0..100 {
            let before = scripts();
            let batch = cached.claim::<usize>([Call::new("odd-0"), Call::new("odd-3")]).await;
            let settled = batch.run(1, |_, _| async move { R::Ok(31) }).await;
            assert!(matches!(settled[0], Settled::Replayed(Ok(0))), "{:?}", settled[0]);
            assert!(matches!(settled[1], Settled::Replayed(Ok(30))), "{:?}", settled[1]);
            sent = scripts() - before;
            if sent == 0 {
                break;
            }
            tokio::time::sleep(ms(20)).await;
        }
        assert_eq!(sent, 0, "the batch's claim did not replay from the cache");
    }

    /// A batch redelivered after its bodies failed: every key holds the record of a failed
    /// attempt, which only acquire.lua can take (it counts the attempt). The keys the plain
    /// `SET NX GET`s could not decide go to the script together, one call for the 100, not one
    /// each.
    #[tokio::test]
    async fn a_batch_redelivered_after_failures_is_scripted_once_not_per_key() {
        let fx = Fixture::new(Backend::Redis, 1).await;
        let idem = fx.idem(0);
        let keys = || (0..100).map(|i| Call::new(format!("again-{i}")));
        let batch = idem.claim::<u32>(keys()).await;
        let settled = batch.run(8, |_, _| async { R::<u32>::Err(AppError::Failed("no")) }).await;
        assert!(settled.iter().all(|s| s.ack() == Ack::Requeue));
        let server = fx.server.as_ref().expect("a server of the test's own");
        let scripts = || server.command_calls().get("evalsha").copied().unwrap_or(0);
        let before = scripts();
        let batch = idem.claim::<u32>(keys()).await;
        assert_eq!(scripts() - before, 1, "script calls to claim 100 keys holding failed attempts");
        assert_eq!(batch.to_run(), 100);
        let settled = batch.run(8, |_, context| async move { R::Ok(context.attempt()) }).await;
        assert!(settled.iter().all(|s| matches!(s, Settled::Executed { value: 2, .. })), "{settled:?}");
    }

    #[tokio::test]
    async fn a_batch_is_one_round_trip_to_claim_and_one_to_commit() {
        let fx = Fixture::new(Backend::Redis, 1).await;
        // Per key claimed one `SET NX GET`, top level, in one pipeline (its fence left unread: no
        // TIME). Per key committed, on Redis 7 a GET and a SET inside one script call; on a
        // server with `SET IFEQ`, that one command per key, in one pipeline. Per key that failed
        // a GET and a SET (the record of its failure, with its count) inside one script call. A
        // script call per key, or any other command per key, would show.
        let compare_and_set = fx.redis_store(0).commit_path() == idempotency::store::redis::CommitPath::CompareAndSet;
        let expected: &[(&str, u64)] = if compare_and_set {
            &[("evalsha", 1), ("get", 100), ("set", 400)]
        } else {
            &[("evalsha", 2), ("get", 200), ("set", 400)]
        };
        let expected: Vec<(String, u64)> = expected.iter().map(|(n, c)| (n.to_string(), *c)).collect();
        assert_eq!(counted(&fx, |i| format!("batch-{i}")).await, expected);
    }
}
