//! Unknown outcomes resolved: a key held under `on_crash = hold` whose holder stopped without a
//! word is resolved by the application's resolver (asked by the first call that finds it, e.g.
//! one that asks the payment provider whether the payout went through) or by an operator
//! ([`Idempotency::resolve`], the CLI's `resolve`). Every resolution is logged and counted
//! (`idempotency_resolutions_total`).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::error::Error;
use crate::store::{BoxFuture, Resolution, Resolved};
use crate::telemetry;

use super::operations::full_key;
use super::{Idempotency, IdempotencyBuilder};

/// How long a resolver may take by default before the call gets `Error::OutcomeUnknown`.
pub const DEFAULT_RESOLVER_TIMEOUT: Duration = Duration::from_secs(10);

/// A key whose outcome is unknown, as a resolver is told of it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Unresolved {
    /// The full key (scope and key): a resolver serving several scopes tells them apart by it.
    pub key: String,
    /// The owner id of the attempt that held the key.
    pub owner: String,
    /// When its lease ended, by the store's clock.
    pub lease_ended: SystemTime,
    /// Which attempt of the key it was.
    pub attempt: u32,
    /// The fingerprint of its payload, if the call had one.
    pub fingerprint: Option<String>,
}

/// What became of an unknown outcome, as a resolver or an operator found out.
///
/// ```
/// use idempotency::Resolve;
///
/// // The provider says the payout went through, with this receipt.
/// let done = Resolve::completed(&"receipt-981").unwrap();
/// assert_eq!(done, Resolve::Completed(serde_json::json!("receipt-981")));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub enum Resolve {
    /// It happened: the key completes with this value, the JSON of the `Ok` value a call would
    /// have returned, and calls replay it. A value that does not decode as the calls' type
    /// fails each of them with `Error::Codec`.
    Completed(serde_json::Value),
    /// It happened, with no value to replay: the key completes as not replayable (calls get
    /// `Error::Duplicate`).
    CompletedWithoutValue,
    /// It did not happen: the key is released (its attempt counted) and the next call runs the
    /// body.
    NotDone,
    /// Still unknown: nothing changes.
    StillUnknown,
}

impl Resolve {
    /// [`Resolve::Completed`] with `value` as JSON.
    pub fn completed<T: Serialize + ?Sized>(value: &T) -> Result<Resolve, serde_json::Error> {
        serde_json::to_value(value).map(Resolve::Completed)
    }

    /// The name the log line and the metric give it.
    fn name(&self) -> &'static str {
        match self {
            Resolve::Completed(_) | Resolve::CompletedWithoutValue => "completed",
            Resolve::NotDone => "not_done",
            Resolve::StillUnknown => "still_unknown",
        }
    }
}

/// The application's resolver ([`IdempotencyBuilder::resolver`]).
pub(super) type Resolver = Arc<dyn Fn(Unresolved) -> BoxFuture<'static, Result<Resolve, String>> + Send + Sync>;

impl IdempotencyBuilder {
    /// Resolves unknown outcomes (`on_crash = hold`): the first call that finds a key whose
    /// holder stopped without a word asks `resolver` what became of it (a function that asks
    /// the payment provider, say) before answering. Its answer is written to the store
    /// (owner-checked: a second resolution or the holder's own late commit that came first
    /// wins), logged and counted, and the call goes on as the key now says: it replays a
    /// completed value, or runs the body when the outcome was [`Resolve::NotDone`]. A resolver
    /// that fails, says [`Resolve::StillUnknown`], or takes longer than the
    /// [`resolver_timeout`](Self::resolver_timeout) leaves the key held, and the call gets
    /// [`Error::OutcomeUnknown`].
    ///
    /// ```
    /// use idempotency::{Idempotency, MemoryStore, Resolve, Unresolved};
    ///
    /// let idem = Idempotency::builder(MemoryStore::new())
    ///     .resolver(|unknown: Unresolved| async move {
    ///         // Ask the provider about the payout of `unknown.key`...
    ///         let paid = unknown.key.ends_with(":981");
    ///         Ok(if paid { Resolve::completed(&"receipt-981").map_err(|e| e.to_string())? } else { Resolve::NotDone })
    ///     })
    ///     .build();
    /// # let _ = idem;
    /// ```
    pub fn resolver<F, Fut>(mut self, resolver: F) -> Self
    where
        F: Fn(Unresolved) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Resolve, String>> + Send + 'static,
    {
        self.inner.resolver = Some(Arc::new(move |unresolved| Box::pin(resolver(unresolved))));
        self
    }

    /// How long the resolver may take before the call that asked it gets
    /// [`Error::OutcomeUnknown`] (default 10 s); the key stays held.
    pub fn resolver_timeout(mut self, timeout: Duration) -> Self {
        self.inner.resolver_timeout = timeout.min(crate::MAX_DURATION);
        self
    }
}

