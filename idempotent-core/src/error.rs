//! Errors: what a call can fail with, each naming the key it is about.

use std::fmt;
use std::time::Duration;

/// Everything a call through the runtime can fail with.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use idempotency::{Call, Error, Idempotency, MemoryStore};
///
/// #[derive(Debug)]
/// enum AppError { Busy, Other(Error) }
/// impl From<Error> for AppError {
///     fn from(e: Error) -> Self {
///         match e {
///             Error::Conflict { .. } => AppError::Busy, // answer 409, retry later
///             other => AppError::Other(other),
///         }
///     }
/// }
/// let idem = Idempotency::new(MemoryStore::new());
/// let r: Result<u8, AppError> = idem.run(Call::new(""), || async { Ok(1) }).await;
/// assert!(matches!(r, Err(AppError::Other(Error::InvalidKey { .. }))));
/// # }
/// ```
///
/// Every variant names the key it is about (the full key: scope and key, see
/// [`Call`](crate::Call)); [`Error::key`] returns it. The function wrapped by the runtime returns
/// its own error type, which must implement `From<idempotency::Error>`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Another call holds the key in progress, and the policy is to reject (the default).
    #[error("key {}: another call holds it in progress", shown(key))]
    Conflict {
        /// The key.
        key: String,
        /// How long until the holder's lease runs out unless it is renewed, when the store said:
        /// the longest a holder that crashed can keep the key (a live holder renews its lease,
        /// and usually finishes far sooner).
        retry_after: Option<Duration>,
    },
    /// The key has completed before and the policy is to reject duplicates, or its stored result
    /// is not replayable (it was larger than the limit, or did not serialize).
    #[error("key {}: already completed{}", shown(key), if *replayable { "" } else { " (its result is not replayable)" })]
    Duplicate {
        /// The key.
        key: String,
        /// Whether the stored result could have been replayed under the replay policy.
        replayable: bool,
    },
    /// The key was used before with a different payload (its fingerprint differs).
    #[error("key {}: reused with a different payload (fingerprint mismatch)", shown(key))]
    KeyReused {
        /// The key.
        key: String,
    },
    /// Token mode: the token is not one this runtime's keys signed for the call's scope (made
    /// up, tampered with, issued for another scope or with a key no longer accepted), or it has
    /// expired. Decided without a store command.
    #[error("key {}: not a valid token (not issued for this scope, or expired)", shown(key))]
    InvalidToken {
        /// The key (scope and token).
        key: String,
    },
    /// The wait policy gave up: the key was still in progress after waiting this long.
    #[error("key {}: still in progress after waiting {waited:?}", shown(key))]
    Timeout {
        /// The key.
        key: String,
        /// How long the call waited.
        waited: Duration,
    },
    /// A lock ([`Idempotency::lock`](crate::Idempotency::lock)) is held by another holder:
    /// at once for [`acquire`](crate::LockRequest::acquire), still after `waited` for
    /// [`wait`](crate::LockRequest::wait). A lock is not a guarded call: no result comes of the
    /// other holder, so this is neither a `Conflict` nor a `Timeout`.
    #[error("lock {}: {}", shown(key), LockedFor(*waited))]
    Locked {
        /// The lock's full key (scope and key).
        key: String,
        /// How long the call waited for the lock, when it waited.
        waited: Option<Duration>,
    },
    /// The lease was lost while the body ran and the call was set to abort on lease loss.
    #[error("key {}: lease lost while the body ran: {reason}", shown(key))]
    LeaseLost {
        /// The key.
        key: String,
        /// What showed the loss.
        reason: String,
    },
    /// The store failed: Redis unreachable, a timeout, a script error.
    #[error("key {}: store error: {source}", shown(key))]
    Store {
        /// The key.
        key: String,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// The body ran and its result was stored, but the store could not confirm it durable: fewer
    /// replicas than required acknowledged the commit (see `RedisStoreBuilder::replica_acks`).
    /// The record stays on the primary: a retry with the same key replays it, unless a failover
    /// lost it.
    #[error("key {}: the body ran and its result was stored, but it is not confirmed durable: {source}", shown(key))]
    Unconfirmed {
        /// The key.
        key: String,
        /// The store's error (kind `Replication`).
        #[source]
        source: StoreError,
    },
    /// A value did not serialize, or stored bytes no longer decode as the result type.
    #[error("key {}: {message}", shown(key))]
    Codec {
        /// The key.
        key: String,
        /// What did not encode or decode, and why.
        message: String,
    },
    /// The key holds something that is not an idempotency record.
    #[error("key {}: {reason}", shown(key))]
    Corrupt {
        /// The key.
        key: String,
        /// What was found.
        reason: String,
    },
    /// No runtime was set with [`init`](crate::init) before a call through the global instance.
    #[error("key {}: no idempotency runtime is configured (call idempotency::init first)", shown(key))]
    NotConfigured {
        /// The key.
        key: String,
    },
    /// The key is empty or too long.
    #[error("key {}: invalid key: {reason}", shown(key))]
    InvalidKey {
        /// The key.
        key: String,
        /// Why it is refused.
        reason: String,
    },
    /// An option of the call is out of range (a zero lease, for example).
    #[error("key {}: invalid call: {reason}", shown(key))]
    InvalidCall {
        /// The key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// `give_up_after(N)`: the key's body failed `attempts` times, the most its policy allows,
    /// and it is not run again until an operator forgets the key or its record's `keep` ends
    /// ([`Idempotency::run_giving_up`](crate::Idempotency::run_giving_up)).
    #[error("key {}: gave up after {attempts} failed attempts; the last failed with: {last_error}", shown(key))]
    GaveUp {
        /// The key.
        key: String,
        /// How many attempts failed.
        attempts: u32,
        /// The last attempt's error, as its `Display` wrote it.
        last_error: String,
    },
    /// `on_crash = hold`: the key's holder stopped mid-body without a commit or a release (its
    /// process died, or it stalled past its lease, or its call was dropped), so whether the
    /// body's effect happened is unknown; the body is not run again until the outcome is
    /// resolved ([`Idempotency::resolve`](crate::Idempotency::resolve), `idempotency resolve`,
    /// or the runtime's resolver) or the record's `keep` ends.
    #[error(
        "key {}: outcome unknown: attempt {attempt}, held by {owner}, stopped without a commit (its lease ended at {}); resolve it before it runs again",
        shown(key),
        crate::utc::Iso8601(*lease_ended)
    )]
    OutcomeUnknown {
        /// The key.
        key: String,
        /// The owner id of the attempt that held it (its last 8 characters carry when it started,
        /// which `idempotency inspect` shows).
        owner: String,
        /// When its lease ended, by the store's clock.
        lease_ended: std::time::SystemTime,
        /// Which attempt of the key it was.
        attempt: u32,
    },
}

