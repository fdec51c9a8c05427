//! What became of each item of a batch ([`Settled`]) and what a queue consumer does with its
//! delivery ([`Ack`], [`AckPlan`]).

use crate::call::Call;
use crate::error::Error;
use crate::telemetry::{self, CallOutcome};

/// What a queue consumer does with an item's delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ack {
    /// Done, now or before: acknowledge it.
    Ack,
    /// Not done, and may be done later (its body failed and its key was released, another
    /// process holds its key, its outcome is unknown until resolved, the store failed): hand it
    /// back to be delivered again.
    Requeue,
    /// Never to be done as it is (its key was used for another payload, or is not a valid key or
    /// token, or gave up after its failed attempts): move it aside.
    DeadLetter,
}

/// What became of one item of a batch.
#[derive(Debug)]
pub enum Settled<T, E> {
    /// The body ran. `stored`: the store confirmed its record (`false`: the key was taken by
    /// another holder after this item's lease was lost, or the commit goes on in the background
    /// past the commit deadline).
    Executed {
        /// The body's value.
        value: T,
        /// Whether the record is confirmed.
        stored: bool,
    },
    /// The key had completed before: its stored value, or why it cannot be returned as `T`
    /// (`Error::Duplicate` for a result kept as not replayable or under `on_duplicate =
    /// reject`, `Error::Codec`). The body did not run.
    Replayed(Result<T, Error>),
    /// The body returned `Err`: the failure was recorded and the key freed, a redelivery runs
    /// it again as the next attempt.
    Failed(E),
    /// The body returned `Err` as the last attempt its call allows (`Call::give_up_after`): the
    /// key gave up, and every redelivery gets `Error::GaveUp` without running it.
    GaveUp {
        /// The body's error.
        error: E,
        /// How many attempts failed.
        attempts: u32,
    },
    /// Another holder has the key (another consumer, or an earlier copy in this batch).
    InProgress,
    /// The key's outcome is unknown (`Error::OutcomeUnknown`, `on_crash = hold`): its holder
    /// stopped without a word. Hand the delivery back: once the outcome is resolved, a
    /// redelivery replays it or runs it. (A batch does not ask the runtime's resolver.)
    Held(Error),
    /// The item can never run as it is: `Error::KeyReused`, `Error::InvalidKey`,
    /// `Error::InvalidCall`, `Error::InvalidToken`, `Error::Corrupt`, `Error::GaveUp` (its key
    /// gave up before).
    Refused(Error),
    /// The store failed, or the item's lease was lost before its body started, or its record
    /// was not confirmed by enough replicas: nothing ran that was not released or kept; try
    /// again.
    Unavailable(Error),
}

impl<T, E> Settled<T, E> {
    /// What a queue consumer does with this item's delivery.
    pub fn ack(&self) -> Ack {
        match self {
            Settled::Executed { .. } | Settled::Replayed(_) => Ack::Ack,
            Settled::Failed(_) | Settled::InProgress | Settled::Held(_) | Settled::Unavailable(_) => Ack::Requeue,
            Settled::Refused(_) | Settled::GaveUp { .. } => Ack::DeadLetter,
        }
    }

    /// The outcome's name in metrics.
    pub(super) fn outcome(&self) -> CallOutcome {
        match self {
            Settled::Executed { .. } => CallOutcome::Executed,
            Settled::Replayed(Ok(_)) => CallOutcome::Replayed,
            Settled::Replayed(Err(e)) | Settled::Refused(e) | Settled::Unavailable(e) | Settled::Held(e) => {
                CallOutcome::of_error(e)
            }
            // The attempt that gives up on its key failed as its body: counted as a single
            // call's last attempt is (`gave_up` is a call that finds the key given up).
            Settled::Failed(_) | Settled::GaveUp { .. } => CallOutcome::BodyError,
            Settled::InProgress => CallOutcome::Conflict,
        }
    }
}

/// Which items' deliveries to acknowledge, hand back, or move aside: indices into the batch, in
/// order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AckPlan {
    /// [`Ack::Ack`].
    pub ack: Vec<usize>,
    /// [`Ack::Requeue`].
    pub requeue: Vec<usize>,
    /// [`Ack::DeadLetter`].
    pub dead_letter: Vec<usize>,
}

impl AckPlan {
    /// The plan for `items`.
    pub fn of<T, E>(items: &[Settled<T, E>]) -> AckPlan {
        let mut plan = AckPlan::default();
        for (i, item) in items.iter().enumerate() {
            match item.ack() {
                Ack::Ack => plan.ack.push(i),
                Ack::Requeue => plan.requeue.push(i),
                Ack::DeadLetter => plan.dead_letter.push(i),
            }
        }
        plan
    }
}

/// `item`, counted in the call metrics under `call`'s scope.
pub(super) fn recorded<T, E>(item: Settled<T, E>, call: &Call) -> Settled<T, E> {
    telemetry::record::call(item.outcome(), telemetry::scope_label(call.scope_str()));
    item
}
