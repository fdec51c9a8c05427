//! The semantic suite, run unchanged on `MemoryStore`, and on `RedisStore` against a real
//! standalone `redis-server` each test starts for itself, a Redis Cluster and a Sentinel group.

#[macro_use]
mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use idempotency::store::{AcquireOutcome, AcquireRequest, CommitRequest, Lease, Transition};
use idempotency::{Call, CallContext, Error, Idempotency, OnConflict, OnDuplicate, Store};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use support::{counter, eventually, ms, AppError, Backend, Fixture, R};
use tokio::time::Instant;

all_stores!(
    concurrent_callers_run_the_body_once,
    replay_returns_identical_values,
    error_releases_the_key,
    panic_releases_the_key_and_reaches_the_caller,
    cancelled_call_releases_the_key,
    watchdog_keeps_the_lease_of_a_long_body,
    without_renewal_a_long_body_runs_twice,
    lost_lease_aborts_the_body,
    commit_never_overwrites_another_owner,
    fencing_tokens_strictly_increase,
    waiter_gets_the_result_when_the_holder_commits,
    waiter_runs_the_body_when_the_holder_fails,
    waiter_times_out_when_the_holder_outlives_the_wait,
    token_runs_once_then_replays,
    token_second_submit_rejected_by_policy,
    unknown_expired_or_used_token_is_invalid,
    a_used_tokens_record_is_kept_until_the_token_expires,
    failed_attempt_leaves_the_token_usable,
    token_double_click_runs_once,
    crashed_token_holder_frees_the_token_after_its_lease,
    empty_or_oversized_key_is_invalid,
    result_that_no_longer_decodes_is_a_codec_error,
    key_reused_with_another_payload_is_refused,
    reject_policy_gives_duplicate,
    keep_zero_makes_a_mutex,
    oversized_result_is_completed_but_not_replayable,
    values_that_cannot_replay_as_themselves_fail_at_the_first_call,
    transitions_are_safe_to_repeat,
    unread_fences_belong_to_their_holder,
    replay_cache_answers_locally_and_respects_keep,
);

/// 100 callers on one key through 4 separate clients: one body runs; every other caller gets
/// the replayed value or `Conflict`.
async fn concurrent_callers_run_the_body_once(backend: Backend) {
    let fx = Fixture::new(backend, 4).await;
    let runs = counter();
    let barrier = Arc::new(tokio::sync::Barrier::new(100));
    let mut tasks = Vec::new();
    for i in 0..100 {
        let (idem, runs, barrier) = (fx.idem(i % 4), runs.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            idem.run(Call::new("order:1").scope("race"), || async move {
                runs.fetch_add(1, SeqCst);
                tokio::time::sleep(ms(300)).await;
                R::Ok(format!("receipt from caller {i}"))
            })
            .await
        }));
    }
    let mut values = Vec::new();
    let mut conflicts = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(v) => values.push(v),
            Err(AppError::Idem(Error::Conflict { .. })) => conflicts += 1,
            Err(other) => panic!("unexpected result {other:?}"),
        }
    }
    assert_eq!(runs.load(SeqCst), 1, "the body ran more than once");
    assert!(!values.is_empty());
    assert!(values.iter().all(|v| v == &values[0]), "callers saw different values: {values:?}");
    assert_eq!(values.len() + conflicts, 100);
    // Once completed, every caller gets the winner's value.
    for i in 0..20 {
        let idem = fx.idem(i % 4);
        let again = idem.run(Call::new("order:1").scope("race"), || async { R::Ok(String::from("rerun")) });
        assert_eq!(again.await.unwrap(), values[0]);
    }
    assert_eq!(runs.load(SeqCst), 1);
    println!("{backend:?}: 100 racing callers: 1 execution, {} got the value, {conflicts} conflicts", values.len());
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    id: u64,
    amount_cents: i64,
    note: Option<String>,
    tags: Vec<String>,
}

/// Runs `first` on a fresh key, then a call whose body would give `second`: the replay must be
/// `first`, and the second body must not run.
async fn replays<T>(idem: &Idempotency, key: &str, first: T, second: T)
where
    T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug + Clone + Send + 'static,
{
    let runs = counter();
    let r1 = runs.clone();
    let f = first.clone();
    let got = idem.run(Call::new(key), || async move {
        r1.fetch_add(1, SeqCst);
        R::Ok(f)
    });
    assert_eq!(got.await.unwrap(), first);
    let r2 = runs.clone();
    let got = idem.run(Call::new(key), || async move {
        r2.fetch_add(1, SeqCst);
        R::Ok(second)
    });
    assert_eq!(got.await.unwrap(), first, "replay of {key} differs");
    assert_eq!(runs.load(SeqCst), 1, "{key}: the body ran again instead of replaying");
}

