//! What a call leaves behind for the people running it: a `tracing` span per call with its
//! outcome, events for each transition, and (feature `metrics`) counters, histograms and gauges
//! through the `metrics` facade. Keys are redacted unless the process opts in: a log line shows a
//! short stable hash of the key (the same in every process, so lines about one key match), never
//! the key itself, which may carry a transaction id, an e-mail or an account number.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};

/// Whether log lines and spans show full keys.
static FULL_KEYS: AtomicBool = AtomicBool::new(false);

/// Shows full keys in log lines and spans from now on (`true`), or their redacted form (the
/// default). Process-wide: it also covers what the stores log. Errors returned to the caller
/// always name the full key.
pub fn log_full_keys(full: bool) {
    FULL_KEYS.store(full, Ordering::Relaxed);
}

/// A key as log lines show it: `#` and 8 hex digits of a hash of it (redacted, the default), or
/// the key itself after [`log_full_keys`]`(true)`.
///
/// ```
/// use idempotency::telemetry::logged_key;
///
/// let shown = logged_key("pay:stripe:txn_1").to_string();
/// assert!(shown.starts_with('#') && shown.len() == 9 && !shown.contains("txn_1"));
/// assert_eq!(shown, logged_key("pay:stripe:txn_1").to_string()); // stable: lines about one key match
/// ```
pub fn logged_key(key: &str) -> LoggedKey<'_> {
    LoggedKey(key)
}

/// A key as log lines show it; see [`logged_key`].
#[derive(Clone, Copy)]
pub struct LoggedKey<'a>(&'a str);

impl fmt::Display for LoggedKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if FULL_KEYS.load(Ordering::Relaxed) {
            return f.write_str(self.0);
        }
        let hash = Sha256::digest(self.0.as_bytes());
        write!(f, "#{:02x}{:02x}{:02x}{:02x}", hash[0], hash[1], hash[2], hash[3])
    }
}

impl fmt::Debug for LoggedKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// An error as log lines show it: its message, with the key it names redacted like
/// [`logged_key`] (unless [`log_full_keys`] is on).
///
/// ```
/// use idempotency::telemetry::logged_error;
/// use idempotency::Error;
///
/// let e = Error::Conflict { key: "pay:txn_1".into(), retry_after: None };
/// let line = logged_error(&e).to_string();
/// assert!(line.contains("another call holds it") && !line.contains("txn_1"));
/// ```
pub fn logged_error(error: &crate::Error) -> LoggedError<'_> {
    LoggedError(error)
}

/// An error as log lines show it; see [`logged_error`].
#[derive(Clone, Copy)]
pub struct LoggedError<'a>(&'a crate::Error);

impl fmt::Display for LoggedError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let message = self.0.to_string();
        let key = self.0.key();
        if FULL_KEYS.load(Ordering::Relaxed) || key.is_empty() {
            return f.write_str(&message);
        }
        // Every message opens with the key as `shown` writes it.
        let shown = crate::error::shown(key).to_string();
        match message.strip_prefix("key ").and_then(|rest| rest.strip_prefix(shown.as_str())) {
            Some(rest) => write!(f, "key {}{rest}", logged_key(key)),
            None => write!(f, "key {}: {}", logged_key(key), message.replace(key, "…")),
        }
    }
}

