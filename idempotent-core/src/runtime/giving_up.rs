//! `on_error = give_up_after(N)`: a body's `Err` frees its key for a retry, counted, and the
//! N-th failure marks the key as given up, so that a poison message redelivered forever stops
//! running after N tries.
//!
//! Built from the state machine every store already has, with nothing new asked of a store: the
//! key's first attempt runs on its own record, and a failed attempt completes its record with a
//! marker (`Stored::Failed`) instead of releasing it. The next attempt runs on a record of its
//! own, the first key followed by `#`, the chain's id (drawn by the first failure and written
//! in its marker) and the attempt's number: `orders:42#<chain>.2`. So a duplicate walks the
//! chain from the first record, one acquire per step, each answered atomically by the store;
//! two duplicates that reach the same free step race for it as for any key, and the loser waits
//! or is told the key is in progress. Every guarantee of a single call holds per step; attempt
//! numbers can only grow, because a step's record is written once, and the step that gives up
//! completes with `Stored::GaveUp`, which every later walk stops at.
//!
//! A chain starts again when its first record goes (its `keep` ends, or an operator forgets the
//! key): the next failure draws a new chain id, so the old chain's records, still kept, are
//! never read again.

use std::fmt::Display;
use std::future::Future;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::call::{Call, Mode, OnDuplicate, MAX_KEY_BYTES};
use crate::error::Error;
use crate::ids;

use super::Idempotency;

/// The most attempts `give_up_after` accepts: each is one record, and a duplicate walks them all.
pub const MAX_ATTEMPTS: u32 = 100;

/// The bytes a later attempt's key adds to the first one: `#`, a chain id, `.`, a number.
const CHAIN_SUFFIX_BYTES: usize = 1 + 22 + 1 + 3;

/// What one attempt's record holds under `give_up_after`.
#[derive(Serialize, Deserialize)]
enum Stored<T> {
    /// The body's value: the key completed at this attempt.
    Done(T),
    /// The body failed here, and the next attempt runs on the chain's next record.
    Failed {
        /// The chain's id: the same in every marker of one chain.
        chain: String,
        /// The body's error, as its `Display` wrote it.
        error: String,
    },
    /// The body failed here for the N-th time: the key is not run again.
    GaveUp {
        /// How many attempts failed.
        attempts: u32,
        /// The last one's error.
        error: String,
    },
}

impl Idempotency {
    /// Runs `body` like [`run`](Self::run), and gives up on the key after `attempts` failures:
    /// an `Err` of the body frees the key for a retry (the caller gets its `Err`), counted
    /// across retries, by any process; the `attempts`-th `Err` marks the key as given up, and
    /// every call after it gets [`Error::GaveUp`] with the count and the last error's text,
    /// without running the body, until an operator forgets the key ([`forget`](Self::forget),
    /// `idempotency purge`) or its records' `keep` ends. [`CallContext::attempt`] tells the
    /// body which attempt it is. The attribute's `on_error = give_up_after(N)`.
    ///
    /// What it costs: a retry after `k` failures asks the store `k + 1` times before its body
    /// runs (each failed attempt keeps a small record of its own, for `keep`), and so does a
    /// duplicate of a key that succeeded at attempt `k + 1`. A key that never fails costs what
    /// `run` costs. A panic or a dropped call is not counted: it frees its record, as in `run`.
    /// Token mode is refused ([`Error::InvalidCall`]): a token's record lives as long as the
    /// token, which the later attempts' records could not follow.
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
    ///
    /// [`CallContext::attempt`]: crate::CallContext::attempt
    pub async fn run_giving_up<T, E, F, Fut>(&self, call: Call, attempts: u32, body: F) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error> + Display,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let first_key = call.full_key();
        check(&call, &first_key, attempts)?;
        // Every step replays what it finds (a failure marker is read, not refused); a policy of
        // rejecting duplicates applies to the value the chain ends in.
        let reject = call.on_duplicate == OnDuplicate::Reject;
        let call = call.on_duplicate(OnDuplicate::Replay);
        let mut body = Some(body);
        let mut failed: Option<E> = None;
        let mut chain: Option<String> = None;
        let mut last_error = String::new();
        for attempt in 1..=attempts {
            let step = match &chain {
                None => call.clone(),
                Some(chain) => call.on_key(format!("{first_key}#{chain}.{attempt}"), attempt - 1),
            };
            let marker_chain = chain.clone().unwrap_or_else(|| ids::owner_id().as_str().to_owned());
            let (slot, failure) = (&mut body, &mut failed);
            let stored = self
                .run(step, || async move {
                    let Some(body) = slot.take() else {
                        // Unreachable: a step that runs the body ends the walk.
                        return Err(E::from(Error::InvalidCall {
                            key: String::new(),
                            reason: "the body of a give_up_after call was asked to run twice".into(),
                        }));
                    };
                    match body().await {
                        Ok(value) => Ok(Stored::Done(value)),
                        Err(e) => {
                            let error = e.to_string();
                            *failure = Some(e);
                            Ok(if attempt >= attempts {
                                Stored::GaveUp { attempts: attempt, error }
                            } else {
                                Stored::Failed { chain: marker_chain, error }
                            })
                        }
                    }
                })
                .await;
            // The body's own error first, whatever became of its marker.
            if let Some(e) = failed.take() {
                return Err(e);
            }
            let stored = stored?;
            let ran = body.is_none();
            match stored {
                Stored::Done(_) if reject && !ran => {
                    return Err(Error::Duplicate { key: first_key, replayable: true }.into());
                }
                Stored::Done(value) => return Ok(value),
                Stored::GaveUp { attempts, error } => {
                    return Err(Error::GaveUp { key: first_key, attempts, last_error: error }.into());
                }
                Stored::Failed { chain: theirs, error } => {
                    chain.get_or_insert(theirs);
                    last_error = error;
                }
            }
        }
        // Every step failed, none said it gave up: the key was run under a larger limit. This
        // call's limit is reached.
        Err(Error::GaveUp { key: first_key, attempts, last_error }.into())
    }
}

/// Refuses what the chain could not keep: no attempts, too many, token mode, a first key that
/// leaves no room for the later ones' keys.
fn check(call: &Call, first_key: &str, attempts: u32) -> Result<(), Error> {
    let invalid = |reason: String| Error::InvalidCall { key: first_key.to_owned(), reason };
    if attempts == 0 || attempts > MAX_ATTEMPTS {
        return Err(invalid(format!("give_up_after({attempts}): the attempts must be 1 to {MAX_ATTEMPTS}")));
    }
    if call.mode == Mode::Token {
        return Err(invalid("give_up_after does not go with token mode: a token's record lives as long as the token, which the later attempts' records could not follow".into()));
    }
    if attempts > 1 && first_key.len() + CHAIN_SUFFIX_BYTES > MAX_KEY_BYTES {
        return Err(Error::InvalidKey {
            key: first_key.to_owned(),
            reason: format!(
                "{} bytes: with give_up_after, a key may have at most {} bytes (the later attempts' keys add {CHAIN_SUFFIX_BYTES})",
                first_key.len(),
                MAX_KEY_BYTES - CHAIN_SUFFIX_BYTES
            ),
        });
    }
    Ok(())
}
