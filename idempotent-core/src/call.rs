//! `Call`: one guarded call's key and policies, built with chained setters.

use std::time::Duration;

use serde::Serialize;

use crate::codec::{self, MAX_FINGERPRINT_BYTES};
use crate::error::Error;
use crate::key::KeyBuilder;
use crate::store::Lapse;

/// The most attempts `give_up_after` accepts.
pub const MAX_ATTEMPTS: u32 = 1000;

/// Parameter mode (the key comes from the call's arguments) or token mode (the key is a
/// one-time token issued beforehand).
///
/// ```
/// use idempotency::{Call, Mode};
///
/// let by_params = Call::new("order:42"); // Mode::Param
/// let by_token = Call::new("<token from the form>").mode(Mode::Token); // Call::token(..) alike
/// assert_eq!(by_token.full_key(), "token:<token from the form>");
/// # let _ = by_params;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// The key is built from the call's parameters; an absent key is acquired.
    #[default]
    Param,
    /// The key is a token from [`issue_token`](crate::Idempotency::issue_token): checked before
    /// anything else (a forged, tampered, expired or other-scope token is
    /// [`InvalidToken`](crate::Error::InvalidToken) without a store command), and its record is
    /// kept until the token expires, so a used token is never run again.
    Token,
}

/// The longest key (scope included) a call accepts, in bytes.
pub const MAX_KEY_BYTES: usize = 1024;

/// The shortest lease a call accepts: below it, renewals could not keep up.
pub const MIN_LEASE: Duration = Duration::from_millis(10);

/// The longest lease, `keep`, wait or token lifetime accepted (100 years of 365 days): far past
/// any use, and short enough for every store's expiry arithmetic (Redis's `PX` after the
/// server's clock, a monotonic instant plus it). A longer one is [`Error::InvalidCall`] before
/// the body runs; the runtime's defaults are capped at it.
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// What a call does when it finds its key completed.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use idempotency::{Call, Error, Idempotency, MemoryStore, OnDuplicate};
///
/// let idem = Idempotency::new(MemoryStore::new());
/// let call = || Call::new("signup:ann@example.com").on_duplicate(OnDuplicate::Reject);
/// let first: Result<u8, Error> = idem.run(call(), || async { Ok(1) }).await;
/// let again: Result<u8, Error> = idem.run(call(), || async { Ok(2) }).await;
/// assert!(first.is_ok() && matches!(again, Err(Error::Duplicate { .. })));
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnDuplicate {
    /// Return the stored result without running the body (idempotency). The default.
    #[default]
    Replay,
    /// Fail with [`Error::Duplicate`] (anti-duplicate).
    Reject,
}

/// What a call does when another call holds its key in progress.
///
/// ```
/// use std::time::Duration;
/// use idempotency::{Call, OnConflict};
///
/// // A retry that arrives while the first attempt runs waits for its result (up to 5 s).
/// let call = Call::new("refund:17").on_conflict(OnConflict::Wait(Duration::from_secs(5)));
/// # let _ = call;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnConflict {
    /// Fail at once with [`Error::Conflict`]. The default.
    #[default]
    Reject,
    /// Wait up to this long for the holder to finish, then act on what it left: replay its
    /// result, or run the body if it failed. [`Error::Timeout`] if it is still running.
    Wait(Duration),
}

/// What becomes of a key whose holder stops mid-body without a word: its process dies, it is
/// paused past its lease, its call is dropped or its body panics. The body may have had its
/// effect (called the payment provider) or not.
///
/// ```
/// use idempotency::{Call, OnCrash};
///
/// // A payout whose holder died mid-body is not paid again until someone checks.
/// let call = Call::new("payout:981").scope("payouts").on_crash(OnCrash::Hold);
/// # let _ = call;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnCrash {
    /// The key is free again (after the lease, for a process that died; at once, for a dropped
    /// call or a panic): the next call runs the body. The default: right when running the body
    /// twice is harmless or its effect is checked downstream (the fence).
    #[default]
    Rerun,
    /// The key is held: once the lease ends without a commit, calls get
    /// [`Error::OutcomeUnknown`](crate::Error::OutcomeUnknown) and the body does not run again
    /// until the outcome is resolved: by an operator (`idempotency resolve`,
    /// [`Idempotency::resolve`](crate::Idempotency::resolve)) or by the runtime's resolver
    /// ([`IdempotencyBuilder::resolver`](crate::IdempotencyBuilder::resolver)), or until the
    /// record's `keep` ends. A body's `Err` still releases the key (the body says it failed).
    /// Right for a withdrawal or a payout: never run twice on a guess.
    Hold,
}

