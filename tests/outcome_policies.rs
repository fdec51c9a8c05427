//! Outcome policies (issue 26): `on_error = store` keeps a body's `Err` and replays it, through the
//! function API and the attribute, on every store; `on_error = give_up_after(N)` counts failures
//! across retries and processes and stops running the body after N; the default releases the
//! key and a retry runs.

#[macro_use]
mod support;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

use idempotency::{idempotent, Call, Error, Idempotency, OnDuplicate};
use serde::{Deserialize, Serialize};
use support::{counter, Backend, Fixture};

all_stores!(
    a_kept_error_is_replayed_and_the_body_does_not_run_again,
    the_attribute_keeps_errors_with_on_error_store,
    without_on_error_store_a_failure_releases_the_key,
    a_poison_call_gives_up_after_n_attempts_across_processes,
    a_retry_that_succeeds_after_failures_is_replayed,
    two_retries_racing_for_the_next_attempt_run_it_once,
    the_attribute_gives_up_with_on_error_give_up_after,
    give_up_after_refuses_what_it_cannot_count,
);

/// An application's error that serializes, so that it can be kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum PayError {
    Declined { reason: String, attempt: usize },
    Idem(String),
}

impl From<Error> for PayError {
    fn from(e: Error) -> Self {
        PayError::Idem(e.to_string())
    }
}

impl std::fmt::Display for PayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PayError::Declined { reason, attempt } => write!(f, "declined ({reason}) on attempt {attempt}"),
            PayError::Idem(e) => f.write_str(e),
        }
    }
}

fn declined(runs: &Arc<AtomicUsize>) -> Result<String, PayError> {
    let attempt = runs.fetch_add(1, SeqCst) + 1;
    Err(PayError::Declined { reason: "insufficient funds".into(), attempt })
}

async fn a_kept_error_is_replayed_and_the_body_does_not_run_again(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let runs = counter();
    let pay =
        |runs: Arc<AtomicUsize>| idem.run_keeping_errors(Call::new("pay:1"), move || async move { declined(&runs) });
    let first = pay(runs.clone()).await;
    assert_eq!(first, Err(PayError::Declined { reason: "insufficient funds".into(), attempt: 1 }));
    assert_eq!(pay(runs.clone()).await, first, "the duplicate gets the first error");
    assert_eq!(runs.load(SeqCst), 1);
    // An `Ok` is kept as before.
    let ok = idem.run_keeping_errors(Call::new("pay:2"), || async { Ok::<_, PayError>("paid".to_owned()) }).await;
    let again = idem.run_keeping_errors(Call::new("pay:2"), || async { Ok::<_, PayError>("twice".to_owned()) }).await;
    assert_eq!((ok.unwrap(), again.unwrap()), ("paid".to_owned(), "paid".to_owned()));
    // A record kept under one policy, read under the other, is said not to decode.
    let other: Result<String, Error> = idem.run(Call::new("pay:1"), || async { Ok("ran".to_owned()) }).await;
    assert!(matches!(other, Err(Error::Codec { .. })), "{other:?}");
    assert_eq!(runs.load(SeqCst), 1);
    // `on_duplicate = reject`: a kept error is a completed call like any, refused as a duplicate.
    let rejected = idem
        .run_keeping_errors(Call::new("pay:1").on_duplicate(OnDuplicate::Reject), || async {
            Ok::<_, PayError>("ran".to_owned())
        })
        .await;
    assert!(matches!(&rejected, Err(PayError::Idem(e)) if e.contains("already completed")), "{rejected:?}");
}

#[idempotent(key = "refund:{order}", on_error = store, store = idem)]
async fn refund(idem: &Idempotency, runs: &Arc<AtomicUsize>, order: u32) -> Result<String, PayError> {
    declined(runs)
}

#[idempotent(key = "refund-finished:{order}", on_error = store, on_cancel = finish, store = idem)]
async fn refund_to_completion(idem: Idempotency, runs: Arc<AtomicUsize>, order: u32) -> Result<String, PayError> {
    declined(&runs)
}