impl Error {
    /// The key the error is about.
    pub fn key(&self) -> &str {
        match self {
            Error::Conflict { key, .. }
            | Error::Duplicate { key, .. }
            | Error::KeyReused { key }
            | Error::InvalidToken { key }
            | Error::Timeout { key, .. }
            | Error::Locked { key, .. }
            | Error::LeaseLost { key, .. }
            | Error::Store { key, .. }
            | Error::Unconfirmed { key, .. }
            | Error::Codec { key, .. }
            | Error::Corrupt { key, .. }
            | Error::NotConfigured { key }
            | Error::InvalidKey { key, .. }
            | Error::InvalidCall { key, .. }
            | Error::GaveUp { key, .. }
            | Error::OutcomeUnknown { key, .. } => key,
        }
    }
}

/// The end of a [`Error::Locked`] message.
struct LockedFor(Option<Duration>);

impl fmt::Display for LockedFor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            None => f.write_str("held by another holder"),
            Some(waited) => write!(f, "still held by another holder after waiting {waited:?}"),
        }
    }
}

/// The longest part of a key an error message shows.
const SHOWN_KEY_CHARS: usize = 120;

/// A key as error messages show it: quoted, escaped, and cut short when long.
pub(crate) fn shown(key: &str) -> impl fmt::Display + '_ {
    struct Shown<'a>(&'a str);
    impl fmt::Display for Shown<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let chars = self.0.chars().count();
            if chars <= SHOWN_KEY_CHARS {
                write!(f, "{:?}", self.0)
            } else {
                let head: String = self.0.chars().take(SHOWN_KEY_CHARS).collect();
                write!(f, "{head:?}… ({} bytes)", self.0.len())
            }
        }
    }
    Shown(key)
}

