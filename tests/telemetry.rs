//! What a call leaves for the people running it, seen through a capturing `tracing` layer and
//! `metrics-util`'s debugging recorder: every outcome as its span's `outcome` field and as
//! `idempotency_calls_total{outcome, scope}`, on the in-memory store and on a real
//! `redis-server`; the transitions as DEBUG events, the failures as WARN; the histograms and
//! gauges; the HTTP layer's span nested under the request's; keys redacted unless turned on.
//!
//! The subscriber and the recorder are process-wide and the recorder's snapshot drains what it
//! read, so the tests of this binary take turns ([`turn`]); each runs in a scope of its own.

#[macro_use]
mod support;

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use idempotency::store::Resolved;
use idempotency::telemetry::{self, CallOutcome};
use idempotency::{
    Call, CallContext, Error, Force, Idempotency, OnConflict, OnCrash, OnDuplicate, RedisStore, Resolve,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use support::{counter, eventually, ms, AppError, Backend, Fixture, R};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

both_stores!(every_outcome_has_its_span_and_counter, transitions_are_events_and_metrics, waits_are_told);

/// A closed span as captured: its name, level, fields, and its parent's name.
#[derive(Debug, Clone)]
struct SpanRec {
    name: &'static str,
    level: tracing::Level,
    fields: BTreeMap<String, String>,
    parent: Option<&'static str>,
}

/// An event as captured: its level, message and fields, and the fields of the call span it
/// happened in, if any.
#[derive(Debug, Clone)]
struct EventRec {
    level: tracing::Level,
    fields: BTreeMap<String, String>,
    call: Option<BTreeMap<String, String>>,
}

#[derive(Default)]
struct Captured {
    spans: Vec<SpanRec>,
    events: Vec<EventRec>,
    /// Every field value written, spans and events alike: what a log would show.
    text: String,
}

fn captured() -> &'static Mutex<Captured> {
    static C: OnceLock<Mutex<Captured>> = OnceLock::new();
    C.get_or_init(Default::default)
}

struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

fn text_of(fields: &BTreeMap<String, String>) -> String {
    fields.iter().map(|(k, v)| format!("{k}={v} ")).collect()
}

/// Captures every span and event, at every level.
struct Capture;

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields(BTreeMap::new());
        attrs.record(&mut fields);
        captured().lock().unwrap().text.push_str(&text_of(&fields.0));
        ctx.span(id).unwrap().extensions_mut().insert(fields);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let span = ctx.span(id).unwrap();
        let mut ext = span.extensions_mut();
        let fields = ext.get_mut::<Fields>().unwrap();
        let mut new = Fields(BTreeMap::new());
        values.record(&mut new);
        captured().lock().unwrap().text.push_str(&text_of(&new.0));
        fields.0.extend(new.0);
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields(BTreeMap::new());
        event.record(&mut fields);
        let call = ctx.event_scope(event).and_then(|scope| {
            scope
                .into_iter()
                .find(|s| s.name() == "idempotent.call")
                .map(|s| s.extensions().get::<Fields>().unwrap().0.clone())
        });
        let mut c = captured().lock().unwrap();
        c.text.push_str(&text_of(&fields.0));
        c.events.push(EventRec { level: *event.metadata().level(), fields: fields.0, call });
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let span = ctx.span(&id).unwrap();
        let fields = span.extensions().get::<Fields>().map(|f| f.0.clone()).unwrap_or_default();
        let rec = SpanRec {
            name: span.name(),
            level: *span.metadata().level(),
            fields,
            parent: span.parent().map(|p| p.name()),
        };
        captured().lock().unwrap().spans.push(rec);
    }
}

/// The recorder's snapshotter, the recorder and the subscriber installed once per process.
fn snapshotter() -> &'static Snapshotter {
    static S: OnceLock<Snapshotter> = OnceLock::new();
    S.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().expect("the only recorder");
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Capture))
            .expect("the only subscriber");
        snapshotter
    })
}

/// The metrics recorded since the last look (the snapshot drains them): (name, labels) to value.
struct Metrics(Vec<(String, BTreeMap<String, String>, DebugValue)>);

fn metrics() -> Metrics {
    let rows = snapshotter().snapshot().into_vec();
    Metrics(
        rows.into_iter()
            .map(|(ck, _, _, v)| {
                let key = ck.key();
                let labels = key.labels().map(|l| (l.key().to_owned(), l.value().to_owned())).collect();
                (key.name().to_owned(), labels, v)
            })
            .collect(),
    )
}

