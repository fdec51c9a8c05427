//! A batch whose bodies' effects and records commit together (`Batch::run_committing`): the
//! bodies run one after the other, each handed the caller's state (a store's transaction) and
//! handing it on; then every completed record goes to the caller's commit with that state, which
//! writes them beside the effects and commits all at once, or nothing. The inbox pattern, for a
//! store that can write records inside a transaction of its own (PostgreSQL:
//! `PgStore::run_batch_in_transaction`).

use std::future::Future;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::time::Instant;

use crate::context::CallContext;
use crate::error::{Error, StoreError, StoreErrorKind};
use crate::store::{Completed, Transition};

use super::batch::{Batch, Lost, Ran, Slot};
use super::commit::replayable;
use super::settled::{recorded, Settled};

impl<T> Batch<T>
where
    T: Serialize + DeserializeOwned,
{
    /// Runs `body(state, index, context)` for every item won, one after the other (they share
    /// `state`: one transaction has one connection), each under its call's context, and hands
    /// `state` on from each body to the next; then hands `state` and every completed record to
    /// `commit`, which writes the records beside the bodies' effects and commits them together.
    /// [`run`](Self::run) is the batch that commits through the store instead.
    ///
    /// `spent(&state)`, asked before each item's turn and before the commit, says whether the
    /// state can take no more (the store's transaction broke, or no one can tell what it holds):
    /// then the items left do not run, nothing is committed, and every item whose body returned
    /// its value, and every item left, is released and settled as [`Settled::Unavailable`] with
    /// that error, no attempt counted. A body that returned `Err` keeps its failure, counted as
    /// any body's `Err` is.
    ///
    /// `commit` answers one [`Transition`] per record, in order. Every one `Done`: the effects and
    /// the records are committed, and the items are [`Settled::Executed`]. Any other: `commit`
    /// must have rolled everything back; the batch releases every item's key (owner-checked) and
    /// settles each as [`Settled::Unavailable`] (`LeaseLost` for a record that was not this
    /// batch's any more, `Corrupt` for one that was not a record, `Store` for the items rolled
    /// back with them), so that their deliveries are handed back and run again. `Err`: nothing
    /// was committed; likewise.
    ///
    /// A body's `Err` must leave `state` as it was before that body (the store's wrapper rolls
    /// back to a savepoint): the item is released and the others go on. An item whose lease was
    /// lost before its turn does not run; a lease lost while a body runs does not stop it (its
    /// state is inside it): the commit, owner-checked, finds the loss. Dropped or unwinding before
    /// `commit` has answered, the batch releases every key it holds, the ones whose bodies ran
    /// too: their effects go with the state.
    pub async fn run_committing<X, E, F, Fut, S, C, CFut>(
        mut self,
        state: X,
        mut body: F,
        spent: S,
        commit: C,
    ) -> Vec<Settled<T, E>>
    where
        E: std::fmt::Display,
        F: FnMut(X, usize, CallContext) -> Fut,
        Fut: Future<Output = (X, Result<T, E>)>,
        S: Fn(&X) -> Option<StoreError>,
        C: FnOnce(X, Vec<Completed>) -> CFut,
        CFut: Future<Output = Result<Vec<Transition>, StoreError>>,
    {
        self.effects_uncommitted = true;
        let max = self.idem.inner.max_result_bytes;
        let mut state = state;
        let mut failed: Vec<(usize, E)> = Vec::new();
        let mut lost: Vec<Lost> = Vec::new();
        let mut broken: Option<StoreError> = None;
        for index in 0..self.slots.len() {
            let Slot::Held(holding) = &self.slots[index] else { continue };
            let context = holding.held.context.clone();
            if broken.is_none() {
                broken = spent(&state);
            }
            if let Some(cause) = &broken {
                lost.push(Lost::not_run_after(index, &context, cause));
                continue;
            }
            if context.is_lease_lost() {
                lost.push(Lost::before_its_turn(index, &context));
                continue;
            }
            let (handed_on, out) = context.clone().scope(body(state, index, context)).await;
            state = handed_on;
            match out {
                Err(e) => failed.push((index, e)),
                Ok(value) => {
                    let holding = self.take_held(index);
                    let encoded =
                        crate::codec::encode(&value, max).unwrap_or_else(crate::codec::Encoded::NotReplayable);
                    self.slots[index] = Slot::Ran(Box::new(Ran { holding, value, encoded }));
                }
            }
        }
        let mut settled: Vec<Option<Settled<T, E>>> = (0..self.slots.len()).map(|_| None).collect();
        // The failed bodies' effects were rolled back to their savepoints: their keys go back now.
        self.release_unfinished(failed, lost, &mut settled).await;

        let ran: Vec<usize> = (0..self.slots.len()).filter(|&i| matches!(self.slots[i], Slot::Ran(_))).collect();
        let completed = self.records_of(&ran);
        if broken.is_none() {
            broken = spent(&state);
        }
        if completed.is_empty() {
            // Nothing to write: the state (a transaction with no effect left) is dropped.
            drop(state);
            self.effects_uncommitted = false;
            return self.settle_rest(settled);
        }
        let generation = self.idem.inner.cache_generation();
        let sent = Instant::now();
        let answer = match broken {
            // Nothing can be committed: the state goes (a transaction dropped rolls back).
            Some(cause) => {
                drop(state);
                Err(cause)
            }
            None => commit(state, completed.clone()).await,
        };
        let all_done = matches!(&answer, Ok(t) if t.len() == ran.len() && t.iter().all(|t| *t == Transition::Done));
        if all_done {
            self.effects_uncommitted = false;
            self.settle_committed(&ran, &completed, sent, generation, &mut settled);
            return self.settle_rest(settled);
        }

        // Rolled back: every item that ran goes back, with why.
        let rolled_back = rolled_back(&answer, &completed, &ran);
        // Back to held, so that `release_unfinished` releases them as it does a lost lease.
        for &index in &ran {
            let Slot::Ran(r) = std::mem::replace(&mut self.slots[index], Slot::Empty) else {
                unreachable!("listed as ran")
            };
            self.slots[index] = Slot::Held(Box::new(r.holding));
        }
        self.effects_uncommitted = false;
        self.release_unfinished(Vec::new(), rolled_back, &mut settled).await;
        self.settle_rest(settled)
    }
}