async fn replay_returns_identical_values(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    replays(&idem, "unit", (), ()).await;
    replays(&idem, "zero", 0i64, 1).await;
    replays(&idem, "false", false, true).await;
    replays(&idem, "empty-string", String::new(), "x".into()).await;
    replays(&idem, "none", None::<u32>, Some(1)).await;
    replays(&idem, "empty-vec", Vec::<u32>::new(), vec![1]).await;
    let receipt = Receipt { id: 7, amount_cents: -1250, note: None, tags: vec!["a\"b".into(), "ü".into()] };
    replays(&idem, "struct", receipt, Receipt { id: 8, amount_cents: 0, note: Some("x".into()), tags: vec![] }).await;
    // Ordinary types beyond the falsy ones: each replays as itself.
    replays(&idem, "some-some", Some(Some(3u8)), None).await;
    replays(&idem, "some-none-nested-in-vec", vec![Some(1u8), None], vec![]).await;
    replays(&idem, "floats", vec![0.1f64, -2.5e300, 0.0, f64::MIN_POSITIVE], vec![]).await;
    replays(&idem, "u128", u128::MAX, 0).await;
    replays(&idem, "char", 'é', 'x').await;
    replays(&idem, "tuple", (1u8, String::from("a"), false), (0, String::new(), true)).await;
    let map: std::collections::HashMap<String, u32> = (0..40).map(|i| (format!("k{i}"), i)).collect();
    replays(&idem, "hash-map", map, Default::default()).await;
    let int_keys: std::collections::BTreeMap<u16, String> = [(1, "a".into()), (500, "b".into())].into();
    replays(&idem, "integer-keys", int_keys, Default::default()).await;
    replays(&idem, "enum", Shape::Circle { r: 2.5 }, Shape::Dot).await;
    replays(&idem, "unit-variant", Shape::Dot, Shape::Circle { r: 0.0 }).await;
    replays(&idem, "unit-struct", Marker, Marker).await;
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum Shape {
    Dot,
    Circle { r: f64 },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Marker;

async fn error_releases_the_key(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let runs = counter();
    let call = || Call::new("flaky").ttl(Duration::from_secs(30));
    let r = runs.clone();
    let failed: R<u32> = idem
        .run(call(), || async move {
            r.fetch_add(1, SeqCst);
            Err(AppError::Failed("card declined"))
        })
        .await;
    assert!(matches!(failed, Err(AppError::Failed("card declined"))), "{failed:?}");
    let r = runs.clone();
    let retried = idem.run(call(), || async move {
        r.fetch_add(1, SeqCst);
        R::Ok(5u32)
    });
    assert_eq!(retried.await.unwrap(), 5);
    assert_eq!(runs.load(SeqCst), 2, "the retry did not run the body");
}

async fn panic_releases_the_key_and_reaches_the_caller(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let call = || Call::new("panicky").ttl(Duration::from_secs(30));
    let i = idem.clone();
    let joined = tokio::spawn(async move {
        i.run(call(), || async {
            if std::hint::black_box(true) {
                panic!("boom in the body");
            }
            R::Ok(1u8)
        })
        .await
    })
    .await;
    let panic = joined.expect_err("the panic did not reach the caller").into_panic();
    assert_eq!(panic.downcast_ref::<&str>(), Some(&"boom in the body"));
    let retried = idem.run(call(), || async { R::Ok(2u8) }).await;
    assert_eq!(retried.unwrap(), 2, "the key stayed held after a panic");
}

async fn cancelled_call_releases_the_key(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let call = || Call::new("cancelled").ttl(Duration::from_secs(30));
    let started = Arc::new(AtomicBool::new(false));
    let s = started.clone();
    let cancelled = tokio::time::timeout(
        ms(200),
        idem.run(call(), || async move {
            s.store(true, SeqCst);
            tokio::time::sleep(Duration::from_secs(20)).await;
            R::Ok(1u8)
        }),
    )
    .await;
    assert!(cancelled.is_err() && started.load(SeqCst), "the call was not cancelled mid-body");
    // The lease is 30 s: getting the key within a few seconds proves it was released.
    let value = eventually(Duration::from_secs(5), "the cancelled call's key to be released", || async {
        match idem.run(call(), || async { R::Ok(2u8) }).await {
            Ok(v) => Some(v),
            Err(AppError::Idem(Error::Conflict { .. })) => None,
            Err(e) => panic!("{e:?}"),
        }
    })
    .await;
    assert_eq!(value, 2);
}

/// Lease 1 s, body 3.5 s, a duplicate every 300 ms: the watchdog keeps the key held, so no
/// duplicate runs the body. `renew` switches the watchdog off for the counter-test.
async fn long_body_with_duplicates(backend: Backend, renew: bool) -> usize {
    let fx = Fixture::new(backend, 2).await;
    let runs = counter();
    let call = || Call::new("long-job").ttl(Duration::from_secs(1));
    let (holder, r) = (fx.idem(0), runs.clone());
    let held = tokio::spawn(async move {
        holder
            .run(call().renew(renew), || async move {
                r.fetch_add(1, SeqCst);
                tokio::time::sleep(ms(3500)).await;
                R::Ok(String::from("done"))
            })
            .await
    });
    tokio::time::sleep(ms(50)).await;
    let duplicate = fx.idem(1);
    for _ in 0..12 {
        tokio::time::sleep(ms(300)).await;
        let r = runs.clone();
        let _ = duplicate
            .run(call(), || async move {
                r.fetch_add(1, SeqCst);
                tokio::time::sleep(ms(3500)).await;
                R::Ok(String::from("duplicate"))
            })
            .await;
    }
    let _ = held.await.unwrap();
    runs.load(SeqCst)
}

async fn watchdog_keeps_the_lease_of_a_long_body(backend: Backend) {
    assert_eq!(long_body_with_duplicates(backend, true).await, 1, "a duplicate ran while the watchdog held the lease");
}

async fn without_renewal_a_long_body_runs_twice(backend: Backend) {
    let runs = long_body_with_duplicates(backend, false).await;
    assert!(runs >= 2, "without renewal the lease should have run out under the body (runs = {runs})");
}

async fn lost_lease_aborts_the_body(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let finished = Arc::new(AtomicBool::new(false));
    let f = finished.clone();
    let call = Call::new("abort-me").ttl(ms(900)).abort_on_lease_lost(true);
    let key = call.full_key();
    let run = tokio::spawn(async move {
        idem.run(call, || async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            f.store(true, SeqCst);
            R::Ok(())
        })
        .await
    });
    tokio::time::sleep(ms(100)).await;
    fx.delete_record(&key);
    let started = Instant::now();
    let result = run.await.unwrap();
    assert!(matches!(result, Err(AppError::Idem(Error::LeaseLost { .. }))), "{result:?}");
    assert!(!finished.load(SeqCst), "the body ran to its end after the lease was lost");
    println!("{backend:?}: lease loss noticed {:?} after the record was deleted", started.elapsed());
}

async fn commit_never_overwrites_another_owner(backend: Backend) {
    let fx = Fixture::new(backend, 2).await;
    let call = || Call::new("contested").ttl(ms(600));
    let key = call().full_key();
    let a = fx.idem(0);
    let saw_loss = Arc::new(AtomicBool::new(false));
    let s = saw_loss.clone();
    let first = tokio::spawn(async move {
        a.run(call(), || async move {
            tokio::time::sleep(ms(1500)).await;
            s.store(CallContext::current().unwrap().is_lease_lost(), SeqCst);
            R::Ok(String::from("A"))
        })
        .await
    });
    tokio::time::sleep(ms(100)).await;
    fx.delete_record(&key);
    let b = fx.idem(1).run(call(), || async { R::Ok(String::from("B")) }).await;
    assert_eq!(b.unwrap(), "B");
    // A's body ran, so A gets its value; but B's completed record must stay.
    assert_eq!(first.await.unwrap().unwrap(), "A");
    assert!(saw_loss.load(SeqCst), "A's body was not told its lease was lost");
    let replay = fx.idem(0).run(call(), || async { R::Ok(String::from("C")) }).await;
    assert_eq!(replay.unwrap(), "B", "A's late commit overwrote B's record");
}

async fn fence_of(idem: &Idempotency, call: Call, fail: bool) -> u64 {
    let fence = Arc::new(AtomicUsize::new(0));
    let f = fence.clone();
    let _ = idem
        .run(call, || async move {
            f.store(CallContext::current().unwrap().fence().await? as usize, SeqCst);
            if fail {
                Err(AppError::Failed("x"))
            } else {
                R::Ok(())
            }
        })
        .await;
    fence.load(SeqCst) as u64
}

async fn fencing_tokens_strictly_increase(backend: Backend) {
    let fx = Fixture::new(backend, 2).await;
    let mut fences = Vec::new();
    // Holders one after another: a mutex (nothing kept), failures (released), and clients.
    for i in 0..6 {
        let call = Call::new("fenced").keep(Duration::ZERO);
        fences.push(fence_of(&fx.idem(i % 2), call, i % 3 == 1).await);
    }
    // After a completed record expired.
    fences.push(fence_of(&fx.idem(0), Call::new("fenced").keep(ms(50)), false).await);
    tokio::time::sleep(ms(150)).await;
    fences.push(fence_of(&fx.idem(1), Call::new("fenced").keep(Duration::ZERO), false).await);
    // After a holder's lease expired (a crash: acquired, never renewed nor released).
    let crashed = fx.store(0);
    let req = AcquireRequest {
        key: "fenced",
        owner: "crashed-owner",
        lease: ms(50),
        fingerprint: None,
        will_wait: false,
        report_ttl: true,
        fence_now: false,
        lapse: idempotency::store::Lapse::Free,
        keep: Duration::ZERO,
    };
    let AcquireOutcome::Acquired { fence, .. } = crashed.acquire(req).await.unwrap() else { panic!("not acquired") };
    fences.push(fence);
    tokio::time::sleep(ms(150)).await;
    fences.push(fence_of(&fx.idem(0), Call::new("fenced").keep(Duration::ZERO), false).await);
    assert!(fences.iter().all(|f| *f > 0), "{fences:?}");
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "fences do not strictly increase: {fences:?}");
}

