//! Batches: many calls' keys claimed in one round trip (`Idempotency::claim`), the bodies of the
//! items won run by the caller's closure (in order or several at once), then every completed item
//! committed and every failed one released, each in one round trip (what became of each item:
//! `settled`).
//!
//! Each item is a call of its own: its own owner id, lease (renewed by the watchdog with every
//! other lease of the runtime, in one command per hash slot), fence, fingerprint and record; a
//! key that appears twice in one batch is in progress for its second copy.

use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::time::Instant;

use crate::call::Call;
use crate::call::OnCrash;
use crate::codec::{self, Encoded};
use crate::context::CallContext;
use crate::error::{Error, StoreError};
use crate::ids;
use crate::store::{
    error_text, join_all, AcquireOutcome, AcquireRequest, CommitRequest, FailRequest, Store, Transition,
};
use crate::telemetry;
use crate::watchdog::Registration;

use super::commit::PendingCommit;
use super::pipeline::{replay, Prepared};
use super::resolving::moment;
use super::settled::{recorded, Settled};
use super::state::{check_fingerprint, Held};
use super::waiting::Abandon;
use super::Idempotency;

/// A batch whose keys are claimed ([`Idempotency::claim`]): the items won wait for
/// [`run`](Batch::run). Dropped without running (or while running), it releases every key it
/// holds and stores every result its bodies returned, in the background.
pub struct Batch<T> {
    pub(super) idem: Idempotency,
    pub(super) slots: Vec<Slot<T>>,
    /// The bodies' effects live in the caller's transaction, not yet committed
    /// ([`run_committing`](Batch::run_committing)): dropped, the batch releases the items that ran
    /// instead of storing their results, since their effects go with the transaction.
    pub(super) effects_uncommitted: bool,
}

/// One item of a batch, as it goes.
pub(super) enum Slot<T> {
    /// Claimed: the body may run.
    Held(Box<Holding>),
    /// The body returned a value: to commit.
    Ran(Box<Ran<T>>),
    /// Nothing left to do in the store.
    Settled(Settled<T, std::convert::Infallible>),
    /// Taken out while the batch finishes.
    Empty,
}

/// A key the batch holds for an item.
pub(super) struct Holding {
    pub(super) call: Call,
    pub(super) held: Held,
    pub(super) registration: Registration,
}

/// An item whose body returned its value, to commit.
pub(super) struct Ran<T> {
    pub(super) holding: Holding,
    pub(super) value: T,
    pub(super) encoded: Encoded,
}

