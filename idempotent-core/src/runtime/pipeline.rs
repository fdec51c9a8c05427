//! The call pipeline: prepare (token, key, fingerprint, replay cache) → acquire (see
//! `waiting`) → run the body under the lease → commit (see `commit`) or release; with the span and
//! metrics of every call, and what the caller is told ([`Outcome`]).

use std::future::Future;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::task::Poll;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::time::Instant;

use crate::call::{Call, Mode, OnCrash, OnDuplicate};
use crate::codec::{self, Encoded};
use crate::context::CallContext;
use crate::error::{Error, StoreError, StoreErrorKind};
use crate::ids;
use crate::store::Transition;
use crate::telemetry::{self, CallOutcome};

use super::commit::{CommitWith, NoCommit};
use super::releasing::{ReleaseOnDrop, PANICKED};
use super::state::{check_fingerprint, Held, Track};
use super::waiting::Taken;
use super::Idempotency;
use crate::store::Completed;

impl Idempotency {
    /// Runs `body` at most once for `call`'s key (per the call's policies) and returns its
    /// result, or the stored result of the run that completed before.
    ///
    /// - Key absent: runs the body under a lease the watchdog renews. `Ok` is stored for
    ///   `keep` and returned; `Err` releases the key (a retry may run) and is returned as is; a
    ///   panic releases the key and goes on unwinding; a cancelled (dropped) call releases the
    ///   key in the background.
    /// - Key completed: the stored `Ok` value, decoded, without running the body
    ///   ([`OnDuplicate::Replay`]), or [`Error::Duplicate`] ([`OnDuplicate::Reject`]).
    /// - Key in progress elsewhere: [`Error::Conflict`], or wait ([`OnConflict::Wait`](crate::OnConflict::Wait)).
    /// - Same key, different fingerprint: [`Error::KeyReused`].
    ///
    /// If the result cannot be stored (the store fails at commit, or another owner took the key
    /// after this call's lease was lost), the body's value is still returned, since the body
    /// ran, and a warning is logged; a commit that keeps failing is retried for at most the
    /// commit deadline before the value is returned, and in the background after it
    /// ([`IdempotencyBuilder::commit_deadline`](crate::IdempotencyBuilder::commit_deadline)). The exception: a store that requires replica
    /// acknowledgements and did not get them fails the call with [`Error::Unconfirmed`]; the
    /// record stays on the primary, so a retry replays it unless a failover lost it.
    pub fn run<T, E, F, Fut>(&self, call: Call, body: F) -> impl Future<Output = Result<T, E>> + use<'_, T, E, F, Fut>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        ValueOnly { fut: self.run_with_outcome(call, body) }
    }

    /// Runs `body` like [`run`](Self::run), in a task of its own, so that dropping the call (an
    /// HTTP client that goes away and takes the request's future with it, an outer timeout, a
    /// `select!`) does not cancel it: once started, the call runs to its end and its result is
    /// stored, and a retry meanwhile finds the key in progress, after it the result. With `run`,
    /// a dropped call releases the key and a retry runs the body again. The body and its value
    /// must be `Send + 'static` to move to the task; a panic of the body reaches the caller as
    /// with `run`. The attribute's `on_cancel = finish`.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// use idempotency::{Call, Error, Idempotency, MemoryStore};
    ///
    /// let idem = Idempotency::new(MemoryStore::new());
    /// let slow = idem.run_to_completion(Call::new("charge:1"), || async {
    ///     tokio::time::sleep(Duration::from_millis(50)).await;
    ///     Ok::<_, Error>(7)
    /// });
    /// // The caller gives up after 10 ms; the charge goes on and is stored.
    /// assert!(tokio::time::timeout(Duration::from_millis(10), slow).await.is_err());
    /// tokio::time::sleep(Duration::from_millis(100)).await;
    /// let again = idem.run(Call::new("charge:1"), || async { Ok::<_, Error>(8) }).await;
    /// assert_eq!(again.unwrap(), 7);
    /// # }
    /// ```
    pub async fn run_to_completion<T, E, F, Fut>(&self, call: Call, body: F) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
        E: From<Error> + Send + 'static,
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        let key = call.full_key();
        let idem = self.clone();
        let task = tokio::spawn(tracing::Instrument::in_current_span(async move { idem.run(call, body).await }));
        match task.await {
            Ok(out) => out,
            Err(e) if e.is_panic() => resume_unwind(e.into_panic()),
            // The task's runtime shut down under it.
            Err(_) => Err(E::from(Error::Store {
                key,
                source: StoreError::new(
                    StoreErrorKind::Unavailable,
                    "the call's task was cancelled: its runtime shut down",
                ),
            })),
        }
    }

    /// Runs `body` like [`run`](Self::run), and says what happened: whether the value was
    /// replayed or the body ran, the fencing token, how long the call waited and how many times
    /// it asked the store.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use idempotency::{Call, Error, Idempotency, MemoryStore};
    /// use idempotency::telemetry::CallOutcome;
    ///
    /// let idem = Idempotency::new(MemoryStore::new());
    /// let (value, outcome) = idem.run_with_outcome(Call::new("k"), || async { Ok::<_, Error>(7) }).await.unwrap();
    /// assert_eq!((value, outcome.kind, outcome.replayed), (7, CallOutcome::Executed, false));
    /// let (_, outcome) = idem.run_with_outcome(Call::new("k"), || async { Ok::<_, Error>(8) }).await.unwrap();
    /// assert!(outcome.replayed && outcome.fence.is_none());
    /// # }
    /// ```
    pub fn run_with_outcome<T, E, F, Fut>(
        &self,
        call: Call,
        body: F,
    ) -> impl Future<Output = Result<(T, Outcome), E>> + use<'_, T, E, F, Fut>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let body = move || {
            let fut = body();
            async move { fut.await.map(|value| (value, ())) }
        };
        self.run_inner(call, body, CommitWith::<NoCommit>::Store, named::<E>)
    }

    /// Runs `body` like [`run`](Self::run), for a store that writes the completed record
    /// together with the body's own effects: the body returns its value and a handle `X` (a
    /// database transaction holding its writes), and `commit` receives `X` with the record to
    /// write ([`Completed`]), and makes both durable at once (one database commit).
    ///
    /// What differs from `run`: if `commit` finds another owner holds the key
    /// (`Transition::Lost`: the lease was lost and the key taken), it must have dropped the body's
    /// effects, and the call fails with [`Error::LeaseLost`]; if `commit` fails (a serialization
    /// failure, the database gone), nothing of the body stayed either: the key is released and
    /// the call fails with [`Error::Store`]. An `Err` or a panic of the body drops `X` (rolling
    /// its writes back) and releases the key, as in `run`.
    pub fn run_committing<T, E, X, F, Fut, C, CFut>(
        &self,
        call: Call,
        body: F,
        commit: C,
    ) -> impl Future<Output = Result<T, E>> + use<'_, T, E, X, F, Fut, C, CFut>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(T, X), E>>,
        C: FnOnce(X, Completed) -> CFut,
        CFut: Future<Output = Result<Transition, StoreError>>,
    {
        ValueOnly { fut: self.run_inner(call, body, CommitWith::Custom(commit), named::<E>) }
    }

    /// Every run: the call's span around it, its outcome recorded in the span and the metrics.
    ///
    /// The span is at `INFO` for every call that reaches the store (its cost, a microsecond or
    /// two with a subscriber that records it, is small beside a round trip), and at `DEBUG` for
    /// a replay answered by the in-process cache, which would otherwise cost more to trace than
    /// to answer; the metrics count both.
    pub(super) async fn run_inner<T, E, X, F, Fut, C, CFut>(
        &self,
        mut call: Call,
        body: F,
        commit: CommitWith<C>,
        describe: fn(&E) -> String,
    ) -> Result<(T, Outcome), E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(T, X), E>>,
        C: FnOnce(X, Completed) -> CFut,
        CFut: Future<Output = Result<Transition, StoreError>>,
    {
        let mut track = Track::default();
        let (span, result) = match self.prepare(&mut call) {
            Ok(Prepared::Cached { key, hit }) => {
                let span = call_span!(tracing::Level::DEBUG, call, &key);
                let _entered = span.enter();
                track.replayed();
                let replayed = replay(&key, call.on_duplicate, Some(&hit.result)).map_err(Fail::Lib);
                drop(_entered);
                (span, replayed)
            }
            Ok(Prepared::Store(go)) => {
                let span = call_span!(tracing::Level::INFO, call, &go.key);
                let guarded = self.guarded(&call, go, body, commit, describe, &mut track);
                // A span nothing records is not entered at every poll: with tracing's `log`
                // feature on (sqlx turns it on), each entry, exit and drop of even a disabled
                // span asks the `log` crate whether to write a line (nine times a call).
                let result = if span.is_disabled() {
                    guarded.await
                } else {
                    tracing::Instrument::instrument(guarded, span.clone()).await
                };
                (span, result)
            }
            Err(e) => {
                // Refused before its record key was known: the key as the error names it, if any.
                let named = (!e.key().is_empty()).then(|| tracing::field::display(telemetry::logged_key(e.key())));
                (call_span!(tracing::Level::INFO, call, key = named), Err(Fail::Lib(e)))
            }
        };
        let outcome = match &result {
            Ok(_) => track.outcome,
            Err(Fail::Lib(e)) => CallOutcome::of_error(e),
            Err(Fail::Body(_)) => CallOutcome::BodyError,
        };
        if !span.is_disabled() {
            ended(&span, outcome, &track);
        }
        telemetry::record::call(outcome, telemetry::scope_label(call.scope_str()));
        if !track.waited.is_zero() {
            telemetry::record::wait(track.waited);
        }
        match result {
            Ok(value) => Ok((
                value,
                Outcome {
                    kind: outcome,
                    replayed: track.replayed,
                    fence: track.fence,
                    waited: track.waited,
                    attempts: track.attempts,
                    stored: track.stored,
                },
            )),
            Err(Fail::Lib(e)) => Err(E::from(e)),
            Err(Fail::Body(e)) => Err(e),
        }
    }

    /// What a call needs before the store: its token checked, its key and fingerprint, and the
    /// replay cache asked.
    pub(super) fn prepare(&self, call: &mut Call) -> Result<Prepared, Error> {
        // A key its template could not build is refused before anything else (a token-mode
        // template's empty value is not a bad token).
        call.refusal()?;
        let lease = call.ttl.unwrap_or(self.inner.ttl);
        // A token is checked before anything else, without the store.
        let token_expires = match call.mode {
            Mode::Token => Some(self.verify_token(call)?),
            Mode::Param => None,
        };
        let (key, fingerprint) = call.take_key(lease)?;
        if let Some(cache) = &self.inner.cache {
            let hit = cache.get(&key);
            telemetry::record::cache(hit.is_some());
            if let Some(hit) = hit {
                check_fingerprint(&key, hit.fingerprint.as_deref(), fingerprint.as_deref())?;
                return Ok(Prepared::Cached { key, hit });
            }
        }
        Ok(Prepared::Store(Go { key, fingerprint, lease, token_expires }))
    }

    /// A call that goes to the store, inside its span: a library error is told apart from the
    /// body's.
    pub(super) async fn guarded<T, E, X, F, Fut, C, CFut>(
        &self,
        call: &Call,
        go: Go,
        body: F,
        commit: CommitWith<C>,
        describe: fn(&E) -> String,
        track: &mut Track,
    ) -> Result<T, Fail<E>>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(T, X), E>>,
        C: FnOnce(X, Completed) -> CFut,
        CFut: Future<Output = Result<Transition, StoreError>>,
    {
        let Go { key, fingerprint, lease, token_expires } = go;
        let owner = ids::owner_id();
        let kept = self.kept(call, token_expires);
        let how = self.taking(call, &key, kept.left(|| self.inner.token_clock.now()))?;
        match self.take(&key, owner, lease, fingerprint.as_deref(), how, track).await? {
            Taken::Held { fence, sent, attempt } => {
                track.outcome =
                    if track.waited.is_zero() { CallOutcome::Executed } else { CallOutcome::WaitedThenExecuted };
                let context = CallContext::new(key, owner, fence, attempt, self.inner.store.clone()).keeping(kept);
                let held = Held { context, lease, sent, fingerprint, token_expires };
                if let Some(limit) = call.give_up_after.filter(|limit| attempt > *limit) {
                    return Err(self.give_up_unrun(call, &held, limit).await.into());
                }
                self.execute(call, held, body, commit, describe, track).await
            }
            Taken::Completed { fingerprint: theirs, result, kept_until, generation } => {
                if let Some(bytes) = &result {
                    self.inner.cache_put(&key, theirs.as_deref(), bytes, kept_until, generation);
                }
                track.replayed();
                tracing::debug!(stored = result.is_some(), "idempotency key completed: replaying");
                Ok(replay(&key, call.on_duplicate, result.as_deref())?)
            }
        }
    }

    /// Runs the body on a held key, then commits or releases the key.
    pub(super) async fn execute<T, E, X, F, Fut, C, CFut>(
        &self,
        call: &Call,
        held: Held,
        body: F,
        commit: CommitWith<C>,
        describe: fn(&E) -> String,
        track: &mut Track,
    ) -> Result<T, Fail<E>>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(T, X), E>>,
        C: FnOnce(X, Completed) -> CFut,
        CFut: Future<Output = Result<Transition, StoreError>>,
    {
        let context = &held.context;
        let hold = call.on_crash == OnCrash::Hold;
        let mut guard = ReleaseOnDrop { store: Some(&self.inner.store), context, lease: held.lease, hold };
        let body_started = Instant::now();
        let fut = match catch_unwind(AssertUnwindSafe(body)) {
            Ok(fut) => fut,
            Err(panic) => {
                guard.panicked(self.failure(call, &held, PANICKED)).await;
                panicked(call);
                resume_unwind(panic);
            }
        };
        let scoped = context.clone().scope(fut);
        let caught = async {
            let mut scoped = std::pin::pin!(scoped);
            std::future::poll_fn(|cx| match catch_unwind(AssertUnwindSafe(|| scoped.as_mut().poll(cx))) {
                Ok(Poll::Pending) => Poll::Pending,
                Ok(Poll::Ready(out)) => Poll::Ready(Ok(out)),
                Err(panic) => Poll::Ready(Err(panic)),
            })
            .await
        };
        let registration = self.inner.watchdog.register(held.lease, call.renew, held.sent, context.clone());
        let driven = if call.abort_on_lease_lost {
            // The loss first: a lease known lost stops the body before its next poll.
            tokio::select! {
            biased;
            reason = context.lost() => Driven::Lost(reason),
            out = caught => Driven::Finished(out)}
        } else {
            Driven::Finished(caught.await)
        };
        // The lease as last renewed bounds the commit's retries.
        let lease_end = registration.finish().unwrap_or(held.sent + held.lease);
        telemetry::record::body(body_started.elapsed());
        // Known from the acquisition, or read by the body (`CallContext::fence`).
        track.fence = context.fence_read();
        match driven {
            Driven::Lost(reason) => {
                // Released in the background: the store may be what failed, and the caller
                // should hear of the loss now, not after the store's timeout.
                guard.abandon();
                Err(Error::LeaseLost { key: context.key().to_owned(), reason: reason.to_owned() }.into())
            }
            Driven::Finished(Err(panic)) => {
                guard.panicked(self.failure(call, &held, PANICKED)).await;
                panicked(call);
                resume_unwind(panic)
            }
            Driven::Finished(Ok(Err(e))) => {
                tracing::debug!("idempotency body failed: recording the failure, releasing the key");
                let text = describe(&e);
                guard.fail(self.failure(call, &held, &text)).await;
                Err(Fail::Body(e))
            }
            Driven::Finished(Ok(Ok((value, handle)))) => {
                // Encoded before any await: the call's future holds no `&T` across one, so it is
                // `Send` whenever `T` is. A value that would not replay as itself is kept as
                // completed but not replayable (the body ran: a duplicate must not run it again),
                // and this first call says so.
                let (encoded, inexact) = match codec::encode(&value, self.inner.max_result_bytes) {
                    Ok(encoded) => (encoded, None),
                    Err(why) => (Encoded::NotReplayable(why.clone()), Some(why)),
                };
                let commit_started = Instant::now();
                let stored = match commit {
                    CommitWith::Store => {
                        // From here on the key is never released: the body ran.
                        guard.store = None;
                        drop(handle);
                        self.commit(call, &held, encoded, lease_end)
                            .await
                            .map(|confirmed| track.stored = confirmed)
                            .map_err(|source| Error::Unconfirmed { key: context.key().to_owned(), source })
                    }
                    CommitWith::Custom(commit) => {
                        let completed = self.completed(call, &held, encoded);
                        let (result, fingerprint, keep) =
                            (completed.result.clone(), completed.fingerprint.clone(), completed.keep);
                        let generation = self.inner.cache_generation();
                        let sent = Instant::now();
                        match commit(handle, completed).await {
                            Ok(Transition::Done) => {
                                guard.store = None;
                                track.stored = true;
                                if let Some(bytes) = &result {
                                    let until = sent + keep;
                                    self.inner.cache_put(
                                        context.key(),
                                        fingerprint.as_deref(),
                                        bytes,
                                        until,
                                        generation,
                                    );
                                }
                                Ok(())
                            }
                            // The store dropped the body's effects with its record: the key is
                            // not ours to release.
                            Ok(Transition::Lost) => {
                                guard.store = None;
                                Err(Error::LeaseLost {
                                    key: context.key().to_owned(),
                                    reason: "another owner took the key: the body's writes were rolled back".into(),
                                })
                            }
                            Ok(Transition::Corrupt { reason }) => {
                                guard.store = None;
                                Err(Error::Corrupt { key: context.key().to_owned(), reason })
                            }
                            // Nothing of the body stayed: the key goes back, a retry runs it.
                            Err(source) => {
                                guard.release().await;
                                Err(Error::Store { key: context.key().to_owned(), source })
                            }
                        }
                    }
                };
                telemetry::record::commit(commit_started.elapsed());
                tracing::debug!(stored = stored.is_ok(), "idempotency commit done");
                match (stored, inexact) {
                    (Ok(()), None) => Ok(value),
                    (Ok(()), Some(why)) => Err(Error::Codec {
                        key: context.key().to_owned(),
                        message: format!(
                            "the result, of type `{}`, cannot be stored to replay as itself: {why}. The body ran; the \
                             key is kept as completed but not replayable, so a duplicate gets `Error::Duplicate`",
                            std::any::type_name::<T>()
                        ),
                    }
                    .into()),
                    (Err(e), _) => Err(e.into()),
                }
            }
        }
    }
}