#[idempotent(key = "charge:{order}", store = idem)]
async fn charge(idem: &Idempotency, runs: &Arc<AtomicUsize>, order: u32) -> Result<String, PayError> {
    declined(runs)
}

async fn the_attribute_keeps_errors_with_on_error_store(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let runs = counter();
    let first = refund(&idem, &runs, 7).await;
    assert_eq!(refund(&idem, &runs, 7).await, first);
    assert!(matches!(first, Err(PayError::Declined { attempt: 1, .. })), "{first:?}");
    let finished = refund_to_completion(idem.clone(), runs.clone(), 7).await;
    assert_eq!(refund_to_completion(idem.clone(), runs.clone(), 7).await, finished);
    assert!(matches!(finished, Err(PayError::Declined { attempt: 2, .. })), "{finished:?}");
    assert_eq!(runs.load(SeqCst), 2, "each key's body ran once");
}

async fn without_on_error_store_a_failure_releases_the_key(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let runs = counter();
    let first = charge(&idem, &runs, 1).await;
    let second = charge(&idem, &runs, 1).await;
    assert!(matches!(first, Err(PayError::Declined { attempt: 1, .. })));
    assert!(matches!(second, Err(PayError::Declined { attempt: 2, .. })), "the retry ran: {second:?}");
}

/// The attempt the body is told it is.
fn attempt() -> usize {
    idempotency::CallContext::current().expect("in a call").attempt() as usize
}

/// A body that always fails, counting its runs, and saying which attempt the runtime told it.
fn poison(runs: &Arc<AtomicUsize>) -> Result<String, PayError> {
    runs.fetch_add(1, SeqCst);
    Err(PayError::Declined { reason: "poison".into(), attempt: attempt() })
}

async fn a_poison_call_gives_up_after_n_attempts_across_processes(backend: Backend) {
    let fx = Fixture::new(backend, 2).await;
    let runs = counter();
    let deliver = |i: usize| {
        let (idem, runs) = (fx.idem(i), runs.clone());
        async move { idem.run_giving_up(Call::new("msg:1").scope("queue"), 3, || async { poison(&runs) }).await }
    };
    // Redelivered to one process, then the other: each failure is counted, whoever ran it.
    for (n, process) in [(1, 0), (2, 1), (3, 0)] {
        let r = deliver(process).await;
        assert_eq!(r, Err(PayError::Declined { reason: "poison".into(), attempt: n }), "delivery {n}");
    }
    for process in [1, 0] {
        let r = deliver(process).await;
        assert_eq!(
            r,
            Err(PayError::Idem(
                "key \"queue:msg:1\": gave up after 3 failed attempts; the last failed with: declined (poison) on attempt 3"
                    .into()
            ))
        );
    }
    assert_eq!(runs.load(SeqCst), 3, "the body ran three times, then never again");
    // The library's own error says it too, with the count.
    let idem = fx.idem(1);
    let r: Result<String, Error> =
        idem.run_giving_up(Call::new("msg:1").scope("queue"), 3, || async { Ok("ran".to_owned()) }).await;
    assert!(matches!(&r, Err(Error::GaveUp { attempts: 3, key, .. }) if key == "queue:msg:1"), "{r:?}");
    // An operator's forget of the key starts it again from the first attempt.
    idem.forget("queue", "msg:1", idempotency::Force::CompletedOnly).await.unwrap();
    let r = deliver(0).await;
    assert_eq!(r, Err(PayError::Declined { reason: "poison".into(), attempt: 1 }));
    let r = deliver(1).await;
    assert_eq!(r, Err(PayError::Declined { reason: "poison".into(), attempt: 2 }), "a new chain, counted again");
    assert_eq!(runs.load(SeqCst), 5);
}