impl Idempotency {
    /// Claims every call's key at once: one round trip on a standalone Redis server (one script
    /// call per hash slot on a cluster, all at once; the memory store answers at once; other
    /// stores one acquire after the other unless they send them together). Each call is checked
    /// as [`run`](Self::run) checks it (key, token, fingerprint, the replay cache); a batch never
    /// waits for a key in progress elsewhere, whatever the call's `on_conflict`: it reports it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use idempotency::{Ack, AckPlan, Call, Error, Idempotency, MemoryStore};
    ///
    /// let idem = Idempotency::new(MemoryStore::new());
    /// let ids = ["m1", "m2", "m1"];
    /// let batch = idem.claim::<u32>(ids.iter().map(|id| Call::new(*id).scope("orders"))).await;
    /// assert_eq!(batch.to_run(), 2); // the second m1 finds the first in progress
    /// let settled = batch.run(1, |i, _context| async move { Ok::<u32, Error>(i as u32 * 10) }).await;
    /// let plan = AckPlan::of(&settled);
    /// assert_eq!((plan.ack, plan.requeue), (vec![0, 1], vec![2]));
    ///
    /// // Redelivered: replayed, not run again.
    /// let again = idem.claim::<u32>([Call::new("m1").scope("orders")]).await;
    /// let settled = again.run(1, |_, _| async { Ok::<u32, Error>(99) }).await;
    /// assert!(matches!(settled[0], idempotency::Settled::Replayed(Ok(0))));
    /// assert_eq!(settled[0].ack(), Ack::Ack);
    /// # }
    /// ```
    pub async fn claim<T>(&self, calls: impl IntoIterator<Item = Call>) -> Batch<T>
    where
        T: Serialize + DeserializeOwned,
    {
        let mut slots: Vec<Slot<T>> = Vec::new();
        // The items that go to the store: their slot, call, what it takes there, and its owner.
        let mut going = Vec::new();
        for mut call in calls {
            let index = slots.len();
            match self.prepare(&mut call) {
                Err(e) => {
                    let settled = Settled::Refused(e);
                    slots.push(Slot::Settled(recorded(settled, &call)));
                }
                Ok(Prepared::Cached { key, hit }) => {
                    let settled = Settled::Replayed(replay(&key, call.on_duplicate, Some(&hit.result)));
                    slots.push(Slot::Settled(recorded(settled, &call)));
                }
                Ok(Prepared::Store(go)) => {
                    let kept = self.kept(&call, go.token_expires);
                    match self.taking(&call, &go.key, kept.left(|| self.inner.token_clock.now())) {
                        Err(e) => slots.push(Slot::Settled(recorded(Settled::Refused(e), &call))),
                        Ok(how) => {
                            slots.push(Slot::Empty);
                            going.push((index, call, go, ids::owner_id(), how));
                        }
                    }
                }
            }
        }
        let requests: Vec<AcquireRequest<'_>> = going
            .iter()
            .map(|(_, _, go, owner, how)| AcquireRequest {
                key: &go.key,
                owner: owner.as_str(),
                lease: go.lease,
                fingerprint: go.fingerprint.as_deref(),
                will_wait: false,
                report_ttl: self.inner.cache.is_some(),
                fence_now: false,
                lapse: how.lapse,
                keep: how.keep,
            })
            .collect();
        let generation = self.inner.cache_generation();
        let sent = Instant::now();
        // Armed before the claim is sent, as one call's acquire is: a claim dropped while it is in
        // flight has every key it may have taken released, owner-checked, in the background.
        let abandon: Vec<Abandon<'_>> = going
            .iter()
            .map(|(_, _, go, owner, _)| Abandon {
                store: Some(&self.inner.store),
                key: &go.key,
                owner: owner.as_str(),
                lease: go.lease,
            })
            .collect();
        let found = if requests.is_empty() { Vec::new() } else { self.inner.store.acquire_many(&requests).await };
        abandon.into_iter().for_each(Abandon::disarm);
        drop(requests);
        let answered = sent.elapsed();
        for ((index, call, go, owner, _), found) in going.into_iter().zip(found) {
            let key = go.key;
            let settled = match found {
                Ok(AcquireOutcome::Acquired { fence, attempt }) => {
                    let margin = crate::watchdog::safety_margin(go.lease);
                    if Instant::now() + margin >= sent + go.lease {
                        // As for one call (`waiting::take`): a reply later than the lease may
                        // come after another caller took the key.
                        self.release_in_background(&key, owner.as_str(), go.lease);
                        Settled::Unavailable(Error::LeaseLost {
                            key,
                            reason: format!(
                                "the store answered the batch's acquire after {answered:?}, with the lease of {:?} \
                                 (less its safety margin) run out: another caller may hold the key",
                                go.lease
                            ),
                        })
                    } else {
                        let kept = self.kept(&call, go.token_expires);
                        let context =
                            CallContext::new(key, owner, fence, attempt, self.inner.store.clone()).keeping(kept);
                        let held = Held {
                            context,
                            lease: go.lease,
                            sent,
                            fingerprint: go.fingerprint,
                            token_expires: go.token_expires,
                        };
                        if let Some(limit) = call.give_up_after.filter(|limit| attempt > *limit) {
                            Settled::Refused(self.give_up_unrun(&call, &held, limit).await)
                        } else {
                            let registration =
                                self.inner.watchdog.register(go.lease, call.renew, sent, held.context.clone());
                            slots[index] = Slot::Held(Box::new(Holding { call, held, registration }));
                            continue;
                        }
                    }
                }
                Ok(AcquireOutcome::Completed { fingerprint: theirs, result, kept_for }) => {
                    match check_fingerprint(&key, theirs.as_deref(), go.fingerprint.as_deref()) {
                        Err(e) => Settled::Refused(e),
                        Ok(()) => {
                            if let Some(bytes) = &result {
                                self.inner.cache_put(&key, theirs.as_deref(), bytes, sent + kept_for, generation);
                            }
                            Settled::Replayed(replay(&key, call.on_duplicate, result.as_deref()))
                        }
                    }
                }
                Ok(AcquireOutcome::InProgress { fingerprint: theirs, .. }) => {
                    match check_fingerprint(&key, theirs.as_deref(), go.fingerprint.as_deref()) {
                        Err(e) => Settled::Refused(e),
                        Ok(()) => Settled::InProgress,
                    }
                }
                Ok(AcquireOutcome::GaveUp { fingerprint: theirs, attempts, last_error }) => {
                    match check_fingerprint(&key, theirs.as_deref(), go.fingerprint.as_deref()) {
                        Err(e) => Settled::Refused(e),
                        Ok(()) => Settled::Refused(Error::GaveUp { key, attempts, last_error }),
                    }
                }
                // A batch does not ask the resolver: the item goes back until the outcome is
                // resolved (by a single call that asks it, or an operator).
                Ok(AcquireOutcome::Unknown { fingerprint: theirs, owner: holder, lease_ended_ms, attempt }) => {
                    match check_fingerprint(&key, theirs.as_deref(), go.fingerprint.as_deref()) {
                        Err(e) => Settled::Refused(e),
                        Ok(()) => Settled::Held(Error::OutcomeUnknown {
                            key,
                            owner: holder,
                            lease_ended: moment(lease_ended_ms),
                            attempt,
                        }),
                    }
                }
                Ok(AcquireOutcome::Corrupt { reason }) => Settled::Refused(Error::Corrupt { key, reason }),
                Err(source) => {
                    // It may still land later: the store releases it for this owner.
                    self.release_in_background(&key, owner.as_str(), go.lease);
                    Settled::Unavailable(Error::Store { key, source })
                }
            };
            slots[index] = Slot::Settled(recorded(settled, &call));
        }
        Batch { idem: self.clone(), slots, effects_uncommitted: false }
    }
}

