//! The standard scenarios, run against any [`Subject`]: something the kit can call with the same
//! request again and again (a function, an HTTP route, an RPC method), whose effects it can count,
//! on the kit's [`TestStore`]. Each scenario starts on an empty store and checks the effects the
//! subject made and what each caller was answered, as `docs/guarantees.md` says they should be.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use crate::store::join::join_all;
use crate::testing::report::{Outcome, Scenario, Verdict};
use crate::testing::store::TestStore;

/// What the kit asks a subject to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// The request every duplicate sends: same key, same payload.
    Same,
    /// The same key with another payload.
    OtherPayload,
}

/// What a subject's caller was answered, as the kit tells answers apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The subject's answer (a function's `Ok`, a stored response), shown so that two can be
    /// compared; `replayed` when the subject says whether it was a replay (an HTTP response's
    /// replay header), `None` when it cannot tell.
    Value {
        /// The answer, rendered.
        shown: String,
        /// Whether it says it is a replay.
        replayed: Option<bool>,
    },
    /// Another call holds the key in flight (`Error::Conflict`, a 409).
    InFlight,
    /// The key was used with another payload (`Error::KeyReused`, a 422).
    KeyReused,
    /// The store could not be reached; nothing ran (`Error::Store`, a 503).
    StoreUnavailable,
    /// The body failed, or anything else: what it was.
    Failed(String),
}

impl Answer {
    fn label(&self) -> String {
        match self {
            Answer::Value { shown, replayed: Some(true) } => format!("replay {shown}"),
            Answer::Value { shown, .. } => shown.clone(),
            Answer::InFlight => "in flight".into(),
            Answer::KeyReused => "key reused".into(),
            Answer::StoreUnavailable => "store unavailable".into(),
            Answer::Failed(why) => format!("failed: {why}"),
        }
    }

    fn shown(&self) -> Option<&str> {
        match self {
            Answer::Value { shown, .. } => Some(shown),
            _ => None,
        }
    }
}

/// A future a subject answers with.
pub type Answering<'a> = Pin<Box<dyn Future<Output = Answer> + 'a>>;

/// Something the kit can run its scenarios against: [`function`](crate::testing::function) for
/// an async function, `idempotent_http::testing::route` for an HTTP route, or an adapter of
/// your own for another protocol.
pub trait Subject {
    /// Sends one request and tells what its caller was answered.
    fn call(&self, ask: Ask) -> Answering<'_>;

    /// Whether it can send [`Ask::OtherPayload`].
    fn has_other_payload(&self) -> bool;

    /// What it is, for the report.
    fn describe(&self) -> String;
}

/// What the scenarios run with.
pub(crate) struct Bench<'a> {
    pub(crate) subject: &'a dyn Subject,
    pub(crate) store: &'a TestStore,
    pub(crate) effects: &'a dyn Fn() -> usize,
    pub(crate) fail_next: Option<&'a dyn Fn()>,
    pub(crate) duplicates: usize,
    /// How long the kit waits for a key in flight to settle, or for an effect to show.
    pub(crate) patience: Duration,
}

/// The effects made and the answers given in one scenario.
struct Tally<'a> {
    bench: &'a Bench<'a>,
    before: usize,
    answers: Vec<Answer>,
}

impl<'a> Tally<'a> {
    fn start(bench: &'a Bench<'a>) -> Self {
        bench.store.reset();
        Tally { bench, before: (bench.effects)(), answers: Vec::new() }
    }

    fn effects(&self) -> usize {
        (self.bench.effects)().saturating_sub(self.before)
    }

    async fn call(&mut self, ask: Ask) -> Answer {
        let answer = self.bench.subject.call(ask).await;
        self.answers.push(answer.clone());
        answer
    }

