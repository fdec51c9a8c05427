//! `MemoryStore`: the state machine in this process's memory, for one process, examples and
//! tests. Same semantics as the Redis store, lease and keep expiry included.

use std::hash::BuildHasher;
use std::sync::Mutex;
use std::time::Duration;

use foldhash::fast::RandomState;
use hashbrown::HashTable;
use tokio::time::Instant;

use super::channels::Channels;
use super::expiry::Expiries;
use super::{
    error_text, AcquireOutcome, AcquireRequest, CommitRequest, FailRequest, Forgotten, Inspected, Lapse, Lease,
    PurgeEvent, PurgeHandler, RecordState, RecordView, Resolution, Resolved, ScanPage, Store, StoreFuture, Transition,
    Watcher, LAPSED, RESOLVED_RELEASED,
};
use crate::error::StoreError;

/// How many expired records a write removes at most, besides its own key.
const EXPIRE_PER_WRITE: usize = 32;

/// The fewest records that trigger a full sweep.
const SWEEP_FLOOR: usize = 1024;

/// A store in this process's memory.
///
/// Keys expire like in Redis (a lease, `keep`), so everything a
/// [`RedisStore`](super::redis::RedisStore) does can be tried without one. It only protects
/// calls made within this process.
///
/// Keys are hashed with foldhash, seeded per process: fast, and only minimally resistant to a
/// client that studies the process to send colliding keys. A long-running service that takes
/// keys straight from untrusted clients is better served by `RedisStore`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use idempotent_core::{Call, Error, Idempotency, MemoryStore};
///
/// let idem = Idempotency::new(MemoryStore::new());
/// let first: Result<u32, Error> = idem.run(Call::new("job:1"), || async { Ok(7) }).await;
/// let again: Result<u32, Error> = idem.run(Call::new("job:1"), || async { Ok(8) }).await;
/// assert_eq!((first.unwrap(), again.unwrap()), (7, 7)); // the second call replays
/// # }
/// ```
#[derive(Default)]
pub struct MemoryStore {
    state: Mutex<State>,
    watchers: Channels,
    /// The replay caches following this store's purges.
    purges: Mutex<Vec<PurgeHandler>>,
    /// The token secret of the runtimes on this store, made on first use.
    token_secret: std::sync::OnceLock<Vec<u8>>,
}

#[derive(Default)]
struct State {
    records: Records,
    /// Which records are due to expire (completed records; see `expiry`).
    expiries: Expiries,
    /// Past this many records, sweep every expired one (in-progress records are not queued).
    sweep_at: usize,
    last_fence: u64,
}

/// The records by key. Each call hashes its key once; each entry keeps its key's hash, so that
/// neither expiry (which queues hashes, not keys) nor growing the table reads a key again.
#[derive(Default)]
struct Records {
    table: HashTable<Entry>,
    hasher: RandomState,
}

struct Entry {
    hash: u64,
    key: Short,
    record: Record,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    InProgress,
    Completed,
    /// A failed attempt's record: the next acquire takes it as the next attempt.
    Released,
    /// Given up: every acquire reports it.
    Failed,
}

struct Record {
    phase: Phase,
    /// In progress: the holder. Completed, released, failed: the attempt that wrote it (a
    /// repeated command by it is `Done`).
    owner: Option<Short>,
    fingerprint: Option<Box<str>>,
    fence: u64,
    /// Completed: the result, `None` when not replayable.
    result: Option<Box<[u8]>>,
    /// Completed, released, failed: when it was written (unix ms), for operators.
    stored_ms: u64,
    /// When the record disappears: the lease's end while in progress (unless the record keeps
    /// it in `lease_end`), `keep` after the commit.
    expires_at: Instant,
    /// A caller waits for this key to change.
    watched: bool,
    /// In progress: which attempt. Released, failed: how many failed.
    attempt: u32,
    /// In progress, when the record keeps its lease's end (and outlives it by `after`).
    lease_end: Option<Instant>,
    /// In progress: held as unknown when its lease ends (`Lapse::Hold`).
    hold: bool,
    /// How long a record that keeps its lease's end outlives it: the call's `keep`.
    after: Duration,
    /// Released, failed: the last failure's text.
    error: Option<Box<str>>,
}