impl<T> Batch<T>
where
    T: Serialize + DeserializeOwned,
{
    /// How many items the batch holds.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether the batch has no items.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// How many items were won: their bodies run in [`run`](Self::run).
    pub fn to_run(&self) -> usize {
        self.slots.iter().filter(|s| matches!(s, Slot::Held(_))).count()
    }

    /// The context of item `index`, if the batch won its key.
    pub fn context(&self, index: usize) -> Option<&CallContext> {
        match self.slots.get(index) {
            Some(Slot::Held(h)) => Some(&h.held.context),
            _ => None,
        }
    }

    /// Runs `body(index, context)` for every item won, at most `concurrency` at once (1: in
    /// order), each under its call's context ([`CallContext::current`]) and lease; then commits
    /// every item whose body returned `Ok` in one round trip and releases every one that returned
    /// `Err` in another. An item whose lease was lost before its turn does not run
    /// ([`Settled::Unavailable`]); one whose lease is lost while its body runs is stopped there
    /// if its call says `abort_on_lease_lost`, as for one call. Answers, per item in order, what
    /// became of it; [`AckPlan::of`](super::AckPlan::of) maps that onto a broker.
    ///
    /// A panic of a body goes on unwinding: the batch, dropped, releases the keys it holds and
    /// stores the results returned so far, in the background. So does a batch dropped mid-run.
    pub async fn run<E, F, Fut>(mut self, concurrency: usize, mut body: F) -> Vec<Settled<T, E>>
    where
        E: Display,
        F: FnMut(usize, CallContext) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let runnable: Vec<usize> = (0..self.slots.len()).filter(|&i| matches!(self.slots[i], Slot::Held(_))).collect();
        let mut failed: Vec<(usize, E)> = Vec::new();
        let mut lost: Vec<Lost> = Vec::new();
        {
            let mut next = 0;
            let mut inflight = Vec::new();
            let slots = &mut self.slots;
            let max = self.idem.inner.max_result_bytes;
            std::future::poll_fn(|cx| loop {
                while inflight.len() < concurrency.max(1) && next < runnable.len() {
                    let index = runnable[next];
                    next += 1;
                    let Slot::Held(holding) = &slots[index] else { continue };
                    let context = holding.held.context.clone();
                    if context.is_lease_lost() {
                        lost.push(Lost::before_its_turn(index, &context));
                        continue;
                    }
                    let abort = holding.call.abort_on_lease_lost;
                    inflight.push((index, Box::pin(driven(context.clone(), abort, body(index, context)))));
                }
                let mut finished = false;
                let mut i = 0;
                while i < inflight.len() {
                    let (index, fut) = &mut inflight[i];
                    if let Poll::Ready(out) = fut.as_mut().poll(cx) {
                        let index = *index;
                        drop(inflight.swap_remove(i));
                        finished = true;
                        match out {
                            Err(reason) => {
                                let Slot::Held(h) = &slots[index] else { unreachable!("a running item is held") };
                                let key = h.held.context.key().to_owned();
                                let error = Error::LeaseLost { key, reason: reason.into() };
                                lost.push(Lost { index, error, ran: true });
                            }
                            Ok(Err(e)) => failed.push((index, e)),
                            Ok(Ok(value)) => {
                                let Slot::Held(holding) = std::mem::replace(&mut slots[index], Slot::Empty) else {
                                    unreachable!("a running item is held")
                                };
                                let encoded = codec::encode(&value, max).unwrap_or_else(Encoded::NotReplayable);
                                slots[index] = Slot::Ran(Box::new(Ran { holding: *holding, value, encoded }));
                            }
                        }
                    } else {
                        i += 1;
                    }
                }
                if inflight.is_empty() && next >= runnable.len() {
                    return Poll::Ready(());
                }
                if !finished {
                    return Poll::Pending;
                }
            })
            .await;
        }
        self.finish(failed, lost).await
    }

    /// Records the failed items and releases the lost ones, commits the completed ones, and says
    /// what became of every item. Each item stays in the batch until the store has answered for
    /// it, so that a batch dropped meanwhile still releases or stores it.
    async fn finish<E: Display>(mut self, failed: Vec<(usize, E)>, lost: Vec<Lost>) -> Vec<Settled<T, E>> {
        let mut settled: Vec<Option<Settled<T, E>>> = (0..self.slots.len()).map(|_| None).collect();
        self.release_unfinished(failed, lost, &mut settled).await;
        self.commit_ran(&mut settled).await;
        self.settle_rest(settled)
    }

    /// Records the failures of the items whose body failed (each counted, or its key given up),
    /// and releases the keys of the ones whose lease was lost, owner-checked, one round trip
    /// each, and settles them. Under `on_crash = hold`, an item whose body was stopped by the loss
    /// of its lease is left to its lease: whether it had its effect is unknown.
    pub(super) async fn release_unfinished<E: Display>(
        &mut self,
        failed: Vec<(usize, E)>,
        lost: Vec<Lost>,
        settled: &mut [Option<Settled<T, E>>],
    ) {
        let idem = self.idem.clone();
        if !failed.is_empty() {
            // Owned, so that the future holds no borrow of the batch across the round trip (a
            // borrow there makes the future of a caller's generic batch not `Send`).
            let failures: Vec<Owned> = failed
                .iter()
                .map(|(i, e)| {
                    let holding = self.holding(*i);
                    let held = &holding.held;
                    let error = e.to_string();
                    // What one call's failure would leave: its keep, and whether it gives up.
                    let failure = idem.failure(&holding.call, held, error_text(&error));
                    Owned {
                        key: held.context.key().to_owned(),
                        owner: held.context.owner().to_owned(),
                        lease: held.lease,
                        attempt: held.context.attempt(),
                        error: failure.error.to_owned(),
                        keep: failure.keep,
                        give_up: failure.give_up,
                        fingerprint: failure.fingerprint.map(str::to_owned),
                    }
                })
                .collect();
            let answers = {
                let requests: Vec<FailRequest<'_>> = failures.iter().map(Owned::request).collect();
                idem.inner.store.fail_many(&requests).await
            };
            for (failure, answer) in failures.iter().zip(answers) {
                idem.settle_store_answer("failure", &failure.key, &failure.owner, failure.lease, answer);
            }
            for ((index, e), failure) in failed.into_iter().zip(failures) {
                let holding = self.take_held(index);
                let item = if failure.give_up {
                    Settled::GaveUp { error: e, attempts: failure.attempt }
                } else {
                    Settled::Failed(e)
                };
                settled[index] = Some(recorded(item, &holding.call));
            }
        }
        let (left, releasing): (Vec<Lost>, Vec<Lost>) =
            lost.into_iter().partition(|l| l.ran && self.holding(l.index).call.on_crash == OnCrash::Hold);
        for l in &left {
            tracing::warn!(key = %telemetry::logged_key(self.holding(l.index).held.context.key()), "idempotency batch item stopped without an outcome under on_crash = hold: its key stays held, and is unknown once its lease ends");
        }
        if !releasing.is_empty() {
            let held = self.keys_held(&releasing.iter().map(|l| l.index).collect::<Vec<_>>());
            let released = {
                let pairs: Vec<(&str, &str)> = held.iter().map(|(k, o, _)| (k.as_str(), o.as_str())).collect();
                idem.inner.store.release_many(&pairs).await
            };
            for ((key, owner, lease), released) in held.into_iter().zip(released) {
                idem.settle_store_answer("release", &key, &owner, lease, released);
            }
        }
        for Lost { index, error, .. } in left.into_iter().chain(releasing) {
            let holding = self.take_held(index);
            settled[index] = Some(recorded(Settled::Unavailable(error), &holding.call));
        }
    }

    /// Commits every item whose body returned its value, in one round trip; a commit that fails
    /// retries as one call's does.
    async fn commit_ran<E>(&mut self, settled: &mut [Option<Settled<T, E>>]) {
        let idem = self.idem.clone();
        let store = &idem.inner.store;
        let ran: Vec<usize> = (0..self.slots.len()).filter(|&i| matches!(self.slots[i], Slot::Ran(_))).collect();
        if !ran.is_empty() {
            let requests: Vec<CommitRequest<'_>> = ran
                .iter()
                .map(|&i| {
                    let Slot::Ran(r) = &self.slots[i] else { unreachable!("listed as ran") };
                    let held = &r.holding.held;
                    let result = match &r.encoded {
                        Encoded::Replayable(bytes) => Some(bytes.as_slice()),
                        Encoded::NotReplayable(why) => {
                            tracing::warn!(key = %telemetry::logged_key(held.context.key()), why = %why, "idempotency result stored as not replayable");
                            None
                        }
                    };
                    CommitRequest {
                        key: held.context.key(),
                        owner: held.context.owner(),
                        fence: held.context.fence_read().unwrap_or(0),
                        keep: idem.keep_for(&r.holding.call, held),
                        result,
                        fingerprint: held.fingerprint.as_deref(),
                        lease_in_record: held.lease_in_record(&r.holding.call),
                    }
                })
                .collect();
            let generation = idem.inner.cache_generation();
            let sent = Instant::now();
            let outcomes = store.commit_many(&requests).await;
            // Per item: what its commit settled (`Ok`), or the error to retry after (`Err`).
            let decided: Vec<Result<Result<bool, StoreError>, StoreError>> = requests
                .iter()
                .zip(outcomes)
                .map(|(request, outcome)| match outcome {
                    Err(e) if e.may_succeed_later() => Err(e),
                    outcome => Ok(idem.inner.committed(request, outcome, sent, generation)),
                })
                .collect();
            drop(requests);
            let mut retries = Vec::new();
            for (index, decided) in ran.into_iter().zip(decided) {
                let Slot::Ran(r) = std::mem::replace(&mut self.slots[index], Slot::Empty) else {
                    unreachable!("listed as ran")
                };
                match decided {
                    Err(first) => retries.push((index, r, first)),
                    Ok(committed) => {
                        let item = match committed {
                            Ok(stored) => Settled::Executed { value: r.value, stored },
                            Err(source) => Settled::Unavailable(Error::Unconfirmed {
                                key: r.holding.held.context.key().to_owned(),
                                source,
                            }),
                        };
                        settled[index] = Some(recorded(item, &r.holding.call));
                    }
                }
            }
            let retried = retries.into_iter().map(|(index, r, first)| {
                let idem = &idem;
                async move {
                    let Ran { holding, value, encoded } = *r;
                    let key = holding.held.context.key();
                    tracing::warn!(key = %telemetry::logged_key(key), error = %first, "idempotency commit failed; retrying");
                    let lease_end = holding.registration.finish().unwrap_or(holding.held.sent + holding.held.lease);
                    let item = match idem.commit(&holding.call, &holding.held, encoded, lease_end).await {
                        Ok(stored) => Settled::Executed { value, stored },
                        Err(source) => {
                            Settled::Unavailable(Error::Unconfirmed { key: holding.held.context.key().to_owned(), source })
                        }
                    };
                    (index, recorded(item, &holding.call))
                }
            });
            for (index, item) in join_all(retried).await {
                settled[index] = Some(item);
            }
        }
    }

    /// Settles the items settled at the claim, and answers every item in order.
    pub(super) fn settle_rest<E>(&mut self, mut settled: Vec<Option<Settled<T, E>>>) -> Vec<Settled<T, E>> {
        for (index, slot) in self.slots.iter_mut().enumerate() {
            if let Slot::Settled(_) = slot {
                let Slot::Settled(s) = std::mem::replace(slot, Slot::Empty) else { unreachable!() };
                settled[index] = Some(match s {
                    Settled::Executed { value, stored } => Settled::Executed { value, stored },
                    Settled::Replayed(r) => Settled::Replayed(r),
                    Settled::InProgress => Settled::InProgress,
                    Settled::Held(e) => Settled::Held(e),
                    Settled::Refused(e) => Settled::Refused(e),
                    Settled::Unavailable(e) => Settled::Unavailable(e),
                    Settled::Failed(never) | Settled::GaveUp { error: never, .. } => match never {},
                });
            }
        }
        settled.into_iter().map(|s| s.expect("every item of a batch is settled")).collect()
    }

    /// The key, owner and lease of each item `indices` names, held.
    fn keys_held(&self, indices: &[usize]) -> Vec<(String, String, std::time::Duration)> {
        let of = |i: usize| {
            let held = &self.holding(i).held;
            (held.context.key().to_owned(), held.context.owner().to_owned(), held.lease)
        };
        indices.iter().map(|&i| of(i)).collect()
    }

    /// Item `index`'s hold, in place.
    fn holding(&self, index: usize) -> &Holding {
        match &self.slots[index] {
            Slot::Held(h) => h,
            _ => unreachable!("a released item is held"),
        }
    }

    /// Item `index`'s hold, taken out of the batch.
    pub(super) fn take_held(&mut self, index: usize) -> Holding {
        match std::mem::replace(&mut self.slots[index], Slot::Empty) {
            Slot::Held(h) => *h,
            _ => unreachable!("a released item is held"),
        }
    }
}

