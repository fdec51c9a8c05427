//! Token mode's side of the runtime: issuing tokens, checking a call's token before anything
//! else, and the clock both go by.

use std::time::Duration;

use tokio::time::Instant;

use crate::call::Call;
use crate::error::Error;

use super::Idempotency;

/// The time tokens are issued and checked by: the system's clock, or, if it is behind, the time
/// the runtime's monotonic clock (tokio's) has counted since the runtime was built. Records
/// expire by the monotonic clock; a token must never be valid while its record has expired, also
/// under tokio's paused clock in a user's tests (where the system's clock does not follow it).
pub(super) struct TokenClock {
    system: std::time::SystemTime,
    monotonic: Instant,
}

impl TokenClock {
    pub(super) fn new() -> Self {
        TokenClock { system: std::time::SystemTime::now(), monotonic: Instant::now() }
    }

    pub(super) fn now(&self) -> std::time::SystemTime {
        std::time::SystemTime::now().max(self.system + self.monotonic.elapsed())
    }
}

impl Idempotency {
    /// Issues a one-time token for token mode, valid for `ttl`: hand it to the client, which
    /// sends it back with the request (`Call::token(token)`). It is signed, not stored: issuing
    /// writes nothing, and only its first use creates a record (kept until the token expires).
    /// 56 URL-safe characters.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// use idempotency::{Call, Error, Idempotency, MemoryStore};
    ///
    /// let idem = Idempotency::new(MemoryStore::new());
    /// let token = idem.issue_token(Duration::from_secs(3600)).unwrap(); // with the form
    /// let submit = || idem.run(Call::token(&token), || async { Ok::<_, Error>(7u32) });
    /// assert_eq!(submit().await.unwrap(), 7);
    /// assert_eq!(submit().await.unwrap(), 7); // a double click: replayed
    /// let forged: Result<u32, Error> = idem.run(Call::token("made-up"), || async { Ok(8) }).await;
    /// assert!(matches!(forged, Err(Error::InvalidToken { .. })));
    /// # }
    /// ```
    pub fn issue_token(&self, ttl: Duration) -> Result<String, Error> {
        self.issue(None, ttl)
    }

    /// Issues a token in `scope`, for calls made with `Call::token(t).scope(scope)`: a token
    /// issued for one scope is refused in any other.
    pub fn issue_token_scoped(&self, scope: &str, ttl: Duration) -> Result<String, Error> {
        self.issue(Some(scope), ttl)
    }

    pub(super) fn issue(&self, scope: Option<&str>, ttl: Duration) -> Result<String, Error> {
        let scope = scope.unwrap_or("token");
        if ttl < crate::call::MIN_LEASE {
            return Err(Error::InvalidCall {
                key: scope.to_owned(),
                reason: format!("a token's lifetime of {ttl:?} is too short"),
            });
        }
        if ttl > crate::MAX_DURATION {
            return Err(Error::InvalidCall {
                key: scope.to_owned(),
                reason: format!("a token's lifetime of {ttl:?} is over the {:?} maximum", crate::MAX_DURATION),
            });
        }
        self.inner.token_keys.issue(scope, ttl, self.inner.token_clock.now())
    }

    /// Checks a token-mode call's token (no store command) and puts the part of it that names
    /// its record in its place; when the token expires.
    pub(super) fn verify_token(&self, call: &mut Call) -> Result<std::time::SystemTime, Error> {
        let scope = call.token_scope();
        match self.inner.token_keys.verify(scope, call.key(), self.inner.token_clock.now()) {
            Ok(verified) => {
                call.set_key(verified.id);
                Ok(verified.expires)
            }
            Err(why) => {
                tracing::debug!(reason = %why, "idempotency token refused");
                Err(Error::InvalidToken { key: call.full_key() })
            }
        }
    }
}
