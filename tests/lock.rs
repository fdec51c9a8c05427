//! The lock guard on every store: mutual exclusion across four clients (a counter that detects
//! overlap), a lease renewed past its length while held, release on drop and on panic, fences
//! growing from holder to holder, and loss noticed when the key is deleted behind its back.

#[macro_use]
mod support;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use idempotency::{Error, Idempotency, MemoryStore, RedisStore, Store, LOCK_SCOPE};
use support::{eventually, ms, Backend, Fixture};

both_stores!(
    four_clients_never_overlap,
    a_held_lock_outlives_its_lease,
    dropping_or_panicking_releases_the_lock,
    fences_grow_from_holder_to_holder,
    a_lock_deleted_behind_its_back_is_known_lost,
    waiters_take_the_lock_in_turn_not_as_a_herd,
);

async fn four_clients_never_overlap(backend: Backend) {
    let fx = Fixture::new(backend, 4).await;
    let inside = Arc::new(AtomicUsize::new(0));
    let entries = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for client in 0..4 {
        let (idem, inside, entries) = (fx.idem(client), inside.clone(), entries.clone());
        workers.push(tokio::spawn(async move {
            for _ in 0..10 {
                let guard =
                    idem.lock("shared").ttl(Duration::from_secs(5)).wait(Duration::from_secs(20)).await.unwrap();
                assert_eq!(inside.fetch_add(1, SeqCst), 0, "two holders at once");
                entries.fetch_add(1, SeqCst);
                tokio::time::sleep(ms(5)).await;
                assert_eq!(inside.fetch_sub(1, SeqCst), 1, "two holders at once");
                guard.release().await.unwrap();
            }
        }));
    }
    for w in workers {
        w.await.unwrap();
    }
    assert_eq!(entries.load(SeqCst), 40);
}

async fn a_held_lock_outlives_its_lease(backend: Backend) {
    let fx = Fixture::new(backend, 2).await;
    let guard = fx.idem(0).lock("long").ttl(ms(300)).acquire().await.unwrap();
    for _ in 0..4 {
        tokio::time::sleep(ms(250)).await;
        let other = fx.idem(1).lock("long").acquire().await;
        assert!(matches!(other, Err(Error::Locked { waited: None, .. })), "taken while held past its lease: {other:?}");
    }
    assert!(!guard.is_lost(), "the lease was not renewed");
    guard.release().await.unwrap();
    fx.idem(1).lock("long").acquire().await.expect("free after release").release().await.unwrap();
}

async fn dropping_or_panicking_releases_the_lock(backend: Backend) {
    let fx = Fixture::new(backend, 2).await;
    let guard = fx.idem(0).lock("dropped").ttl(Duration::from_secs(30)).acquire().await.unwrap();
    drop(guard);
    let again = eventually(Duration::from_secs(2), "the dropped lock to be free", || async {
        fx.idem(1).lock("dropped").acquire().await.ok()
    })
    .await;
    drop(again);
    let idem = fx.idem(0);
    let panicked = tokio::spawn(async move {
        let _guard = idem.lock("panicked").ttl(Duration::from_secs(30)).acquire().await.unwrap();
        panic!("the critical section failed");
    });
    assert!(panicked.await.unwrap_err().is_panic());
    eventually(Duration::from_secs(2), "the panicked holder's lock to be free", || async {
        fx.idem(1).lock("panicked").acquire().await.ok()
    })
    .await;
}

async fn fences_grow_from_holder_to_holder(backend: Backend) {
    let fx = Fixture::new(backend, 2).await;
    let mut last = 0;
    for i in 0..10 {
        let guard = fx.idem(i % 2).lock("fenced").acquire().await.unwrap();
        assert!(guard.fence() > last, "fence went back: {last} then {}", guard.fence());
        last = guard.fence();
        guard.release().await.unwrap();
    }
}

async fn a_lock_deleted_behind_its_back_is_known_lost(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let guard = fx.idem(0).lock("deleted").ttl(ms(400)).acquire().await.unwrap();
    assert_eq!(guard.key(), format!("{LOCK_SCOPE}:deleted"));
    fx.delete_record(guard.key());
    let reason = tokio::time::timeout(Duration::from_secs(3), guard.lost()).await.expect("the loss went unnoticed");
    assert!(guard.is_lost(), "{reason}");
    let released = guard.release().await;
    assert!(released.is_ok() || matches!(released, Err(Error::LeaseLost { .. })), "{released:?}");
}

/// `n` callers of one runtime wait for a lock a first holder has; each takes it in turn, holds it
/// 2 ms and lets it go, by hand or by dropping its guard (`support::handover`). Before, every
/// release woke every waiter and each sent an acquire (10 waiters cost 76 acquires on f1b9438): now the
/// waiters are in line, and the one whose turn it is finds the lock free when its predecessor let
/// it go. Counted: at most 2 acquires per hand-over, for 10 and 100 waiters, in the order they
/// came.
async fn waiters_take_the_lock_in_turn_not_as_a_herd(backend: Backend) {
    let _server;
    let store: Arc<dyn Store> = match backend {
        Backend::Memory => Arc::new(MemoryStore::new()),
        _ => {
            let server = support::RedisServer::start();
            let store = RedisStore::connect(&server.url()).await.unwrap();
            _server = server;
            Arc::new(store)
        }
    };
    for n in [10usize, 100] {
        let key = format!("herd-{n}");
        let seen = support::handover::hand_over(store.clone(), &key, n).await;
        assert!(seen.acquires <= 2 * n, "{n} waiters, {n} hand-overs: {seen:?}");
        assert_eq!(seen.order, (0..n).collect::<Vec<_>>(), "{n} waiters: not in the order they came");
        let idem = Idempotency::builder_shared(store.clone()).build();
        let last = eventually(ms(2000), "the lock free after the last waiter", || async {
            idem.lock(key.clone()).acquire().await.ok()
        })
        .await;
        last.release().await.unwrap();
    }
}