impl Record {
    /// An in-progress record for `req`'s owner as its `attempt`.
    fn pending(req: &AcquireRequest<'_>, fence: u64, attempt: u32, now: Instant) -> Record {
        let keeps_lease = req.lapse.keeps_lease_end(attempt);
        let lease_end = after(now, req.lease);
        Record {
            phase: Phase::InProgress,
            owner: Some(Short::new(req.owner)),
            fingerprint: req.fingerprint.map(Box::from),
            fence,
            result: None,
            stored_ms: 0,
            expires_at: if keeps_lease { after(lease_end, req.keep) } else { lease_end },
            watched: false,
            attempt,
            lease_end: keeps_lease.then_some(lease_end),
            hold: req.lapse == Lapse::Hold,
            after: req.keep,
            error: None,
        }
    }

    /// A record of failed attempts (released) or of a key given up (failed), by `owner`.
    fn failure(
        phase: Phase,
        owner: &str,
        attempts: u32,
        error: &str,
        fingerprint: Option<&str>,
        until: Instant,
    ) -> Record {
        Record {
            phase,
            owner: Some(Short::new(owner)),
            fingerprint: fingerprint.map(Box::from),
            fence: 0,
            result: None,
            stored_ms: unix_ms(),
            expires_at: until,
            watched: false,
            attempt: attempts,
            lease_end: None,
            hold: false,
            after: Duration::ZERO,
            error: (!error.is_empty()).then(|| Box::from(error)),
        }
    }

    /// A completed record (no owner: a repeated commit knows itself by its fence), kept until
    /// `until`.
    fn completed(fingerprint: Option<Box<str>>, fence: u64, result: Option<&[u8]>, until: Instant) -> Record {
        Record {
            phase: Phase::Completed,
            owner: None,
            fingerprint,
            fence,
            result: result.map(Box::from),
            stored_ms: unix_ms(),
            expires_at: until,
            watched: false,
            attempt: 0,
            lease_end: None,
            hold: false,
            after: Duration::ZERO,
            error: None,
        }
    }

    /// In progress, its lease's end kept and passed at `now`.
    fn lapsed(&self, now: Instant) -> bool {
        self.phase == Phase::InProgress && self.lease_end.is_some_and(|end| end <= now)
    }

    /// What the record is at `now`, as operators see it.
    fn state(&self, now: Instant) -> RecordState {
        match self.phase {
            Phase::InProgress if self.lapsed(now) && self.hold => RecordState::Unknown,
            Phase::InProgress if self.lapsed(now) => RecordState::Released,
            Phase::InProgress => RecordState::InProgress,
            Phase::Completed => RecordState::Completed,
            Phase::Released => RecordState::Released,
            Phase::Failed => RecordState::Failed,
        }
    }
}

/// A key or an owner id, inline up to 22 bytes (the runtime's owner ids have 22, and many keys
/// are as short), on the heap beyond: most records allocate nothing for either.
enum Short {
    Inline(u8, [u8; 22]),
    Long(Box<str>),
}

impl Short {
    fn new(text: &str) -> Self {
        let mut bytes = [0; 22];
        match bytes.get_mut(..text.len()) {
            Some(inline) => {
                inline.copy_from_slice(text.as_bytes());
                Short::Inline(text.len() as u8, bytes)
            }
            None => Short::Long(text.into()),
        }
    }

    fn as_str(&self) -> &str {
        match self {
            // Only ever built from a `&str` (see `new`): the inline bytes are UTF-8.
            Short::Inline(len, bytes) => std::str::from_utf8(&bytes[..usize::from(*len)]).unwrap_or(""),
            Short::Long(long) => long,
        }
    }