/// A body under its context; `Err` with the reason when its lease was lost and the call aborts.
async fn driven<T, E>(
    context: CallContext,
    abort: bool,
    body: impl Future<Output = Result<T, E>>,
) -> Result<Result<T, E>, &'static str> {
    let scoped = context.clone().scope(body);
    if abort {
        tokio::select! {
            biased;
            reason = context.lost() => Err(reason),
            out = scoped => Ok(out),
        }
    } else {
        Ok(scoped.await)
    }
}

/// An item whose lease was lost: before its turn (its body did not run), or while its body ran
/// (`ran`: it was stopped there, `abort_on_lease_lost`).
pub(super) struct Lost {
    pub(super) index: usize,
    pub(super) error: Error,
    pub(super) ran: bool,
}

impl Lost {
    /// An item whose lease was lost before its turn came.
    pub(super) fn before_its_turn(index: usize, context: &CallContext) -> Lost {
        let reason = "the lease was lost before the item's turn came: its body did not run";
        Lost { index, error: Error::LeaseLost { key: context.key().to_owned(), reason: reason.into() }, ran: false }
    }

    /// An item not run because the state a committing batch hands on broke at an earlier one.
    pub(super) fn not_run_after(index: usize, context: &CallContext, cause: &StoreError) -> Lost {
        let message = format!(
            "not run: the batch's transaction broke at an earlier item, and nothing of the batch was committed ({})",
            cause.message()
        );
        let source = StoreError::new(cause.kind(), message);
        Lost { index, error: Error::Store { key: context.key().to_owned(), source }, ran: false }
    }
}