impl fmt::Debug for LoggedError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// How a guarded call ended, as its span's `outcome` field and the `outcome` label of
/// `idempotency_calls_total` say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CallOutcome {
    /// The body ran and its result was stored.
    Executed,
    /// A stored result was returned; the body did not run.
    Replayed,
    /// The call waited for another holder, then replayed its result.
    WaitedThenReplayed,
    /// The call waited for another holder, which failed; then the body ran.
    WaitedThenExecuted,
    /// Another call held the key (`Error::Conflict`).
    Conflict,
    /// A completed key under `on_duplicate = reject`, or a result not replayable
    /// (`Error::Duplicate`).
    Duplicate,
    /// The wait for another holder ran out (`Error::Timeout`).
    Timeout,
    /// The key was used before with another payload (`Error::KeyReused`).
    KeyReused,
    /// Token mode: not a valid token (`Error::InvalidToken`).
    InvalidToken,
    /// The key or an option was refused (`Error::InvalidKey`, `Error::InvalidCall`).
    Invalid,
    /// The lease was lost while the body ran (`Error::LeaseLost`).
    LeaseLost,
    /// The store failed (`Error::Store`, `Error::Unconfirmed`, `Error::NotConfigured`).
    StoreError,
    /// A stored record or a result could not be read or written (`Error::Codec`,
    /// `Error::Corrupt`).
    CodecError,
    /// The body returned `Err`: the key was released.
    BodyError,
    /// The body panicked: the key was released (or, under `on_crash = hold`, left to its
    /// lease).
    Panicked,
    /// The key gave up after its failed attempts (`Error::GaveUp`).
    GaveUp,
    /// The key's outcome is unknown (`Error::OutcomeUnknown`).
    OutcomeUnknown,
}

/// How many outcomes there are.
#[cfg(feature = "metrics")]
const OUTCOMES: usize = CallOutcome::OutcomeUnknown as usize + 1;

impl CallOutcome {
    /// The outcome's name in spans and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            CallOutcome::Executed => "executed",
            CallOutcome::Replayed => "replayed",
            CallOutcome::WaitedThenReplayed => "waited_then_replayed",
            CallOutcome::WaitedThenExecuted => "waited_then_executed",
            CallOutcome::Conflict => "conflict",
            CallOutcome::Duplicate => "duplicate",
            CallOutcome::Timeout => "timeout",
            CallOutcome::KeyReused => "key_reused",
            CallOutcome::InvalidToken => "invalid_token",
            CallOutcome::Invalid => "invalid",
            CallOutcome::LeaseLost => "lease_lost",
            CallOutcome::StoreError => "store_error",
            CallOutcome::CodecError => "codec_error",
            CallOutcome::BodyError => "body_error",
            CallOutcome::Panicked => "panicked",
            CallOutcome::GaveUp => "gave_up",
            CallOutcome::OutcomeUnknown => "outcome_unknown",
        }
    }

    /// The outcome of a call that failed with `error`.
    pub(crate) fn of_error(error: &crate::Error) -> CallOutcome {
        use crate::Error;
        match error {
            Error::Conflict { .. } => CallOutcome::Conflict,
            Error::Duplicate { .. } => CallOutcome::Duplicate,
            Error::KeyReused { .. } => CallOutcome::KeyReused,
            Error::InvalidToken { .. } => CallOutcome::InvalidToken,
            Error::Timeout { .. } => CallOutcome::Timeout,
            Error::LeaseLost { .. } => CallOutcome::LeaseLost,
            Error::InvalidKey { .. } | Error::InvalidCall { .. } => CallOutcome::Invalid,
            Error::Codec { .. } | Error::Corrupt { .. } => CallOutcome::CodecError,
            Error::GaveUp { .. } => CallOutcome::GaveUp,
            Error::OutcomeUnknown { .. } => CallOutcome::OutcomeUnknown,
            _ => CallOutcome::StoreError,
        }
    }
}

impl fmt::Display for CallOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How taking a lock ([`Idempotency::lock`](crate::Idempotency::lock)) ended, as the
/// `idempotent.lock` span's `outcome` field and the `outcome` label of `idempotency_locks_total`
/// say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockOutcome {
    /// The lock was free and is taken.
    Taken,
    /// The lock was held; the call waited for it and took it.
    WaitedThenTaken,
    /// The lock is held by another holder (`Error::Locked`, from `acquire`).
    Held,
    /// The lock was still held when the patience ran out (`Error::Locked`, from `wait`).
    Timeout,
    /// The key or the lease was refused (`Error::InvalidKey`, `Error::InvalidCall`).
    Invalid,
    /// The store failed (`Error::Store`), or the acquire's reply came later than the lease.
    StoreError,
    /// The key holds something that is not a record (`Error::Corrupt`).
    CodecError,
}

