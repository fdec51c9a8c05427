//! What operators see of records: one record read whole ([`RecordView`]), a page of a scan, and
//! what forgetting a key did. Built by each store from its own format; the runtime and the CLI
//! read only these.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// The state of a record.
///
/// ```
/// use idempotency::store::RecordState;
///
/// assert_eq!(RecordState::InProgress.to_string(), "in_progress");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordState {
    /// A call holds the key and runs its body.
    InProgress,
    /// A call completed; its result is kept (and replayed, unless not replayable).
    Completed,
    /// The last attempt failed (its body returned `Err`) and freed the key: the record keeps the
    /// count of failed attempts and the last error for the next attempt, which may run.
    Released,
    /// The key gave up (`give_up_after(N)`): its body failed N times and does not run again
    /// until an operator forgets the key or its `keep` ends.
    Failed,
    /// The key's holder stopped without a commit or a release (its process died, or stalled
    /// past its lease) under `on_crash = hold`: whether its body's effect happened is unknown,
    /// and the key does not run again until it is resolved (`Idempotency::resolve`, the CLI's
    /// `resolve`) or its `keep` ends.
    Unknown,
}

impl std::fmt::Display for RecordState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RecordState::InProgress => "in_progress",
            RecordState::Completed => "completed",
            RecordState::Released => "released",
            RecordState::Failed => "failed",
            RecordState::Unknown => "unknown",
        })
    }
}

/// One record, as an operator sees it (`Idempotency::inspect`, the CLI's `inspect` and `list`).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use idempotency::store::{Inspected, RecordState};
/// use idempotency::{Call, Error, Idempotency, MemoryStore};
///
/// let idem = Idempotency::new(MemoryStore::new());
/// let _: Result<u32, Error> = idem.run(Call::new("42").scope("orders"), || async { Ok(7) }).await;
/// let Inspected::Record(view) = idem.inspect("orders", "42").await.unwrap() else { panic!() };
/// assert_eq!(view.state, RecordState::Completed);
/// assert_eq!(view.result_json(), Some(serde_json::json!(7)));
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RecordView {
    /// The full key (scope and key).
    pub key: String,
    /// Its state: in progress, completed, released after a failure, failed for good, or unknown.
    pub state: RecordState,
    /// The acquisition's fencing token, when the record carries it. A completed record does
    /// when its token was drawn: always on PostgreSQL (the acquire draws it), on Redis only when
    /// the body read its fence (a token left unread is never drawn). An in-progress one on Redis
    /// does not (its token is the server's `TIME`, read by the holder when it needs one, and
    /// not stored).
    pub fence: Option<u64>,
    /// In progress or unknown: the owner id of the attempt holding (or that held) the key.
    pub owner: Option<String>,
    /// In progress or unknown: when the attempt started (unix ms, by the holder's clock, from
    /// its owner id).
    pub started_ms: Option<u64>,
    /// Which attempt holds the key (in progress, unknown), or how many failed (released,
    /// failed); `None` where the store does not count them (a first attempt in progress whose
    /// record does not keep its lease's end).
    pub attempts: Option<u32>,
    /// Released or failed: the last failed attempt's error, as its `Display` wrote it (empty
    /// when the attempt left none: a dropped call, a lease that ran out).
    pub last_error: Option<String>,
    /// When the holder's lease ends (in progress) or ended (unknown), unix ms by the store's
    /// clock, for a record that keeps it (`on_crash = hold`, attempts counted); `None` where
    /// the record's own expiry is the lease.
    pub lease_end_ms: Option<u64>,
    /// The record is held when its holder stops without a word (`on_crash = hold`).
    pub holds: bool,
    /// Completed, released or failed: when the result or the failure was stored (unix ms, by
    /// the committing client's clock on Redis and memory, the database's on PostgreSQL).
    pub stored_ms: Option<u64>,
    /// What the store says the record has left: the lease while in progress, `keep` once
    /// completed (`None` when it does not expire).
    #[serde(serialize_with = "millis")]
    pub ttl: Option<Duration>,
    /// The payload's fingerprint stored with the key.
    pub fingerprint: Option<String>,
    /// A caller in some process waits for the key to change.
    pub watched: bool,
    /// Completed: whether the result can be replayed (it was stored).
    pub replayable: bool,
    /// Completed and replayable: the stored result, JSON bytes.
    #[serde(skip)]
    pub result: Option<Vec<u8>>,
}

fn millis<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_some(&(d.as_millis() as u64)),
        None => s.serialize_none(),
    }
}

impl RecordView {
    /// The stored result as JSON, when it is replayable and decodes.
    pub fn result_json(&self) -> Option<serde_json::Value> {
        self.result.as_deref().and_then(|r| serde_json::from_slice(r).ok())
    }

    /// The stored result's size in bytes.
    pub fn result_bytes(&self) -> Option<usize> {
        self.result.as_ref().map(Vec::len)
    }

    /// How old the record is at `now`: since its attempt started (in progress) or its result
    /// was stored (completed), by the clocks that wrote them; `None` when unknown.
    pub fn age(&self, now: SystemTime) -> Option<Duration> {
        let at = match self.state {
            RecordState::InProgress | RecordState::Unknown => self.started_ms?,
            RecordState::Completed | RecordState::Released | RecordState::Failed => self.stored_ms?,
        };
        let now_ms = now.duration_since(UNIX_EPOCH).ok()?.as_millis() as u64;
        Some(Duration::from_millis(now_ms.saturating_sub(at)))
    }
}

/// What a key holds, read by [`Store::inspect`](super::Store::inspect).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use idempotency::store::Inspected;
/// use idempotency::{Idempotency, MemoryStore};
///
/// let idem = Idempotency::new(MemoryStore::new());
/// match idem.inspect("orders", "42").await.unwrap() {
///     Inspected::Absent => println!("never ran, or forgotten"),
///     Inspected::Record(view) => println!("{}: {}", view.key, view.state),
///     Inspected::Foreign { reason } => println!("not ours: {reason}"),
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inspected {
    /// No record.
    Absent,
    /// A record.
    Record(RecordView),
    /// Something that is not a record of this library (another program's value, or a record of
    /// a format this version does not read).
    Foreign {
        /// What was found.
        reason: String,
    },
}

/// What [`Store::forget`](super::Store::forget) did.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use idempotency::store::Forgotten;
/// use idempotency::{Force, Idempotency, MemoryStore};
///
/// let idem = Idempotency::new(MemoryStore::new());
/// assert_eq!(idem.forget("orders", "42", Force::CompletedOnly).await.unwrap(), Forgotten::Absent);
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Forgotten {
    /// The record was deleted; it was in this state.
    Deleted(RecordState),
    /// There was no record.
    Absent,
    /// The record is in progress and the call did not force it: nothing was deleted.
    InProgress,
    /// The key holds something that is not a record of this library: nothing was deleted.
    Foreign {
        /// What was found.
        reason: String,
    },
}

/// One page of a [`Store::scan`](super::Store::scan).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanPage {
    /// The records of this page (full keys under the prefix).
    pub records: Vec<RecordView>,
    /// Keys under the prefix that hold something that is not a record, with what they hold.
    pub foreign: Vec<(String, String)>,
    /// Where the next page starts; `None` when the scan is complete.
    pub next: Option<String>,
    /// How many keys the store looked at for this page (for progress), records or not.
    pub examined: usize,
}