/// A failure to record, owned (see `release_unfinished`).
struct Owned {
    key: String,
    owner: String,
    lease: std::time::Duration,
    attempt: u32,
    error: String,
    keep: std::time::Duration,
    give_up: bool,
    fingerprint: Option<String>,
}

impl Owned {
    fn request(&self) -> FailRequest<'_> {
        FailRequest {
            key: &self.key,
            owner: &self.owner,
            attempt: self.attempt,
            error: &self.error,
            keep: self.keep,
            give_up: self.give_up,
            fingerprint: self.fingerprint.as_deref(),
        }
    }
}

impl Idempotency {
    /// What the store answered for a batch item's `what` (a release or a failure): a key found
    /// not ours is logged; a store error has the key released in the background.
    fn settle_store_answer(
        &self,
        what: &str,
        key: &str,
        owner: &str,
        lease: std::time::Duration,
        answer: Result<Transition, StoreError>,
    ) {
        match answer {
            Ok(Transition::Done) => {}
            Ok(other) => {
                tracing::warn!(key = %telemetry::logged_key(key), what, outcome = ?other, "idempotency batch item's key found not ours")
            }
            Err(e) => {
                tracing::warn!(key = %telemetry::logged_key(key), what, error = %e, "idempotency batch item's key not released; releasing in the background");
                self.release_in_background(key, owner, lease);
            }
        }
    }
}

