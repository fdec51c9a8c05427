//! What a call carries as it goes through the runtime's rooms: what became of it so far
//! ([`Track`]), the key it holds ([`Held`]), and the one check every room makes of a record it
//! finds (its fingerprint).

use std::time::Duration;

use tokio::time::Instant;

use crate::context::CallContext;
use crate::error::Error;
use crate::telemetry::CallOutcome;

/// What became of a call, gathered as it runs.
#[derive(Debug)]
pub(crate) struct Track {
    pub(super) outcome: CallOutcome,
    pub(super) replayed: bool,
    pub(super) fence: Option<u64>,
    pub(super) waited: Duration,
    pub(super) attempts: u32,
    /// The store confirmed this call's record (or the value replayed is a stored one).
    pub(super) stored: bool,
}

impl Default for Track {
    fn default() -> Self {
        Track {
            outcome: CallOutcome::Executed,
            replayed: false,
            fence: None,
            waited: Duration::ZERO,
            attempts: 0,
            stored: false,
        }
    }
}

impl Track {
    /// How many acquires were sent.
    pub(crate) fn attempts(&self) -> u32 {
        self.attempts
    }

    /// How long the call waited for another holder.
    pub(crate) fn waited(&self) -> Duration {
        self.waited
    }

    pub(super) fn replayed(&mut self) {
        self.replayed = true;
        self.stored = true;
        self.outcome = if self.waited.is_zero() { CallOutcome::Replayed } else { CallOutcome::WaitedThenReplayed };
    }
}

/// A key this call holds.
pub(super) struct Held {
    /// The key, owner and fence, as the body sees them.
    pub(super) context: CallContext,
    pub(super) lease: Duration,
    /// When the acquire that took the key was sent.
    pub(super) sent: Instant,
    pub(super) fingerprint: Option<String>,
    /// Token mode: when the token expires (its record is kept at least that long).
    pub(super) token_expires: Option<std::time::SystemTime>,
}

impl Held {
    /// Whether the acquire wrote a record that keeps its lease's end (`CommitRequest::lease_in_record`).
    pub(super) fn lease_in_record(&self, call: &crate::call::Call) -> bool {
        call.lapse().keeps_lease_end(self.context.attempt())
    }
}

/// A stored fingerprint differing from the call's: the key was reused for another payload.
pub(super) fn check_fingerprint(key: &str, theirs: Option<&str>, ours: Option<&str>) -> Result<(), Error> {
    match (theirs, ours) {
        (Some(theirs), Some(ours)) if theirs != ours => Err(Error::KeyReused { key: key.to_owned() }),
        _ => Ok(()),
    }
}