impl Idempotency {
    /// Resolves the unknown outcome of `key` in `scope` (an empty scope: `key` is a full key),
    /// for an operator who found out what became of it: completed with a value (calls replay it)
    /// or without one, or not done (the key is released and the next call runs the body). Only
    /// a record whose holder stopped under `on_crash = hold` is changed: anything else is
    /// reported as found ([`Resolved::NotUnknown`], or [`Resolved::Running`] while its holder's
    /// lease lasts). Logged and counted, as a resolver's answers are. The CLI's `resolve`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use idempotency::store::Resolved;
    /// use idempotency::{Idempotency, MemoryStore, Resolve};
    ///
    /// let idem = Idempotency::new(MemoryStore::new());
    /// let resolved = idem.resolve("payouts", "981", Resolve::NotDone).await.unwrap();
    /// assert_eq!(resolved, Resolved::Absent);
    /// # }
    /// ```
    pub async fn resolve(&self, scope: &str, key: &str, resolve: Resolve) -> Result<Resolved, Error> {
        let key = full_key(scope, key);
        self.apply_resolution(&key, None, &resolve, "operator").await
    }

    /// Asks the resolver about `unresolved`, within its timeout, and writes what it says: `true`
    /// when the key changed (the caller acquires it again), `false` when it stays unknown.
    pub(super) async fn ask_resolver(&self, unresolved: Unresolved) -> bool {
        let Some(resolver) = self.inner.resolver.clone() else { return false };
        let key = unresolved.key.clone();
        let owner = unresolved.owner.clone();
        let answer = tokio::time::timeout(self.inner.resolver_timeout, resolver(unresolved)).await;
        let resolve = match answer {
            Ok(Ok(resolve)) => resolve,
            Ok(Err(why)) => {
                tracing::warn!(key = %telemetry::logged_key(&key), error = %why, "idempotency resolver failed; the outcome stays unknown");
                telemetry::record::resolution("failed", "resolver");
                return false;
            }
            Err(_) => {
                tracing::warn!(
                    key = %telemetry::logged_key(&key),
                    timeout_ms = self.inner.resolver_timeout.as_millis() as u64,
                    "idempotency resolver did not answer in time; the outcome stays unknown"
                );
                telemetry::record::resolution("failed", "resolver");
                return false;
            }
        };
        // Still unknown (the resolver could not say): nothing is sent, nothing changed.
        let unchanged = matches!(resolve, Resolve::StillUnknown);
        match self.apply_resolution(&key, Some(&owner), &resolve, "resolver").await {
            Ok(Resolved::Done) => true,
            // The store found the key otherwise: resolved by someone else meanwhile, committed
            // late by its holder, or held unknown by a later holder. Look again.
            Ok(Resolved::NotUnknown(_) | Resolved::Absent) => !unchanged,
            Ok(_) => false,
            Err(e) => {
                tracing::warn!(key = %telemetry::logged_key(&key), error = %e, "idempotency resolution not written; the outcome stays unknown");
                false
            }
        }
    }

    /// Writes `resolve` to the store for `key` (held by `holder` when given), logs it and counts
    /// it as done `by` the resolver or an operator.
    async fn apply_resolution(
        &self,
        key: &str,
        holder: Option<&str>,
        resolve: &Resolve,
        by: &'static str,
    ) -> Result<Resolved, Error> {
        let result = match resolve {
            Resolve::Completed(value) => Some(
                serde_json::to_vec(value).map_err(|e| Error::Codec { key: key.to_owned(), message: e.to_string() })?,
            ),
            _ => None,
        };
        let resolution = match resolve {
            Resolve::Completed(_) | Resolve::CompletedWithoutValue => Resolution::Completed(result.as_deref()),
            Resolve::NotDone => Resolution::Release,
            Resolve::StillUnknown => {
                tracing::info!(key = %telemetry::logged_key(key), by, "idempotency outcome still unknown");
                telemetry::record::resolution(resolve.name(), by);
                return Ok(Resolved::NotUnknown(crate::store::RecordState::Unknown));
            }
        };
        let resolved = self
            .inner
            .store
            .resolve(key, holder, resolution)
            .await
            .map_err(|source| Error::Store { key: key.to_owned(), source })?;
        if resolved == Resolved::Done {
            if let Some(cache) = &self.inner.cache {
                cache.forget(key);
            }
            tracing::info!(key = %telemetry::logged_key(key), by, resolved = resolve.name(), "idempotency unknown outcome resolved");
            telemetry::record::resolution(resolve.name(), by);
        } else {
            tracing::info!(key = %telemetry::logged_key(key), by, found = ?resolved, "idempotency resolution found nothing to resolve");
        }
        Ok(resolved)
    }
}

/// Unix milliseconds as a moment.
pub(super) fn moment(unix_ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(unix_ms)
}
