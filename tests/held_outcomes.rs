//! `on_crash = hold` (issue 26): a key whose holder stops mid-body without a word is held as
//! unknown once its lease ends, never run again until resolved (by an operator, by the runtime's
//! resolver, or by its holder's own late commit), on every store. A holder "stops" here by
//! stalling past a lease it does not renew (`renew(false)`): to the store that is a crashed
//! process; `tests/hold_kill.rs` kills real processes.

#[macro_use]
mod support;

use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::Duration;

use idempotency::store::{Inspected, RecordState, Resolved};
use idempotency::{Call, CallContext, Error, Idempotency, OnCrash, Resolve, Unresolved};
use support::{counter, ms, Backend, Fixture, R};

all_stores!(
    a_held_key_whose_holder_stopped_is_unknown_until_resolved,
    an_unknown_outcome_resolved_as_completed_replays_its_value,
    resolve_changes_nothing_but_an_unknown_outcome,
    the_resolver_answers_for_the_first_call_that_finds_the_key,
    a_holder_that_commits_late_resolves_its_own_key,
    under_hold_a_dropped_call_leaves_its_key_held_and_an_err_frees_it,
    without_hold_a_stopped_holder_frees_its_key,
);

const LEASE: Duration = Duration::from_millis(300);

/// A call whose holder, a process of its own on `fx`'s store, stalls: its body starts, never
/// ends, and its lease is not renewed. Returns once the body has started: the holder's death
/// (call it, then the process sends nothing more, as after a SIGKILL).
fn stalled(fx: &Fixture, call: Call) -> impl FnOnce() {
    let (idem, dying) = support::dying::Dying::runtime(fx.store(0));
    let (started_tx, started) = std::sync::mpsc::channel();
    let task = tokio::spawn(async move {
        idem.run(call.ttl(LEASE).renew(false), || async move {
            started_tx.send(()).unwrap();
            std::future::pending::<()>().await;
            R::Ok("never".to_owned())
        })
        .await
    });
    tokio::task::block_in_place(|| started.recv_timeout(Duration::from_secs(10)).expect("the holder started"));
    move || {
        dying.die();
        task.abort();
    }
}

fn held(key: &str) -> Call {
    Call::new(key).scope("payouts").on_crash(OnCrash::Hold)
}

/// A call whose body counts its runs and returns which attempt it was.
async fn attempt(idem: &Idempotency, call: Call, runs: &Arc<std::sync::atomic::AtomicUsize>) -> R<String> {
    idem.run(call, || async {
        runs.fetch_add(1, SeqCst);
        Ok(format!("paid on attempt {}", CallContext::current().unwrap().attempt()))
    })
    .await
}

async fn a_held_key_whose_holder_stopped_is_unknown_until_resolved(backend: Backend) {
    let fx = Fixture::new(backend, 2).await;
    let (holder, other) = (fx.idem(0), fx.idem(1));
    let runs = counter();
    let holder_task = stalled(&fx, held("981"));
    // While its lease lasts the key is in progress, as always.
    let early = attempt(&other, held("981"), &runs).await;
    assert!(matches!(early, Err(support::AppError::Idem(Error::Conflict { .. }))), "{early:?}");
    tokio::time::sleep(LEASE + ms(200)).await;
    // Its process dies: nothing more comes of it.
    holder_task();
    let started = std::time::SystemTime::now();
    for _ in 0..2 {
        match attempt(&other, held("981"), &runs).await {
            Err(support::AppError::Idem(Error::OutcomeUnknown { key, owner, lease_ended, attempt })) => {
                assert_eq!((key.as_str(), attempt), ("payouts:981", 1));
                assert_eq!(owner.len(), 22, "the holder's owner id: {owner}");
                let ago = started.duration_since(lease_ended).unwrap_or_default();
                assert!(ago < Duration::from_secs(5), "the lease ended {ago:?} before, by the store's clock");
            }
            other => panic!("{other:?}"),
        }
    }
    // Any call on the key, whatever its own policy: the record says the key is held.
    let rerun = attempt(&other, Call::new("981").scope("payouts"), &runs).await;
    assert!(matches!(rerun, Err(support::AppError::Idem(Error::OutcomeUnknown { .. }))), "{rerun:?}");
    assert_eq!(runs.load(SeqCst), 0, "the body never ran again");
    let Inspected::Record(view) = other.inspect("payouts", "981").await.unwrap() else { panic!("no record") };
    assert_eq!((view.state, view.holds, view.attempts), (RecordState::Unknown, true, Some(1)), "{view:?}");
    assert!(view.owner.is_some() && view.lease_end_ms.is_some(), "{view:?}");
    // The operator finds the payout was not made: the key is free, and the next call is attempt 2.
    assert_eq!(other.resolve("payouts", "981", Resolve::NotDone).await.unwrap(), Resolved::Done);
    assert_eq!(attempt(&other, held("981"), &runs).await.unwrap(), "paid on attempt 2");
    assert_eq!(attempt(&holder, held("981"), &runs).await.unwrap(), "paid on attempt 2", "replayed");
    assert_eq!(runs.load(SeqCst), 1);
}