async fn waiter_gets_the_result_when_the_holder_commits(backend: Backend) {
    let fx = Fixture::new(backend, 2).await;
    // No fallback re-check and a long holder lease: only the commit notification can wake the
    // waiter before its patience (10 s) runs out.
    let waiter = fx.idem_with(1, |b| b.wait_recheck(Duration::from_secs(60)));
    let call = || Call::new("slow-report").ttl(Duration::from_secs(30));
    let runs = counter();
    let (holder, r) = (fx.idem(0), runs.clone());
    let held = tokio::spawn(async move {
        let out = holder
            .run(call(), || async move {
                r.fetch_add(1, SeqCst);
                tokio::time::sleep(ms(700)).await;
                R::Ok(42u32)
            })
            .await;
        (out, Instant::now())
    });
    tokio::time::sleep(ms(150)).await;
    let r = runs.clone();
    let got = waiter
        .run(call().on_conflict(OnConflict::Wait(Duration::from_secs(10))), || async move {
            r.fetch_add(1, SeqCst);
            R::Ok(0u32)
        })
        .await;
    let woke = Instant::now();
    let (held, committed) = held.await.unwrap();
    assert_eq!(held.unwrap(), 42);
    assert_eq!(got.unwrap(), 42, "the waiter did not get the holder's result");
    assert_eq!(runs.load(SeqCst), 1);
    let latency = woke.saturating_duration_since(committed);
    println!("{backend:?}: wait-wake latency after commit: {:.2} ms", latency.as_secs_f64() * 1e3);
}