impl LockOutcome {
    /// The outcome's name in spans and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            LockOutcome::Taken => "taken",
            LockOutcome::WaitedThenTaken => "waited_then_taken",
            LockOutcome::Held => "held",
            LockOutcome::Timeout => "timeout",
            LockOutcome::Invalid => "invalid",
            LockOutcome::StoreError => "store_error",
            LockOutcome::CodecError => "codec_error",
        }
    }

    /// The outcome of taking a lock that failed with `error`.
    pub(crate) fn of_error(error: &crate::Error) -> LockOutcome {
        use crate::Error;
        match error {
            Error::Locked { waited: None, .. } => LockOutcome::Held,
            Error::Locked { waited: Some(_), .. } => LockOutcome::Timeout,
            Error::InvalidKey { .. } | Error::InvalidCall { .. } => LockOutcome::Invalid,
            Error::Codec { .. } | Error::Corrupt { .. } => LockOutcome::CodecError,
            _ => LockOutcome::StoreError,
        }
    }
}

impl fmt::Display for LockOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `scope` label of a call's metrics: its scope up to the first `:` that is not part of a
/// `::` (`orders`, `my_crate::payments::pay`, `http`, `token`), so that a scope carrying a
/// client id (the HTTP layer's `http:key:<client>`) does not make the label unbounded.
pub(crate) fn scope_label(scope: Option<&str>) -> &str {
    let Some(scope) = scope else { return "" };
    let bytes = scope.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b':' {
            if bytes.get(i + 1) == Some(&b':') {
                i += 2;
                continue;
            }
            return &scope[..i];
        }
        i += 1;
    }
    scope
}

/// Describes the metrics (unit and help text) to the installed `metrics` recorder: an exporter
/// such as Prometheus shows them as `# HELP` lines, and has the runtime ask the recorder for its
/// handles again (each thread keeps the ones it got). Every
/// [`IdempotencyBuilder::build`](crate::IdempotencyBuilder::build) does it; call it yourself if
/// you install the recorder after building the runtime. Without the `metrics` feature, nothing.
pub fn describe_metrics() {
    record::refresh();
    #[cfg(feature = "metrics")]
    {
        use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
        describe_counter!("idempotency_calls_total", Unit::Count, "Guarded calls, by outcome and scope.");
        describe_histogram!(
            "idempotency_acquire_seconds",
            Unit::Seconds,
            "Time from sending an acquire to its answer (one per round trip)."
        );
        describe_counter!("idempotency_locks_total", Unit::Count, "Locks taken or refused, by outcome and scope.");
        describe_histogram!("idempotency_body_seconds", Unit::Seconds, "Time the guarded body ran.");
        describe_histogram!(
            "idempotency_wait_seconds",
            Unit::Seconds,
            "Time a call waited for another holder of its key (on_conflict = wait)."
        );
        describe_histogram!("idempotency_commit_seconds", Unit::Seconds, "Time to store a result, retries included.");
        describe_gauge!("idempotency_leases_held", Unit::Count, "Leases held by calls and locks in this process.");
        describe_counter!(
            "idempotency_renewals_total",
            Unit::Count,
            "Lease renewals: renewed, refused (the lease was lost), failed (the store failed; retried)."
        );
        describe_counter!(
            "idempotency_replay_cache_lookups_total",
            Unit::Count,
            "Replay cache lookups, by result (hit, miss)."
        );
        describe_gauge!(
            "idempotency_replay_cache_entries",
            Unit::Count,
            "Results held by replay caches in this process."
        );
        describe_gauge!(
            "idempotency_background_tasks",
            Unit::Count,
            "Store work going on after its caller gave up or returned: background releases and commits."
        );
        describe_counter!(
            "idempotency_resolutions_total",
            Unit::Count,
            "Unknown outcomes (on_crash = hold) resolved, by what became of them (completed, not_done, still_unknown, failed) and by whom (resolver, operator)."
        );
        describe_counter!(
            "idempotency_background_dropped_total",
            Unit::Count,
            "Background releases and commits not started because 10,000 were in flight (an outage): the key frees itself when its lease ends."
        );
    }
}

