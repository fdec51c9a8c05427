//! Edges of round three (issue 22): durations the stores cannot hold, errors that will never
//! pass, a lost lease that wakes every waiter, a late acquire. Each on every store where the
//! store matters.

#[macro_use]
mod support;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use idempotency::store::{AcquireOutcome, AcquireRequest, CommitRequest, Lease, StoreFuture, Transition, Watcher};
use idempotency::RedisStore;
use idempotency::{
    Call, CallContext, Error, Force, Idempotency, MemoryStore, OnConflict, Store, StoreError, StoreErrorKind,
};
use support::proxy::{Direction, Proxy};
use support::{counter, AppError, Backend, Fixture, RedisServer, R};

all_stores!(
    durations_the_store_cannot_hold_are_refused_before_the_body_runs,
    a_forced_forget_never_gives_the_next_holder_a_smaller_fence,
    runtimes_on_one_store_take_each_others_tokens_by_default,
);

/// `keep`, `ttl`, a wait and a token lifetime of `Duration::MAX` are `InvalidCall` naming the
/// key and the limit, before any store command and without a panic; the key stays free.
async fn durations_the_store_cannot_hold_are_refused_before_the_body_runs(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let runs = counter();
    let max = Duration::MAX;
    let calls =
        [Call::new("long").keep(max), Call::new("long").ttl(max), Call::new("long").on_conflict(OnConflict::Wait(max))];
    for call in calls {
        let r = runs.clone();
        let out: R<u32> = idem
            .run(call, || async move {
                r.fetch_add(1, SeqCst);
                Ok(1)
            })
            .await;
        match out {
            Err(AppError::Idem(Error::InvalidCall { key, reason })) => {
                assert_eq!(key, "long");
                assert!(reason.contains("maximum"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(runs.load(SeqCst), 0, "a body ran under a duration the store cannot hold");
    assert!(matches!(idem.issue_token(max), Err(Error::InvalidCall { .. })));
    assert!(matches!(idem.lock("long").ttl(max).acquire().await, Err(Error::InvalidCall { .. })));
    assert!(matches!(idem.lock("long").wait(max).await, Err(Error::InvalidCall { .. })));
    // The longest accepted ones work, and the key was never taken.
    let r = runs.clone();
    let ok: R<u32> = idem
        .run(Call::new("long").keep(idempotency::MAX_DURATION), || async move {
            r.fetch_add(1, SeqCst);
            Ok(2)
        })
        .await;
    assert_eq!(ok.unwrap(), 2);
    assert_eq!(runs.load(SeqCst), 1);
}

/// A memory store whose commits the backend refuses (as Redis refuses an invalid expire time),
/// counting them.
struct RefusedCommits(MemoryStore, AtomicUsize);

impl Store for RefusedCommits {
    fn acquire<'a>(&'a self, r: AcquireRequest<'a>) -> StoreFuture<'a, Result<AcquireOutcome, StoreError>> {
        self.0.acquire(r)
    }
    fn renew<'a>(&'a self, leases: &'a [Lease<'a>]) -> StoreFuture<'a, Result<Vec<bool>, StoreError>> {
        self.0.renew(leases)
    }
    fn commit<'a>(&'a self, _: CommitRequest<'a>) -> StoreFuture<'a, Result<Transition, StoreError>> {
        self.1.fetch_add(1, SeqCst);
        StoreFuture::ready(Err(StoreError::new(
            StoreErrorKind::Refused,
            "commit: ERR invalid expire time in 'set' command",
        )))
    }
    fn release<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, Result<Transition, StoreError>> {
        self.0.release(key, owner)
    }
    fn watch<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<Watcher, StoreError>> {
        self.0.watch(key)
    }
    fn call_timeout(&self) -> Option<Duration> {
        Some(Duration::from_secs(2))
    }
}

/// A commit the backend refuses is not retried as if the store were away, and the caller is told
/// (`Unconfirmed`), not handed an `Ok` whose record will never exist.
#[tokio::test]
async fn a_refused_commit_is_not_retried_and_the_caller_is_told() {
    let store = Arc::new(RefusedCommits(MemoryStore::new(), AtomicUsize::new(0)));
    let idem = Idempotency::builder_shared(store.clone()).build();
    let started = tokio::time::Instant::now();
    let out: Result<u32, Error> = idem.run(Call::new("k"), || async { Ok(1) }).await;
    assert!(matches!(&out, Err(Error::Unconfirmed { key, .. }) if key == "k"), "{out:?}");
    assert_eq!(store.1.load(SeqCst), 1, "a refused commit was sent again");
    assert!(started.elapsed() < Duration::from_secs(1), "the caller waited for retries: {:?}", started.elapsed());
}

/// Every task waiting on a lock's loss wakes, and one that starts waiting after it resolves too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_wakes_every_waiter() {
    let store = Arc::new(MemoryStore::new());
    let idem = Idempotency::builder_shared(store.clone()).build();
    let guard = Arc::new(idem.lock("ledger").ttl(Duration::from_millis(300)).acquire().await.unwrap());
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let g = guard.clone();
            tokio::spawn(async move { g.lost().await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(store.remove("lock:ledger"), "the lock's record");
    for w in waiters {
        tokio::time::timeout(Duration::from_secs(2), w).await.expect("a waiter on lost() never woke").unwrap();
    }
    assert!(guard.is_lost());
    tokio::time::timeout(Duration::from_millis(100), guard.lost()).await.expect("a late waiter hangs");
}

/// Client A's replies come 700 ms late through a relay, under a 300 ms lease; client B, direct,
/// takes the key at 400 ms and runs. A's acquire reply lands after its lease ran out: its body
/// must not start (it gets `LeaseLost`), so the key's body runs once, B's, and B's record stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_never_starts_after_its_lease_ran_out() {
    let server = RedisServer::start();
    let relay = Proxy::start(server.port());
    let a =
        Idempotency::new(RedisStore::builder(&relay.url()).timeout(Duration::from_secs(3)).connect().await.unwrap());
    let b = Idempotency::new(RedisStore::connect(&server.url()).await.unwrap());
    relay.set_latency(Direction::Down, Duration::from_millis(700));
    let runs = counter();
    let call = || Call::new("late").ttl(Duration::from_millis(300));
    let body = |who: &'static str| {
        let runs = runs.clone();
        move || async move {
            runs.fetch_add(1, SeqCst);
            tokio::time::sleep(Duration::from_millis(600)).await;
            R::Ok(who.to_owned())
        }
    };
    let late = tokio::spawn({
        let (a, call, body) = (a.clone(), call(), body("a"));
        async move { a.run(call, body).await }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let direct = b.run(call(), body("b")).await;
    let late = late.await.unwrap();
    assert_eq!(direct.unwrap(), "b");
    assert!(matches!(late, Err(AppError::Idem(Error::LeaseLost { .. }))), "{late:?}");
    assert_eq!(runs.load(SeqCst), 1, "two bodies of one key ran at once");
    relay.set_latency(Direction::Down, Duration::ZERO);
    let replayed = b.run(call(), body("c")).await.unwrap();
    assert_eq!(replayed, "b", "the late holder's release took B's record");
}

/// A replay cache turns on for every runtime on a healthy server, also through a relay (where a
/// check message can overtake the subscription it checks): 20 runtimes in a row, each answering
/// a duplicate from its cache (no store command) within two seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_cache_turns_on_for_every_runtime_on_a_healthy_server() {
    let server = RedisServer::start();
    let relay = Proxy::start(server.port());
    for i in 0..20 {
        let store = RedisStore::connect(&relay.url()).await.unwrap();
        let idem = Idempotency::builder(store).replay_cache(100).build();
        let key = format!("cached:{i}");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        loop {
            let (value, outcome) = idem.run_with_outcome(Call::new(key.as_str()), || async { R::Ok(i) }).await.unwrap();
            assert_eq!(value, i);
            if outcome.attempts == 0 {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "runtime {i}: its replay cache never turned on");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// One `Idempotency` used from two tokio runtimes: runtime A starts the watchdog's loop, runtime
/// B starts a 2.5 s body on a 300 ms lease, then A shuts down. B's lease is still renewed: a
/// second caller is refused for as long as the body runs, and the body is never told its lease
/// was lost.
#[test]
fn one_runtime_serves_several_tokio_runtimes_and_keeps_every_lease() {
    let idem = Idempotency::new(MemoryStore::new());
    let rt = |name: &str| {
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).thread_name(name).enable_all().build().unwrap()
    };
    let a = rt("runtime-a");
    let b = rt("runtime-b");
    let warm: Result<(), Error> = a.block_on(idem.run(Call::new("warm").ttl(Duration::from_millis(300)), || async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        Ok(())
    }));
    warm.unwrap();
    let long = b.spawn({
        let idem = idem.clone();
        async move {
            idem.run(Call::new("long").ttl(Duration::from_millis(300)), || async {
                tokio::time::sleep(Duration::from_millis(2500)).await;
                Ok::<_, Error>(idempotency::CallContext::current().unwrap().is_lease_lost())
            })
            .await
        }
    });
    std::thread::sleep(Duration::from_millis(200));
    a.shutdown_timeout(Duration::from_secs(1));
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(200));
        let second: Result<u8, Error> = b.block_on(idem.run(Call::new("long"), || async { Ok(2) }));
        assert!(matches!(second, Err(Error::Conflict { .. })), "a second caller got {second:?} while the body ran");
    }
    let lost = b.block_on(long).unwrap().unwrap();
    assert!(!lost, "the lease was lost while its body ran");
}

/// Under tokio's paused clock (a user's tests), a used token's record expires by tokio's clock;
/// the token's own validity follows the same time, so it never runs twice.
#[tokio::test(start_paused = true)]
async fn a_used_token_never_runs_again_under_a_paused_clock() {
    let idem = Idempotency::new(MemoryStore::new());
    let token = idem.issue_token(Duration::from_secs(60)).unwrap();
    let runs = counter();
    let submit = || {
        let r = runs.clone();
        idem.run(Call::token(&token), move || async move {
            r.fetch_add(1, SeqCst);
            R::Ok(1u8)
        })
    };
    submit().await.unwrap();
    tokio::time::advance(Duration::from_secs(2 * 3600)).await;
    let again = submit().await;
    assert_eq!(runs.load(SeqCst), 1, "a used token ran again: {again:?}");
    assert!(matches!(again, Err(AppError::Idem(Error::InvalidToken { .. }))), "{again:?}");
}

/// An operator's `forget(Force::InProgress)` between a holder's acquire and its reading of its
/// fence: the next holder's fence is still larger (fences come from the store's clock or
/// sequence, never from the record that was forgotten).
async fn a_forced_forget_never_gives_the_next_holder_a_smaller_fence(backend: Backend) {
    let fx = Fixture::new(backend, 2).await;
    let (a, b) = (fx.idem(0), fx.idem(1));
    let (forgotten_tx, forgotten) = tokio::sync::oneshot::channel::<()>();
    let (taken_tx, taken) = tokio::sync::oneshot::channel::<()>();
    let first = tokio::spawn({
        let a = a.clone();
        async move {
            a.run(Call::new("forced").ttl(Duration::from_secs(30)), || async move {
                // Read while it holds the key, as a body that writes with it does.
                let fence = CallContext::current().unwrap().fence().await?;
                let _ = taken_tx.send(());
                let _ = forgotten.await;
                R::Ok(fence)
            })
            .await
        }
    });
    taken.await.unwrap();
    b.forget("", "forced", Force::InProgress).await.unwrap();
    let second: R<u64> =
        b.run(Call::new("forced"), || async { Ok(CallContext::current().unwrap().fence().await?) }).await;
    let _ = forgotten_tx.send(());
    let first = first.await.unwrap().unwrap();
    let second = second.unwrap();
    assert!(second > first, "the next holder's fence {second} is not above the forgotten holder's {first}");
}

/// Four runtimes on one store, each built with the default settings (as four instances of a
/// service behind a load balancer are): a token issued by one is taken by every other; 100
/// concurrent submits of one token across the four run the body once, and none is refused as
/// invalid. A made-up token is still refused.
async fn runtimes_on_one_store_take_each_others_tokens_by_default(backend: Backend) {
    let fx = Fixture::new(backend, 4).await;
    let fleet: Vec<Idempotency> = (0..4).map(|i| Idempotency::builder_shared(fx.store(i)).build()).collect();
    let token = fleet[1].issue_token(Duration::from_secs(600)).unwrap();
    let runs = counter();
    let submits = (0..100).map(|i| {
        let (idem, token, runs) = (fleet[i % 4].clone(), token.clone(), runs.clone());
        tokio::spawn(async move {
            idem.run(Call::token(token), move || async move {
                runs.fetch_add(1, SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                R::Ok(7u32)
            })
            .await
        })
    });
    let mut invalid = 0;
    for submit in submits.collect::<Vec<_>>() {
        match submit.await.unwrap() {
            Ok(7) | Err(AppError::Idem(Error::Conflict { .. })) => {}
            Err(AppError::Idem(Error::InvalidToken { .. })) => invalid += 1,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(invalid, 0, "runtimes of one store refused each other's tokens");
    assert_eq!(runs.load(SeqCst), 1, "one token ran more than once");
    let replayed: R<u32> = fleet[3].run(Call::token(token.as_str()), || async { Ok(8) }).await;
    assert_eq!(replayed.unwrap(), 7);
    let forged: R<u32> = fleet[0].run(Call::token("A".repeat(56)), || async { Ok(9) }).await;
    assert!(matches!(forged, Err(AppError::Idem(Error::InvalidToken { .. }))), "{forged:?}");
}

/// A memory store whose first commit lands but whose reply is lost, and an operator forgets the
/// record before the runtime sends the commit again.
struct ForgottenBetweenCommits(MemoryStore, AtomicUsize);

impl Store for ForgottenBetweenCommits {
    fn acquire<'a>(&'a self, r: AcquireRequest<'a>) -> StoreFuture<'a, Result<AcquireOutcome, StoreError>> {
        self.0.acquire(r)
    }
    fn renew<'a>(&'a self, leases: &'a [Lease<'a>]) -> StoreFuture<'a, Result<Vec<bool>, StoreError>> {
        self.0.renew(leases)
    }
    fn commit<'a>(&'a self, r: CommitRequest<'a>) -> StoreFuture<'a, Result<Transition, StoreError>> {
        StoreFuture::new(async move {
            let landed = self.0.commit(r).await;
            if self.1.fetch_add(1, SeqCst) == 0 {
                // The reply is lost; meanwhile an operator forgets the record.
                assert_eq!(
                    self.0.forget(r.key, false).await.unwrap(),
                    idempotency::store::Forgotten::Deleted(idempotency::store::RecordState::Completed)
                );
                return Err(StoreError::new(StoreErrorKind::Timeout, "commit: no reply"));
            }
            landed
        })
    }
    fn release<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, Result<Transition, StoreError>> {
        self.0.release(key, owner)
    }
    fn watch<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<Watcher, StoreError>> {
        self.0.watch(key)
    }
    fn forget<'a>(
        &'a self,
        key: &'a str,
        force: bool,
    ) -> StoreFuture<'a, Result<idempotency::store::Forgotten, StoreError>> {
        self.0.forget(key, force)
    }
    fn call_timeout(&self) -> Option<Duration> {
        Some(Duration::from_secs(2))
    }
}

