//! Attempts counted across retries (issue 26), on every store: a body's `Err` leaves a small
//! record with the count and the last error's text, kept for `keep`; the next attempt knows its
//! number (`CallContext::attempt`) and `inspect` shows both; the count never goes back (a dropped
//! call is not counted, a later attempt whose holder stopped is); `give_up_after` counts holders
//! that stopped too; batches count their items' failures and dead-letter a key given up.

#[macro_use]
mod support;

use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use idempotency::store::{Inspected, RecordState, RecordView, LAPSED};
use idempotency::{Ack, AckPlan, Call, CallContext, Error, Idempotency, OnCrash, Settled};
use support::{counter, ms, AppError, Backend, Fixture, R};

all_stores!(
    a_failure_is_counted_and_the_next_attempt_knows_its_number,
    a_dropped_call_is_not_counted_and_the_count_never_goes_back,
    an_attempt_whose_holder_stopped_after_a_failure_is_counted,
    give_up_after_counts_holders_that_stopped,
    a_mutex_keeps_no_count,
    a_batch_counts_failures_and_dead_letters_a_key_given_up,
    a_holder_resolved_as_not_done_that_then_fails_its_last_attempt_gives_up,
);

const LEASE: Duration = Duration::from_millis(300);

fn attempt() -> u32 {
    CallContext::current().expect("in a call").attempt()
}

async fn record(idem: &Idempotency, key: &str) -> RecordView {
    match idem.inspect("jobs", key).await.unwrap() {
        Inspected::Record(view) => view,
        other => panic!("{key}: {other:?}"),
    }
}

fn job(key: &str) -> Call {
    Call::new(key).scope("jobs")
}

/// A call whose body starts, says which attempt it is, and never ends, in a process of its own
/// on `fx`'s store: its lease renewed or not. Returns the process's death (call it, then the
/// process sends nothing more) and the attempt.
fn stalled(fx: &Fixture, call: Call, renew: bool) -> (impl FnOnce(), u32) {
    let (idem, dying) = support::dying::Dying::runtime(fx.store(0));
    let (task, at) = started(&idem, call, renew);
    (
        move || {
            dying.die();
            task.abort();
        },
        at,
    )
}

/// A call whose body starts, says which attempt it is, and never ends; its lease is renewed or
/// not. Returns the task (aborting it is the caller dropping the call) and the attempt.
fn started(idem: &Idempotency, call: Call, renew: bool) -> (tokio::task::JoinHandle<R<u32>>, u32) {
    let (started_tx, started) = std::sync::mpsc::channel();
    let idem = idem.clone();
    let task = tokio::spawn(async move {
        idem.run(call.ttl(LEASE).renew(renew), || async move {
            started_tx.send(attempt()).unwrap();
            std::future::pending::<()>().await;
            R::Ok(0)
        })
        .await
    });
    let at = tokio::task::block_in_place(|| started.recv_timeout(Duration::from_secs(10)).expect("it started"));
    (task, at)
}

async fn a_failure_is_counted_and_the_next_attempt_knows_its_number(backend: Backend) {
    let fx = Fixture::new(backend, 2).await;
    let (a, b) = (fx.idem(0), fx.idem(1));
    // `run` has no `Display` of the error to keep: its type's name says what failed.
    let first: R<u32> = a.run(job("1"), || async { Err(AppError::Failed("provider down")) }).await;
    assert!(first.is_err());
    let view = record(&a, "1").await;
    assert_eq!((view.state, view.attempts), (RecordState::Released, Some(1)), "{view:?}");
    assert!(view.last_error.as_deref().is_some_and(|e| e.contains("AppError")), "{view:?}");
    // The next attempt, in another process, is the second; through `run_giving_up` its error's
    // own text is kept.
    let second: R<u32> = b
        .run_giving_up(job("1"), 10, || async {
            assert_eq!(attempt(), 2);
            Err(AppError::Failed("provider down again"))
        })
        .await;
    assert!(second.is_err());
    let view = record(&b, "1").await;
    assert_eq!((view.attempts, view.last_error.as_deref()), (Some(2), Some("provider down again")), "{view:?}");
    // The third succeeds; its duplicates replay it.
    let third: R<u32> = a.run(job("1"), || async { Ok(attempt()) }).await;
    assert_eq!(third.unwrap(), 3);
    let again: R<u32> = b.run(job("1"), || async { Ok(99) }).await;
    assert_eq!(again.unwrap(), 3);
    assert_eq!(record(&a, "1").await.state, RecordState::Completed);
    // A key that never failed is its first attempt.
    let fresh: R<u32> = a.run(job("2"), || async { Ok(attempt()) }).await;
    assert_eq!(fresh.unwrap(), 1);
}

