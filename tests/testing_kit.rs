//! The test kit (`idempotency::testing`) on functions: a correct one passes every scenario, and
//! each scenario catches the defect it is there for (a hand-rolled check-then-set, a missing
//! fingerprint, a body dropped with its caller, a failure that is kept, an outage that runs the
//! body twice), through the function API, the attribute and the global runtime.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotency::testing::{function, pass_through, Kit, Scenario, Verdict};
use idempotency::{idempotent, Call, Error, Idempotency};

/// A payment provider stub: counts charges, declines the next one when told.
#[derive(Clone, Default)]
struct Provider {
    charges: Arc<AtomicUsize>,
    decline_next: Arc<AtomicBool>,
}

impl Provider {
    async fn charge(&self, amount: u64) -> Result<String, Error> {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if self.decline_next.swap(false, SeqCst) {
            return Err(Error::InvalidCall { key: "provider".into(), reason: "declined".into() });
        }
        let n = self.charges.fetch_add(1, SeqCst) + 1;
        // The provider's answer takes a while after the charge is made.
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok(format!("charge #{n}: {amount}"))
    }

    fn charges(&self) -> impl Fn() -> usize {
        let charges = self.charges.clone();
        move || charges.load(SeqCst)
    }

    fn fail_next(&self) -> Option<impl Fn()> {
        let decline = self.decline_next.clone();
        Some(move || decline.store(true, SeqCst))
    }
}

/// How a charge runs through the runtime.
#[derive(Clone, Copy, PartialEq)]
enum Run {
    /// `run_to_completion`: the body finishes when its caller goes away.
    ToCompletion,
    /// `run`: the body is dropped with its caller.
    WithCaller,
}

type Charging = Pin<Box<dyn Future<Output = Result<String, Error>>>>;

/// A charge of `amount` through `idem` under `key`, the amount fingerprinted when `fingerprint`.
fn charger(
    idem: Idempotency,
    provider: &Provider,
    key: &'static str,
    run: Run,
    fingerprint: bool,
) -> impl Fn(u64) -> Charging {
    let provider = provider.clone();
    move |amount| {
        let (idem, p) = (idem.clone(), provider.clone());
        let call = if fingerprint { Call::new(key).fingerprint(&amount) } else { Call::new(key) };
        Box::pin(async move {
            let body = move || async move { p.charge(amount).await };
            match run {
                Run::ToCompletion => idem.run_to_completion(call, body).await,
                Run::WithCaller => idem.run(call, body).await,
            }
        })
    }
}

fn verdict(report: &idempotency::testing::Report, scenario: Scenario) -> &Verdict {
    &report.outcome(scenario).expect("every scenario reported").verdict
}

/// The charge done right: a fingerprint, and the body finished when its caller goes away.
#[tokio::test]
async fn a_correct_function_passes_every_scenario() {
    let kit = Kit::new();
    let provider = Provider::default();
    let charge = charger(kit.idempotency(), &provider, "charge:order-1", Run::ToCompletion, true);
    let report =
        kit.check_failing(function(charge, 100).other_payload(250), provider.charges(), provider.fail_next()).await;
    println!("{report}");
    report.assert_passed();
    for scenario in Scenario::ALL {
        assert_eq!(verdict(&report, scenario), &Verdict::Passed, "{report}");
    }
    assert_eq!(report.outcome(Scenario::ConcurrentDuplicates).unwrap().effects, 1);
}

