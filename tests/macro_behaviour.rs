//! The `#[idempotent]` attribute's behaviour, run unchanged on `MemoryStore` and on `RedisStore`
//! against a real `redis-server` each test starts for itself. Each annotated function points at
//! the test's own runtime with `store = ...`, and counts its body's runs.

#[macro_use]
mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use idempotency::{idempotent, Error, Idempotency};
use serde::{Deserialize, Serialize};
use support::{ms, AppError, Backend, Fixture, R};

/// One `Ok(1)` and one `Conflict`, in either order: two calls at once, one ran.
fn one_ran_one_conflicted(x: R<usize>, y: R<usize>) {
    let conflict = |r: &R<usize>| matches!(r, Err(AppError::Idem(Error::Conflict { .. })));
    match (&x, &y) {
        (Ok(1), other) | (other, Ok(1)) if conflict(other) => {}
        _ => panic!("expected one run and one conflict, got {x:?} and {y:?}"),
    }
}

/// Counts a body run and returns the new count.
fn ran(runs: &AtomicUsize) -> usize {
    runs.fetch_add(1, SeqCst) + 1
}

both_stores!(
    duplicate_call_replays_the_result,
    reject_policy_gives_duplicate,
    error_releases_the_key,
    token_mode_runs_each_token_once,
    concurrent_call_conflicts,
    waiting_call_gets_the_holders_result,
    same_template_on_two_functions_does_not_collide,
    explicit_scope_shares_keys,
    unit_and_falsy_results_replay_as_themselves,
    methods_on_self,
    nested_fields_and_references_in_the_key,
    arguments_named_like_the_expansion,
    key_is_taken_before_the_body_runs,
    fingerprint_refuses_a_reused_key,
    generic_function,
    keep_zero_makes_a_mutex,
    renamed_crate_path,
);

#[idempotent(key = "charge:{order}", store = idem)]
async fn charge(idem: &Idempotency, runs: &AtomicUsize, order: u32) -> R<String> {
    Ok(format!("receipt #{} for order {order}", ran(runs)))
}

async fn duplicate_call_replays_the_result(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let runs = AtomicUsize::new(0);
    let first = charge(&idem, &runs, 1).await.unwrap();
    let again = charge(&idem, &runs, 1).await.unwrap();
    assert_eq!(first, "receipt #1 for order 1");
    assert_eq!(again, first, "the duplicate was not replayed");
    assert_eq!(charge(&idem, &runs, 2).await.unwrap(), "receipt #2 for order 2", "another key must run");
    assert_eq!(runs.load(SeqCst), 2);
}

#[idempotent(key = "{id}", on_duplicate = reject, store = idem)]
async fn accept_once(idem: &Idempotency, runs: &AtomicUsize, id: u32) -> R<u32> {
    ran(runs);
    Ok(id)
}

async fn reject_policy_gives_duplicate(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let runs = AtomicUsize::new(0);
    assert_eq!(accept_once(&idem, &runs, 5).await.unwrap(), 5);
    let again = accept_once(&idem, &runs, 5).await;
    match again {
        Err(AppError::Idem(Error::Duplicate { key, replayable: true })) => {
            assert_eq!(key, format!("{}::accept_once:5", module_path!()), "the key is scoped by the function");
        }
        other => panic!("expected Duplicate, got {other:?}"),
    }
    assert_eq!(runs.load(SeqCst), 1);
}

#[idempotent(key = "{id}", store = idem)]
async fn flaky(idem: &Idempotency, runs: &AtomicUsize, fail: &AtomicBool, id: u32) -> R<usize> {
    let n = ran(runs);
    if fail.load(SeqCst) {
        return Err(AppError::Failed("provider down"));
    }
    Ok(n)
}