    /// Calls [`Ask::Same`] until it is answered with something other than in flight or store
    /// unavailable, for at most the bench's patience.
    async fn settled(&mut self) -> Answer {
        let until = Instant::now() + self.bench.patience;
        loop {
            let answer = self.call(Ask::Same).await;
            let unsettled = matches!(answer, Answer::InFlight | Answer::StoreUnavailable);
            if !unsettled || Instant::now() >= until {
                return answer;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Drives `call` until the subject's effect shows, for at most the bench's patience; `Err`
    /// when the call ended first or nothing showed.
    async fn until_effect(&mut self, call: &mut Answering<'_>) -> Result<(), String> {
        let (effects, before, patience) = (self.bench.effects, self.before, self.bench.patience);
        let shown = async {
            while effects() <= before {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        let ended = tokio::select! {
            answer = call.as_mut() => Some(answer),
            _ = shown => return Ok(()),
            _ = tokio::time::sleep(patience) => None,
        };
        match ended {
            Some(answer) => {
                let why = format!("the call ended ({}) before its effect showed", answer.label());
                self.answers.push(answer);
                Err(why)
            }
            None => Err(format!("no effect showed within {patience:?}")),
        }
    }

    fn outcome(self, scenario: Scenario, verdict: Result<(), String>) -> Outcome {
        let mut counted: BTreeMap<String, usize> = BTreeMap::new();
        for answer in &self.answers {
            *counted.entry(answer.label()).or_default() += 1;
        }
        let answers = counted.into_iter().map(|(a, n)| if n == 1 { a } else { format!("{n} x {a}") }).collect();
        let verdict = match verdict {
            Ok(()) => Verdict::Passed,
            Err(why) => Verdict::Failed(why),
        };
        Outcome { scenario, verdict, effects: self.effects(), answers }
    }
}

/// `Err(why)` unless `ok`.
fn expect(ok: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(why())
    }
}

/// Runs every scenario against the bench's subject.
pub(crate) async fn run_all(bench: &Bench<'_>) -> Vec<Outcome> {
    let mut outcomes = Vec::new();
    for scenario in Scenario::ALL {
        let outcome = match scenario {
            Scenario::ConcurrentDuplicates => concurrent_duplicates(bench).await,
            Scenario::AfterCompletion => after_completion(bench).await,
            Scenario::OtherPayload => other_payload(bench).await,
            Scenario::FailureThenRetry => failure_then_retry(bench).await,
            Scenario::CancelledCaller => cancelled_caller(bench).await,
            Scenario::StoreAway => store_away(bench).await,
        };
        outcomes.push(outcome);
    }
    bench.store.reset();
    outcomes
}

fn skipped(scenario: Scenario, why: &str) -> Outcome {
    Outcome { scenario, verdict: Verdict::Skipped(why.into()), effects: 0, answers: Vec::new() }
}

async fn concurrent_duplicates(bench: &Bench<'_>) -> Outcome {
    let mut tally = Tally::start(bench);
    let answers = join_all((0..bench.duplicates).map(|_| bench.subject.call(Ask::Same))).await;
    tally.answers = answers;
    let values: Vec<&str> = tally.answers.iter().filter_map(Answer::shown).collect();
    let verdict = expect(tally.effects() == 1, || {
        format!("{} identical calls at once made {} effects, not 1", bench.duplicates, tally.effects())
    })
    .and_then(|()| expect(!values.is_empty(), || "no call was answered with a value".into()))
    .and_then(|()| {
        expect(values.iter().all(|v| *v == values[0]), || {
            "the calls answered with a value were answered differently".into()
        })
    })
    .and_then(|()| {
        let other = tally.answers.iter().find(|a| !matches!(a, Answer::Value { .. } | Answer::InFlight));
        expect(other.is_none(), || format!("a duplicate was answered {}", other.map(Answer::label).unwrap_or_default()))
    });
    tally.outcome(Scenario::ConcurrentDuplicates, verdict)
}

async fn after_completion(bench: &Bench<'_>) -> Outcome {
    let mut tally = Tally::start(bench);
    let first = tally.call(Ask::Same).await;
    let again = tally.call(Ask::Same).await;
    let verdict = expect(first.shown().is_some(), || format!("the first call was answered {}", first.label()))
        .and_then(|()| {
            expect(again.shown() == first.shown(), || {
                format!("the duplicate was answered {}, the first {}", again.label(), first.label())
            })
        })
        .and_then(|()| {
            expect(!matches!(again, Answer::Value { replayed: Some(false), .. }), || {
                "the duplicate's answer does not say it is a replay".into()
            })
        })
        .and_then(|()| expect(tally.effects() == 1, || format!("two calls made {} effects, not 1", tally.effects())));
    tally.outcome(Scenario::AfterCompletion, verdict)
}

async fn other_payload(bench: &Bench<'_>) -> Outcome {
    if !bench.subject.has_other_payload() {
        return skipped(Scenario::OtherPayload, "no other payload given");
    }
    let mut tally = Tally::start(bench);
    let first = tally.call(Ask::Same).await;
    let other = tally.call(Ask::OtherPayload).await;
    let verdict = expect(first.shown().is_some(), || format!("the first call was answered {}", first.label()))
        .and_then(|()| {
            expect(other == Answer::KeyReused, || format!("the other payload was answered {}", other.label()))
        })
        .and_then(|()| expect(tally.effects() == 1, || format!("made {} effects, not 1", tally.effects())));
    tally.outcome(Scenario::OtherPayload, verdict)
}

async fn failure_then_retry(bench: &Bench<'_>) -> Outcome {
    let Some(fail_next) = bench.fail_next else {
        return skipped(Scenario::FailureThenRetry, "no way to make a body fail given (`fail_next`)");
    };
    let mut tally = Tally::start(bench);
    fail_next();
    let failed = tally.call(Ask::Same).await;
    let of_the_failure = tally.effects();
    let retry = tally.call(Ask::Same).await;
    let of_the_retry = tally.effects() - of_the_failure;
    let again = tally.call(Ask::Same).await;
    let verdict = expect(failed.shown().is_none(), || {
        format!("`fail_next` did not make the call fail: it was answered {}", failed.label())
    })
    .and_then(|()| expect(retry.shown().is_some(), || format!("the retry was answered {}", retry.label())))
    .and_then(|()| expect(of_the_retry == 1, || format!("the retry made {of_the_retry} effects, not 1")))
    .and_then(|()| {
        expect(again.shown() == retry.shown() && tally.effects() == of_the_failure + 1, || {
            format!("after the retry, the same call was answered {} and ran again", again.label())
        })
    });
    tally.outcome(Scenario::FailureThenRetry, verdict)
}

async fn cancelled_caller(bench: &Bench<'_>) -> Outcome {
    let mut tally = Tally::start(bench);
    bench.store.hold_commits();
    let mut call = bench.subject.call(Ask::Same);
    let reached = tally.until_effect(&mut call).await;
    drop(call);
    bench.store.let_commits_through();
    let verdict = match reached {
        Err(why) => Err(why),
        Ok(()) => {
            let retry = tally.settled().await;
            expect(retry.shown().is_some(), || format!("the retry was answered {}", retry.label())).and_then(|()| {
                expect(tally.effects() == 1, || {
                    format!(
                        "a caller cancelled after the effect and before the commit, then a retry: {} effects. The \
                         cancelled body's effect was not kept (with the attribute: `on_cancel = finish`; with \
                         `Idempotency::run`: `run_to_completion`)",
                        tally.effects()
                    )
                })
            })
        }
    };
    tally.outcome(Scenario::CancelledCaller, verdict)
}

async fn store_away(bench: &Bench<'_>) -> Outcome {
    let mut tally = Tally::start(bench);
    bench.store.hold_commits();
    let mut call = bench.subject.call(Ask::Same);
    let reached = tally.until_effect(&mut call).await;
    bench.store.go_away();
    bench.store.let_commits_through();
    let verdict = match reached {
        Err(why) => {
            drop(call);
            Err(why)
        }
        Ok(()) => {
            let first = call.await;
            tally.answers.push(first);
            let meanwhile = tally.call(Ask::Same).await;
            let effects_away = tally.effects();
            bench.store.come_back();
            let after = tally.settled().await;
            expect(meanwhile == Answer::StoreUnavailable, || {
                format!("a duplicate while the store was away was answered {}", meanwhile.label())
            })
            .and_then(|()| expect(effects_away == 1, || format!("{effects_away} effects while the store was away")))
            .and_then(|()| expect(after.shown().is_some(), || format!("once it was back, answered {}", after.label())))
            .and_then(|()| expect(tally.effects() == 1, || format!("{} effects in all, not 1", tally.effects())))
        }
    };
    bench.store.come_back();
    tally.outcome(Scenario::StoreAway, verdict)
}