/// What happened to a call that returned a value ([`Idempotency::run_with_outcome`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Outcome {
    /// Executed, replayed, or either after waiting for another holder.
    pub kind: CallOutcome,
    /// The value is a stored one: the body did not run.
    pub replayed: bool,
    /// The fencing token of this call's acquisition, when the body ran and it is known: read by
    /// the body, or stamped at the acquisition by a store that always does (memory,
    /// PostgreSQL). On Redis a body that never read it leaves it `None`: it was never stamped.
    pub fence: Option<u64>,
    /// How long the call waited for another holder (`OnConflict::Wait`).
    pub waited: Duration,
    /// How many times the call asked the store for the key (0: answered from the replay cache).
    pub attempts: u32,
    /// Whether the value is stored: a replayed one, or the body's own with its record confirmed
    /// by the store. `false` when the body ran but the store refused its record (its lease was
    /// lost and another caller took the key: a duplicate may run the body again) or the commit
    /// still goes on in the background past the commit deadline.
    pub stored: bool,
}

/// A call's failure: the library's, or the body's own.
pub(crate) enum Fail<E> {
    Lib(Error),
    Body(E),
}

impl<E> From<Error> for Fail<E> {
    fn from(e: Error) -> Self {
        Fail::Lib(e)
    }
}