async fn error_releases_the_key(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let (runs, fail) = (AtomicUsize::new(0), AtomicBool::new(true));
    assert!(matches!(flaky(&idem, &runs, &fail, 1).await, Err(AppError::Failed("provider down"))));
    fail.store(false, SeqCst);
    assert_eq!(flaky(&idem, &runs, &fail, 1).await.unwrap(), 2, "the retry after an error did not run");
    assert_eq!(flaky(&idem, &runs, &fail, 1).await.unwrap(), 2, "the success was not kept");
    assert_eq!(runs.load(SeqCst), 2);
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct NewOrder {
    item: String,
    qty: u32,
}

#[idempotent(mode = Token, key = "{token}", store = idem)]
async fn submit(idem: &Idempotency, runs: &AtomicUsize, token: &str, order: &NewOrder, fail: bool) -> R<String> {
    let n = ran(runs);
    if fail {
        return Err(AppError::Failed("out of stock"));
    }
    Ok(format!("order #{n}: {} x {}", order.qty, order.item))
}

async fn token_mode_runs_each_token_once(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let runs = AtomicUsize::new(0);
    let order = NewOrder { item: "book".into(), qty: 2 };

    let unknown = submit(&idem, &runs, "never-issued", &order, false).await;
    assert!(matches!(unknown, Err(AppError::Idem(Error::InvalidToken { .. }))), "{unknown:?}");
    assert_eq!(runs.load(SeqCst), 0, "an unknown token ran the body");

    let token = idem.issue_token(Duration::from_secs(60)).unwrap();
    let failed = submit(&idem, &runs, &token, &order, true).await;
    assert!(matches!(failed, Err(AppError::Failed(_))), "{failed:?}");
    let first = submit(&idem, &runs, &token, &order, false).await.unwrap();
    assert_eq!(first, "order #2: 2 x book", "the token was not usable after a failed attempt");
    let again = submit(&idem, &runs, &token, &order, false).await.unwrap();
    assert_eq!(again, first, "the second submit was not replayed");
    assert_eq!(runs.load(SeqCst), 2);
}

#[idempotent(key = "{id}", store = idem)]
async fn slow(idem: &Idempotency, runs: &AtomicUsize, id: u32) -> R<usize> {
    let n = ran(runs);
    tokio::time::sleep(ms(300)).await;
    Ok(n)
}

async fn concurrent_call_conflicts(backend: Backend) {
    let fx = Fixture::new(backend, 2).await;
    let (a, b) = (fx.idem(0), fx.idem(1));
    let runs = AtomicUsize::new(0);
    let (x, y) = tokio::join!(slow(&a, &runs, 1), async {
        tokio::time::sleep(ms(50)).await;
        slow(&b, &runs, 1).await
    });
    one_ran_one_conflicted(x, y);
    assert_eq!(runs.load(SeqCst), 1);
}

#[idempotent(key = "{id}", on_conflict = wait("5s"), store = idem)]
async fn slow_waiting(idem: &Idempotency, runs: &AtomicUsize, id: u32) -> R<usize> {
    let n = ran(runs);
    tokio::time::sleep(ms(300)).await;
    Ok(n)
}

async fn waiting_call_gets_the_holders_result(backend: Backend) {
    let fx = Fixture::new(backend, 2).await;
    let (a, b) = (fx.idem(0), fx.idem(1));
    let runs = AtomicUsize::new(0);
    let (x, y) = tokio::join!(slow_waiting(&a, &runs, 1), async {
        tokio::time::sleep(ms(50)).await;
        slow_waiting(&b, &runs, 1).await
    });
    assert_eq!(x.unwrap(), 1);
    assert_eq!(y.unwrap(), 1, "the waiter did not get the holder's result");
    assert_eq!(runs.load(SeqCst), 1);
}

#[idempotent(key = "{id}", store = idem)]
async fn create_invoice(idem: &Idempotency, runs: &AtomicUsize, id: u32) -> R<String> {
    ran(runs);
    Ok(format!("invoice {id}"))
}

#[idempotent(key = "{id}", store = idem)]
async fn send_email(idem: &Idempotency, runs: &AtomicUsize, id: u32) -> R<String> {
    ran(runs);
    Ok(format!("email {id}"))
}

async fn same_template_on_two_functions_does_not_collide(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let runs = AtomicUsize::new(0);
    assert_eq!(create_invoice(&idem, &runs, 7).await.unwrap(), "invoice 7");
    assert_eq!(send_email(&idem, &runs, 7).await.unwrap(), "email 7", "the second function got the first's result");
    assert_eq!(create_invoice(&idem, &runs, 7).await.unwrap(), "invoice 7");
    assert_eq!(send_email(&idem, &runs, 7).await.unwrap(), "email 7");
    assert_eq!(runs.load(SeqCst), 2);
}

#[idempotent(key = "{id}", scope = "shared-checkout", store = idem)]
async fn checkout_web(idem: &Idempotency, runs: &AtomicUsize, id: u32) -> R<String> {
    ran(runs);
    Ok(format!("checkout {id} from web"))
}

#[idempotent(key = "{id}", scope = "shared-checkout", store = idem)]
async fn checkout_app(idem: &Idempotency, runs: &AtomicUsize, id: u32) -> R<String> {
    ran(runs);
    Ok(format!("checkout {id} from app"))
}

async fn explicit_scope_shares_keys(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let runs = AtomicUsize::new(0);
    assert_eq!(checkout_web(&idem, &runs, 3).await.unwrap(), "checkout 3 from web");
    assert_eq!(checkout_app(&idem, &runs, 3).await.unwrap(), "checkout 3 from web", "the scope was not shared");
    assert_eq!(runs.load(SeqCst), 1);
}

#[idempotent(key = "unit", store = idem)]
async fn unit(idem: &Idempotency, runs: &AtomicUsize) -> R<()> {
    ran(runs);
    Ok(())
}

#[idempotent(key = "zero", store = idem)]
async fn zero(idem: &Idempotency, runs: &AtomicUsize) -> R<i64> {
    ran(runs);
    Ok(0)
}

#[idempotent(key = "no", store = idem)]
async fn no(idem: &Idempotency, runs: &AtomicUsize) -> R<bool> {
    ran(runs);
    Ok(false)
}

#[idempotent(key = "empty", store = idem)]
async fn empty(idem: &Idempotency, runs: &AtomicUsize) -> R<(String, Option<u8>, Vec<u8>)> {
    ran(runs);
    Ok((String::new(), None, Vec::new()))
}

async fn unit_and_falsy_results_replay_as_themselves(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let runs = AtomicUsize::new(0);
    for _ in 0..2 {
        unit(&idem, &runs).await.unwrap();
        assert_eq!(zero(&idem, &runs).await.unwrap(), 0);
        assert!(!no(&idem, &runs).await.unwrap());
        assert_eq!(empty(&idem, &runs).await.unwrap(), (String::new(), None, Vec::new()));
    }
    assert_eq!(runs.load(SeqCst), 4, "a falsy result was taken for no result and ran again");
}

struct Ledger {
    idem: Idempotency,
    name: String,
    runs: AtomicUsize,
    entries: Vec<String>,
}

impl Ledger {
    #[idempotent(key = "{self.name}:{entry}", store = self.idem)]
    async fn record(&self, entry: u32) -> R<usize> {
        Ok(ran(&self.runs))
    }

    /// `&mut self`: the store is cloned out of `self`, so that the body can borrow `self` mutably.
    #[idempotent(key = "{self.name}:{entry}", store = self.idem.clone())]
    async fn append(&mut self, entry: String) -> R<usize> {
        ran(&self.runs);
        self.entries.push(entry);
        Ok(self.entries.len())
    }
}

async fn methods_on_self(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let mut ledger = Ledger { idem: fx.idem(0), name: "main".into(), runs: AtomicUsize::new(0), entries: Vec::new() };
    assert_eq!(ledger.record(1).await.unwrap(), 1);
    assert_eq!(ledger.record(1).await.unwrap(), 1);
    assert_eq!(ledger.record(2).await.unwrap(), 2);
    assert_eq!(ledger.append("a".into()).await.unwrap(), 1);
    assert_eq!(ledger.append("a".into()).await.unwrap(), 1);
    assert_eq!(ledger.entries, ["a"], "the &mut self body ran twice");
    let other = Ledger { name: "other".into(), ..ledger };
    assert_eq!(other.record(1).await.unwrap(), 4, "`{{self.name}}` was not part of the key");
    assert_eq!(other.runs.load(SeqCst), 4);
}

struct Customer {
    id: u64,
    region: &'static str,
}

struct Order {
    customer: Customer,
    lines: (u32, u32),
}

#[idempotent(key = "{order.customer.region}/{order.customer.id}/{order.lines.0}-{{{n}}}", store = idem)]
async fn ship(idem: &Idempotency, runs: &AtomicUsize, order: &Order, n: &&u8) -> R<String> {
    ran(runs);
    Ok(idempotency::CallContext::current().unwrap().key().to_owned())
}

async fn nested_fields_and_references_in_the_key(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let runs = AtomicUsize::new(0);
    let order = Order { customer: Customer { id: 42, region: "eu" }, lines: (3, 9) };
    let key = ship(&idem, &runs, &order, &&7).await.unwrap();
    assert_eq!(key, format!("{}::ship:eu/42/3-{{7}}", module_path!()));
    let other = Order { customer: Customer { id: 42, region: "eu" }, lines: (3, 10) };
    assert_eq!(ship(&idem, &runs, &other, &&7).await.unwrap(), key, "`lines.1` is not in the key");
    assert_eq!(runs.load(SeqCst), 1);
}

/// Arguments named like things an expansion could use.
#[idempotent(key = "{key}:{store}:{result}:{call}:{body}", store = idem)]
async fn clashing_names(
    idem: &Idempotency,
    runs: &AtomicUsize,
    key: String,
    store: u32,
    result: bool,
    call: &str,
    body: char,
) -> R<String> {
    ran(runs);
    Ok(format!("{key}/{store}/{result}/{call}/{body}"))
}

async fn arguments_named_like_the_expansion(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let runs = AtomicUsize::new(0);
    let got = clashing_names(&idem, &runs, "k".into(), 1, true, "c", 'b').await.unwrap();
    assert_eq!(got, "k/1/true/c/b");
    let again = clashing_names(&idem, &runs, "k".into(), 1, true, "c", 'b').await.unwrap();
    assert_eq!(again, got);
    clashing_names(&idem, &runs, "k".into(), 2, true, "c", 'b').await.unwrap();
    assert_eq!(runs.load(SeqCst), 2);
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    id: u32,
    attempts: u32,
}

#[idempotent(key = "job:{job.id}", store = idem)]
async fn bump(idem: &Idempotency, runs: &AtomicUsize, mut job: Job) -> R<Job> {
    ran(runs);
    job.id += 100; // does not change the key: it was taken before the body ran
    job.attempts += 1;
    Ok(job)
}

async fn key_is_taken_before_the_body_runs(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let runs = AtomicUsize::new(0);
    let done = bump(&idem, &runs, Job { id: 1, attempts: 0 }).await.unwrap();
    assert_eq!((done.id, done.attempts), (101, 1));
    let again = bump(&idem, &runs, Job { id: 1, attempts: 0 }).await.unwrap();
    assert_eq!(again.id, 101, "job 1 was not replayed");
    assert_eq!(runs.load(SeqCst), 1);
    // Had the key been taken after the body, "job:101" would be completed and replay.
    let other = bump(&idem, &runs, Job { id: 101, attempts: 0 }).await.unwrap();
    assert_eq!(other.id, 201);
    assert_eq!(runs.load(SeqCst), 2);
}

#[idempotent(key = "{id}", fingerprint = (id, amount), store = idem)]
async fn refund(idem: &Idempotency, runs: &AtomicUsize, id: u32, amount: u64) -> R<u64> {
    ran(runs);
    Ok(amount)
}

async fn fingerprint_refuses_a_reused_key(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let runs = AtomicUsize::new(0);
    assert_eq!(refund(&idem, &runs, 1, 500).await.unwrap(), 500);
    assert_eq!(refund(&idem, &runs, 1, 500).await.unwrap(), 500);
    let reused = refund(&idem, &runs, 1, 900).await;
    assert!(matches!(reused, Err(AppError::Idem(Error::KeyReused { .. }))), "{reused:?}");
    assert_eq!(runs.load(SeqCst), 1);
}

#[idempotent(key = "{item}", store = idem)]
async fn remember<T>(idem: &Idempotency, runs: &AtomicUsize, item: T) -> R<T>
where
    T: std::fmt::Display + Serialize + serde::de::DeserializeOwned,
{
    ran(runs);
    Ok(item)
}

async fn generic_function(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let runs = AtomicUsize::new(0);
    assert_eq!(remember(&idem, &runs, 5u32).await.unwrap(), 5);
    assert_eq!(remember(&idem, &runs, 5u32).await.unwrap(), 5);
    assert_eq!(remember(&idem, &runs, String::from("x")).await.unwrap(), "x");
    assert_eq!(remember(&idem, &runs, String::from("x")).await.unwrap(), "x");
    // Every instantiation shares the function's key space: "5" is the key `5u32` completed.
    let shared = remember(&idem, &runs, String::from("5")).await;
    assert!(matches!(shared, Err(AppError::Idem(Error::Codec { .. }))), "{shared:?}");
    assert_eq!(runs.load(SeqCst), 2);
}

#[idempotent(key = "nightly", ttl = "2s", keep = "0s", store = idem)]
async fn nightly(idem: &Idempotency, runs: &AtomicUsize) -> R<usize> {
    let n = ran(runs);
    tokio::time::sleep(ms(200)).await;
    Ok(n)
}

async fn keep_zero_makes_a_mutex(backend: Backend) {
    let fx = Fixture::new(backend, 2).await;
    let (a, b) = (fx.idem(0), fx.idem(1));
    let runs = AtomicUsize::new(0);
    let (x, y) = tokio::join!(nightly(&a, &runs), async {
        tokio::time::sleep(ms(50)).await;
        nightly(&b, &runs).await
    });
    one_ran_one_conflicted(x, y);
    assert_eq!(nightly(&b, &runs).await.unwrap(), 2, "keep = 0s kept the result");
}

mod renamed {
    pub use idempotency as idem_lib;
}

#[idempotent(key = "{id}", crate = renamed::idem_lib, store = idem)]
async fn through_renamed_crate(idem: &Idempotency, runs: &AtomicUsize, id: u8) -> R<u8> {
    ran(runs);
    Ok(id)
}

async fn renamed_crate_path(backend: Backend) {
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let runs = AtomicUsize::new(0);
    assert_eq!(through_renamed_crate(&idem, &runs, 9).await.unwrap(), 9);
    assert_eq!(through_renamed_crate(&idem, &runs, 9).await.unwrap(), 9);
    assert_eq!(runs.load(SeqCst), 1);
}

/// The attribute refuses a `ttl` under 10 ms at compile time (tests/ui/fail/ttl_too_short.rs);
/// that must stay the runtime's own minimum.
#[test]
fn the_attribute_uses_the_runtimes_minimum_lease() {
    assert_eq!(idempotency::MIN_LEASE, Duration::from_millis(10));
}