/// A hand-rolled "have we seen it?" check before the work, the way a handler without the
/// library does it: concurrent duplicates both pass the check.
#[tokio::test]
async fn a_hand_rolled_check_then_set_fails_concurrent_duplicates() {
    let kit = Kit::new();
    let provider = Provider::default();
    let seen: Arc<Mutex<HashSet<u64>>> = Arc::default();
    let p = provider.clone();
    let charge = move |amount: u64| {
        let (seen, p) = (seen.clone(), p.clone());
        async move {
            if seen.lock().unwrap().contains(&amount) {
                return Ok::<_, Error>("already charged".to_owned());
            }
            let receipt = p.charge(amount).await?;
            seen.lock().unwrap().insert(amount);
            Ok(receipt)
        }
    };
    let report = kit.check(function(charge, 100), provider.charges()).await;
    println!("{report}");
    assert!(!report.passed());
    let concurrent = report.outcome(Scenario::ConcurrentDuplicates).unwrap();
    assert!(matches!(concurrent.verdict, Verdict::Failed(_)), "{report}");
    assert_eq!(concurrent.effects, 20, "{report}");
}

/// Without a fingerprint, the same key with another amount is answered with the first
/// amount's receipt instead of being refused.
#[tokio::test]
async fn without_a_fingerprint_another_payload_is_not_refused() {
    let kit = Kit::new();
    let provider = Provider::default();
    let charge = charger(kit.idempotency(), &provider, "charge:order-2", Run::ToCompletion, false);
    let report = kit.check(function(charge, 100).other_payload(250), provider.charges()).await;
    println!("{report}");
    let Verdict::Failed(why) = verdict(&report, Scenario::OtherPayload) else { panic!("{report}") };
    assert!(why.contains("the other payload was answered \"charge #"), "{why}");
    assert_eq!(verdict(&report, Scenario::ConcurrentDuplicates), &Verdict::Passed);
    assert_eq!(
        verdict(&report, Scenario::FailureThenRetry),
        &Verdict::Skipped("no way to make a body fail given (`fail_next`)".into())
    );
}

/// `run` drops the body with its caller (and releases the key): a caller cancelled after the
/// charge and before the commit leaves the charge made and the key free, and the retry charges
/// again. `run_to_completion` passes the same scenario (above).
#[tokio::test]
async fn a_body_dropped_with_its_caller_fails_the_cancelled_caller_scenario() {
    let kit = Kit::new();
    let provider = Provider::default();
    let charge = charger(kit.idempotency(), &provider, "charge:order-3", Run::WithCaller, true);
    let report =
        kit.check_failing(function(charge, 100).other_payload(250), provider.charges(), provider.fail_next()).await;
    println!("{report}");
    let cancelled = report.outcome(Scenario::CancelledCaller).unwrap();
    let Verdict::Failed(why) = &cancelled.verdict else { panic!("{report}") };
    assert!(why.contains("on_cancel = finish"), "{why}");
    assert_eq!(cancelled.effects, 2, "{report}");
    for scenario in
        [Scenario::ConcurrentDuplicates, Scenario::AfterCompletion, Scenario::OtherPayload, Scenario::FailureThenRetry]
    {
        assert_eq!(verdict(&report, scenario), &Verdict::Passed, "{report}");
    }
}

/// A failure kept as the answer: a body that catches the provider's decline and returns it as
/// its `Ok` stores the decline, and the retry is answered with it instead of running.
#[tokio::test]
async fn a_failure_stored_as_the_answer_fails_the_retry_scenario() {
    let kit = Kit::new();
    let provider = Provider::default();
    let (idem, p) = (kit.idempotency(), provider.clone());
    let charge = move |amount: u64| {
        let (idem, p) = (idem.clone(), p.clone());
        async move {
            let call = Call::new("charge:order-4").fingerprint(&amount);
            let stored: Result<Result<String, String>, Error> = idem
                .run_to_completion(call, move || async move { Ok(p.charge(amount).await.map_err(|e| e.to_string())) })
                .await;
            match stored {
                Ok(Ok(receipt)) => Ok(receipt),
                Ok(Err(declined)) => Err(declined),
                Err(e) => Err(e.to_string()),
            }
        }
    };
    let report = kit.check_failing(function(charge, 100), provider.charges(), provider.fail_next()).await;
    println!("{report}");
    let Verdict::Failed(why) = verdict(&report, Scenario::FailureThenRetry) else { panic!("{report}") };
    assert!(why.contains("the retry was answered failed"), "{why}");
}