    fn is(&self, text: &str) -> bool {
        match self {
            Short::Inline(len, bytes) => &bytes[..usize::from(*len)] == text.as_bytes(),
            Short::Long(long) => **long == *text,
        }
    }
}

/// A record as operators see it.
fn view(key: &str, record: &Record, now: Instant) -> RecordView {
    let state = record.state(now);
    let holding = matches!(state, RecordState::InProgress | RecordState::Unknown);
    let owner = holding.then(|| record.owner.as_ref().map(|o| o.as_str().to_owned())).flatten();
    let counted = record.phase != Phase::InProgress || record.lease_end.is_some();
    RecordView {
        key: key.to_owned(),
        state,
        fence: Some(record.fence).filter(|f| *f != 0),
        started_ms: owner.as_deref().and_then(crate::ids::started_ms),
        owner,
        attempts: counted.then_some(record.attempt).filter(|a| *a > 0),
        last_error: if record.lapsed(now) && !record.hold {
            Some(LAPSED.to_owned())
        } else {
            record.error.as_deref().map(str::to_owned)
        },
        lease_end_ms: record.lease_end.map(|end| unix_ms_at(end, now)),
        holds: record.hold,
        stored_ms: matches!(record.phase, Phase::Completed | Phase::Released | Phase::Failed)
            .then_some(record.stored_ms),
        ttl: Some(record.expires_at.saturating_duration_since(now)),
        fingerprint: record.fingerprint.as_deref().map(str::to_owned),
        watched: record.watched,
        replayable: record.result.is_some(),
        result: record.result.as_deref().map(<[u8]>::to_vec),
    }
}

/// `at` as unix ms, by this machine's clock read at `now`.
fn unix_ms_at(at: Instant, now: Instant) -> u64 {
    let ms = unix_ms();
    if at >= now {
        ms.saturating_add(at.duration_since(now).as_millis() as u64)
    } else {
        ms.saturating_sub(now.duration_since(at).as_millis() as u64)
    }
}

