//! What a run records: every call's invocation, its body's start, effects and end, when the body
//! was told its lease was lost, what the call returned; every store command a process sent, with
//! when it was sent and answered; the operator's purges and the records the store lost. Times are
//! microseconds since the run started, on the clock the run uses (tokio's paused clock here).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// A call's number in its schedule (probes after the schedule get numbers after its calls).
pub type CallId = usize;

/// Microseconds since the run started.
pub type Micros = u64;

/// What a call returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Returned {
    /// A value: the body's own (`replayed` false) or a stored one. `stored` is false when the
    /// runtime said the value is not confirmed stored.
    /// `cached`: answered by the process's replay cache, without the store.
    Ok { value: String, replayed: bool, cached: bool, stored: bool },
    /// An error of the library, by name (`Conflict`, `LeaseLost`, ...).
    Err(String),
    /// The body's own error, returned as it is.
    BodyErr,
    /// The body panicked and the panic reached the caller.
    Panicked,
    /// The caller dropped the call.
    Cancelled,
}

/// How a body ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyEnd {
    /// It returned `Ok` with this value.
    Ok(String),
    /// It returned its own error.
    Failed,
    /// It panicked.
    Panicked,
    /// It was dropped before it finished (a cancelled call, or the runtime aborting it).
    Dropped,
}

/// A store command, as the process that sent it saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpKind {
    Acquire,
    Commit,
    Release,
    Renew,
    /// A fencing token read after the acquisition (`Store::fence`).
    Fence,
    /// A failed attempt recorded (`Store::fail`), the key freed for the next.
    Fail,
    /// A failed attempt recorded as the last: the key given up (`Store::fail` with `give_up`).
    GiveUp,
}

/// What a store command answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpResult {
    Acquired {
        fence: u64,
    },
    /// A fence read found the key held by the asking owner.
    Fence {
        fence: u64,
    },
    InProgress,
    Completed,
    Done,
    Lost,
    Error,
    /// The caller stopped waiting (or the reply never came).
    NoReply,
}

/// One event of a history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A call began. `bound` is how long it may take besides its body (I6); a `probe` is made
    /// after the schedule, once every fault has ended (I5); an `unholdable` one asks for a
    /// duration no store can hold, and must be refused (I8); a `token` one carries a genuine
    /// token, which must be taken (I8); a `transactional` one's body effects commit with its record
    /// in one transaction, or not at all (I9); a `hold` one (`on_crash = hold`) leaves its key
    /// unknown if its holder stops without a word (I10); one that gives up after `give_up`
    /// failures stops the key then (I12).
    Invoke {
        call: CallId,
        proc: usize,
        key: String,
        keep: Duration,
        lock: bool,
        abort: bool,
        bound: Duration,
        probe: bool,
        unholdable: bool,
        token: bool,
        transactional: bool,
        ttl: Duration,
        hold: bool,
        give_up: Option<u32>,
    },
    /// Its body started, holding the key as `owner` with `fence` when it was known then (a lock
    /// guard's; a guarded call's body reads its own: `FenceRead`), as the key's `attempt` (I11);
    /// `lost` is whether the context said the lease was lost at that moment.
    BodyStart { call: CallId, owner: String, fence: Option<u64>, attempt: u32, lost: bool },
    /// The body asked for its fencing token (`CallContext::fence`) and got it (`None`: the
    /// read failed).
    FenceRead { call: CallId, fence: Option<u64> },
    /// The body did something (woke from a step); `lost` as above.
    Effect { call: CallId, lost: bool },
    /// The body was told its lease is lost (`CallContext::lost` resolved), by watcher `which`.
    Told { call: CallId, which: u8 },
    /// The body ended.
    BodyEnd { call: CallId, end: BodyEnd },
    /// The lock was still known lost when its holder let it go, and this many of its `lost()`
    /// waiters had resolved.
    LockLost { call: CallId, woken: u8 },
    /// The call returned.
    Return { call: CallId, returned: Returned },
    /// A process sent a store command (`id` numbers the process's commands).
    OpSent { proc: usize, id: u64, kind: OpKind, key: String, owner: String },
    /// Its answer reached the caller (or the caller gave up on it).
    OpAnswered { proc: usize, id: u64, result: OpResult },
    /// An operator forgot a key (`force`: in progress too) and the store answered `deleted`.
    Purge { key: String, force: bool, sent: Micros, deleted: bool },
    /// A purge's broadcast reached process `proc` (its replay cache drops the key now).
    PurgeDelivered { proc: usize, key: String },
    /// The store lost the key's record (a failover, a restart): a documented exception.
    Lose { key: String },
    /// Process `proc` crashed (the real-server layer): nothing more leaves it, and its calls
    /// return `Cancelled` without a word from their runtime.
    Crash { proc: usize },
    /// An operator resolved the key's unknown outcome (`Idempotency::resolve`), sent at `sent`:
    /// completed with `value`, or not done (`None`); `done` when the store says it resolved one.
    Resolve { key: String, sent: Micros, value: Option<String>, done: bool },
}

/// A history: events with their times, in the order they happened.
#[derive(Clone)]
pub struct History {
    start: Instant,
    events: Arc<Mutex<Vec<(Micros, Event)>>>,
}

impl History {
    /// An empty history whose clock starts now.
    pub fn new() -> Self {
        History { start: Instant::now(), events: Arc::default() }
    }

    /// Microseconds since the run started.
    pub fn now(&self) -> Micros {
        self.start.elapsed().as_micros() as Micros
    }

    /// Records `event` now.
    pub fn record(&self, event: Event) {
        let at = self.now();
        self.events.lock().unwrap_or_else(|p| p.into_inner()).push((at, event));
    }

    /// The events so far.
    pub fn events(&self) -> Vec<(Micros, Event)> {
        self.events.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Default for History {
    fn default() -> Self {
        Self::new()
    }
}