async fn a_retry_that_succeeds_after_failures_is_replayed(backend: Backend) {
    let fx = Fixture::new(backend, 2).await;
    let runs = counter();
    let call = || Call::new("pay:9").fingerprint(&("eur", 100));
    let flaky = |i: usize| {
        let (idem, runs) = (fx.idem(i), runs.clone());
        async move {
            idem.run_giving_up(call(), 5, || async {
                runs.fetch_add(1, SeqCst);
                match attempt() {
                    n @ (1 | 2) => Err(PayError::Declined { reason: "provider down".into(), attempt: n }),
                    n => Ok(format!("paid on attempt {n}")),
                }
            })
            .await
        }
    };
    assert!(matches!(flaky(0).await, Err(PayError::Declined { attempt: 1, .. })));
    assert!(matches!(flaky(1).await, Err(PayError::Declined { attempt: 2, .. })));
    assert_eq!(flaky(0).await.unwrap(), "paid on attempt 3");
    for i in [1, 0] {
        assert_eq!(flaky(i).await.unwrap(), "paid on attempt 3", "a duplicate replays the value");
    }
    assert_eq!(runs.load(SeqCst), 3);
    // A different payload on the key is refused at its first record, as in `run`.
    let idem = fx.idem(1);
    let reused: Result<String, Error> =
        idem.run_giving_up(Call::new("pay:9").fingerprint(&("eur", 999)), 5, || async { Ok("x".into()) }).await;
    assert!(matches!(reused, Err(Error::KeyReused { .. })), "{reused:?}");
    // `on_duplicate = reject` refuses the duplicate of the completed value, not the failures on the way.
    let rejected: Result<String, Error> =
        idem.run_giving_up(call().on_duplicate(OnDuplicate::Reject), 5, || async { Ok("x".into()) }).await;
    assert!(matches!(rejected, Err(Error::Duplicate { replayable: true, ref key }) if key == "pay:9"), "{rejected:?}");
    assert_eq!(runs.load(SeqCst), 3);
}

async fn two_retries_racing_for_the_next_attempt_run_it_once(backend: Backend) {
    let fx = Fixture::new(backend, 2).await;
    let runs = counter();
    let (a, b) = (fx.idem(0), fx.idem(1));
    let first: Result<String, PayError> = a.run_giving_up(Call::new("job:3"), 3, || async { poison(&runs) }).await;
    assert!(matches!(first, Err(PayError::Declined { attempt: 1, .. })));
    // Two retries at once: one takes the second attempt's record, the other finds it in
    // progress (and is told so, by default), and the body runs once.
    let (gate, open) = (Arc::new(tokio::sync::Notify::new()), counter());
    let slow = |idem: Idempotency| {
        let (runs, gate, open) = (runs.clone(), gate.clone(), open.clone());
        async move {
            idem.run_giving_up(Call::new("job:3"), 3, || async move {
                runs.fetch_add(1, SeqCst);
                open.fetch_add(1, SeqCst);
                gate.notified().await;
                Ok::<_, PayError>(format!("done on attempt {}", attempt()))
            })
            .await
        }
    };
    let one = tokio::spawn(slow(a.clone()));
    support::eventually(std::time::Duration::from_secs(10), "the first retry runs", || {
        let open = open.clone();
        async move { (open.load(SeqCst) == 1).then_some(()) }
    })
    .await;
    let other = slow(b.clone()).await;
    assert!(matches!(&other, Err(PayError::Idem(e)) if e.contains("in progress")), "{other:?}");
    gate.notify_one();
    assert_eq!(one.await.unwrap().unwrap(), "done on attempt 2");
    assert_eq!(slow(b).await.unwrap(), "done on attempt 2", "replayed");
    assert_eq!(runs.load(SeqCst), 2, "attempt 1, then attempt 2 once");
}

#[idempotent(key = "webhook:{id}", on_error = give_up_after(2), store = idem)]
async fn on_webhook(idem: &Idempotency, runs: &Arc<AtomicUsize>, id: u32) -> Result<String, PayError> {
    poison(runs)
}

async fn the_attribute_gives_up_with_on_error_give_up_after(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let runs = counter();
    assert!(matches!(on_webhook(&idem, &runs, 5).await, Err(PayError::Declined { attempt: 1, .. })));
    assert!(matches!(on_webhook(&idem, &runs, 5).await, Err(PayError::Declined { attempt: 2, .. })));
    let gave_up = on_webhook(&idem, &runs, 5).await;
    assert!(matches!(&gave_up, Err(PayError::Idem(e)) if e.contains("gave up after 2 failed attempts")), "{gave_up:?}");
    assert_eq!(runs.load(SeqCst), 2);
    // Another key is its own count.
    assert!(matches!(on_webhook(&idem, &runs, 6).await, Err(PayError::Declined { attempt: 1, .. })));
}