/// What docs/guarantees.md says of a forget that overtakes a call still committing: the call's
/// retry writes the record again (the key was absent, and a commit records its result then), so
/// the forget is undone and a duplicate replays; forgetting after the call returned sticks.
#[tokio::test]
async fn a_forget_that_overtakes_a_retried_commit_is_undone_by_it() {
    let store = Arc::new(ForgottenBetweenCommits(MemoryStore::new(), AtomicUsize::new(0)));
    let idem = Idempotency::builder_shared(store.clone()).build();
    let first: Result<u32, Error> = idem.run(Call::new("k"), || async { Ok(1) }).await;
    assert_eq!(first.unwrap(), 1);
    assert_eq!(store.1.load(SeqCst), 2, "the lost commit was not sent again");
    let again: Result<u32, Error> = idem.run(Call::new("k"), || async { Ok(2) }).await;
    assert_eq!(again.unwrap(), 1, "the retried commit did not write the record again");
    assert_eq!(
        idem.forget("", "k", Force::CompletedOnly).await.unwrap(),
        idempotency::store::Forgotten::Deleted(idempotency::store::RecordState::Completed)
    );
    let after: Result<u32, Error> = idem.run(Call::new("k"), || async { Ok(3) }).await;
    assert_eq!(after.unwrap(), 3, "a forget after the call returned did not stick");
}