async fn a_dropped_call_is_not_counted_and_the_count_never_goes_back(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let failed: R<u32> = idem.run(job("3"), || async { Err(AppError::Failed("no")) }).await;
    assert!(failed.is_err());
    // Attempt 2 starts, and its caller goes away: its key is released, the failure before kept.
    let (task, at) = started(&idem, job("3"), true);
    assert_eq!(at, 2);
    task.abort();
    let _ = task.await;
    let seen = support::eventually(Duration::from_secs(5), "the dropped attempt's key is released", || {
        let idem = idem.clone();
        async move { idem.run(job("3"), || async { R::Ok(attempt()) }).await.ok() }
    })
    .await;
    assert_eq!(seen, 2, "the dropped attempt is not counted, and the failure before it still is");
}

async fn an_attempt_whose_holder_stopped_after_a_failure_is_counted(backend: Backend) {
    let fx = Fixture::new(backend, 2).await;
    let (a, b) = (fx.idem(0), fx.idem(1));
    let failed: R<u32> = a.run(job("4"), || async { Err(AppError::Failed("no")) }).await;
    assert!(failed.is_err());
    // Attempt 2's process dies mid-body (its lease is not renewed, then it is gone): its record
    // keeps the count past the lease, and the attempt counts as failed.
    let (die, at) = stalled(&fx, job("4"), false);
    assert_eq!(at, 2);
    tokio::time::sleep(LEASE + ms(200)).await;
    die();
    let view = record(&b, "4").await;
    assert_eq!((view.state, view.attempts, view.last_error.as_deref()), (RecordState::Released, Some(2), Some(LAPSED)));
    let next: R<u32> = b.run(job("4"), || async { Ok(attempt()) }).await;
    assert_eq!(next.unwrap(), 3);
}

async fn give_up_after_counts_holders_that_stopped(backend: Backend) {
    let fx = Fixture::new(backend, 2).await;
    let (a, b) = (fx.idem(0), fx.idem(1));
    let runs = counter();
    // A poison message that kills its consumer: each attempt's process dies mid-body. Its first
    // attempt's record keeps the lease's end too (give_up_after counts crashes), so the crashes
    // are counted, and after the limit the key is given up without running the body.
    for n in 1..=2 {
        let (die, at) = stalled(&fx, job("5").give_up_after(10), false);
        assert_eq!(at, n);
        tokio::time::sleep(LEASE + ms(200)).await;
        die();
    }
    let r: R<u32> = b
        .run_giving_up(job("5"), 2, || async {
            runs.fetch_add(1, SeqCst);
            R::Ok(0)
        })
        .await;
    assert!(matches!(&r, Err(AppError::Idem(Error::GaveUp { attempts: 2, .. }))), "{r:?}");
    assert_eq!(runs.load(SeqCst), 0);
    assert_eq!(record(&b, "5").await.state, RecordState::Failed);
    // And every call after it, whatever it asks.
    let again: R<u32> = a.run(job("5"), || async { R::Ok(1) }).await;
    assert!(matches!(again, Err(AppError::Idem(Error::GaveUp { attempts: 2, .. }))), "{again:?}");
}

async fn a_mutex_keeps_no_count(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let call = || job("6").keep(Duration::ZERO);
    let failed: R<u32> = idem.run(call(), || async { Err(AppError::Failed("no")) }).await;
    assert!(failed.is_err());
    assert!(matches!(idem.inspect("jobs", "6").await.unwrap(), Inspected::Absent));
    let next: R<u32> = idem.run(call(), || async { Ok(attempt()) }).await;
    assert_eq!(next.unwrap(), 1, "nothing is kept with a keep of zero, the count neither");
}