async fn waiter_runs_the_body_when_the_holder_fails(backend: Backend) {
    let fx = Fixture::new(backend, 2).await;
    let waiter = fx.idem_with(1, |b| b.wait_recheck(Duration::from_secs(60)));
    let call = || Call::new("fails-then-waiter").ttl(Duration::from_secs(30));
    let holder = fx.idem(0);
    let held = tokio::spawn(async move {
        holder
            .run(call(), || async {
                tokio::time::sleep(ms(400)).await;
                R::<u32>::Err(AppError::Failed("holder failed"))
            })
            .await
    });
    tokio::time::sleep(ms(100)).await;
    let got = waiter.run(call().on_conflict(OnConflict::Wait(Duration::from_secs(10))), || async { R::Ok(9u32) });
    assert_eq!(got.await.unwrap(), 9, "the waiter did not run the body after the holder released");
    assert!(matches!(held.await.unwrap(), Err(AppError::Failed(_))));
}

async fn waiter_times_out_when_the_holder_outlives_the_wait(backend: Backend) {
    let fx = Fixture::new(backend, 2).await;
    let call = || Call::new("very-slow").ttl(Duration::from_secs(30));
    let holder = fx.idem(0);
    let held = tokio::spawn(async move {
        holder
            .run(call(), || async {
                tokio::time::sleep(ms(2000)).await;
                R::Ok(1u8)
            })
            .await
    });
    tokio::time::sleep(ms(100)).await;
    let got = fx.idem(1).run(call().on_conflict(OnConflict::Wait(ms(300))), || async { R::Ok(2u8) }).await;
    match got {
        Err(AppError::Idem(Error::Timeout { waited, .. })) => assert!(waited >= ms(300), "{waited:?}"),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert_eq!(held.await.unwrap().unwrap(), 1);
}

async fn token_runs_once_then_replays(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let token = idem.issue_token(Duration::from_secs(60)).unwrap();
    assert_eq!(token.len(), idempotency::TOKEN_CHARS, "{token}");
    let runs = counter();
    for _ in 0..3 {
        let r = runs.clone();
        let got =
            idem.run(Call::token(&token), || async move { R::Ok(format!("order #{}", r.fetch_add(1, SeqCst) + 1)) });
        assert_eq!(got.await.unwrap(), "order #1");
    }
    assert_eq!(runs.load(SeqCst), 1);
}

async fn token_second_submit_rejected_by_policy(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let token = idem.issue_token(Duration::from_secs(60)).unwrap();
    let call = || Call::token(&token).on_duplicate(OnDuplicate::Reject);
    assert_eq!(idem.run(call(), || async { R::Ok(1u8) }).await.unwrap(), 1);
    let again = idem.run(call(), || async { R::Ok(2u8) }).await;
    assert!(matches!(again, Err(AppError::Idem(Error::Duplicate { replayable: true, .. }))), "{again:?}");
}

async fn unknown_expired_or_used_token_is_invalid(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let invalid = |r: R<u8>| matches!(r, Err(AppError::Idem(Error::InvalidToken { .. })));
    let runs = counter();
    let body = |runs: Arc<AtomicUsize>| move || async move { R::Ok(runs.fetch_add(1, SeqCst) as u8) };

    assert!(invalid(idem.run(Call::token("never-issued"), body(runs.clone())).await), "unknown token accepted");

    let short = idem.issue_token(ms(100)).unwrap();
    tokio::time::sleep(ms(250)).await;
    assert!(invalid(idem.run(Call::token(&short), body(runs.clone())).await), "expired token accepted");

    // Issued for another scope: refused in this one.
    let elsewhere = idem.issue_token_scoped("elsewhere", Duration::from_secs(60)).unwrap();
    assert!(invalid(idem.run(Call::token(&elsewhere), body(runs.clone())).await), "other-scope token accepted");

    // A used token stays used until it expires, even after its call's `keep` ran out.
    let used = idem.issue_token(Duration::from_secs(60)).unwrap();
    assert_eq!(idem.run(Call::token(&used).keep(ms(100)), body(runs.clone())).await.unwrap(), 0);
    tokio::time::sleep(ms(250)).await;
    assert_eq!(idem.run(Call::token(&used), body(runs.clone())).await.unwrap(), 0, "a used token ran again");
    assert_eq!(runs.load(SeqCst), 1, "an invalid or used token ran the body");
}

/// A used token's record is kept until the token expires plus the clock skew allowed between
/// machines (default 5 minutes), whatever the call's `keep` (default 24 h): past that the token is
/// refused before its record is read, so a longer keep would hold memory for nothing, and a
/// shorter one would let the token run again.
async fn a_used_tokens_record_is_kept_until_the_token_expires(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    for keep in [None, Some(ms(100)), Some(Duration::from_secs(7200))] {
        let token = idem.issue_token(Duration::from_secs(600)).unwrap();
        let call = match keep {
            Some(keep) => Call::token(&token).keep(keep),
            None => Call::token(&token),
        };
        assert_eq!(idem.run(call, || async { R::Ok(1u8) }).await.unwrap(), 1);
        let (filter, mut records, mut cursor) = (idempotency::ScanFilter::prefix("token:"), Vec::new(), None);
        loop {
            let page = idem.scan(&filter, cursor.as_deref(), 1000).await.unwrap();
            records.extend(page.records);
            cursor = page.next;
            if cursor.is_none() {
                break;
            }
        }
        assert_eq!(records.len(), 1, "{records:?}");
        let ttl = records[0].ttl.expect("the record expires");
        let until = Duration::from_secs(600) + idempotency::DEFAULT_TOKEN_SKEW;
        assert!(ttl > until - Duration::from_secs(5) && ttl <= until, "keep {keep:?}: kept for {ttl:?}");
        let key = records[0].key.clone();
        idem.forget("", &key, idempotency::Force::CompletedOnly).await.unwrap();
    }
}

async fn failed_attempt_leaves_the_token_usable(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let token = idem.issue_token(Duration::from_secs(60)).unwrap();
    let failed: R<u8> = idem.run(Call::token(&token), || async { Err(AppError::Failed("out of stock")) }).await;
    assert!(matches!(failed, Err(AppError::Failed(_))));
    let retried = idem.run(Call::token(&token), || async { R::Ok(3u8) }).await;
    assert_eq!(retried.unwrap(), 3, "the token was not usable after a failed attempt");
    let replayed = idem.run(Call::token(&token), || async { R::Ok(4u8) }).await;
    assert_eq!(replayed.unwrap(), 3);
}

async fn token_double_click_runs_once(backend: Backend) {
    let fx = Fixture::new(backend, 2).await;
    let token = fx.idem(0).issue_token(Duration::from_secs(60)).unwrap();
    let runs = counter();
    let click = |i: usize| {
        let (idem, runs, token) = (fx.idem(i), runs.clone(), token.clone());
        tokio::spawn(async move {
            idem.run(Call::token(&token), || async move {
                runs.fetch_add(1, SeqCst);
                tokio::time::sleep(ms(300)).await;
                R::Ok(String::from("one order"))
            })
            .await
        })
    };
    let (a, b) = (click(0), click(1));
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    assert_eq!(runs.load(SeqCst), 1);
    let oks = [&a, &b].iter().filter(|r| r.is_ok()).count();
    let conflicts = [&a, &b].iter().filter(|r| matches!(r, Err(AppError::Idem(Error::Conflict { .. })))).count();
    assert_eq!(oks + conflicts, 2, "{a:?} {b:?}");
}

async fn crashed_token_holder_frees_the_token_after_its_lease(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let token = idem.issue_token(Duration::from_secs(60)).unwrap();
    // A holder whose renewals stop (as a crashed process's would): its 200 ms lease runs out.
    let (tx, rx) = tokio::sync::oneshot::channel();
    let holder = tokio::spawn({
        let (idem, token) = (idem.clone(), token.clone());
        async move {
            let _: R<u8> = idem
                .run(Call::token(&token).ttl(ms(200)).renew(false), || async move {
                    let _ = tx.send(());
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    Ok(0)
                })
                .await;
        }
    });
    rx.await.unwrap();
    let held = idem.run(Call::token(&token), || async { R::Ok(1u8) }).await;
    assert!(matches!(held, Err(AppError::Idem(Error::Conflict { .. }))), "{held:?}");
    tokio::time::sleep(ms(350)).await;
    let after = idem.run(Call::token(&token), || async { R::Ok(2u8) }).await;
    assert_eq!(after.unwrap(), 2, "the token stayed held after its holder's lease ran out");
    holder.abort();
}

async fn empty_or_oversized_key_is_invalid(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let runs = counter();
    let body = |runs: Arc<AtomicUsize>| move || async move { R::Ok(runs.fetch_add(1, SeqCst)) };
    for call in [Call::new(""), Call::new("k".repeat(2000))] {
        let got = idem.run(call, body(runs.clone())).await;
        match got {
            Err(AppError::Idem(e @ Error::InvalidKey { .. })) => assert!(e.to_string().contains("key"), "{e}"),
            other => panic!("expected InvalidKey, got {other:?}"),
        }
    }
    // An empty or oversized token is not a token: refused before anything else.
    for token in [String::new(), "t".repeat(2000)] {
        let got = idem.run(Call::token(token), body(runs.clone())).await;
        assert!(matches!(got, Err(AppError::Idem(Error::InvalidToken { .. }))), "{got:?}");
    }
    assert_eq!(runs.load(SeqCst), 0);
    // Unicode, NUL and newline are fine.
    assert_eq!(idem.run(Call::new("ключ\0\n🔑"), body(runs.clone())).await.unwrap(), 0);
}

async fn result_that_no_longer_decodes_is_a_codec_error(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    assert_eq!(idem.run(Call::new("v1"), || async { R::Ok(5u32) }).await.unwrap(), 5);
    let runs = counter();
    let r = runs.clone();
    let got: R<Receipt> = idem
        .run(Call::new("v1"), || async move {
            r.fetch_add(1, SeqCst);
            Ok(Receipt { id: 1, amount_cents: 1, note: None, tags: vec![] })
        })
        .await;
    match got {
        Err(AppError::Idem(e @ Error::Codec { .. })) => assert_eq!(e.key(), "v1"),
        other => panic!("expected Codec, got {other:?}"),
    }
    assert_eq!(runs.load(SeqCst), 0, "an undecodable result must not re-run the body");
}

async fn key_reused_with_another_payload_is_refused(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let call = |amount: u32| Call::new("pay:1").fingerprint(&("pay", amount));
    assert_eq!(idem.run(call(100), || async { R::Ok(1u8) }).await.unwrap(), 1);
    assert_eq!(idem.run(call(100), || async { R::Ok(2u8) }).await.unwrap(), 1, "same payload must replay");
    let reused = idem.run(call(999), || async { R::Ok(3u8) }).await;
    assert!(matches!(reused, Err(AppError::Idem(Error::KeyReused { .. }))), "{reused:?}");
    // Also while in progress.
    let i = idem.clone();
    let held = tokio::spawn(async move {
        i.run(Call::new("pay:2").fingerprint(&1), || async {
            tokio::time::sleep(ms(400)).await;
            R::Ok(1u8)
        })
        .await
    });
    tokio::time::sleep(ms(100)).await;
    let reused = idem.run(Call::new("pay:2").fingerprint(&2), || async { R::Ok(2u8) }).await;
    assert!(matches!(reused, Err(AppError::Idem(Error::KeyReused { .. }))), "{reused:?}");
    held.await.unwrap().unwrap();
}

async fn reject_policy_gives_duplicate(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let call = || Call::new("webhook:evt_1").on_duplicate(OnDuplicate::Reject);
    assert_eq!(idem.run(call(), || async { R::Ok(1u8) }).await.unwrap(), 1);
    let dup = idem.run(call(), || async { R::Ok(2u8) }).await;
    assert!(matches!(dup, Err(AppError::Idem(Error::Duplicate { .. }))), "{dup:?}");
}

async fn keep_zero_makes_a_mutex(backend: Backend) {
    let fx = Fixture::new(backend, 2).await;
    let runs = counter();
    let call = || Call::new("nightly").keep(Duration::ZERO);
    let (a, r) = (fx.idem(0), runs.clone());
    let held = tokio::spawn(async move {
        a.run(call(), || async move {
            r.fetch_add(1, SeqCst);
            tokio::time::sleep(ms(300)).await;
            R::Ok(())
        })
        .await
    });
    tokio::time::sleep(ms(100)).await;
    let busy = fx.idem(1).run(call(), || async { R::Ok(()) }).await;
    assert!(matches!(busy, Err(AppError::Idem(Error::Conflict { .. }))), "{busy:?}");
    held.await.unwrap().unwrap();
    let r = runs.clone();
    fx.idem(1)
        .run(call(), || async move {
            r.fetch_add(1, SeqCst);
            R::Ok(())
        })
        .await
        .unwrap();
    assert_eq!(runs.load(SeqCst), 2, "with keep = 0 the next run must run again");
}

async fn oversized_result_is_completed_but_not_replayable(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem_with(0, |b| b.max_result_bytes(100));
    let runs = counter();
    let body = |runs: Arc<AtomicUsize>| {
        move || async move {
            runs.fetch_add(1, SeqCst);
            R::Ok("x".repeat(500))
        }
    };
    assert_eq!(idem.run(Call::new("big"), body(runs.clone())).await.unwrap().len(), 500);
    let again = idem.run(Call::new("big"), body(runs.clone())).await;
    assert!(matches!(again, Err(AppError::Idem(Error::Duplicate { replayable: false, .. }))), "{again:?}");
    assert_eq!(runs.load(SeqCst), 1, "an unreplayable result must not re-run the body");
}

/// Values JSON cannot carry exactly: the first call fails with `Codec`, naming the key and the
/// type, instead of a different value or a failure at the first duplicate; the body ran, so the
/// key stays completed (not replayable) and a duplicate gets `Duplicate` without running it.
async fn values_that_cannot_replay_as_themselves_fail_at_the_first_call(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    async fn refused<T>(idem: &Idempotency, key: &str, value: T, type_name: &str, says: &str)
    where
        T: Serialize + DeserializeOwned + Clone + Send + std::fmt::Debug + 'static,
    {
        let runs = counter();
        let body = |runs: Arc<AtomicUsize>, value: T| {
            move || async move {
                runs.fetch_add(1, SeqCst);
                R::Ok(value)
            }
        };
        let first = idem.run(Call::new(key).scope("exact"), body(runs.clone(), value.clone())).await;
        match &first {
            Err(AppError::Idem(Error::Codec { key: k, message })) => {
                assert_eq!(k, &format!("exact:{key}"));
                assert!(message.contains(type_name), "{key}: the message does not name the type: {message}");
                assert!(message.contains(says), "{key}: {message}");
            }
            other => panic!("{key}: expected a Codec error at the first call, got {other:?}"),
        }
        let again = idem.run(Call::new(key).scope("exact"), body(runs.clone(), value)).await;
        assert!(matches!(again, Err(AppError::Idem(Error::Duplicate { replayable: false, .. }))), "{key}: {again:?}");
        assert_eq!(runs.load(SeqCst), 1, "{key}: the body ran again");
    }
    refused(&idem, "some-unit", Some(()), "Option<()>", "Some").await;
    refused(&idem, "some-none", Some(None::<u8>), "Option<core::option::Option<u8>>", "Some").await;
    refused(&idem, "nan", f64::NAN, "f64", "NaN").await;
    let tuple_keys: std::collections::HashMap<(u8, u8), u8> = [((1, 2), 3)].into();
    refused(&idem, "tuple-keys", tuple_keys, "HashMap<(u8, u8), u8>", "key must be a string").await;
}

/// `me`'s commit of `key` (held by `me` with `fence`) is `Done`, and `Done` again when repeated
/// (a re-sent command); `other`'s (with `other_fence`) is then `Lost`.
async fn commits_are_their_owners(store: &dyn Store, key: &str, fence: u64, other_fence: u64) {
    let commit = CommitRequest {
        key,
        owner: "me",
        fence,
        keep: Duration::from_secs(60),
        result: Some(b"1"),
        fingerprint: None,
        lease_in_record: false,
    };
    assert_eq!(store.commit(commit).await.unwrap(), Transition::Done);
    assert_eq!(store.commit(commit).await.unwrap(), Transition::Done, "a repeated commit was not its own");
    assert_eq!(
        store.commit(CommitRequest { owner: "other", fence: other_fence, ..commit }).await.unwrap(),
        Transition::Lost,
        "another owner's commit took the completed record for its own"
    );
}

/// A plain acquire may leave its fencing token unread (`fence: 0`, on Redis: no `TIME`): only
/// its holder can read it then, while it holds the key; a commit with an unread fence is known
/// as its owner's (repeated: `Done`) and nobody else's (`Lost`: before the completed record
/// named its owner, any commit with fence 0 matched it). A caller that asks for the token at
/// once (`fence_now`, a lock) always has it.
async fn unread_fences_belong_to_their_holder(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let store = fx.store(0);
    let req = |key: &'static str, owner: &'static str, fence_now: bool| AcquireRequest {
        key,
        owner,
        lease: Duration::from_secs(10),
        fingerprint: None,
        will_wait: false,
        report_ttl: false,
        fence_now,
        lapse: idempotency::store::Lapse::Free,
        keep: Duration::ZERO,
    };
    let AcquireOutcome::Acquired { fence: now, .. } = store.acquire(req("eager", "me", true)).await.unwrap() else {
        panic!("not acquired")
    };
    assert!(now > 0, "a fence asked for at the acquisition was left unread");
    let AcquireOutcome::Acquired { fence, .. } = store.acquire(req("lazy", "me", false)).await.unwrap() else {
        panic!("not acquired")
    };
    if fence == 0 {
        assert_eq!(store.fence("lazy", "other").await.unwrap(), None, "another owner read the holder's fence");
        let read = store.fence("lazy", "me").await.unwrap().expect("the holder reads its fence");
        assert!(read > now, "a fence read later is not larger: {now} then {read}");
    }
    // What the runtime passes: the acquisition's fence, 0 when it stayed unread (and another
    // owner's unread fence is 0 too).
    commits_are_their_owners(&*store, "lazy", fence, if fence == 0 { 0 } else { fence + 1 }).await;
    if fence == 0 {
        assert_eq!(store.fence("lazy", "me").await.unwrap(), None, "a fence read after the commit");
    }
}

/// A client re-sends commands whose replies it lost: each transition repeated by the same owner
/// gives the same answer, and never turns the owner's own lease into a conflict.
async fn transitions_are_safe_to_repeat(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let store = fx.store(0);
    let req = |key: &'static str, owner: &'static str| AcquireRequest {
        key,
        owner,
        lease: Duration::from_secs(10),
        fingerprint: None,
        will_wait: false,
        report_ttl: true,
        fence_now: false,
        lapse: idempotency::store::Lapse::Free,
        keep: Duration::ZERO,
    };
    let AcquireOutcome::Acquired { fence, .. } = store.acquire(req("repeat", "me")).await.unwrap() else {
        panic!("not acquired")
    };
    // A re-sent acquire is "acquired" again, with a token as good as the first: the same, or the
    // server's clock read later while this owner holds the key.
    let AcquireOutcome::Acquired { fence: again, .. } = store.acquire(req("repeat", "me")).await.unwrap() else {
        panic!("a re-sent acquire turned against its own owner")
    };
    assert!(again >= fence, "a re-sent acquire's fence went back: {fence} then {again}");
    assert!(matches!(store.acquire(req("repeat", "other")).await.unwrap(), AcquireOutcome::InProgress { .. }));
    let lease = [Lease { key: "repeat", owner: "me", lease: Duration::from_secs(10) }];
    assert_eq!(store.renew(&lease).await.unwrap(), vec![true]);
    assert_eq!(store.renew(&lease).await.unwrap(), vec![true]);
    commits_are_their_owners(&*store, "repeat", fence, fence + 1).await;
    assert_eq!(store.release("repeat", "other").await.unwrap(), Transition::Lost);
    // Renewing a completed key is refused: it is not in progress any more.
    assert_eq!(store.renew(&lease).await.unwrap(), vec![false]);

    let AcquireOutcome::Acquired { .. } = store.acquire(req("released", "me")).await.unwrap() else {
        panic!("not acquired")
    };
    assert_eq!(store.release("released", "me").await.unwrap(), Transition::Done);
    assert_eq!(store.release("released", "me").await.unwrap(), Transition::Done);
    assert!(matches!(store.acquire(req("released", "other")).await.unwrap(), AcquireOutcome::Acquired { .. }));
}

/// With the replay cache on, a completed result is answered from this process: it survives the
/// record's deletion from the store (proof that no store call was made), never covers a key in
/// progress, and expires with `keep`.
async fn replay_cache_answers_locally_and_respects_keep(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let cached = fx.idem_with(0, |b| b.replay_cache(1000));
    let runs = counter();
    let body = |runs: Arc<AtomicUsize>| {
        move || async move {
            tokio::time::sleep(ms(200)).await;
            R::Ok(runs.fetch_add(1, SeqCst) as u32 + 1)
        }
    };
    let call = || Call::new("hot").keep(ms(1500));
    // In progress: not cached, a duplicate conflicts.
    let c = cached.clone();
    let first = tokio::spawn({
        let runs = runs.clone();
        async move { c.run(call(), body(runs)).await }
    });
    tokio::time::sleep(ms(50)).await;
    assert!(matches!(cached.run(call(), body(runs.clone())).await, Err(AppError::Idem(Error::Conflict { .. }))));
    assert_eq!(first.await.unwrap().unwrap(), 1);
    fx.delete_record(&call().full_key());
    assert_eq!(cached.run(call(), body(runs.clone())).await.unwrap(), 1, "not answered from the cache");
    // A runtime without the cache sees the deleted record and runs the body.
    assert_eq!(fx.idem(0).run(call(), body(runs.clone())).await.unwrap(), 2);
    tokio::time::sleep(ms(1700)).await;
    let after = cached.run(call(), body(runs.clone())).await.unwrap();
    assert_eq!(after, 3, "a cached result outlived its keep");
}