impl Metrics {
    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.0
            .iter()
            .filter(|(n, l, _)| n == name && labels.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v)))
            .map(|(_, _, v)| match v {
                DebugValue::Counter(n) => *n,
                other => panic!("{name} is not a counter: {other:?}"),
            })
            .sum()
    }

    fn gauge(&self, name: &str) -> f64 {
        self.0
            .iter()
            .filter(|(n, _, _)| n == name)
            .map(|(_, _, v)| match v {
                DebugValue::Gauge(g) => g.into_inner(),
                other => panic!("{name} is not a gauge: {other:?}"),
            })
            .sum()
    }

    fn histogram(&self, name: &str) -> usize {
        self.0
            .iter()
            .filter(|(n, _, _)| n == name)
            .map(|(_, _, v)| match v {
                DebugValue::Histogram(values) => values.len(),
                other => panic!("{name} is not a histogram: {other:?}"),
            })
            .sum()
    }

    /// Every label value of every metric: none may be a raw key.
    fn label_values(&self) -> Vec<String> {
        self.0.iter().flat_map(|(_, l, _)| l.values().cloned()).collect()
    }
}

/// The tests' turn: one at a time, with the capture and the recorder emptied.
async fn turn() -> tokio::sync::MutexGuard<'static, ()> {
    static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let guard = TURN.lock().await;
    let _ = metrics();
    *captured().lock().unwrap() = Captured::default();
    guard
}

/// The closed call spans of `scope`.
fn call_spans(scope: &str) -> Vec<SpanRec> {
    let c = captured().lock().unwrap();
    c.spans
        .iter()
        .filter(|s| s.name == "idempotent.call" && s.fields.get("scope").is_some_and(|x| x == scope))
        .cloned()
        .collect()
}

/// The one closed call span of `scope` whose outcome is `outcome`.
fn span_with(scope: &str, outcome: CallOutcome) -> SpanRec {
    let spans: Vec<_> = call_spans(scope)
        .into_iter()
        .filter(|s| s.fields.get("outcome").map(String::as_str) == Some(outcome.as_str()))
        .collect();
    assert_eq!(spans.len(), 1, "one span with outcome {outcome}: {:#?}", call_spans(scope));
    spans.into_iter().next().unwrap()
}

/// The events of `scope`'s calls.
fn events(scope: &str) -> Vec<EventRec> {
    let c = captured().lock().unwrap();
    c.events
        .iter()
        .filter(|e| e.call.as_ref().and_then(|f| f.get("scope")).is_some_and(|x| x == scope))
        .cloned()
        .collect()
}

/// Every event captured in this turn: the watchdog's and the background releases' happen
/// outside the call's span, and name the key (redacted) instead.
fn all_events() -> Vec<EventRec> {
    captured().lock().unwrap().events.clone()
}

fn message(e: &EventRec) -> &str {
    e.fields.get("message").map(String::as_str).unwrap_or("")
}

/// Holds `key` in `scope` (a 10 s lease) until `release` fires ([`support::hold`]).
fn hold(
    idem: &Idempotency,
    scope: &str,
    key: &str,
    fail: bool,
) -> (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<R<u32>>) {
    support::hold(idem, Call::new(key).scope(scope).ttl(Duration::from_secs(10)), fail)
}