async fn an_unknown_outcome_resolved_as_completed_replays_its_value(backend: Backend) {
    let fx = Fixture::new(backend, 2).await;
    let other = fx.idem(1);
    let runs = counter();
    let holder_task = stalled(&fx, held("982").fingerprint(&("eur", 50)));
    tokio::time::sleep(LEASE + ms(200)).await;
    holder_task();
    // The provider says it was paid, with this receipt.
    let done = other.resolve("payouts", "982", Resolve::completed(&"receipt-982").unwrap()).await.unwrap();
    assert_eq!(done, Resolved::Done);
    let replay = attempt(&other, held("982").fingerprint(&("eur", 50)), &runs).await;
    assert_eq!(replay.unwrap(), "receipt-982");
    // The payload's fingerprint stays with the key.
    let reused = attempt(&other, held("982").fingerprint(&("eur", 99)), &runs).await;
    assert!(matches!(reused, Err(support::AppError::Idem(Error::KeyReused { .. }))), "{reused:?}");
    assert_eq!(runs.load(SeqCst), 0);
    // Completed without a value: calls are told it ran, and nothing replays.
    let holder_task = stalled(&fx, held("983"));
    tokio::time::sleep(LEASE + ms(200)).await;
    holder_task();
    other.resolve("payouts", "983", Resolve::CompletedWithoutValue).await.unwrap();
    let dup = attempt(&other, held("983"), &runs).await;
    assert!(matches!(dup, Err(support::AppError::Idem(Error::Duplicate { replayable: false, .. }))), "{dup:?}");
}

async fn resolve_changes_nothing_but_an_unknown_outcome(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let runs = counter();
    assert_eq!(idem.resolve("payouts", "none", Resolve::NotDone).await.unwrap(), Resolved::Absent);
    // A holder whose lease lasts (renewed) may still commit: not the operator's to decide.
    let (gate, task) = support::hold(&idem, held("live").ttl(LEASE), false);
    tokio::time::sleep(LEASE + ms(100)).await;
    assert_eq!(idem.resolve("payouts", "live", Resolve::NotDone).await.unwrap(), Resolved::Running);
    gate.send(()).unwrap();
    task.await.unwrap().unwrap();
    let again = idem.resolve("payouts", "live", Resolve::NotDone).await.unwrap();
    assert_eq!(again, Resolved::NotUnknown(RecordState::Completed));
    // A key without `on_crash = hold` is never unknown.
    let (gate, task) = support::hold(&idem, Call::new("plain").scope("payouts"), false);
    let plain = idem.resolve("payouts", "plain", Resolve::NotDone).await.unwrap();
    assert_eq!(plain, Resolved::NotUnknown(RecordState::InProgress));
    gate.send(()).unwrap();
    task.await.unwrap().unwrap();
    assert_eq!(runs.load(SeqCst), 0);
}

async fn the_resolver_answers_for_the_first_call_that_finds_the_key(backend: Backend) {
    let fx = Fixture::new(backend, 2).await;
    let (asked, runs) = (counter(), counter());
    let seen = Arc::new(std::sync::Mutex::new(Vec::<Unresolved>::new()));
    let other = fx.idem_with(1, |b| {
        let (asked, seen) = (asked.clone(), seen.clone());
        b.resolver(move |unknown: Unresolved| {
            asked.fetch_add(1, SeqCst);
            seen.lock().unwrap().push(unknown.clone());
            async move {
                // The provider knows payout 1 went through and payout 2 did not; 3 it cannot say.
                Ok(match unknown.key.as_str() {
                    "payouts:1" => Resolve::completed(&"receipt-1").unwrap(),
                    "payouts:2" => Resolve::NotDone,
                    _ => Resolve::StillUnknown,
                })
            }
        })
    });
    for key in ["1", "2", "3"] {
        let holder_task = stalled(&fx, held(key));
        tokio::time::sleep(LEASE + ms(200)).await;
        holder_task();
    }
    assert_eq!(attempt(&other, held("1"), &runs).await.unwrap(), "receipt-1");
    assert_eq!(attempt(&other, held("2"), &runs).await.unwrap(), "paid on attempt 2");
    let scripts = || fx.server.as_ref().map(|s| s.command_calls().get("evalsha").copied().unwrap_or(0));
    let before = scripts();
    let still = attempt(&other, held("3"), &runs).await;
    assert!(matches!(still, Err(support::AppError::Idem(Error::OutcomeUnknown { .. }))), "{still:?}");
    // A key still unknown is not asked for again: one acquire (acquire.lua on Redis), no more.
    if let (Some(before), Some(after)) = (before, scripts()) {
        assert_eq!(after - before, 1, "script calls for a call whose resolver said the outcome is still unknown");
    }
    assert_eq!((asked.load(SeqCst), runs.load(SeqCst)), (3, 1));
    // Resolved keys are not asked about again.
    assert_eq!(attempt(&other, held("1"), &runs).await.unwrap(), "receipt-1");
    assert_eq!(attempt(&other, held("2"), &runs).await.unwrap(), "paid on attempt 2");
    assert_eq!(asked.load(SeqCst), 3);
    let seen = seen.lock().unwrap();
    assert!(seen.iter().all(|u| u.attempt == 1 && u.owner.len() == 22), "{seen:?}");
}

