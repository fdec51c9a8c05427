//! Failures counted: a body's `Err` (or panic) leaves its key's record with the count of failed
//! attempts and the last error (`Store::fail`), so that the next attempt knows its number
//! (`CallContext::attempt`); under `on_error = give_up_after(N)` the N-th failure marks the key
//! as failed, and every call after it gets `Error::GaveUp`: a poison message redelivered forever
//! stops running after N tries. The count lives in the key's one record, changed by the store's
//! atomic transitions, so it never goes back and two retries never run one attempt twice.

use std::fmt::Display;
use std::future::Future;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::call::Call;
use crate::context::CallContext;
use crate::error::Error;
use crate::store::{error_text, FailRequest};

use super::commit::{CommitWith, NoCommit};
use super::releasing::Failure;
use super::state::Held;
use super::Idempotency;

impl Idempotency {
    /// Runs `body` like [`run`](Self::run), and gives up on the key after `attempts` failures:
    /// an `Err` of the body frees the key for a retry (the caller gets its `Err`), counted
    /// across retries, by any process, and so are a panic and a lease that ran out (a process
    /// that died mid-body: the count is kept with the lease's end in the record); the
    /// `attempts`-th failure marks the key as failed, and every call after it gets
    /// [`Error::GaveUp`] with the count and the last error's text, without running the body,
    /// until an operator forgets the key ([`forget`](Self::forget), `idempotency purge`) or its
    /// record's `keep` ends. [`CallContext::attempt`] tells the body which attempt it is. The
    /// attribute's `on_error = give_up_after(N)`; [`Call::give_up_after`] on a batch's items.
    ///
    /// What it costs: nothing more than `run` for a key that never fails, besides the record of
    /// its lease's end (on Redis the acquire is a script rather than a plain `SET`); a failure
    /// leaves a small record, kept for `keep`; a retry after a failure takes its key in one
    /// command more on Redis (the plain `SET` finds the failure's record, the script takes it).
    /// A dropped call is not counted (its attempt is freed, as with `run`).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use idempotency::{Call, CallContext, Error, Idempotency, MemoryStore};
    ///
    /// #[derive(Debug)]
    /// enum JobError { Broken(u32), Idem(Error) }
    /// impl std::fmt::Display for JobError {
    ///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
    ///         match self { JobError::Broken(n) => write!(f, "broken on attempt {n}"), JobError::Idem(e) => e.fmt(f) }
    ///     }
    /// }
    /// impl From<Error> for JobError {
    ///     fn from(e: Error) -> Self { JobError::Idem(e) }
    /// }
    ///
    /// let idem = Idempotency::new(MemoryStore::new());
    /// let deliver = || idem.run_giving_up(Call::new("msg:7"), 3, || async {
    ///     Err::<(), _>(JobError::Broken(CallContext::current().unwrap().attempt()))
    /// });
    /// for n in 1..=3 {
    ///     assert!(matches!(deliver().await, Err(JobError::Broken(a)) if a == n));
    /// }
    /// // The fourth delivery does not run the body.
    /// match deliver().await {
    ///     Err(JobError::Idem(Error::GaveUp { attempts, last_error, .. })) => {
    ///         assert_eq!((attempts, last_error.as_str()), (3, "broken on attempt 3"));
    ///     }
    ///     other => panic!("{other:?}"),
    /// }
    /// # }
    /// ```
    pub async fn run_giving_up<T, E, F, Fut>(&self, call: Call, attempts: u32, body: F) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error> + Display,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let body = move || {
            let fut = body();
            async move { fut.await.map(|value| (value, ())) }
        };
        self.run_inner(call.give_up_after(attempts), body, CommitWith::<NoCommit>::Store, displayed::<E>)
            .await
            .map(|(value, _)| value)
    }

    /// What `held`'s failure with `error` leaves in its record: counted, or the key given up when
    /// the call's limit is reached.
    pub(super) fn failure<'a>(&self, call: &Call, held: &'a Held, error: &'a str) -> Failure<'a> {
        Failure {
            error,
            keep: self.keep_for(call, held),
            give_up: gives_up(call, &held.context),
            fingerprint: held.fingerprint.as_deref(),
        }
    }

    /// A key taken as an attempt past the call's `limit` (the attempt before it ran out of its
    /// lease, or the key was run under a larger limit): given up without running the body.
    pub(super) async fn give_up_unrun(&self, call: &Call, held: &Held, limit: u32) -> Error {
        let context = &held.context;
        let attempts = context.attempt().saturating_sub(1);
        let last_error =
            format!("{attempts} attempts failed or ran out of their lease, the most give_up_after({limit}) allows");
        let request = FailRequest {
            key: context.key(),
            owner: context.owner(),
            attempt: attempts,
            error: error_text(&last_error),
            keep: self.keep_for(call, held),
            give_up: true,
            fingerprint: held.fingerprint.as_deref(),
        };
        if let Err(e) = self.inner.store.fail(request).await {
            tracing::warn!(error = %e, "idempotency key not marked as given up; releasing it in the background");
            self.release_in_background(context.key(), context.owner(), held.lease);
        }
        Error::GaveUp { key: context.key().to_owned(), attempts, last_error }
    }
}

/// Whether a failure of the attempt `context` holds gives up on the key.
fn gives_up(call: &Call, context: &CallContext) -> bool {
    call.give_up_after.is_some_and(|limit| context.attempt() >= limit)
}

/// A failure's text: its `Display`.
fn displayed<E: Display>(e: &E) -> String {
    e.to_string()
}