/// The metrics, through the `metrics` facade (feature `metrics`; without it, nothing). Names and
/// labels are listed in `docs/observability.md`.
///
/// Asking the recorder for a handle (`counter!`) builds a key, hashes it and looks it up under
/// the recorder's lock: a few hundred nanoseconds, which would more than add a third to a replay
/// answered from the in-process cache. So each thread keeps the handles it got, and asks again
/// only when [`describe_metrics`] has run since (every runtime's `build` runs it): a recorder
/// installed before the runtime is built, or followed by a call to `describe_metrics`, is the
/// one recorded to.
#[cfg(feature = "metrics")]
pub(crate) mod record {
    use std::cell::RefCell;
    use std::collections::HashMap;
    use std::sync::atomic::AtomicU64;

    use metrics::{Counter, Gauge, Histogram};

    use super::*;

    /// Bumped by [`describe_metrics`]: handles got before are asked for again.
    static EPOCH: AtomicU64 = AtomicU64::new(0);

    /// The most scopes a thread keeps handles for (scopes are chosen by code: a few dozen).
    const MAX_SCOPES: usize = 1024;

    pub(crate) fn refresh() {
        EPOCH.fetch_add(1, Ordering::Relaxed);
    }

    /// One thread's handles.
    #[derive(Default)]
    struct Handles {
        epoch: u64,
        /// Hashed with foldhash, once per call: SipHash's two lookups were half of what a call's
        /// counting cost.
        calls: HashMap<Box<str>, [Option<Counter>; OUTCOMES], foldhash::fast::RandomState>,
        hit: Option<Counter>,
        miss: Option<Counter>,
        acquire: Option<Histogram>,
        body: Option<Histogram>,
        wait: Option<Histogram>,
        commit: Option<Histogram>,
        leases: Option<Gauge>,
        entries: Option<Gauge>,
    }

    thread_local! {
        static HANDLES: RefCell<Handles> = RefCell::new(Handles::default());
    }

    /// Runs `f` on this thread's handles, emptied first if the recorder may have changed.
    fn with<T>(f: impl FnOnce(&mut Handles) -> T) -> T {
        let epoch = EPOCH.load(Ordering::Relaxed);
        HANDLES.with_borrow_mut(|h| {
            if h.epoch != epoch {
                *h = Handles { epoch, ..Handles::default() };
            }
            f(h)
        })
    }

    pub(crate) fn call(outcome: CallOutcome, scope: &str) {
        with(|h| {
            let counters = match h.calls.get_mut(scope) {
                Some(counters) => counters,
                None => {
                    if h.calls.len() >= MAX_SCOPES {
                        h.calls.clear();
                    }
                    h.calls.entry(scope.into()).or_default()
                }
            };
            counters[outcome as usize]
                .get_or_insert_with(|| {
                    metrics::counter!("idempotency_calls_total", "outcome" => outcome.as_str(), "scope" => scope.to_owned())
                })
                .increment(1);
        })
    }

    /// A lock taken or refused. Not cached per thread as calls are: a lock is taken far less
    /// often than a call is made.
    pub(crate) fn lock(outcome: LockOutcome, scope: &str) {
        metrics::counter!("idempotency_locks_total", "outcome" => outcome.as_str(), "scope" => scope.to_owned())
            .increment(1);
    }

    fn histogram(slot: fn(&mut Handles) -> &mut Option<Histogram>, name: &'static str, took: Duration) {
        with(|h| slot(h).get_or_insert_with(|| metrics::histogram!(name)).record(took.as_secs_f64()))
    }

    pub(crate) fn acquire(took: Duration) {
        histogram(|h| &mut h.acquire, "idempotency_acquire_seconds", took)
    }

    pub(crate) fn body(took: Duration) {
        histogram(|h| &mut h.body, "idempotency_body_seconds", took)
    }