/// One guarded call: its key and the policies it runs under.
///
/// The full key is `scope:key` when a scope is set; in token mode without a scope it is
/// `token:<token>`, where [`issue_token`](crate::Idempotency::issue_token) puts tokens.
///
/// ```
/// use std::time::Duration;
/// use idempotent_core::{Call, OnConflict};
///
/// let call = Call::new("42")
///     .scope("orders::create")
///     .ttl(Duration::from_secs(10))
///     .keep(Duration::from_secs(3600))
///     .on_conflict(OnConflict::Wait(Duration::from_secs(5)));
/// assert_eq!(call.full_key(), "orders::create:42");
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct Call {
    key: String,
    scope: Option<String>,
    pub(crate) mode: Mode,
    pub(crate) ttl: Option<Duration>,
    pub(crate) keep: Option<Duration>,
    pub(crate) on_duplicate: OnDuplicate,
    pub(crate) on_conflict: OnConflict,
    fingerprint: Option<Result<String, codec::FingerprintError>>,
    pub(crate) abort_on_lease_lost: bool,
    pub(crate) renew: bool,
    /// Why the key could not be built (the attribute's template with an empty value): the
    /// runtime refuses the call with it before anything else, recorded like every refused call.
    /// (The template, why.)
    refused: Option<(String, String)>,
    pub(crate) on_crash: OnCrash,
    /// `give_up_after(N)`: the N-th failed attempt gives up on the key.
    pub(crate) give_up_after: Option<u32>,
}

impl Call {
    /// A call in parameter mode on `key`, used as it is: in no scope unless
    /// [`scope`](Self::scope) puts it in one (the attribute's default scope is the function's
    /// module path and name), so two unrelated calls given the same key share one record. A key
    /// made of several values should be built with [`KeyBuilder`](crate::KeyBuilder), which
    /// escapes each value: `format!("{a}:{b}")` gives `x:y` + `z` and `x` + `y:z` the same key.
    pub fn new(key: impl Into<String>) -> Self {
        Call {
            key: key.into(),
            scope: None,
            mode: Mode::Param,
            ttl: None,
            keep: None,
            on_duplicate: OnDuplicate::Replay,
            on_conflict: OnConflict::Reject,
            fingerprint: None,
            abort_on_lease_lost: false,
            renew: true,
            refused: None,
            on_crash: OnCrash::Rerun,
            give_up_after: None,
        }
    }

    /// The call the attribute makes from its key template's builder, in `mode`. A key that
    /// cannot be built (an empty value, as [`KeyBuilder::finish`] says) is not returned early:
    /// the runtime refuses the call as [`Error::InvalidKey`] before anything else, with its span
    /// and its `invalid` outcome like every refused call.
    #[doc(hidden)]
    pub fn from_template(key: KeyBuilder, mode: Mode) -> Self {
        match key.build() {
            Ok(key) => Call::new(key).mode(mode),
            Err(refused) => Call { refused: Some(refused), ..Call::new(String::new()).mode(mode) },
        }
    }

    /// The refusal of a call whose key its template could not build (taken out of it); `Ok`
    /// for every other call.
    pub(crate) fn refusal(&mut self) -> Result<(), Error> {
        match self.refused.take() {
            Some((key, reason)) => Err(Error::InvalidKey { key, reason }),
            None => Ok(()),
        }
    }

    /// A call in token mode on `token`, as issued by
    /// [`issue_token`](crate::Idempotency::issue_token).
    pub fn token(token: impl Into<String>) -> Self {
        Call::new(token).mode(Mode::Token)
    }