impl<T> Batch<T> {
    /// The completed record of each item `ran` names (its body returned its value).
    fn records_of(&mut self, ran: &[usize]) -> Vec<Completed> {
        let mut records = Vec::with_capacity(ran.len());
        for &i in ran {
            let Slot::Ran(r) = &mut self.slots[i] else { unreachable!("listed as ran") };
            let held = &r.holding.held;
            let key = held.context.key();
            let encoded = std::mem::replace(&mut r.encoded, crate::codec::Encoded::NotReplayable(String::new()));
            records.push(Completed {
                key: key.to_owned(),
                owner: held.context.owner().to_owned(),
                fence: held.context.fence_read().unwrap_or(0),
                keep: self.idem.keep_for(&r.holding.call, held),
                result: replayable(key, encoded),
                fingerprint: held.fingerprint.clone(),
            });
        }
        records
    }

    /// Settles the items `ran` names as executed and stored, their results in the replay cache.
    fn settle_committed<E>(
        &mut self,
        ran: &[usize],
        completed: &[Completed],
        sent: Instant,
        generation: u64,
        settled: &mut [Option<Settled<T, E>>],
    ) {
        for (&index, record) in ran.iter().zip(completed) {
            let Slot::Ran(r) = std::mem::replace(&mut self.slots[index], Slot::Empty) else {
                unreachable!("listed as ran")
            };
            if let Some(bytes) = &record.result {
                let until = sent + record.keep;
                self.idem.inner.cache_put(&record.key, record.fingerprint.as_deref(), bytes, until, generation);
            }
            let item = Settled::Executed { value: r.value, stored: true };
            settled[index] = Some(recorded(item, &r.holding.call));
        }
    }
}