impl<T> Drop for Batch<T> {
    /// A batch dropped before it finished (cancelled, or a body panicked): its keys released and
    /// its results stored, in the background.
    fn drop(&mut self) {
        let store: &Arc<dyn Store> = &self.idem.inner.store;
        let mut pending = Vec::new();
        for slot in self.slots.drain(..) {
            match slot {
                Slot::Held(h) if h.call.on_crash == OnCrash::Hold => {
                    tracing::warn!(key = %telemetry::logged_key(h.held.context.key()), "idempotency batch dropped before this item finished, under on_crash = hold: its key stays held, and is unknown once its lease ends");
                }
                Slot::Held(h) => {
                    tracing::warn!(key = %telemetry::logged_key(h.held.context.key()), "idempotency batch dropped before this item finished; releasing its key in the background");
                    store.clone().abandon(h.held.context.key(), h.held.context.owner(), h.held.lease);
                }
                Slot::Ran(r) if self.effects_uncommitted => {
                    let held = &r.holding.held;
                    tracing::warn!(key = %telemetry::logged_key(held.context.key()), "idempotency batch dropped before its transaction committed; releasing this item's key in the background");
                    store.clone().abandon(held.context.key(), held.context.owner(), held.lease);
                }
                Slot::Ran(r) => {
                    let held = &r.holding.held;
                    let result = match r.encoded {
                        Encoded::Replayable(bytes) => Some(bytes),
                        Encoded::NotReplayable(_) => None,
                    };
                    pending.push(PendingCommit {
                        key: held.context.key().to_owned(),
                        owner: held.context.owner().to_owned(),
                        fence: held.context.fence_read().unwrap_or(0),
                        keep: self.idem.keep_for(&r.holding.call, held),
                        result,
                        fingerprint: held.fingerprint.clone(),
                        lease_in_record: held.lease_in_record(&r.holding.call),
                    });
                }
                Slot::Settled(_) | Slot::Empty => {}
            }
        }
        if pending.is_empty() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        let Some(slot) = crate::store::background::slot("commit") else { return };
        let store = store.clone();
        rt.spawn(async move {
            let _slot = slot;
            let requests: Vec<CommitRequest<'_>> = pending.iter().map(PendingCommit::request).collect();
            for (request, outcome) in requests.iter().zip(store.commit_many(&requests).await) {
                if !matches!(outcome, Ok(Transition::Done)) {
                    tracing::warn!(key = %telemetry::logged_key(request.key), outcome = ?outcome, "idempotency result of a dropped batch not stored");
                }
            }
        });
    }
}