    /// Puts the key in a scope: the full key becomes `scope:key`. Two functions whose keys
    /// could coincide keep apart by scope; the attribute scopes by function by default.
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.scope = Some(scope.into());
        self
    }

    /// Parameter or token mode.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// The lease: how long the key stays held if its holder stops renewing it (a crash). While
    /// the body runs, the watchdog renews it every `ttl / 3`. Default: the runtime's (30 s).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How long a completed result is kept (and replayed); zero keeps nothing, for a mutex.
    /// Default: the runtime's (24 h).
    pub fn keep(mut self, keep: Duration) -> Self {
        self.keep = Some(keep);
        self
    }

    /// What to do on a completed key.
    pub fn on_duplicate(mut self, policy: OnDuplicate) -> Self {
        self.on_duplicate = policy;
        self
    }

    /// What to do on a key in progress elsewhere.
    pub fn on_conflict(mut self, policy: OnConflict) -> Self {
        self.on_conflict = policy;
        self
    }

    /// The payload whose fingerprint is stored with the key: a later call with the same key
    /// and a different payload fails with [`Error::KeyReused`]. Hashed from its JSON form, map
    /// keys sorted; a payload whose JSON is over [`MAX_FINGERPRINT_BYTES`] fails the call with
    /// [`Error::InvalidCall`] (hash a digest of it instead).
    pub fn fingerprint<T: Serialize + ?Sized>(mut self, payload: &T) -> Self {
        self.fingerprint = Some(codec::fingerprint(payload));
        self
    }

    /// Like [`fingerprint`](Self::fingerprint), for a payload that is raw bytes in parts (an
    /// HTTP request's method, target and body): hashed as they are, without a JSON form.
    pub fn fingerprint_parts<'a>(mut self, parts: impl IntoIterator<Item = &'a [u8]>) -> Self {
        self.fingerprint = Some(Ok(codec::fingerprint_parts(parts)));
        self
    }

    /// Drop the body and fail with [`Error::LeaseLost`] as soon as the lease is known lost;
    /// by default the body runs on (a warning is logged) and its result is committed only if
    /// no other owner took the key.
    pub fn abort_on_lease_lost(mut self, abort: bool) -> Self {
        self.abort_on_lease_lost = abort;
        self
    }

    /// What becomes of the key if its holder stops mid-body without a word (default:
    /// [`OnCrash::Rerun`]). [`OnCrash::Hold`] needs a store that keeps attempts (memory, Redis,
    /// PostgreSQL) and a `keep` over zero (an unknown outcome is held for `keep` after the lease).
    pub fn on_crash(mut self, policy: OnCrash) -> Self {
        self.on_crash = policy;
        self
    }

    /// Gives up on the key after `attempts` failed attempts, counted across retries and
    /// processes (a body's `Err`, a panic, a lease that ran out): the failures before free the
    /// key for a retry, the `attempts`-th marks it as failed, and every call after it gets
    /// [`Error::GaveUp`](crate::Error::GaveUp) without running the body. The last error's text
    /// is its `Display` through [`Idempotency::run_giving_up`](crate::Idempotency::run_giving_up)
    /// and a batch, its type's name through `run`. 1 to [`MAX_ATTEMPTS`].
    pub fn give_up_after(mut self, attempts: u32) -> Self {
        self.give_up_after = Some(attempts);
        self
    }

    /// What the store is to make of this call's key if its lease runs out.
    pub(crate) fn lapse(&self) -> Lapse {
        match (self.on_crash, self.give_up_after) {
            (OnCrash::Hold, _) => Lapse::Hold,
            (OnCrash::Rerun, Some(_)) => Lapse::Count,
            (OnCrash::Rerun, None) => Lapse::Free,
        }
    }

    /// Whether the watchdog renews the lease while the body runs (default: yes). Without it
    /// the lease bounds the body: a body that outlives it may run twice.
    pub fn renew(mut self, renew: bool) -> Self {
        self.renew = renew;
        self
    }

    /// The full key: `scope:key`, or `token:key` in token mode without a scope.
    pub fn full_key(&self) -> String {
        match self.key_prefix() {
            Some(prefix) => format!("{prefix}:{}", self.key),
            None => self.key.clone(),
        }
    }

    /// The call's scope as spans and metrics show it: what goes before the key in the full key.
    pub(crate) fn scope_str(&self) -> Option<&str> {
        self.key_prefix()
    }

    /// What goes before the key in the full key, if anything.
    fn key_prefix(&self) -> Option<&str> {
        match (&self.scope, self.mode) {
            (Some(scope), _) => Some(scope),
            (None, Mode::Token) => Some("token"),
            (None, Mode::Param) => None,
        }
    }

    /// The scope a token of this call is signed for: the call's scope, or `token`.
    pub(crate) fn token_scope(&self) -> &str {
        self.scope.as_deref().unwrap_or("token")
    }

    /// The key as given (a token, in token mode).
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// Replaces the key (a verified token by the part of it that names its record).
    pub(crate) fn set_key(&mut self, key: String) {
        self.key = key;
    }

    /// Checks the call like [`validate`](Self::validate) and takes the full key out of it: moved,
    /// not copied, when it is the key alone. The call keeps its policies.
    pub(crate) fn take_key(&mut self, lease: Duration) -> Result<(String, Option<String>), Error> {
        if self.key_prefix().is_some() {
            let key = self.full_key();
            let fingerprint = self.validate(&key, lease)?;
            return Ok((key, fingerprint));
        }
        let fingerprint = self.validate(&self.key, lease)?;
        Ok((std::mem::take(&mut self.key), fingerprint))
    }

    /// Checks the key's size and computes the fingerprint.
    pub(crate) fn validate(&self, full_key: &str, lease: Duration) -> Result<Option<String>, Error> {
        if self.key.is_empty() {
            let reason = if self.mode == Mode::Token { "the token is empty" } else { "the key is empty" };
            return Err(Error::InvalidKey { key: full_key.to_owned(), reason: reason.into() });
        }
        if full_key.len() > MAX_KEY_BYTES {
            return Err(Error::InvalidKey {
                key: full_key.to_owned(),
                reason: format!("{} bytes, over the {MAX_KEY_BYTES}-byte limit", full_key.len()),
            });
        }
        if lease < MIN_LEASE {
            return Err(Error::InvalidCall {
                key: full_key.to_owned(),
                reason: format!("the lease (ttl) is {lease:?}, under the {MIN_LEASE:?} minimum"),
            });
        }
        let too_long = |what: &str, d: Duration| Error::InvalidCall {
            key: full_key.to_owned(),
            reason: format!("{what} is {d:?}, over the {MAX_DURATION:?} maximum (MAX_DURATION)"),
        };
        if lease > MAX_DURATION {
            return Err(too_long("the lease (ttl)", lease));
        }
        if let Some(keep) = self.keep.filter(|k| *k > MAX_DURATION) {
            return Err(too_long("keep", keep));
        }
        if let OnConflict::Wait(patience) = self.on_conflict {
            check_patience(full_key, patience)?;
        }
        if let Some(attempts) = self.give_up_after {
            if attempts == 0 || attempts > MAX_ATTEMPTS {
                return Err(Error::InvalidCall {
                    key: full_key.to_owned(),
                    reason: format!("give_up_after({attempts}): the attempts must be 1 to {MAX_ATTEMPTS}"),
                });
            }
        }
        match &self.fingerprint {
            None => Ok(None),
            Some(Ok(fp)) => Ok(Some(fp.clone())),
            Some(Err(codec::FingerprintError::Codec(message))) => {
                Err(Error::Codec { key: full_key.to_owned(), message: message.clone() })
            }
            Some(Err(codec::FingerprintError::TooLarge)) => Err(Error::InvalidCall {
                key: full_key.to_owned(),
                reason: format!("the fingerprint payload is over {MAX_FINGERPRINT_BYTES} bytes of JSON"),
            }),
        }
    }
}

