//! What an attempt that does not complete leaves behind: what a lease that runs out makes of a key
//! ([`Lapse`]), the record a failed attempt leaves ([`FailRequest`]: the count of attempts and the
//! last error, or the key given up), and how a key whose outcome is unknown is resolved
//! ([`Resolution`]).
//!
//! ```text
//!   IN_PROGRESS ──fail──▶ RELEASED (attempts, last error; the next acquire takes it as attempt n + 1)
//!        │      ──fail, give up──▶ FAILED (every acquire: gave up)
//!        └── lease ends, Lapse::Hold ──▶ UNKNOWN ──resolve──▶ COMPLETED | RELEASED
//! ```

use std::time::Duration;

use super::RecordState;

/// What a key becomes when its holder's lease runs out without a commit or a release (the
/// holder's process died, or stalled past its lease), asked with each acquire.
///
/// With `Free`, a first attempt's record goes with its lease: the store needs no clock of its
/// own for it (its expiry is the lease). With `Count` and `Hold`, and for every attempt after a
/// failed one, the record keeps its lease's end (by the store's clock) and outlives it by the
/// call's `keep`, so that what the lease's end means is decided by the store, not by the key's
/// disappearance.
///
/// ```
/// use idempotency::store::Lapse;
///
/// assert_eq!(Lapse::default(), Lapse::Free);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Lapse {
    /// The key is free again: the next call runs its body. A first attempt that ends this way
    /// is not counted; a later one is (its record counts the attempts).
    #[default]
    Free,
    /// The key is free again, and the attempt counts as a failed one (`give_up_after`: a body
    /// that crashes its process every time is given up on like one that fails).
    Count,
    /// The key is held: its outcome is unknown (the body may have had its effect before the
    /// holder stopped), and no call runs it again until it is resolved
    /// ([`Store::resolve`](super::Store::resolve)) or the record's `keep` ends.
    Hold,
}

impl Lapse {
    /// Whether an acquire with this lapse, taking the key as its `attempt`, writes a record that
    /// keeps its lease's end (and outlives it by `keep`): every lapse but `Free` does, and so
    /// does every attempt after a failed one.
    ///
    /// ```
    /// use idempotency::store::Lapse;
    ///
    /// assert!(!Lapse::Free.keeps_lease_end(1));
    /// assert!(Lapse::Free.keeps_lease_end(2));
    /// assert!(Lapse::Hold.keeps_lease_end(1));
    /// ```
    pub fn keeps_lease_end(self, attempt: u32) -> bool {
        self != Lapse::Free || attempt > 1
    }

    /// The lapse as the stores' scripts and statements take it: `"0"` free, `"1"` count,
    /// `"2"` hold.
    ///
    /// ```
    /// use idempotency::store::Lapse;
    ///
    /// assert_eq!(Lapse::Hold.code(), "2");
    /// ```
    pub fn code(self) -> &'static str {
        match self {
            Lapse::Free => "0",
            Lapse::Count => "1",
            Lapse::Hold => "2",
        }
    }
}

/// What [`Store::fail`](super::Store::fail) is asked: the owner's attempt failed.
#[derive(Debug, Clone, Copy)]
pub struct FailRequest<'a> {
    /// The full key.
    pub key: &'a str,
    /// The owner that holds it.
    pub owner: &'a str,
    /// Which attempt failed (the acquire said: `AcquireOutcome::Acquired { attempt, .. }`).
    pub attempt: u32,
    /// The failure, as the body's error's `Display` wrote it (cut to
    /// [`MAX_ERROR_BYTES`] by the runtime).
    pub error: &'a str,
    /// How long the record of the failure is kept; zero keeps nothing (the key is released).
    pub keep: Duration,
    /// This failure gives up on the key (`give_up_after(N)`, the N-th): the key becomes FAILED,
    /// and every later acquire reports `GaveUp`. Otherwise it becomes RELEASED: the next acquire
    /// takes it as the next attempt.
    pub give_up: bool,
    /// The payload's fingerprint, kept with a key given up (a call with another payload is
    /// `KeyReused`, as on a completed key).
    pub fingerprint: Option<&'a str>,
}

/// The most bytes of a failure's text a record keeps.
pub const MAX_ERROR_BYTES: usize = 1024;

/// `error` cut to [`MAX_ERROR_BYTES`] on a character boundary.
pub(crate) fn error_text(error: &str) -> &str {
    if error.len() <= MAX_ERROR_BYTES {
        return error;
    }
    let mut end = MAX_ERROR_BYTES;
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    &error[..end]
}

/// How a key whose outcome is unknown is resolved ([`Store::resolve`](super::Store::resolve)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution<'a> {
    /// The body's effect happened: the key is completed with this result (JSON bytes of the
    /// call's `Ok` value; `None`: completed, not replayable), kept for the record's `keep`.
    Completed(Option<&'a [u8]>),
    /// The effect did not happen: the key is released (its attempt counted), and the next call
    /// runs the body.
    Release,
}

/// What [`Store::resolve`](super::Store::resolve) did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// The unknown record was resolved as asked.
    Done,
    /// There is no record (it was resolved and forgotten, or its `keep` ended).
    Absent,
    /// The record is not unknown: another resolution or its holder's late commit came first, or
    /// the key was never held (this state); nothing changed.
    NotUnknown(RecordState),
    /// The holder's lease has not ended: it may still commit or release. Nothing changed.
    Running,
    /// The key holds something that is not an idempotency record: nothing changed.
    Corrupt {
        /// What was found.
        reason: String,
    },
}

/// What a failed attempt's record says when the store wrote it for an attempt whose lease ran out
/// (`Lapse::Count`): no error of the body's came back.
pub const LAPSED: &str = "the attempt's lease ran out before it committed or released the key";

/// What the record of an unknown outcome resolved as not done says ([`Resolution::Release`]).
pub const RESOLVED_RELEASED: &str = "released by a resolution: its outcome was unknown";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_errors_are_cut_on_a_character_boundary() {
        assert_eq!(error_text("short"), "short");
        let long = "é".repeat(MAX_ERROR_BYTES);
        let cut = error_text(&long);
        assert!(cut.len() <= MAX_ERROR_BYTES && cut.len() >= MAX_ERROR_BYTES - 1, "{}", cut.len());
        assert!(cut.chars().all(|c| c == 'é'));
    }
}