/// Records a panicked body's outcome (the span and the counter) before the panic goes on.
pub(super) fn panicked(call: &Call) {
    tracing::Span::current().record("outcome", CallOutcome::Panicked.as_str());
    telemetry::record::call(CallOutcome::Panicked, telemetry::scope_label(call.scope_str()));
}

pin_project_lite::pin_project! {
    /// A call's answer without its [`Outcome`]. `run` returns this around the call's future
    /// rather than being an `async fn` that awaits it: the `async fn`'s state would hold a
    /// second copy of the call's whole future (2.8 KB), copied into it at the first poll, on
    /// every call.
    struct ValueOnly<F> {
        #[pin]
        fut: F,
    }
}

impl<T, E, F: Future<Output = Result<(T, Outcome), E>>> Future for ValueOnly<F> {
    type Output = Result<T, E>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        self.project().fut.poll(cx).map(|answer| answer.map(|(value, _)| value))
    }
}

/// A call's span: `idempotent.call` at `$level`, with the fields a call fills in as it goes;
/// its key as [`telemetry::logged_key`] shows it (`&key`), or as given (`key = value`: an
/// `Option`, empty when a refused call's error names no key).
macro_rules! call_span {
    ($level:expr, $call:expr, &$key:expr) => {
        call_span!($level, $call, key = tracing::field::display(telemetry::logged_key(&$key)))
    };
    ($level:expr, $call:expr, key = $shown:expr) => {
        tracing::span!(
            $level,
            "idempotent.call",
            scope = $call.scope_str().unwrap_or(""),
            key = $shown,
            mode = if $call.mode == Mode::Token { "token" } else { "param" },
            outcome = tracing::field::Empty,
            fence = tracing::field::Empty,
            attempts = tracing::field::Empty,
            waited_ms = tracing::field::Empty,
        )
    };
}
use call_span;