/// Checks a wait's patience against [`MAX_DURATION`].
pub(crate) fn check_patience(full_key: &str, patience: Duration) -> Result<(), Error> {
    if patience > MAX_DURATION {
        return Err(Error::InvalidCall {
            key: full_key.to_owned(),
            reason: format!("the wait is {patience:?}, over the {MAX_DURATION:?} maximum (MAX_DURATION)"),
        });
    }
    Ok(())
}

/// Checks a lock's key (`key` as given, `full_key` with its scope) and lease, as a call's.
pub(crate) fn check_lock_key(full_key: &str, key: &str, lease: Duration) -> Result<(), Error> {
    Call::new(key).validate(full_key, lease).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_keys() {
        assert_eq!(Call::new("a").full_key(), "a");
        assert_eq!(Call::new("a").scope("s").full_key(), "s:a");
        assert_eq!(Call::token("t").full_key(), "token:t");
        assert_eq!(Call::token("t").scope("s").full_key(), "s:t");
    }

    #[test]
    fn bad_input_is_named() {
        let lease = Duration::from_secs(1);
        let e = Call::new("").scope("s").validate("s:", lease).unwrap_err();
        assert!(matches!(e, Error::InvalidKey { .. }), "{e}");
        let long = "x".repeat(MAX_KEY_BYTES + 1);
        assert!(matches!(Call::new(&long).validate(&long, lease), Err(Error::InvalidKey { .. })));
        assert!(matches!(Call::new("k").validate("k", Duration::ZERO), Err(Error::InvalidCall { .. })));
        let max = Duration::MAX;
        assert!(matches!(Call::new("k").validate("k", max), Err(Error::InvalidCall { .. })));
        assert!(matches!(Call::new("k").keep(max).validate("k", lease), Err(Error::InvalidCall { .. })));
        let waits = Call::new("k").on_conflict(OnConflict::Wait(max));
        assert!(matches!(waits.validate("k", lease), Err(Error::InvalidCall { .. })));
        assert!(Call::new("k").keep(MAX_DURATION).validate("k", MAX_DURATION).is_ok());
    }
}