/// Every outcome of the list in `telemetry::CallOutcome` that a store can produce, once each in
/// a scope of its own: the span's `outcome` field says it, and
/// `idempotency_calls_total{outcome, scope}` counts exactly it. Keys never appear in what was
/// captured.
async fn every_outcome_has_its_span_and_counter(backend: Backend) {
    let _turn = turn().await;
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let scope = format!("outcomes_{backend:?}").to_lowercase();
    let key = |name: &str| format!("customer-4711-{name}");
    let call = |name: &str| Call::new(key(name)).scope(scope.clone());
    let mut expected: Vec<CallOutcome> = Vec::new();

    // executed (its body reads its fence: the span shows it), then replayed.
    let r: R<u32> = idem
        .run(call("a"), || async {
            CallContext::current().unwrap().fence().await?;
            Ok(1)
        })
        .await;
    assert_eq!(r.unwrap(), 1);
    let r: R<u32> = idem.run(call("a"), || async { Ok(2) }).await;
    assert_eq!(r.unwrap(), 1);
    expected.extend([CallOutcome::Executed, CallOutcome::Replayed]);
    // duplicate: a completed key under on_duplicate = reject.
    let r: R<u32> = idem.run(call("a").on_duplicate(OnDuplicate::Reject), || async { Ok(3) }).await;
    assert!(matches!(r, Err(AppError::Idem(Error::Duplicate { .. }))), "{r:?}");
    expected.push(CallOutcome::Duplicate);
    // key_reused: another payload.
    let r: R<u32> = idem.run(call("f").fingerprint(&1), || async { Ok(1) }).await;
    assert!(r.is_ok());
    let r: R<u32> = idem.run(call("f").fingerprint(&2), || async { Ok(1) }).await;
    assert!(matches!(r, Err(AppError::Idem(Error::KeyReused { .. }))), "{r:?}");
    expected.extend([CallOutcome::Executed, CallOutcome::KeyReused]);
    // conflict, then timeout, while another call holds the key.
    let (release, holder) = hold(&idem, &scope, &key("held"), false);
    let r: R<u32> = idem.run(call("held"), || async { Ok(1) }).await;
    assert!(matches!(r, Err(AppError::Idem(Error::Conflict { .. }))), "{r:?}");
    let r: R<u32> = idem.run(call("held").on_conflict(OnConflict::Wait(ms(150))), || async { Ok(1) }).await;
    assert!(matches!(r, Err(AppError::Idem(Error::Timeout { .. }))), "{r:?}");
    release.send(()).unwrap();
    assert_eq!(holder.await.unwrap().unwrap(), 1);
    expected.extend([CallOutcome::Conflict, CallOutcome::Timeout, CallOutcome::Executed]);
    // invalid_token, invalid.
    let r: R<u32> = idem.run(Call::token("not-a-token-customer-4711").scope(scope.clone()), || async { Ok(1) }).await;
    assert!(matches!(r, Err(AppError::Idem(Error::InvalidToken { .. }))), "{r:?}");
    let r: R<u32> = idem.run(Call::new("").scope(scope.clone()), || async { Ok(1) }).await;
    assert!(matches!(r, Err(AppError::Idem(Error::InvalidKey { .. }))), "{r:?}");
    expected.extend([CallOutcome::InvalidToken, CallOutcome::Invalid]);
    // body_error, then a value that would not replay as itself (codec_error).
    let r: R<u32> = idem.run(call("b"), || async { Err(AppError::Failed("no")) }).await;
    assert!(matches!(r, Err(AppError::Failed("no"))), "{r:?}");
    let r: R<f64> = idem.run(call("nan"), || async { Ok(f64::NAN) }).await;
    assert!(matches!(r, Err(AppError::Idem(Error::Codec { .. }))), "{r:?}");
    expected.extend([CallOutcome::BodyError, CallOutcome::CodecError]);
    // lease_lost: the record deleted behind the holder's back; its next renewal finds out.
    let full = format!("{scope}:{}", key("lost"));
    let r: R<u32> = idem
        .run(call("lost").ttl(ms(300)).abort_on_lease_lost(true), || async {
            fx.delete_record(&full);
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok(1)
        })
        .await;
    assert!(matches!(r, Err(AppError::Idem(Error::LeaseLost { .. }))), "{r:?}");
    expected.push(CallOutcome::LeaseLost);
    // panicked.
    let panicking = {
        let idem = idem.clone();
        let call = call("p");
        tokio::spawn(async move {
            let _: R<u32> = idem.run(call, || async { panic!("the body panics") }).await;
        })
    };
    assert!(panicking.await.unwrap_err().is_panic());
    expected.push(CallOutcome::Panicked);
    // gave_up: the one attempt give_up_after(1) allows fails (body_error); the next call finds
    // the key given up.
    let r: R<u32> = idem.run(call("g").give_up_after(1), || async { Err(AppError::Failed("declined")) }).await;
    assert!(matches!(r, Err(AppError::Failed("declined"))), "{r:?}");
    let r: R<u32> = idem.run(call("g").give_up_after(1), || async { Ok(1) }).await;
    assert!(matches!(r, Err(AppError::Idem(Error::GaveUp { .. }))), "{r:?}");
    expected.extend([CallOutcome::BodyError, CallOutcome::GaveUp]);
    // outcome_unknown: a call under on_crash = hold dropped mid-body leaves its key to its
    // lease; once the lease ends the next call finds the outcome unknown. The dropped call's
    // span closes without an outcome. An operator's resolution is counted.
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let stopped = {
        let (idem, call) = (idem.clone(), call("u").on_crash(OnCrash::Hold).ttl(ms(300)));
        tokio::spawn(async move {
            let _: R<u32> = idem
                .run(call, || async move {
                    let _ = started_tx.send(());
                    std::future::pending().await
                })
                .await;
        })
    };
    started.await.unwrap();
    stopped.abort();
    tokio::time::sleep(ms(500)).await;
    let r: R<u32> = idem.run(call("u"), || async { Ok(1) }).await;
    assert!(matches!(r, Err(AppError::Idem(Error::OutcomeUnknown { .. }))), "{r:?}");
    expected.push(CallOutcome::OutcomeUnknown);
    let resolved = idem.resolve(&scope, &key("u"), Resolve::NotDone).await.unwrap();
    assert_eq!(resolved, Resolved::Done);
    let dropped_spans = 1;
    // store_error: the server gone (Redis only: the in-memory store cannot fail).
    if backend == Backend::Redis {
        let store = RedisStore::builder(&fx.server.as_ref().unwrap().url()).timeout(ms(300)).connect().await.unwrap();
        let down = Idempotency::new(store);
        let mut fx = fx;
        fx.server.as_mut().unwrap().kill();
        let r: R<u32> = down.run(call("down"), || async { Ok(1) }).await;
        assert!(matches!(r, Err(AppError::Idem(Error::Store { .. }))), "{r:?}");
        expected.push(CallOutcome::StoreError);
    }

    let m = metrics();
    let mut want: BTreeMap<&str, u64> = BTreeMap::new();
    for o in &expected {
        *want.entry(o.as_str()).or_default() += 1;
    }
    for (outcome, n) in &want {
        let spans = call_spans(&scope)
            .into_iter()
            .filter(|s| s.fields.get("outcome").map(String::as_str) == Some(*outcome))
            .count();
        assert_eq!(spans as u64, *n, "spans with outcome {outcome}: {:#?}", call_spans(&scope));
        let counted = m.counter("idempotency_calls_total", &[("outcome", outcome), ("scope", &scope)]);
        assert_eq!(counted, *n, "idempotency_calls_total{{outcome={outcome}}}");
    }
    assert_eq!(call_spans(&scope).len(), expected.len() + dropped_spans, "one span per call");
    assert_eq!(m.counter("idempotency_resolutions_total", &[("how", "not_done"), ("by", "operator")]), 1);
    assert_eq!(m.counter("idempotency_calls_total", &[("scope", &scope)]), expected.len() as u64);
    // Store calls are INFO spans with the key redacted the same way every time.
    let executed = call_spans(&scope).into_iter().find(|s| s.fields["outcome"] == "executed").unwrap();
    assert_eq!(executed.level, tracing::Level::INFO);
    assert_eq!(executed.fields["key"], telemetry::logged_key(&format!("{scope}:{}", key("a"))).to_string());
    assert_eq!(executed.fields["mode"], "param");
    assert!(executed.fields["fence"].parse::<u64>().unwrap() > 0);
    assert_eq!(executed.fields["attempts"], "1");
    let lost = span_with(&scope, CallOutcome::LeaseLost);
    assert!(
        all_events().iter().any(|e| e.level == tracing::Level::WARN
            && e.fields.get("key") == Some(&lost.fields["key"])
            && message(e).contains("lease lost")),
        "a WARN names the lost lease's key: {:#?}",
        all_events()
    );
    // No key, no customer number, in anything captured or in any label.
    let text = captured().lock().unwrap().text.clone();
    assert!(!text.contains("customer-4711"), "a key leaked into the logs: {text}");
    assert!(m.label_values().iter().all(|v| !v.contains("customer-4711")));
}