/// Records how the call ended in its span, in one record: a subscriber finds the span once,
/// not once a field.
fn ended(span: &tracing::Span, outcome: CallOutcome, track: &Track) {
    let Some(meta) = span.metadata() else { return };
    let fields = meta.fields();
    let found = |name: &str| fields.field(name);
    // `call_span!` declares all four: none is missing.
    let (Some(o), Some(f), Some(a), Some(w)) =
        (found("outcome"), found("fence"), found("attempts"), found("waited_ms"))
    else {
        return;
    };
    let (outcome, waited_ms) = (outcome.as_str(), track.waited.as_millis() as u64);
    let values: [(&tracing::field::Field, Option<&dyn tracing::Value>); 4] = [
        (&o, Some(&outcome)),
        (&f, track.fence.as_ref().map(|f| f as &dyn tracing::Value)),
        (&a, Some(&track.attempts)),
        (&w, Some(&waited_ms)),
    ];
    span.record_all(&fields.value_set(&values));
}

/// A call ready for the store, or answered by the replay cache ([`Idempotency::prepare`]).
pub(super) enum Prepared {
    Cached { key: String, hit: crate::cache::Cached },
    Store(Go),
}

/// What a call takes to the store.
pub(super) struct Go {
    pub(super) key: String,
    pub(super) fingerprint: Option<String>,
    pub(super) lease: Duration,
    pub(super) token_expires: Option<std::time::SystemTime>,
}

/// How a body ended.
pub(super) enum Driven<T> {
    Finished(T),
    /// The lease was lost and the call aborts: the body was dropped.
    Lost(&'static str),
}

/// A failure's text where the error type has no `Display` the runtime can ask for: its type's
/// name.
pub(super) fn named<E>(_: &E) -> String {
    format!("the body returned an error of type {}", std::any::type_name::<E>())
}

/// What a call on a completed key returns.
pub(super) fn replay<T: DeserializeOwned>(key: &str, policy: OnDuplicate, result: Option<&[u8]>) -> Result<T, Error> {
    match (policy, result) {
        (OnDuplicate::Replay, Some(bytes)) => {
            codec::decode(bytes).map_err(|message| Error::Codec { key: key.to_owned(), message })
        }
        (_, result) => Err(Error::Duplicate { key: key.to_owned(), replayable: result.is_some() }),
    }
}