async fn a_batch_counts_failures_and_dead_letters_a_key_given_up(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let runs = counter();
    let deliveries = || ["poison", "fine"].map(|k| Call::new(k).scope("queue").give_up_after(2));
    // Each delivery runs both; "poison" always fails.
    let deliver = || async {
        let batch = idem.claim::<u32>(deliveries()).await;
        batch
            .run(1, |i, context| {
                let runs = runs.clone();
                async move {
                    runs.fetch_add(1, SeqCst);
                    if i == 0 {
                        Err(AppError::Failed("cannot parse the message"))
                    } else {
                        Ok(context.attempt())
                    }
                }
            })
            .await
    };
    let first = deliver().await;
    assert!(matches!(first[0], Settled::Failed(_)) && matches!(first[1], Settled::Executed { value: 1, .. }));
    assert_eq!((AckPlan::of(&first).requeue, AckPlan::of(&first).ack), (vec![0], vec![1]));
    // The second delivery is the poison's last attempt: it gives up, and the message goes aside.
    let second = deliver().await;
    assert!(matches!(second[0], Settled::GaveUp { attempts: 2, .. }), "{:?}", second[0]);
    assert_eq!(second[0].ack(), Ack::DeadLetter);
    assert!(matches!(second[1], Settled::Replayed(Ok(1))));
    // Redelivered anyway (a consumer that crashed before its dead-letter): refused, not run.
    let third = deliver().await;
    assert!(
        matches!(&third[0], Settled::Refused(Error::GaveUp { attempts: 2, last_error, .. }) if last_error == "cannot parse the message"),
        "{:?}",
        third[0]
    );
    assert_eq!(AckPlan::of(&third).dead_letter, vec![0]);
    assert_eq!(runs.load(SeqCst), 3, "poison twice, fine once");
    // A key whose outcome is unknown goes back to the queue until it is resolved.
    let (task, _) = {
        let (started_tx, started) = std::sync::mpsc::channel();
        let idem = idem.clone();
        let task = tokio::spawn(async move {
            idem.run(
                Call::new("payout").scope("queue").on_crash(OnCrash::Hold).ttl(LEASE).renew(false),
                || async move {
                    started_tx.send(()).unwrap();
                    std::future::pending::<()>().await;
                    R::Ok(0u32)
                },
            )
            .await
        });
        tokio::task::block_in_place(|| started.recv_timeout(Duration::from_secs(10)).unwrap());
        (task, ())
    };
    tokio::time::sleep(LEASE + ms(200)).await;
    task.abort();
    let batch = idem.claim::<u32>([Call::new("payout").scope("queue").on_crash(OnCrash::Hold)]).await;
    let settled = batch.run(1, |_, _| async { Ok::<u32, AppError>(1) }).await;
    assert!(matches!(&settled[0], Settled::Held(Error::OutcomeUnknown { .. })), "{:?}", settled[0]);
    assert_eq!(settled[0].ack(), Ack::Requeue);
}

/// Under `on_crash = hold` and `give_up_after(2)`: the second attempt's holder stalls past its
/// lease, an operator resolves the unknown outcome as not done (the key is released, the attempt
/// counted), and then the stalled body ends with its `Err`. That was the last attempt the policy
/// allows: the key is given up, as it would have been had nobody resolved it, and no call runs it
/// again (the store had answered the give-up as done while leaving the key released, and the next
/// call without the policy ran it as a third attempt). Found by the explorer (seed 646258067, I12).
async fn a_holder_resolved_as_not_done_that_then_fails_its_last_attempt_gives_up(backend: Backend) {
    let fx = Fixture::new(backend, 2).await;
    let (idem, other) = (fx.idem(0), fx.idem(1));
    let call = || job("payout").on_crash(OnCrash::Hold).give_up_after(2);
    let first: R<u32> = idem.run(call(), || async { Err(AppError::Failed("declined")) }).await;
    assert!(matches!(first, Err(AppError::Failed(_))), "{first:?}");
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let (started_tx, started) = tokio::sync::oneshot::channel::<u32>();
    let holder = {
        let idem = idem.clone();
        tokio::spawn(async move {
            idem.run(call().ttl(LEASE).renew(false), || async move {
                started_tx.send(attempt()).unwrap();
                let _ = released.await;
                R::<u32>::Err(AppError::Failed("declined again"))
            })
            .await
        })
    };
    assert_eq!(started.await.unwrap(), 2);
    tokio::time::sleep(LEASE + ms(200)).await;
    let resolved = other.resolve("jobs", "payout", idempotency::Resolve::NotDone).await.unwrap();
    assert_eq!(resolved, idempotency::store::Resolved::Done);
    release.send(()).unwrap();
    let last = holder.await.unwrap();
    assert!(matches!(last, Err(AppError::Failed(_))), "{last:?}");
    // A call of its own policy (none here) finds the key given up: the key's state, not the
    // call's (a call under the same `give_up_after(2)` would give up on a third attempt anyway).
    let runs = counter();
    let after: R<u32> = other
        .run(job("payout"), || async {
            runs.fetch_add(1, SeqCst);
            Ok(3)
        })
        .await;
    assert!(matches!(after, Err(AppError::Idem(Error::GaveUp { attempts: 2, .. }))), "{after:?}");
    assert_eq!(runs.load(SeqCst), 0);
    assert_eq!(record(&other, "payout").await.state, RecordState::Failed);
}