/// A batch's items are counted as one call each would be: the attempt that gives up on its key
/// is a `body_error`, as a single call's is; a redelivery that finds the key given up is
/// `gave_up`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_counts_its_items_as_single_calls_are_counted() {
    let _turn = turn().await;
    let fx = Fixture::new(Backend::Memory, 1).await;
    let idem = fx.idem(0);
    let scope = "batch_outcomes";
    let calls = || (0..2).map(|i| Call::new(format!("delivery-{i}")).scope(scope).give_up_after(1));
    let batch = idem.claim::<u32>(calls()).await;
    let settled = batch.run(1, |_, _| async { R::<u32>::Err(AppError::Failed("declined")) }).await;
    assert!(settled.iter().all(|s| matches!(s, idempotency::Settled::GaveUp { .. })), "{settled:?}");
    let batch = idem.claim::<u32>(calls()).await;
    let settled = batch.run(1, |_, _| async { R::Ok(1) }).await;
    assert!(settled.iter().all(|s| matches!(s, idempotency::Settled::Refused(Error::GaveUp { .. }))), "{settled:?}");
    let m = metrics();
    let counted = |outcome: &str| m.counter("idempotency_calls_total", &[("outcome", outcome), ("scope", scope)]);
    assert_eq!((counted("body_error"), counted("gave_up")), (2, 2));
}