/// What kind of failure a [`StoreError`] is.
///
/// ```
/// use idempotency::{Error, StoreErrorKind};
///
/// /// Whether a caller may retry the same call later.
/// fn retryable(e: &Error) -> bool {
///     match e {
///         Error::Store { source, .. } => {
///             matches!(source.kind(), StoreErrorKind::Unavailable | StoreErrorKind::Timeout)
///         }
///         Error::Conflict { .. } | Error::Timeout { .. } => true,
///         _ => false,
///     }
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The backend could not be reached (connection refused, dropped, not yet reconnected).
    Unavailable,
    /// The store did not answer within its time bound.
    Timeout,
    /// The backend answered with an error that may pass (an out-of-memory refusal, a server
    /// loading its data or busy with a script).
    Backend,
    /// The backend refused the command itself (an argument or script error, like Redis's
    /// `ERR invalid expire time`): sending it again cannot succeed.
    Refused,
    /// The backend's answer did not have the expected shape.
    Reply,
    /// The store's configuration is invalid (a bad URL, a prefix with braces, refused
    /// credentials).
    Config,
    /// Fewer replicas than required acknowledged a write in time (see
    /// `RedisStoreBuilder::replica_acks`).
    Replication,
    /// The database aborted a transaction to keep transactions serializable (a serialization
    /// failure or a deadlock, SQLSTATE 40001 or 40P01): nothing of it stayed, and running it again
    /// may succeed.
    Serialization,
}

impl fmt::Display for StoreErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StoreErrorKind::Unavailable => "unavailable",
            StoreErrorKind::Timeout => "timed out",
            StoreErrorKind::Backend => "backend error",
            StoreErrorKind::Refused => "refused by the backend",
            StoreErrorKind::Reply => "unexpected reply",
            StoreErrorKind::Config => "configuration error",
            StoreErrorKind::Replication => "too few replicas",
            StoreErrorKind::Serialization => "serialization failure",
        })
    }
}

/// A failure of a [`Store`](crate::Store) operation.
#[derive(Debug, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct StoreError {
    kind: StoreErrorKind,
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl StoreError {
    /// Whether the same command may succeed if sent again: the store was unreachable, slow, or
    /// answered with an error that passes (not a refused command, a bad configuration, an
    /// unexpected reply, or replicas that did not acknowledge a write that is already done).
    pub fn may_succeed_later(&self) -> bool {
        matches!(
            self.kind,
            StoreErrorKind::Unavailable
                | StoreErrorKind::Timeout
                | StoreErrorKind::Backend
                | StoreErrorKind::Serialization
        )
    }

    /// A store error of `kind` with a message.
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        StoreError { kind, message: message.into(), source: None }
    }

    /// A copy of this error's kind and message, without its source (which need not be
    /// cloneable): one command's failure told to each item it carried, in a batch.
    ///
    /// ```
    /// use idempotency::{StoreError, StoreErrorKind};
    ///
    /// let e = StoreError::new(StoreErrorKind::Timeout, "no reply within 1s");
    /// let each: Vec<StoreError> = (0..3).map(|_| e.copied()).collect();
    /// assert_eq!(each[2].to_string(), e.to_string());
    /// ```
    pub fn copied(&self) -> StoreError {
        StoreError::new(self.kind, self.message.clone())
    }

    /// Attaches the underlying error.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// The message, without the kind.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The same error with `prefix: ` before its message.
    #[cfg(any(feature = "redis", feature = "postgres"))]
    pub(crate) fn prefixed(mut self, prefix: &str) -> Self {
        self.message = format!("{prefix}: {}", self.message);
        self
    }

    /// A timeout after `after`.
    pub fn timeout(operation: &str, after: Duration) -> Self {
        StoreError::new(StoreErrorKind::Timeout, format!("{operation} got no answer within {after:?}"))
    }

    /// An answer of an unexpected shape.
    pub fn reply(operation: &str, detail: impl fmt::Display) -> Self {
        StoreError::new(StoreErrorKind::Reply, format!("{operation}: {detail}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_key() {
        let e = Error::Conflict { key: "orders:42".into(), retry_after: None };
        assert_eq!(e.to_string(), "key \"orders:42\": another call holds it in progress");
        assert_eq!(e.key(), "orders:42");
    }

    #[test]
    fn long_and_odd_keys_are_shown_short_and_escaped() {
        let long = "k".repeat(10_000);
        let msg = Error::InvalidKey { key: long, reason: "too long".into() }.to_string();
        assert!(msg.len() < 300, "{msg}");
        assert!(msg.contains("(10000 bytes)"), "{msg}");
        let odd = Error::Conflict { key: "a\nb\0c".into(), retry_after: None }.to_string();
        assert!(odd.contains(r#""a\nb\0c""#), "{odd}");
    }
}
