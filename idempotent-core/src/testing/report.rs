//! What the test kit found: one line per scenario, what it expected, what the subject answered
//! and how many effects it made; readable when printed, and a panic naming every failure when
//! asserted.

use std::fmt;

/// The standard scenarios the kit runs, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Scenario {
    /// N identical calls at once: one effect; the others are told the key is in flight, or get
    /// the first one's answer.
    ConcurrentDuplicates,
    /// The same call after the first completed: its answer replayed, no new effect.
    AfterCompletion,
    /// The same key with another payload: refused as a reused key, no new effect.
    OtherPayload,
    /// A call whose body fails, then the same call again: the retry runs and its answer is kept.
    FailureThenRetry,
    /// A caller that goes away after the body's effect and before its commit, then a retry: one
    /// effect in all.
    CancelledCaller,
    /// The store goes away after the body's effect and before its commit: a duplicate meanwhile is
    /// told the store is unavailable and runs nothing; once the store is back, one effect in all.
    StoreAway,
}

impl Scenario {
    /// Every scenario, in the order the kit runs them.
    pub const ALL: [Scenario; 6] = [
        Scenario::ConcurrentDuplicates,
        Scenario::AfterCompletion,
        Scenario::OtherPayload,
        Scenario::FailureThenRetry,
        Scenario::CancelledCaller,
        Scenario::StoreAway,
    ];

    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::ConcurrentDuplicates => "concurrent duplicates",
            Scenario::AfterCompletion => "duplicate after completion",
            Scenario::OtherPayload => "same key, other payload",
            Scenario::FailureThenRetry => "failure, then a retry",
            Scenario::CancelledCaller => "caller cancelled mid-call",
            Scenario::StoreAway => "store away mid-call",
        }
    }
}

/// How a scenario went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The subject did what the scenario expects.
    Passed,
    /// It did not: what went wrong.
    Failed(String),
    /// Not run: why (the subject has no other payload, or the kit was not told how to make a
    /// body fail).
    Skipped(String),
}

/// One scenario's result.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Which scenario.
    pub scenario: Scenario,
    /// How it went.
    pub verdict: Verdict,
    /// The effects the subject made during it.
    pub effects: usize,
    /// What the subject answered, call by call (identical answers counted together).
    pub answers: Vec<String>,
}

/// What the kit found, scenario by scenario. Printed, it is a table; [`assert_passed`]
/// panics with it when a scenario failed.
///
/// [`assert_passed`]: Report::assert_passed
#[derive(Debug, Clone)]
pub struct Report {
    /// What was tested.
    pub subject: String,
    /// One per scenario, in order.
    pub outcomes: Vec<Outcome>,
}

impl Report {
    /// Whether no scenario failed (skipped ones do not fail).
    pub fn passed(&self) -> bool {
        self.outcomes.iter().all(|o| !matches!(o.verdict, Verdict::Failed(_)))
    }

    /// The outcome of `scenario`.
    pub fn outcome(&self, scenario: Scenario) -> Option<&Outcome> {
        self.outcomes.iter().find(|o| o.scenario == scenario)
    }

    /// Panics with the report when a scenario failed.
    #[track_caller]
    pub fn assert_passed(&self) {
        if !self.passed() {
            panic!("idempotency test kit: a scenario failed\n{self}");
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.subject)?;
        for o in &self.outcomes {
            let (mark, why) = match &o.verdict {
                Verdict::Passed => ("ok     ", String::new()),
                Verdict::Failed(why) => ("FAILED ", format!("\n        {why}")),
                Verdict::Skipped(why) => ("skipped", format!(" ({why})")),
            };
            let answers =
                if o.answers.is_empty() { String::new() } else { format!("; answers: {}", o.answers.join(", ")) };
            let effects = if matches!(o.verdict, Verdict::Skipped(_)) {
                String::new()
            } else {
                format!(" - {} effect{}{answers}", o.effects, if o.effects == 1 { "" } else { "s" })
            };
            writeln!(f, "  {mark} {}{effects}{why}", o.scenario.name())?;
        }
        Ok(())
    }
}