/// Each transition is a DEBUG event of the call's span; the histograms and gauges move; the
/// cached replay is a DEBUG span, counted like any other.
async fn transitions_are_events_and_metrics(backend: Backend) {
    let _turn = turn().await;
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem_with(0, |b| b.replay_cache(100));
    let scope = format!("transitions_{backend:?}").to_lowercase();
    // Give the cache time to follow purges (it caches nothing before).
    tokio::time::sleep(ms(200)).await;
    let (tx, rx) = tokio::sync::oneshot::channel::<Metrics>();
    let r: R<u32> = idem
        .run(Call::new("t").scope(scope.clone()).ttl(ms(300)), || async {
            // Held past a third of the lease: renewed at least once.
            tokio::time::sleep(ms(400)).await;
            let _ = tx.send(metrics());
            Ok(5)
        })
        .await;
    assert_eq!(r.unwrap(), 5);
    let during = rx.await.unwrap();
    assert_eq!(during.gauge("idempotency_leases_held"), 1.0, "one lease held while the body ran");
    assert!(
        during.counter("idempotency_renewals_total", &[("result", "renewed")]) >= 1,
        "renewed at a third of the lease"
    );
    let m = metrics();
    assert_eq!(m.gauge("idempotency_leases_held"), -1.0, "let go when the body ended");
    assert_eq!(m.counter("idempotency_renewals_total", &[("result", "failed")]), 0);
    let histogram = |name: &str| during.histogram(name) + m.histogram(name);
    assert_eq!(histogram("idempotency_acquire_seconds"), 1);
    assert_eq!(histogram("idempotency_body_seconds"), 1);
    assert_eq!(histogram("idempotency_commit_seconds"), 1);
    assert_eq!(histogram("idempotency_wait_seconds"), 0);
    assert_eq!(m.gauge("idempotency_replay_cache_entries"), 1.0, "the result cached at commit");
    let said: Vec<String> =
        events(&scope).iter().filter(|e| e.level == tracing::Level::DEBUG).map(|e| message(e).to_owned()).collect();
    for step in ["acquire sent", "acquire answered", "commit done"] {
        assert!(said.iter().any(|m| m.contains(step)), "no DEBUG event for {step}: {said:?}");
    }
    let said: Vec<String> =
        all_events().iter().filter(|e| e.level == tracing::Level::DEBUG).map(|e| message(e).to_owned()).collect();
    assert!(said.iter().any(|m| m.contains("leases renewed")), "no DEBUG event for the renewal: {said:?}");
    // A replay from the cache: a DEBUG span, counted as a replay and a cache hit.
    let r: R<u32> = idem.run(Call::new("t").scope(scope.clone()), || async { Ok(6) }).await;
    assert_eq!(r.unwrap(), 5);
    let m = metrics();
    assert_eq!(m.counter("idempotency_calls_total", &[("outcome", "replayed"), ("scope", &scope)]), 1);
    assert_eq!(m.counter("idempotency_replay_cache_lookups_total", &[("result", "hit")]), 1);
    assert_eq!(m.histogram("idempotency_acquire_seconds"), 0, "no round trip");
    let cached = span_with(&scope, CallOutcome::Replayed);
    assert_eq!((cached.level, cached.fields["attempts"].as_str()), (tracing::Level::DEBUG, "0"));
    // A failed body: its failure recorded (the key freed, the attempt counted), said at DEBUG.
    let r: R<u32> = idem.run(Call::new("u").scope(scope.clone()), || async { Err(AppError::Failed("x")) }).await;
    assert!(r.is_err());
    let said: Vec<String> = events(&scope).iter().map(|e| message(e).to_owned()).collect();
    assert!(said.iter().any(|m| m.contains("failure recorded")), "{said:?}");
    // A caller that gives up while the body runs: a WARN (the key is released late, in the
    // background).
    let gave_up = tokio::time::timeout(
        ms(50),
        idem.run(Call::new("v").scope(scope.clone()), || async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            R::Ok(1u32)
        }),
    )
    .await;
    assert!(gave_up.is_err());
    let v = telemetry::logged_key(&format!("{scope}:v")).to_string();
    assert!(
        all_events().iter().any(|e| e.level == tracing::Level::WARN
            && e.fields.get("key") == Some(&v)
            && message(e).contains("releasing the key in the background")),
        "{:#?}",
        all_events()
    );
    // The forgotten record leaves the cache (a gauge of -1 once the purge arrives).
    let _ = idem.forget(&scope, "t", Force::CompletedOnly).await.unwrap();
    eventually(Duration::from_secs(2), "the cache entry purged", || async {
        let r: R<u32> = idem.run(Call::new("t").scope(scope.clone()), || async { Ok(7) }).await;
        (r.unwrap() == 7).then_some(())
    })
    .await;
}