/// Why each item that ran was rolled back with the batch, by its index: its own record not the
/// batch's (`LeaseLost`, `Corrupt`), the commit's error, or another item's lost record.
fn rolled_back(answer: &Result<Vec<Transition>, StoreError>, completed: &[Completed], ran: &[usize]) -> Vec<Lost> {
    let why = |n: usize| -> Error {
        let key = completed[n].key.clone();
        match answer {
            Err(source) => Error::Store { key, source: source.copied() },
            Ok(transitions) => match transitions.get(n) {
                Some(Transition::Lost) => Error::LeaseLost {
                    key,
                    reason: "another owner took the key: the batch's writes were rolled back".into(),
                },
                Some(Transition::Corrupt { reason }) => Error::Corrupt { key, reason: reason.clone() },
                _ => {
                    let lost = ran_keys(completed, transitions).join(", ");
                    let message =
                        format!("rolled back with the batch's transaction: the lease of {lost} was lost; run it again");
                    Error::Store { key, source: StoreError::new(StoreErrorKind::Unavailable, message) }
                }
            },
        }
    };
    // Their effects were rolled back: nothing of them is unknown, their keys go back.
    ran.iter().enumerate().map(|(n, &index)| Lost { index, error: why(n), ran: false }).collect()
}

/// The keys whose record `commit` did not find as this batch's.
fn ran_keys<'a>(completed: &'a [Completed], transitions: &[Transition]) -> Vec<&'a str> {
    completed.iter().zip(transitions).filter(|(_, t)| **t != Transition::Done).map(|(c, _)| c.key.as_str()).collect()
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use crate::call::Call;
    use crate::error::{Error, StoreError, StoreErrorKind};
    use crate::runtime::{Idempotency, Settled};
    use crate::store::memory::MemoryStore;

    /// The state breaks after the first body (a transaction whose savepoint got no answer): the
    /// items after it do not run, the commit is not called, and every item is unavailable with
    /// its key released and no attempt counted (under `give_up_after(1)` a counted failure would
    /// have given the keys up); claimed again, all three run.
    #[tokio::test]
    async fn a_spent_state_runs_nothing_more_and_commits_nothing() {
        let idem = Idempotency::new(MemoryStore::new());
        let calls = || ["a", "b", "c"].map(|k| Call::new(k).give_up_after(1));
        let batch = idem.claim::<u32>(calls()).await;
        assert_eq!(batch.to_run(), 3);
        let ran = Cell::new(0);
        let committed = Cell::new(false);
        let settled = batch
            .run_committing(
                false,
                |_, i, _| {
                    ran.set(ran.get() + 1);
                    // The first body's state comes back broken.
                    std::future::ready((true, Ok::<u32, Error>(i as u32)))
                },
                |broken: &bool| broken.then(|| StoreError::new(StoreErrorKind::Timeout, "savepoint: no answer")),
                |_, _| {
                    committed.set(true);
                    std::future::ready(Ok(Vec::new()))
                },
            )
            .await;
        assert_eq!(ran.get(), 1, "a body ran after the state broke");
        assert!(!committed.get(), "a spent state was committed");
        for (i, item) in settled.iter().enumerate() {
            match item {
                Settled::Unavailable(Error::Store { source, .. }) => {
                    assert_eq!(source.kind(), StoreErrorKind::Timeout, "item {i}: {source}");
                    assert_eq!(source.message().contains("not run"), i > 0, "item {i}: {source}");
                }
                other => panic!("item {i}: expected unavailable, got {other:?}"),
            }
        }
        let again = idem.claim::<u32>(calls()).await;
        assert_eq!(again.to_run(), 3, "a key was not released, or its attempt was counted");
    }
}