/// A caller dropped during its commit (an outer timeout, a `select!`, a client that went away)
/// after its body returned: the commit goes on in the background, so the key is not left in
/// progress to come free after its lease for a retry to run the body a second time. Two windows:
/// the first attempt still on its way (here held by the kit's store), and the retries' backoff
/// after a first attempt that failed (the store away). Found by the test kit's cancelled-caller
/// scenario on a body with no await after its effect.
#[tokio::test]
async fn a_call_dropped_during_its_commit_still_stores_its_result() {
    use idempotency::testing::TestStore;
    for window in ["first attempt in flight", "retry backoff"] {
        let store = Arc::new(TestStore::new());
        let idem = Idempotency::builder_shared(store.clone()).build();
        let runs = counter();
        let call = || Call::new("k").ttl(Duration::from_secs(1));
        let body = |runs: Arc<AtomicUsize>| move || async move { Ok::<_, Error>(runs.fetch_add(1, SeqCst) + 1) };
        store.hold_commits();
        let mut first = Box::pin(idem.run(call(), body(runs.clone())));
        // Driven until its body has run and its commit is held...
        let _ = tokio::time::timeout(Duration::from_millis(10), &mut first).await;
        assert_eq!(runs.load(SeqCst), 1, "{window}");
        if window == "retry backoff" {
            // ... then failed once (the store away), and backing off before the next attempt.
            store.go_away();
            store.let_commits_through();
            let _ = tokio::time::timeout(Duration::from_millis(10), &mut first).await;
            assert_eq!(store.commands().1, 0, "no commit reached the records");
        }
        drop(first);
        store.let_commits_through();
        store.come_back();
        // Past the lease: without the commit the key would be free now.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let again = idem.run(call(), body(runs.clone())).await;
        assert_eq!(again.unwrap(), 1, "{window}: the retry was not answered with the stored result");
        assert_eq!(runs.load(SeqCst), 1, "{window}: the body ran again after its caller was dropped during the commit");
    }
}