/// The outcome to the caller: `run_with_outcome` says replayed, fence, waited and attempts,
/// and the body of a call that waited knows its attempt.
async fn waits_are_told(backend: Backend) {
    let _turn = turn().await;
    let fx = Fixture::new(backend, 1).await;
    let idem = fx.idem(0);
    let scope = format!("waits_{backend:?}").to_lowercase();
    let call = |key: &str| Call::new(key).scope(scope.clone()).on_conflict(OnConflict::Wait(Duration::from_secs(10)));

    // A body that reads its fence: the outcome has it. One that does not: it has one only where
    // the store stamps every acquisition (memory).
    let (value, first) = idem
        .run_with_outcome(call("a"), || async {
            CallContext::current().unwrap().fence().await?;
            R::Ok(1u32)
        })
        .await
        .unwrap();
    assert_eq!((value, first.kind, first.replayed, first.attempts), (1, CallOutcome::Executed, false, 1));
    assert!(first.fence.is_some() && first.waited.is_zero());
    let (_, unread) = idem.run_with_outcome(call("a-unread"), || async { R::Ok(1u32) }).await.unwrap();
    assert_eq!(unread.fence.is_some(), backend == Backend::Memory, "{unread:?}");
    let (value, again) = idem.run_with_outcome(call("a"), || async { R::Ok(2u32) }).await.unwrap();
    assert_eq!((value, again.kind, again.replayed, again.fence), (1, CallOutcome::Replayed, true, None));

    // Waits on a holder that completes: replays its value.
    let (release, holder) = hold(&idem, &scope, "w", false);
    let waiter = tokio::spawn({
        let (idem, call) = (idem.clone(), call("w"));
        async move { idem.run_with_outcome(call, || async { R::Ok(9u32) }).await }
    });
    tokio::time::sleep(ms(100)).await;
    release.send(()).unwrap();
    holder.await.unwrap().unwrap();
    let (value, waited) = waiter.await.unwrap().unwrap();
    assert_eq!((value, waited.kind, waited.replayed), (1, CallOutcome::WaitedThenReplayed, true));
    assert!(waited.waited >= ms(90) && waited.attempts >= 2, "{waited:?}");

    // Waits on a holder that fails: runs the body, which knows it was not the first attempt.
    let (release, holder) = hold(&idem, &scope, "x", true);
    let runs = counter();
    let waiter = tokio::spawn({
        let (idem, call, runs) = (idem.clone(), call("x"), runs.clone());
        async move {
            idem.run_with_outcome(call, || async move {
                runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                CallContext::current().unwrap().fence().await?;
                R::Ok(CallContext::current().unwrap().attempt())
            })
            .await
        }
    });
    tokio::time::sleep(ms(100)).await;
    release.send(()).unwrap();
    assert!(holder.await.unwrap().is_err());
    let (attempt, ran) = waiter.await.unwrap().unwrap();
    assert_eq!((ran.kind, ran.replayed), (CallOutcome::WaitedThenExecuted, false));
    // The holder's failure counted: the waiter's body is the key's second attempt.
    assert_eq!(attempt, 2);
    assert!(ran.attempts >= 2 && ran.waited >= ms(90) && ran.fence.is_some(), "{ran:?}");
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);

    // The spans and the metrics say the same, and the wait is measured.
    let m = metrics();
    for outcome in [CallOutcome::WaitedThenReplayed, CallOutcome::WaitedThenExecuted] {
        let span = span_with(&scope, outcome);
        assert!(span.fields["waited_ms"].parse::<u64>().unwrap() >= 90, "{span:?}");
        assert_eq!(m.counter("idempotency_calls_total", &[("outcome", outcome.as_str()), ("scope", &scope)]), 1);
    }
    assert_eq!(m.histogram("idempotency_wait_seconds"), 2);
}

/// Full keys appear only once turned on, and then in spans and events alike; errors logged by
/// the HTTP layer are redacted the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_keys_only_when_turned_on() {
    let _turn = turn().await;
    let idem = Idempotency::new(idempotency::MemoryStore::new());
    let scope = "full_keys";
    let run = |key: &'static str| {
        let idem = idem.clone();
        async move {
            let _: R<u32> = idem.run(Call::new(key).scope(scope), || async { Err(AppError::Failed("x")) }).await;
        }
    };
    run("alice@example.com").await;
    assert!(!captured().lock().unwrap().text.contains("alice@example.com"));
    telemetry::log_full_keys(true);
    run("bob@example.com").await;
    telemetry::log_full_keys(false);
    let spans = call_spans(scope);
    assert_eq!(spans.len(), 2);
    assert_eq!(spans[1].fields["key"], "full_keys:bob@example.com");
    assert!(spans[0].fields["key"].starts_with('#'));
    let e = Error::Conflict { key: "pay:alice@example.com".into(), retry_after: None };
    assert!(!telemetry::logged_error(&e).to_string().contains("alice"));
    assert!(e.to_string().contains("alice"), "errors returned to the caller name the key");
}