    pub(crate) fn wait(took: Duration) {
        histogram(|h| &mut h.wait, "idempotency_wait_seconds", took)
    }

    pub(crate) fn commit(took: Duration) {
        histogram(|h| &mut h.commit, "idempotency_commit_seconds", took)
    }

    /// Leases held by calls and locks in this process, as they are taken (`+1`) and let go
    /// (`-1`): a gauge shared by every runtime in the process.
    pub(crate) fn leases_held(delta: f64) {
        with(|h| h.leases.get_or_insert_with(|| metrics::gauge!("idempotency_leases_held")).increment(delta))
    }

    pub(crate) fn renewals(result: &'static str, n: usize) {
        if n == 0 {
            return;
        }
        metrics::counter!("idempotency_renewals_total", "result" => result).increment(n as u64);
    }

    pub(crate) fn cache(hit: bool) {
        with(|h| {
            let (slot, result) = if hit { (&mut h.hit, "hit") } else { (&mut h.miss, "miss") };
            slot.get_or_insert_with(|| metrics::counter!("idempotency_replay_cache_lookups_total", "result" => result))
                .increment(1)
        })
    }

    /// Entries in the replay caches of this process, as they come (`+n`) and go (`-n`).
    pub(crate) fn cache_entries(delta: f64) {
        with(|h| h.entries.get_or_insert_with(|| metrics::gauge!("idempotency_replay_cache_entries")).increment(delta))
    }

    /// Background store work (releases, commits) of callers that gave up or returned, as it
    /// starts (`+1`) and ends (`-1`).
    pub(crate) fn background(delta: f64) {
        metrics::gauge!("idempotency_background_tasks").increment(delta)
    }

    /// Background work of kind `what` not started: the bound was reached.
    pub(crate) fn background_dropped(what: &'static str) {
        metrics::counter!("idempotency_background_dropped_total", "what" => what).increment(1)
    }

    /// An unknown outcome resolved (`how`: completed, not_done, still_unknown, failed) by `by`
    /// (resolver, operator).
    pub(crate) fn resolution(how: &'static str, by: &'static str) {
        metrics::counter!("idempotency_resolutions_total", "how" => how, "by" => by).increment(1)
    }
}

/// Without the `metrics` feature: nothing.
#[cfg(not(feature = "metrics"))]
#[allow(unused_variables)]
pub(crate) mod record {
    use super::*;

    #[inline(always)]
    pub(crate) fn refresh() {}
    #[inline(always)]
    pub(crate) fn call(outcome: CallOutcome, scope: &str) {}
    #[inline(always)]
    pub(crate) fn lock(outcome: LockOutcome, scope: &str) {}
    #[inline(always)]
    pub(crate) fn acquire(took: Duration) {}
    #[inline(always)]
    pub(crate) fn body(took: Duration) {}
    #[inline(always)]
    pub(crate) fn wait(took: Duration) {}
    #[inline(always)]
    pub(crate) fn commit(took: Duration) {}
    #[inline(always)]
    pub(crate) fn leases_held(delta: f64) {}
    #[inline(always)]
    pub(crate) fn renewals(result: &'static str, n: usize) {}
    #[inline(always)]
    pub(crate) fn cache(hit: bool) {}
    #[inline(always)]
    pub(crate) fn cache_entries(delta: f64) {}
    #[inline(always)]
    pub(crate) fn background(delta: f64) {}
    #[inline(always)]
    pub(crate) fn background_dropped(what: &'static str) {}

    pub(crate) fn resolution(how: &'static str, by: &'static str) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_labels_are_bounded() {
        assert_eq!(scope_label(Some("orders")), "orders");
        assert_eq!(scope_label(Some("my_crate::payments::pay")), "my_crate::payments::pay");
        assert_eq!(scope_label(Some("http:key:5:alice")), "http");
        assert_eq!(scope_label(Some("a::b:c")), "a::b");
        assert_eq!(scope_label(None), "");
    }
}