async fn give_up_after_refuses_what_it_cannot_count(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let runs = counter();
    let run = |call: Call, n: u32| {
        let (idem, runs) = (idem.clone(), runs.clone());
        async move { idem.run_giving_up(call, n, || async { poison(&runs) }).await }
    };
    for n in [0, idempotency::MAX_ATTEMPTS + 1] {
        let r = run(Call::new("k"), n).await;
        assert!(matches!(&r, Err(PayError::Idem(e)) if e.contains("the attempts must be 1 to 1000")), "{r:?}");
    }
    // A count is kept for `keep`: a keep of zero keeps none.
    let r = run(Call::new("k").keep(std::time::Duration::ZERO), 3).await;
    assert!(matches!(&r, Err(PayError::Idem(e)) if e.contains("a keep of zero keeps nothing")), "{r:?}");
    // A store that does not keep attempts (one of the user's own, wrapping ours) is refused, not
    // silently uncounted.
    let plain = Idempotency::new(Forwarding(fx.store(0)));
    let r: Result<String, PayError> = plain.run_giving_up(Call::new("k"), 3, || async { poison(&runs) }).await;
    assert!(matches!(&r, Err(PayError::Idem(e)) if e.contains("needs a store that keeps attempts")), "{r:?}");
    assert_eq!(runs.load(SeqCst), 0, "nothing refused ran");
    // Token mode: a token's failures are counted for as long as its record is kept (the token's
    // life); the longest key counts as any.
    let token = idem.issue_token(std::time::Duration::from_secs(60)).unwrap();
    for n in 1..=2 {
        let r = run(Call::token(token.clone()), 2).await;
        assert!(matches!(r, Err(PayError::Declined { attempt, .. }) if attempt == n), "{r:?}");
    }
    let r = run(Call::token(token), 2).await;
    assert!(matches!(&r, Err(PayError::Idem(e)) if e.contains("gave up after 2")), "{r:?}");
    let long = "k".repeat(idempotency::MAX_KEY_BYTES);
    let r = run(Call::new(long), 3).await;
    assert!(matches!(r, Err(PayError::Declined { attempt: 1, .. })), "{r:?}");
    assert_eq!(runs.load(SeqCst), 3);
}

/// A store of the user's own that forwards the four transitions to another and keeps none of
/// the rest (`Store::keeps_attempts` says no).
struct Forwarding(Arc<dyn idempotency::Store>);

impl idempotency::Store for Forwarding {
    fn acquire<'a>(
        &'a self,
        r: idempotency::store::AcquireRequest<'a>,
    ) -> idempotency::store::StoreFuture<'a, Result<idempotency::store::AcquireOutcome, idempotency::StoreError>> {
        self.0.acquire(r)
    }
    fn renew<'a>(
        &'a self,
        leases: &'a [idempotency::store::Lease<'a>],
    ) -> idempotency::store::StoreFuture<'a, Result<Vec<bool>, idempotency::StoreError>> {
        self.0.renew(leases)
    }
    fn commit<'a>(
        &'a self,
        r: idempotency::store::CommitRequest<'a>,
    ) -> idempotency::store::StoreFuture<'a, Result<idempotency::store::Transition, idempotency::StoreError>> {
        self.0.commit(r)
    }
    fn release<'a>(
        &'a self,
        key: &'a str,
        owner: &'a str,
    ) -> idempotency::store::StoreFuture<'a, Result<idempotency::store::Transition, idempotency::StoreError>> {
        self.0.release(key, owner)
    }
    fn watch<'a>(
        &'a self,
        key: &'a str,
    ) -> idempotency::store::StoreFuture<'a, Result<idempotency::store::Watcher, idempotency::StoreError>> {
        self.0.watch(key)
    }
}