/// The HTTP layer's span nests under the request's span and the call's span under it, with the
/// replay marker and the status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_span_nests_under_the_request() {
    use axum::routing::post;
    use tower::ServiceExt;

    let _turn = turn().await;
    let idem = Idempotency::new(idempotency::MemoryStore::new());
    let app = axum::Router::new()
        .route("/orders", post(|| async { (axum::http::StatusCode::CREATED, "made") }))
        .layer(idempotency::http::IdempotencyLayer::shared_keys(idem));
    for _ in 0..2 {
        let request = axum::http::Request::post("/orders")
            .header("Idempotency-Key", "\"order-customer-4711\"")
            .body(axum::body::Body::empty())
            .unwrap();
        let span = tracing::info_span!("request", uri = "/orders");
        let response = tracing::Instrument::instrument(app.clone().oneshot(request), span).await.unwrap();
        assert_eq!(response.status(), 201);
    }
    let c = captured().lock().unwrap();
    let http: Vec<_> = c.spans.iter().filter(|s| s.name == "idempotent.http").collect();
    assert_eq!(http.len(), 2, "{:#?}", c.spans);
    assert!(http
        .iter()
        .all(|s| s.parent == Some("request") && s.fields["status"] == "201" && s.fields["method"] == "POST"));
    assert_eq!((http[0].fields["replayed"].as_str(), http[1].fields["replayed"].as_str()), ("false", "true"));
    let calls: Vec<_> = c.spans.iter().filter(|s| s.name == "idempotent.call").collect();
    assert_eq!(calls.len(), 2);
    assert!(calls.iter().all(|s| s.parent == Some("idempotent.http")));
    assert_eq!((calls[0].fields["outcome"].as_str(), calls[1].fields["outcome"].as_str()), ("executed", "replayed"));
    assert!(!c.text.contains("customer-4711"));
}

#[test]
fn outcome_names_are_the_documented_ones() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/observability.md")).unwrap();
    for o in [
        CallOutcome::Executed,
        CallOutcome::Replayed,
        CallOutcome::WaitedThenReplayed,
        CallOutcome::WaitedThenExecuted,
        CallOutcome::Conflict,
        CallOutcome::Duplicate,
        CallOutcome::Timeout,
        CallOutcome::KeyReused,
        CallOutcome::InvalidToken,
        CallOutcome::Invalid,
        CallOutcome::LeaseLost,
        CallOutcome::StoreError,
        CallOutcome::CodecError,
        CallOutcome::BodyError,
        CallOutcome::Panicked,
    ] {
        assert!(doc.contains(&format!("`{}`", o.as_str())), "docs/observability.md lists {o}");
    }
    for name in [
        "idempotency_calls_total",
        "idempotency_acquire_seconds",
        "idempotency_body_seconds",
        "idempotency_wait_seconds",
        "idempotency_commit_seconds",
        "idempotency_leases_held",
        "idempotency_renewals_total",
        "idempotency_replay_cache_lookups_total",
        "idempotency_replay_cache_entries",
    ] {
        assert!(doc.contains(name), "docs/observability.md lists {name}");
    }
}

/// At connect the store says, in an INFO event, which servers it talks to, which server it found,
/// how each transition runs there (the commit a script on Redis 7.0, a `SET IFEQ` on Valkey 8.1),
/// and the ids fred gave its clients: fred names its own log lines (a connection lost, a
/// reconnect) by those ids, which it makes up and cannot be given, so this line is how an operator
/// tells which store a `fred-…` warning is about.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_names_its_server_paths_and_freds_client_ids_at_connect() {
    let _turn = turn().await;
    let valkey = support::valkey_server_binary();
    for (binary, server, commit) in
        [("redis-server", "redis 7.", "script"), (valkey.as_str(), "valkey 8.1.", "SET IFEQ")]
    {
        let process = support::RedisServer::start_binary(binary);
        RedisStore::builder(&process.url()).pool_size(2).connect().await.unwrap();
        let connected: Vec<EventRec> = all_events()
            .into_iter()
            .filter(|e| message(e) == "idempotency store connected" && e.fields["server"].starts_with(server))
            .collect();
        assert_eq!(connected.len(), 1, "{server}: {:?}", all_events());
        let event = &connected[0];
        assert_eq!(event.level, tracing::Level::INFO);
        let field = |name: &str| event.fields.get(name).map(String::as_str);
        assert_eq!(
            (field("acquire"), field("commit"), field("release")),
            (Some("SET NX GET"), Some(commit), Some("script"))
        );
        assert!(field("store").unwrap().contains(&process.port().to_string()), "{event:?}");
        let clients: Vec<&str> = field("clients").unwrap().split(',').collect();
        assert_eq!(clients.len(), 2, "{event:?}");
        for id in clients {
            let tail = id.strip_prefix("fred-").unwrap_or_else(|| panic!("not a fred id: {id}"));
            assert!(tail.len() == 10 && tail.chars().all(|c| c.is_ascii_alphanumeric()), "{id}");
        }
    }
}

/// `migrate()` on a table that exists already logs no notice of what it skipped: sqlx logs the
/// server's notices at `INFO`, and every start logged `schema "public" already exists, skipping`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrating_an_existing_table_logs_no_notice() {
    let _turn = turn().await;
    let url = tokio::task::block_in_place(support::postgres::shared_database);
    let schema = support::postgres::unique_schema();
    for _ in 0..2 {
        let store = idempotency::PgStore::builder(url).schema(&schema).migrate().connect().await.unwrap();
        store.migrate().await.unwrap();
        store.close().await;
    }
    let text = captured().lock().unwrap().text.clone();
    assert!(!text.contains("already exists"), "{text}");
}