/// `now + d`, never past what an instant can hold (calls cap their durations at
/// `MAX_DURATION`; a store used directly may be handed any).
fn after(now: Instant, d: Duration) -> Instant {
    now.checked_add(d).unwrap_or_else(|| now + crate::MAX_DURATION)
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Whether `record` is held in progress by `owner`.
fn held_by(record: &Record, owner: &str) -> bool {
    record.phase == Phase::InProgress && owned_by(record, owner)
}

/// Whether the record names `owner` (the attempt holding it, or that failed last).
fn owned_by(record: &Record, owner: &str) -> bool {
    record.owner.as_ref().is_some_and(|o| o.is(owner))
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of live (unexpired) records.
    pub fn len(&self) -> usize {
        let now = Instant::now();
        self.lock().records.table.iter().filter(|e| e.record.expires_at > now).count()
    }

    /// Whether there are no live records.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops the record of `key` (its full key, scope included), whatever its state: an
    /// operator's tool, and a way for tests to take a lease away. Returns whether there was one.
    pub fn remove(&self, key: &str) -> bool {
        let mut st = self.lock();
        let hash = st.records.hash(key);
        st.records.remove(hash, key)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a record half-written (every write is a
        // single assignment), so a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn acquire_now(&self, req: AcquireRequest<'_>) -> AcquireOutcome {
        let now = Instant::now();
        let mut st = self.lock();
        let st = &mut *st;
        let hash = st.records.hash(req.key);
        let fence = st.last_fence + 1;
        let Some(entry) = st.records.live(hash, req.key, now) else {
            st.last_fence = fence;
            st.records.insert(hash, req.key, Record::pending(&req, fence, 1, now));
            // In-progress records are not queued (their holder commits or releases them), so an
            // acquire only bounds the table.
            st.sweep_if_doubled(now);
            return AcquireOutcome::Acquired { fence, attempt: 1 };
        };
        let rec = &mut entry.record;
        let taken_after = match rec.phase {
            Phase::InProgress if held_by(rec, req.owner) => {
                return AcquireOutcome::Acquired { fence: rec.fence, attempt: rec.attempt };
            }
            Phase::InProgress if rec.lapsed(now) && rec.hold => {
                return AcquireOutcome::Unknown {
                    fingerprint: rec.fingerprint.as_deref().map(str::to_owned),
                    owner: rec.owner.as_ref().map(|o| o.as_str().to_owned()).unwrap_or_default(),
                    lease_ended_ms: rec.lease_end.map_or(0, |end| unix_ms_at(end, now)),
                    attempt: rec.attempt,
                };
            }
            // A lapsed attempt counts; a released record's attempts are counted already.
            Phase::InProgress if rec.lapsed(now) => rec.attempt,
            Phase::Released => rec.attempt,
            Phase::Completed => {
                return AcquireOutcome::Completed {
                    fingerprint: rec.fingerprint.as_deref().map(str::to_owned),
                    result: rec.result.as_deref().map(<[u8]>::to_vec),
                    kept_for: rec.expires_at.saturating_duration_since(now),
                }
            }
            Phase::Failed => {
                return AcquireOutcome::GaveUp {
                    fingerprint: rec.fingerprint.as_deref().map(str::to_owned),
                    attempts: rec.attempt,
                    last_error: rec.error.as_deref().unwrap_or_default().to_owned(),
                }
            }
            Phase::InProgress => {
                rec.watched |= req.will_wait;
                return AcquireOutcome::InProgress {
                    fingerprint: rec.fingerprint.as_deref().map(str::to_owned),
                    lease_left: rec.lease_end.unwrap_or(rec.expires_at).saturating_duration_since(now),
                };
            }
        };
        let attempt = taken_after.saturating_add(1);
        let watched = rec.watched;
        *rec = Record { watched, ..Record::pending(&req, fence, attempt, now) };
        st.last_fence = fence;
        AcquireOutcome::Acquired { fence, attempt }
    }

    fn renew_now(&self, leases: &[Lease<'_>]) -> Vec<bool> {
        let now = Instant::now();
        let mut st = self.lock();
        leases
            .iter()
            .map(|l| {
                let hash = st.records.hash(l.key);
                match st.records.live(hash, l.key, now).map(|e| &mut e.record) {
                    Some(rec) if held_by(rec, l.owner) && !rec.lapsed(now) => {
                        let lease_end = after(now, l.lease);
                        match &mut rec.lease_end {
                            Some(end) => {
                                *end = lease_end;
                                rec.expires_at = after(lease_end, rec.after);
                            }
                            None => rec.expires_at = lease_end,
                        }
                        true
                    }
                    _ => false,
                }
            })
            .collect()
    }

    /// A transition of `key`: `change` reads and writes its record under the lock (given the
    /// state, the key's hash and now) and says what it answers and whether it wrote; a write is
    /// followed by the amortized expiry sweep and, when the record was watched, wakes the key's
    /// waiters.
    fn transition<T>(&self, key: &str, change: impl FnOnce(&mut State, u64, Instant) -> Wrote<T>) -> T {
        let now = Instant::now();
        let (answer, notify) = {
            let mut st = self.lock();
            let hash = st.records.hash(key);
            match change(&mut st, hash, now) {
                Wrote::Nothing(answer) => (answer, false),
                Wrote::Record { answer, watched } => {
                    st.tick(now);
                    (answer, watched)
                }
            }
        };
        if notify {
            self.watchers.notify(key);
        }
        answer
    }

    fn commit_now(&self, req: CommitRequest<'_>) -> Transition {
        self.transition(req.key, |st, hash, now| {
            let watched = match st.records.live(hash, req.key, now).map(|e| &e.record) {
                // Absent, or released by a later attempt that failed: the body ran, its result
                // is recorded.
                None => false,
                // Completed by this acquisition (same fence): a repeated commit.
                Some(rec) if rec.phase == Phase::Completed => {
                    return Wrote::Nothing(if rec.fence == req.fence { Transition::Done } else { Transition::Lost });
                }
                Some(rec) if rec.phase == Phase::Failed => return Wrote::Nothing(Transition::Lost),
                Some(rec) if rec.phase == Phase::InProgress && !held_by(rec, req.owner) => {
                    return Wrote::Nothing(Transition::Lost)
                }
                Some(rec) => rec.watched,
            };
            let completed =
                Record::completed(req.fingerprint.map(Box::from), req.fence, req.result, after(now, req.keep));
            st.put(hash, req.key, completed, req.keep, now);
            Wrote::Record { answer: Transition::Done, watched }
        })
    }

    fn release_now(&self, key: &str, owner: &str) -> Transition {
        self.transition(key, |st, hash, now| {
            let Some(rec) = st.records.live(hash, key, now).map(|e| &e.record) else {
                return Wrote::Nothing(Transition::Done);
            };
            if rec.phase == Phase::Released && owned_by(rec, owner) {
                return Wrote::Nothing(Transition::Done);
            }
            if !held_by(rec, owner) {
                return Wrote::Nothing(Transition::Lost);
            }
            let watched = rec.watched;
            // A record that counts attempts keeps the count of those before this one.
            let earlier = rec.attempt.saturating_sub(1);
            let kept = if rec.lease_end.is_some() && earlier > 0 { rec.after } else { Duration::ZERO };
            let released = Record::failure(Phase::Released, owner, earlier, "", None, after(now, kept));
            st.put(hash, key, released, kept, now);
            Wrote::Record { answer: Transition::Done, watched }
        })
    }

    fn fail_now(&self, req: FailRequest<'_>) -> Transition {
        self.transition(req.key, |st, hash, now| {
            let watched = match st.records.live(hash, req.key, now).map(|e| &e.record) {
                None => false,
                Some(rec) if held_by(rec, req.owner) => rec.watched,
                // Its attempt released by an operator (resolved as not done): its own give-up
                // still gives up on the key.
                Some(rec) if rec.phase == Phase::Released && req.give_up && owned_by(rec, req.owner) => false,
                // This owner's failure, recorded already: a repeated command.
                Some(rec) if matches!(rec.phase, Phase::Released | Phase::Failed) && owned_by(rec, req.owner) => {
                    return Wrote::Nothing(Transition::Done)
                }
                Some(_) => return Wrote::Nothing(Transition::Lost),
            };
            let phase = if req.give_up { Phase::Failed } else { Phase::Released };
            let until = after(now, req.keep);
            let failed = Record::failure(phase, req.owner, req.attempt, error_text(req.error), req.fingerprint, until);
            st.put(hash, req.key, failed, req.keep, now);
            Wrote::Record { answer: Transition::Done, watched }
        })
    }

    fn resolve_now(&self, key: &str, holder: Option<&str>, resolution: Resolution<'_>) -> Resolved {
        self.transition(key, |st, hash, now| {
            let Some(rec) = st.records.live(hash, key, now).map(|e| &e.record) else {
                return Wrote::Nothing(Resolved::Absent);
            };
            let state = rec.state(now);
            let theirs = holder.is_some_and(|h| !rec.owner.as_ref().is_some_and(|o| o.is(h)));
            if rec.phase == Phase::InProgress && rec.hold && !rec.lapsed(now) && !theirs {
                return Wrote::Nothing(Resolved::Running);
            }
            if state != RecordState::Unknown || theirs {
                return Wrote::Nothing(Resolved::NotUnknown(state));
            }
            let (watched, kept, until) = (rec.watched, rec.after, after(now, rec.after));
            let resolved = match resolution {
                // No fence of the holder's: its late commit must find the record not its own.
                Resolution::Completed(result) => Record::completed(rec.fingerprint.clone(), 0, result, until),
                Resolution::Release => {
                    let owner = rec.owner.as_ref().map_or("", |o| o.as_str()).to_owned();
                    Record::failure(Phase::Released, &owner, rec.attempt, RESOLVED_RELEASED, None, until)
                }
            };
            st.put(hash, key, resolved, kept, now);
            Wrote::Record { answer: Resolved::Done, watched }
        })
    }

    fn inspect_now(&self, key: &str) -> Inspected {
        let now = Instant::now();
        let mut st = self.lock();
        let hash = st.records.hash(key);
        match st.records.live(hash, key, now) {
            Some(entry) => Inspected::Record(view(key, &entry.record, now)),
            None => Inspected::Absent,
        }
    }

    fn forget_now(&self, key: &str, force: bool) -> Forgotten {
        let now = Instant::now();
        let (state, watched) = {
            let mut st = self.lock();
            let hash = st.records.hash(key);
            let Some(entry) = st.records.live(hash, key, now) else { return Forgotten::Absent };
            let state = entry.record.state(now);
            if state == RecordState::InProgress && !force {
                return Forgotten::InProgress;
            }
            let watched = entry.record.watched;
            st.records.remove(hash, key);
            (state, watched)
        };
        if watched {
            self.watchers.notify(key);
        }
        for handler in self.purges.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            handler(PurgeEvent::Forgotten(key));
        }
        Forgotten::Deleted(state)
    }

    fn scan_now(&self, prefix: &str) -> ScanPage {
        let now = Instant::now();
        let st = self.lock();
        let mut page = ScanPage::default();
        for entry in st.records.table.iter() {
            page.examined += 1;
            let key = entry.key.as_str();
            if entry.record.expires_at > now && key.starts_with(prefix) {
                page.records.push(view(key, &entry.record, now));
            }
        }
        page.records.sort_by(|a, b| a.key.cmp(&b.key));
        page
    }

    fn watch_now(&self, key: &str) -> Watcher {
        self.watchers.watch(key, |_| {}).0
    }
}

/// What a transition did ([`MemoryStore::transition`]).
enum Wrote<T> {
    /// Nothing was written: its answer.
    Nothing(T),
    /// The record was written (or removed): its answer, and whether it was watched.
    Record { answer: T, watched: bool },
}

impl Records {
    fn hash(&self, key: &str) -> u64 {
        self.hasher.hash_one(key)
    }

    fn len(&self) -> usize {
        self.table.len()
    }

    /// The entry at `key` (hashed to `hash`) unless its record has expired (an expired one is
    /// removed).
    fn live(&mut self, hash: u64, key: &str, now: Instant) -> Option<&mut Entry> {
        match self.table.find_entry(hash, |e| e.key.is(key)) {
            Ok(e) if e.get().record.expires_at <= now => {
                e.remove();
                None
            }
            Ok(e) => Some(e.into_mut()),
            Err(_) => None,
        }
    }

    /// Stores a record at a key not in the table.
    fn insert(&mut self, hash: u64, key: &str, record: Record) {
        self.table.insert_unique(hash, Entry { hash, key: Short::new(key), record }, |e| e.hash);
    }

    /// Removes the record at `key`; returns whether there was one.
    fn remove(&mut self, hash: u64, key: &str) -> bool {
        self.table.find_entry(hash, |e| e.key.is(key)).map(|e| e.remove()).is_ok()
    }
}

impl State {
    /// Writes `record` at `key` (hashed to `hash`) in place of what is there, due to expire
    /// `lifetime` from `now` (the record says when, too); a lifetime of zero removes the key.
    fn put(&mut self, hash: u64, key: &str, record: Record, lifetime: Duration, now: Instant) {
        if lifetime.is_zero() {
            self.records.remove(hash, key);
            return;
        }
        match self.records.table.find_mut(hash, |e| e.key.is(key)) {
            // In place: the entry keeps its key.
            Some(entry) => entry.record = record,
            None => self.records.insert(hash, key, record),
        }
        self.expiries.after(hash, lifetime, after(now, lifetime));
    }

    /// Drops a few expired records (amortized: each write that queues an expiry pays for a
    /// bounded number), and all of them once the store has doubled since the last full sweep.
    fn tick(&mut self, now: Instant) {
        let table = &mut self.records.table;
        self.expiries.due(now, EXPIRE_PER_WRITE, |hash| {
            // The record found by its hash alone may, in theory, be another key's with the same
            // 64-bit hash: harmless, since only an expired record is removed, and every read
            // treats an expired record as absent anyway. A record that has not expired was
            // written again since it was queued: its new write queued it anew if it expires on
            // its own, and the full sweep covers an in-progress one.
            if let Ok(e) = table.find_entry(hash, |e| e.hash == hash) {
                if e.get().record.expires_at <= now {
                    e.remove();
                }
            }
        });
        self.sweep_if_doubled(now);
    }

    /// Drops every expired record once the store has doubled since the last full sweep.
    fn sweep_if_doubled(&mut self, now: Instant) {
        if self.records.len() > self.sweep_at {
            self.records.table.retain(|e| e.record.expires_at > now);
            self.sweep_at = 2 * self.records.len().max(SWEEP_FLOOR);
        }
    }
}

impl Store for MemoryStore {
    fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> StoreFuture<'a, Result<AcquireOutcome, StoreError>> {
        StoreFuture::ready(Ok(self.acquire_now(request)))
    }

    fn renew<'a>(&'a self, leases: &'a [Lease<'a>]) -> StoreFuture<'a, Result<Vec<bool>, StoreError>> {
        StoreFuture::ready(Ok(self.renew_now(leases)))
    }

    fn commit<'a>(&'a self, request: CommitRequest<'a>) -> StoreFuture<'a, Result<Transition, StoreError>> {
        StoreFuture::ready(Ok(self.commit_now(request)))
    }

    fn release<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, Result<Transition, StoreError>> {
        StoreFuture::ready(Ok(self.release_now(key, owner)))
    }

    fn watch<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<Watcher, StoreError>> {
        StoreFuture::ready(Ok(self.watch_now(key)))
    }

    fn keeps_attempts(&self) -> bool {
        true
    }

    fn fail<'a>(&'a self, request: FailRequest<'a>) -> StoreFuture<'a, Result<Transition, StoreError>> {
        StoreFuture::ready(Ok(self.fail_now(request)))
    }

    fn resolve<'a>(
        &'a self,
        key: &'a str,
        holder: Option<&'a str>,
        resolution: Resolution<'a>,
    ) -> StoreFuture<'a, Result<Resolved, StoreError>> {
        StoreFuture::ready(Ok(self.resolve_now(key, holder, resolution)))
    }

    fn inspect<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<Inspected, StoreError>> {
        StoreFuture::ready(Ok(self.inspect_now(key)))
    }

    fn forget<'a>(&'a self, key: &'a str, force: bool) -> StoreFuture<'a, Result<Forgotten, StoreError>> {
        StoreFuture::ready(Ok(self.forget_now(key, force)))
    }

    /// The whole store in one page (it lives in this process's memory).
    fn scan<'a>(
        &'a self,
        prefix: &'a str,
        _cursor: Option<&'a str>,
        _count: usize,
    ) -> StoreFuture<'a, Result<ScanPage, StoreError>> {
        StoreFuture::ready(Ok(self.scan_now(prefix)))
    }

    fn follow_purges(&self, handler: PurgeHandler) -> StoreFuture<'_, Result<bool, StoreError>> {
        handler(PurgeEvent::Following);
        self.purges.lock().unwrap_or_else(|p| p.into_inner()).push(handler);
        StoreFuture::ready(Ok(true))
    }

    /// A random secret of this store's own: the runtimes sharing it take each other's tokens.
    fn token_secrets(&self) -> Vec<Vec<u8>> {
        let secret = self.token_secret.get_or_init(|| {
            crate::token::TokenKeys::decode_secret(&crate::token::TokenKeys::fresh_secret()).unwrap_or_default()
        });
        vec![secret.clone()]
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore").field("records", &self.lock().records.len()).finish()
    }
}
