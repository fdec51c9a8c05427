//! `IdempotencyBuilder`: the runtime's settings, from code or from the environment.

use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;

use crate::telemetry::{self};
use crate::token::TokenKeys;

use super::{Idempotency, Inner};
use crate::cache::ReplayCache;

/// The environment variables of the runtime's own settings
/// ([`IdempotencyBuilder::with_vars`], [`Idempotency::from_env`]), with what each sets.
pub const RUNTIME_ENV_VARS: &[(&str, &str)] = &[
    ("IDEMPOTENCY_TTL", "the default lease, a duration like 30s"),
    ("IDEMPOTENCY_KEEP", "how long results are kept by default, like 24h"),
    ("IDEMPOTENCY_COMMIT_DEADLINE", "how long a caller waits for its result to be stored"),
    ("IDEMPOTENCY_REPLAY_CACHE", "the replay cache's capacity (0: off)"),
    ("IDEMPOTENCY_TOKEN_KEY", "the secret that signs tokens (at least 32 bytes), the same on every instance"),
    ("IDEMPOTENCY_TOKEN_KEY_PREVIOUS", "a previous secret still accepted, while it is rotated out"),
];

/// Configures an [`Idempotency`].
#[must_use]
pub struct IdempotencyBuilder {
    pub(super) inner: Inner,
}

impl IdempotencyBuilder {
    /// The lease of calls that set none (default 30 s).
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.inner.ttl = ttl.min(crate::MAX_DURATION);
        self
    }

    /// How long completed results are kept when a call sets nothing (default 24 h).
    pub fn default_keep(mut self, keep: Duration) -> Self {
        self.inner.keep = keep.min(crate::MAX_DURATION);
        self
    }

    /// The largest result stored for replay (default 1 MiB).
    pub fn max_result_bytes(mut self, bytes: usize) -> Self {
        self.inner.max_result_bytes = bytes;
        self
    }

    /// How many calls of this process may wait on one key at a time (default 1000); one more
    /// finding the key in progress gets [`Error::Conflict`] at once instead of waiting (for a
    /// lock, [`Error::Locked`]). A bound on what a
    /// flood of duplicates of one key can hold (a task, a timer and a subscription each).
    pub fn max_waiters_per_key(mut self, max: usize) -> Self {
        self.inner.max_waiters_per_key = max;
        self
    }

    /// How often a waiting call re-reads the key if no notification came (default 1 s). The
    /// notification normally wakes it first; this bounds the delay if one was missed (the
    /// pub/sub connection reconnecting, say).
    pub fn wait_recheck(mut self, every: Duration) -> Self {
        self.inner.wait_recheck = every.clamp(Duration::from_millis(1), crate::MAX_DURATION);
        self
    }

    /// How long a call whose body succeeded waits for its result to be stored before it returns
    /// the value anyway (default: twice the store's own timeout, 5 s for a store without one).
    ///
    /// A commit that fails (the store unreachable, a failover) is retried; past this deadline the
    /// caller gets its `Ok` (the body ran) and the retries go on in the background until the
    /// lease would have run out, so the record is still written if the store comes back in time.
    /// Meanwhile a duplicate finds the key in progress (`Error::Conflict`, or it waits); once the
    /// record lands it replays it, and if the lease runs out first the key is free and a duplicate
    /// runs the body again.
    pub fn commit_deadline(mut self, deadline: Duration) -> Self {
        self.inner.commit_deadline = deadline.min(crate::MAX_DURATION);
        self
    }

    /// The keys that sign and verify tokens. Default: the secret the store shares with every
    /// runtime on it (Redis and PostgreSQL create one at the first connect and read it at each
    /// connect: a fleet on one store takes each other's tokens with no configuration), or, on a
    /// store that keeps none (`MemoryStore`, a custom store), a random key of this runtime's own.
    /// Keys given here win: every instance then needs the same ones; rotate by putting the new
    /// secret first and the old one in [`TokenKeys::previous`].
    pub fn token_keys(mut self, keys: TokenKeys) -> Self {
        self.inner.token_keys = keys;
        self
    }

    /// How far apart the clocks of the machines that issue and check tokens (and the store's)
    /// may be (default 5 minutes). A used token's record is kept this much past the token's
    /// expiry, so that a machine whose clock is behind never finds the token valid and its
    /// record gone.
    pub fn token_skew(mut self, skew: Duration) -> Self {
        self.inner.token_skew = skew.min(crate::MAX_DURATION);
        self
    }

    /// Keeps up to `capacity` completed results in this process, so that a duplicate of a
    /// recently completed call is answered without a round trip to the store (default: off).
    ///
    /// Only completed results are cached, never a key in progress, and an entry lives no longer
    /// than the record it copies: its lifetime is what the store reported the record has left
    /// when it was read (Redis: the key's `PTTL`), counted from before the read was sent, on this
    /// process's monotonic clock, so no client's idea of the time can stretch it. What it gives
    /// up: a record deleted from the store by hand stays replayable from this process's cache
    /// until then.
    pub fn replay_cache(mut self, capacity: usize) -> Self {
        self.inner.cache = (capacity > 0).then(|| Arc::new(ReplayCache::new(capacity)));
        self
    }

    /// Applies the runtime settings of the environment variables looked up by `vars` (see
    /// [`RUNTIME_ENV_VARS`]); a value that does not parse is [`Error::InvalidCall`] naming the
    /// variable (never showing a token key).
    pub fn with_vars(mut self, vars: &dyn Fn(&str) -> Option<String>) -> Result<Self, Error> {
        let bad = |name: &str, why: String| Error::InvalidCall { key: name.to_owned(), reason: why };
        let duration = |name: &str| -> Result<Option<Duration>, Error> {
            vars(name).map(|t| crate::parse_duration(t.trim()).map_err(|why| bad(name, why))).transpose()
        };
        if let Some(ttl) = duration("IDEMPOTENCY_TTL")? {
            self = self.default_ttl(ttl);
        }
        if let Some(keep) = duration("IDEMPOTENCY_KEEP")? {
            self = self.default_keep(keep);
        }
        if let Some(deadline) = duration("IDEMPOTENCY_COMMIT_DEADLINE")? {
            self = self.commit_deadline(deadline);
        }
        if let Some(n) = vars("IDEMPOTENCY_REPLAY_CACHE") {
            let n = n.trim().parse::<usize>().map_err(|e| bad("IDEMPOTENCY_REPLAY_CACHE", e.to_string()))?;
            self = self.replay_cache(n);
        }
        if let Some(key) = vars("IDEMPOTENCY_TOKEN_KEY") {
            let mut keys = TokenKeys::new(key.as_bytes()).map_err(|_| {
                bad("IDEMPOTENCY_TOKEN_KEY", format!("needs at least {} bytes", crate::MIN_SECRET_BYTES))
            })?;
            if let Some(previous) = vars("IDEMPOTENCY_TOKEN_KEY_PREVIOUS") {
                keys = keys.previous(previous.as_bytes()).map_err(|_| {
                    bad("IDEMPOTENCY_TOKEN_KEY_PREVIOUS", format!("needs at least {} bytes", crate::MIN_SECRET_BYTES))
                })?;
            }
            self = self.token_keys(keys);
        }
        Ok(self)
    }

    /// The runtime. With a replay cache, it starts following the store's purges here (from a
    /// task of the current tokio runtime, for a store that must wait).
    pub fn build(self) -> Idempotency {
        telemetry::describe_metrics();
        let inner = Arc::new(self.inner);
        inner.follow_purges();
        Idempotency { inner }
    }
}