#[idempotency::idempotent(key = "pay:{provider}:{txn}", scope = "telemetry-empty-value", store = idem)]
async fn pay(idem: &Idempotency, provider: &str, txn: &str) -> R<u32> {
    let _ = (provider, txn);
    Ok(1)
}

/// A key whose template got an empty value is refused by the runtime like every refused call:
/// an `invalid` span and `idempotency_calls_total{outcome="invalid"}`, where the attribute used
/// to return before the runtime saw the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_template_value_is_refused_with_a_span_and_a_metric() {
    let _turn = turn().await;
    let idem = Idempotency::new(idempotency::MemoryStore::new());
    let r = pay(&idem, "acme", "").await;
    match r {
        Err(AppError::Idem(Error::InvalidKey { reason, .. })) => assert!(reason.contains("`{txn}`"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(pay(&idem, "acme", "t-1").await.unwrap(), 1);
    let scope = "telemetry-empty-value";
    span_with(scope, CallOutcome::Invalid);
    let m = metrics();
    assert_eq!(m.counter("idempotency_calls_total", &[("outcome", "invalid"), ("scope", scope)]), 1);
    assert_eq!(m.counter("idempotency_calls_total", &[("outcome", "executed"), ("scope", scope)]), 1);
}

/// A lock's take is seen as a call's is: an `idempotent.lock` span with its outcome, fence,
/// attempts and wait (the key redacted), and `idempotency_locks_total` by outcome and scope, for
/// every way it ends: taken, held, taken after a wait, still held after the patience, refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lock_outcome_has_its_span_and_counter() {
    use idempotency::telemetry::LockOutcome;
    let _turn = turn().await;
    let idem = Idempotency::new(idempotency::MemoryStore::new());
    let scope = "telemetry-locks";
    let lock = |key: &str| idem.lock(key.to_owned()).scope(scope);
    let first = lock("acct-4711").ttl(Duration::from_secs(5)).acquire().await.unwrap();
    assert!(matches!(lock("acct-4711").acquire().await, Err(Error::Locked { waited: None, .. })));
    let waited = lock("acct-4711").wait(ms(150)).await;
    assert!(matches!(waited, Err(Error::Locked { waited: Some(w), .. }) if w >= ms(150)), "{waited:?}");
    let waiter = tokio::spawn({
        let idem = idem.clone();
        async move { idem.lock("acct-4711").scope(scope).wait(Duration::from_secs(5)).await }
    });
    tokio::time::sleep(ms(100)).await;
    first.release().await.unwrap();
    let second = waiter.await.unwrap().unwrap();
    assert!(matches!(lock("").acquire().await, Err(Error::InvalidKey { .. })));
    second.release().await.unwrap();

    let spans: Vec<SpanRec> = {
        let c = captured().lock().unwrap();
        c.spans.iter().filter(|s| s.name == "idempotent.lock").cloned().collect()
    };
    let with = |outcome: LockOutcome| {
        let found: Vec<_> =
            spans.iter().filter(|s| s.fields.get("outcome").map(String::as_str) == Some(outcome.as_str())).collect();
        assert_eq!(found.len(), 1, "one lock span with outcome {outcome}: {spans:#?}");
        found[0].clone()
    };
    let taken = with(LockOutcome::Taken);
    assert_eq!((taken.level, taken.fields["scope"].as_str()), (tracing::Level::INFO, scope));
    assert_eq!(taken.fields["key"], telemetry::logged_key(&format!("{scope}:acct-4711")).to_string());
    assert_eq!((taken.fields["fence"].as_str(), taken.fields["attempts"].as_str()), ("1", "1"));
    with(LockOutcome::Held);
    assert!(with(LockOutcome::Timeout).fields["waited_ms"].parse::<u64>().unwrap() >= 150);
    let after_wait = with(LockOutcome::WaitedThenTaken);
    assert!(after_wait.fields["waited_ms"].parse::<u64>().unwrap() > 0, "{after_wait:?}");
    assert_eq!(after_wait.fields["fence"], "2");
    with(LockOutcome::Invalid);
    assert!(!captured().lock().unwrap().text.contains("acct-4711"), "the lock's key was logged unredacted");

    let m = metrics();
    for (outcome, n) in [("taken", 1), ("held", 1), ("timeout", 1), ("waited_then_taken", 1), ("invalid", 1)] {
        assert_eq!(m.counter("idempotency_locks_total", &[("outcome", outcome), ("scope", scope)]), n, "{outcome}");
    }
}
