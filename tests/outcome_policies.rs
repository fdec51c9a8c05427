//! Outcome policies (issue 26): `on_error = store` keeps a body's `Err` and replays it, through the
//! function API and the attribute, on every store; the default releases the key and a retry
//! runs.

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
