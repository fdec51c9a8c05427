//! What a call that does not complete leaves behind: its key released (a dropped call, a lease
//! lost), its failure recorded (a body's `Err`, a panic: the record counts the attempts and keeps
//! the last error, or gives up on the key), or, under `on_crash = hold`, its key left to its lease
//! (a dropped call, a panic, a lease lost: whether the body had its effect is unknown), so that it
//! becomes unknown when the lease ends instead of free.

use std::sync::Arc;
use std::time::Duration;

use crate::context::CallContext;
use crate::store::{error_text, FailRequest, Store, Transition};
use crate::telemetry;

/// A body's failure, as its key's record keeps it.
pub(super) struct Failure<'a> {
    /// The error's text.
    pub(super) error: &'a str,
    /// How long the record of it is kept (the call's `keep`).
    pub(super) keep: Duration,
    /// This failure gives up on the key (`give_up_after`).
    pub(super) give_up: bool,
    pub(super) fingerprint: Option<&'a str>,
}

/// What a body that panicked leaves as its error.
pub(super) const PANICKED: &str = "the body panicked";

/// Releases the key unless disarmed (`store` taken); if dropped armed, which is a cancelled
/// call, or if the release fails, the store releases it in the background
/// ([`Store::abandon`]). Under `on_crash = hold` (`hold`), a call that stops without a word
/// leaves its key to its lease instead.
pub(super) struct ReleaseOnDrop<'a> {
    pub(super) store: Option<&'a Arc<dyn Store>>,
    pub(super) context: &'a CallContext,
    pub(super) lease: Duration,
    pub(super) hold: bool,
}

impl ReleaseOnDrop<'_> {
    /// Has the store release the key in the background, without a word: the caller knows why.
    /// Under `hold`, leaves the key to its lease.
    pub(super) fn abandon(mut self) {
        if let Some(store) = self.store.take() {
            if self.hold {
                self.left_held("its lease was lost");
            } else {
                store.clone().abandon(self.context.key(), self.context.owner(), self.lease);
            }
        }
    }

    /// Releases the key now (in the background if the store fails).
    pub(super) async fn release(&mut self) {
        if let Some(store) = self.store.take() {
            let key = self.context.key();
            match store.release(key, self.context.owner()).await {
                Ok(Transition::Done) => tracing::debug!("idempotency key released"),
                Ok(other) => tracing::warn!(
                    key = %telemetry::logged_key(key),
                    outcome = ?other,
                    "idempotency release found the key not ours"
                ),
                Err(e) => {
                    tracing::warn!(
                        key = %telemetry::logged_key(key),
                        error = %e,
                        "idempotency release failed; releasing in the background"
                    );
                    store.clone().abandon(key, self.context.owner(), self.lease);
                }
            }
        }
    }

    /// Records the body's failure: the key freed for the next attempt with this one counted, or
    /// given up. A store that fails has the key released in the background, uncounted.
    pub(super) async fn fail(&mut self, failure: Failure<'_>) {
        let Some(store) = self.store.take() else { return };
        let key = self.context.key();
        let request = FailRequest {
            key,
            owner: self.context.owner(),
            attempt: self.context.attempt(),
            error: error_text(failure.error),
            keep: failure.keep,
            give_up: failure.give_up,
            fingerprint: failure.fingerprint,
        };
        match store.fail(request).await {
            Ok(Transition::Done) => tracing::debug!(give_up = failure.give_up, "idempotency failure recorded"),
            Ok(other) => tracing::warn!(
                key = %telemetry::logged_key(key),
                outcome = ?other,
                "idempotency failure found the key not ours"
            ),
            Err(e) => {
                tracing::warn!(
                    key = %telemetry::logged_key(key),
                    error = %e,
                    "idempotency failure not recorded; releasing the key in the background, the attempt uncounted"
                );
                store.clone().abandon(key, self.context.owner(), self.lease);
            }
        }
    }

    /// The body panicked: its failure recorded, or under `hold` its key left to its lease (the
    /// body may have had its effect before it panicked).
    pub(super) async fn panicked(&mut self, failure: Failure<'_>) {
        if self.hold {
            if self.store.take().is_some() {
                self.left_held("its body panicked");
            }
        } else {
            self.fail(failure).await;
        }
    }

    /// Says that the key is left to its lease, to become unknown.
    fn left_held(&self, why: &str) {
        tracing::warn!(
            key = %telemetry::logged_key(self.context.key()),
            why,
            "idempotency call stopped without an outcome under on_crash = hold: the key stays held, and is unknown once its lease ends"
        );
    }
}

impl Drop for ReleaseOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(store) = self.store.take() {
            if self.hold {
                self.left_held("the call was dropped while its body ran");
                return;
            }
            tracing::warn!(
                key = %telemetry::logged_key(self.context.key()),
                "idempotency call dropped while its body ran; releasing the key in the background"
            );
            store.clone().abandon(self.context.key(), self.context.owner(), self.lease);
        }
    }
}