/// A store that cannot be reached must refuse the duplicate, not run it: a function that falls
/// back to running the body unguarded when the store fails charges twice.
#[tokio::test]
async fn running_unguarded_when_the_store_fails_fails_the_store_away_scenario() {
    let kit = Kit::new();
    let provider = Provider::default();
    let (idem, p) = (kit.idempotency(), provider.clone());
    let charge = move |amount: u64| {
        let (idem, p) = (idem.clone(), p.clone());
        async move {
            let call = Call::new("charge:order-5").fingerprint(&amount);
            let q = p.clone();
            match idem.run_to_completion(call, move || async move { q.charge(amount).await }).await {
                Err(Error::Store { .. }) => p.charge(amount).await,
                other => other,
            }
        }
    };
    let report = kit.check(function(charge, 100), provider.charges()).await;
    println!("{report}");
    let away = report.outcome(Scenario::StoreAway).unwrap();
    assert!(matches!(away.verdict, Verdict::Failed(_)), "{report}");
    assert_eq!(away.effects, 2, "{report}");
    assert_eq!(verdict(&report, Scenario::ConcurrentDuplicates), &Verdict::Passed);
}

#[idempotent(key = "order:{order}", fingerprint = amount, on_cancel = finish, store = idem)]
async fn place_order(idem: Idempotency, provider: Provider, order: u32, amount: u64) -> Result<String, Error> {
    provider.charge(amount).await
}

/// The attribute, with the kit's runtime passed in (`store = idem`).
#[tokio::test]
async fn a_function_with_the_attribute_passes_every_scenario() {
    let kit = Kit::new().duplicates(50);
    let provider = Provider::default();
    let (idem, p) = (kit.idempotency(), provider.clone());
    let place = move |amount: u64| place_order(idem.clone(), p.clone(), 9, amount);
    let report = kit
        .check_failing(
            function(place, 100).other_payload(101).named("place_order"),
            provider.charges(),
            provider.fail_next(),
        )
        .await;
    println!("{report}");
    report.assert_passed();
    assert!(report.to_string().contains("place_order"));
    assert!(report.outcomes.iter().all(|o| o.verdict == Verdict::Passed), "{report}");
}

#[idempotent(key = "refund:{order}", on_cancel = finish)]
async fn refund(provider: Provider, order: u32) -> Result<String, Error> {
    provider.charge(1).await
}

/// The attribute on the global runtime: the kit installs its own.
#[tokio::test]
async fn a_function_on_the_global_runtime_passes_every_scenario() {
    let kit = Kit::new();
    kit.install_global().expect("the only test here that sets the global runtime");
    kit.install_global().expect("installing the same kit again is fine");
    assert!(Kit::new().install_global().is_err(), "another kit's runtime is refused");
    let provider = Provider::default();
    let p = provider.clone();
    let report = kit
        .check_failing(function(move |order| refund(p.clone(), order), 3), provider.charges(), provider.fail_next())
        .await;
    println!("{report}");
    report.assert_passed();
}

/// The pass-through runtime runs every body: the kit says it guards nothing.
#[tokio::test]
async fn the_pass_through_runtime_runs_every_duplicate() {
    let kit = Kit::new().duplicates(5);
    let provider = Provider::default();
    let charge = charger(pass_through(), &provider, "k", Run::WithCaller, true);
    let report = kit.check(function(charge, 7), provider.charges()).await;
    println!("{report}");
    assert_eq!(report.outcome(Scenario::ConcurrentDuplicates).unwrap().effects, 5, "{report}");
    assert!(!report.passed());
}

/// `assert_passed` panics with the report.
#[tokio::test]
#[should_panic(expected = "caller cancelled mid-call")]
async fn assert_passed_panics_with_the_report() {
    let kit = Kit::new();
    let provider = Provider::default();
    let charge = charger(kit.idempotency(), &provider, "k", Run::WithCaller, false);
    kit.check(function(charge, 1), provider.charges()).await.assert_passed();
}