async fn a_holder_that_commits_late_resolves_its_own_key(backend: Backend) {
    let fx = Fixture::new(backend, 2).await;
    let (holder, other) = (fx.idem(0), fx.idem(1));
    let runs = counter();
    let (open, opened) = tokio::sync::oneshot::channel::<()>();
    let (started_tx, started) = std::sync::mpsc::channel();
    let task = {
        let holder = holder.clone();
        tokio::spawn(async move {
            holder
                .run(held("984").ttl(LEASE).renew(false), || async move {
                    started_tx.send(()).unwrap();
                    let _ = opened.await;
                    R::Ok("paid late".to_owned())
                })
                .await
        })
    };
    tokio::task::block_in_place(|| started.recv_timeout(Duration::from_secs(10)).unwrap());
    tokio::time::sleep(LEASE + ms(200)).await;
    let unknown = attempt(&other, held("984"), &runs).await;
    assert!(matches!(unknown, Err(support::AppError::Idem(Error::OutcomeUnknown { .. }))), "{unknown:?}");
    // The stalled holder wakes up and commits: nobody took the key, its result stands.
    open.send(()).unwrap();
    assert_eq!(task.await.unwrap().unwrap(), "paid late");
    assert_eq!(attempt(&other, held("984"), &runs).await.unwrap(), "paid late");
    assert_eq!(runs.load(SeqCst), 0);
}

async fn under_hold_a_dropped_call_leaves_its_key_held_and_an_err_frees_it(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let runs = counter();
    // A caller dropped mid-body (a client gone, a timeout around the call): under `rerun` the key
    // is released at once; under `hold` it may have had its effect, so it stays held.
    let (_gate, task) = support::hold(&idem, held("985").ttl(LEASE), false);
    task.abort();
    let _ = task.await;
    let now = attempt(&idem, held("985"), &runs).await;
    assert!(matches!(now, Err(support::AppError::Idem(Error::Conflict { .. }))), "{now:?}");
    tokio::time::sleep(LEASE + ms(200)).await;
    let later = attempt(&idem, held("985"), &runs).await;
    assert!(matches!(later, Err(support::AppError::Idem(Error::OutcomeUnknown { .. }))), "{later:?}");
    // The control: the same drop without `hold` frees the key at once.
    let (_gate, task) = support::hold(&idem, Call::new("986").scope("payouts"), false);
    task.abort();
    let _ = task.await;
    support::eventually(Duration::from_secs(5), "the dropped call's key is released", || {
        let (idem, runs) = (idem.clone(), runs.clone());
        async move { attempt(&idem, Call::new("986").scope("payouts"), &runs).await.ok() }
    })
    .await;
    // A body's `Err` says it failed: the key is freed, and the retry is attempt 2.
    let failed: R<String> = idem.run(held("987"), || async { Err(support::AppError::Failed("declined")) }).await;
    assert!(failed.is_err());
    assert_eq!(attempt(&idem, held("987"), &runs).await.unwrap(), "paid on attempt 2");
}

async fn without_hold_a_stopped_holder_frees_its_key(backend: Backend) {
    let fx = Fixture::new(backend, 2).await;
    let other = fx.idem(1);
    let runs = counter();
    let holder_task = stalled(&fx, Call::new("988").scope("payouts"));
    tokio::time::sleep(LEASE + ms(200)).await;
    holder_task();
    assert_eq!(attempt(&other, Call::new("988").scope("payouts"), &runs).await.unwrap(), "paid on attempt 1");
    assert_eq!(runs.load(SeqCst), 1, "the body ran again: the default");
}
