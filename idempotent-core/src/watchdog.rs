//! The watchdog: one per runtime, it keeps the leases of all the runtime's calls in flight.
//!
//! Each call registers its lease when it acquires a key and deregisters when its body ends. A
//! single renewal loop renews every lease that is a third of a lease old, batching all leases
//! due within a short window into one script call (per hash slot), and marks a lease lost when
//! the store says so or when its local deadline passes without a confirmed renewal. The local
//! deadline is the time the last confirmed renewal was *sent*, plus the lease, minus a margin,
//! on the monotonic clock: a slow reply can only make it early, never late.
//!
//! The loop is a task of the runtime's own, started on the first registration and ending when
//! no lease has been left for a while (or the runtime is dropped); a call costs no timer and no
//! task of its own, and a call shorter than a third of its lease costs no renewal at all.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::context::CallContext;
use crate::error::StoreError;
use crate::store::{Lease, Store};
use crate::telemetry::record;

/// The most leases one renewal script call carries.
const BATCH: usize = 200;

/// How long the renewal loop waits with no lease before it ends.
const LINGER: Duration = Duration::from_secs(10);

/// How often an idle (or far-sighted) loop looks at the registry anyway.
const IDLE_LOOK: Duration = Duration::from_secs(1);

/// The part of a lease kept back from the local deadline: a renewal must be confirmed this
/// long before the lease would end on the server.
pub(crate) fn safety_margin(lease: Duration) -> Duration {
    lease / 10
}

/// How long a lease is renewed after it falls due, at most, to share a script call with
/// others: a sixth of the lease, so renewals happen between a third and half of the lease.
fn coalesce(lease: Duration) -> Duration {
    lease / 6
}

/// A runtime's watchdog.
pub(crate) struct Watchdog {
    shared: Arc<Shared>,
}

struct Shared {
    store: Arc<dyn Store>,
    registry: Mutex<Registry>,
    wake: Notify,
}

#[derive(Default)]
struct Registry {
    leases: Leases,
    /// The renewal loop is running.
    running: bool,
    /// When the loop will next look, if it sleeps.
    next_look: Option<Instant>,
}

struct Entry {
    lease: Duration,
    renew: bool,
    /// When the last confirmed renewal (or the acquire) was sent.
    last_sent: Instant,
    /// Local deadline: past it without a confirmed renewal, the lease counts as lost.
    deadline: Instant,
    inflight: bool,
    /// After a failed renewal: not retried before this.
    retry_at: Instant,
    lost: bool,
    context: CallContext,
}

impl Entry {
    fn due(&self) -> Instant {
        (self.last_sent + self.lease / 3).max(self.retry_at)
    }

    /// The next time the loop must look at this lease.
    fn next_look(&self) -> Instant {
        if self.renew && !self.inflight {
            self.deadline.min(self.due() + coalesce(self.lease))
        } else {
            self.deadline
        }
    }

    fn mark_lost(&mut self, reason: &'static str) {
        self.lost = true;
        tracing::warn!(key = %crate::telemetry::logged_key(self.context.key()), reason, "idempotency lease lost while the body runs");
        self.context.mark_lost(reason);
    }
}

/// The registered leases: a slab (no hashing per call), each slot with a generation so that a
/// renewal reply for a lease already gone never lands on the lease that took its slot.
#[derive(Default)]
struct Leases {
    slots: Vec<(u32, Option<Entry>)>,
    free: Vec<u32>,
}

/// A lease id: the slot's generation above its index.
fn lease_id(generation: u32, index: u32) -> u64 {
    (u64::from(generation) << 32) | u64::from(index)
}

impl Leases {
    fn insert(&mut self, entry: Entry) -> u64 {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push((0, None));
                (self.slots.len() - 1) as u32
            }
        };
        record::leases_held(1.0);
        let slot = &mut self.slots[index as usize];
        slot.0 = slot.0.wrapping_add(1);
        slot.1 = Some(entry);
        lease_id(slot.0, index)
    }

    fn slot(&mut self, id: u64) -> Option<&mut (u32, Option<Entry>)> {
        let (generation, index) = ((id >> 32) as u32, id as u32);
        self.slots.get_mut(index as usize).filter(|s| s.0 == generation && s.1.is_some())
    }

    fn remove(&mut self, id: u64) -> Option<Entry> {
        let entry = self.slot(id)?.1.take();
        self.free.push(id as u32);
        record::leases_held(-1.0);
        entry
    }

    fn get_mut(&mut self, id: u64) -> Option<&mut Entry> {
        self.slot(id).and_then(|s| s.1.as_mut())
    }

    fn is_empty(&self) -> bool {
        // Every slot is either taken or free.
        self.slots.len() == self.free.len()
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = (u64, &mut Entry)> {
        self.slots
            .iter_mut()
            .enumerate()
            .filter_map(|(i, (generation, e))| e.as_mut().map(|e| (lease_id(*generation, i as u32), e)))
    }
}

/// One call's registration; deregisters when finished or dropped.
pub(crate) struct Registration {
    shared: Arc<Shared>,
    id: u64,
    finished: bool,
}

impl Registration {
    /// Deregisters, and tells when the lease runs out unless renewed again: the last confirmed
    /// renewal (or the acquire) was sent at that time minus the lease.
    pub(crate) fn finish(mut self) -> Option<Instant> {
        self.finished = true;
        let entry = self.shared.lock().leases.remove(self.id);
        entry.map(|e| e.last_sent + e.lease)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if !self.finished {
            self.shared.lock().leases.remove(self.id);
        }
    }
}

/// What to renew in one script call: lease ids with owned keys and owners.
struct Batch {
    ids: Vec<u64>,
    leases: Vec<(String, String, Duration)>,
}

/// What came back for a batch.
struct Renewed {
    sent: Instant,
    ids: Vec<u64>,
    result: Result<Vec<bool>, StoreError>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Watchdog {
    pub(crate) fn new(store: Arc<dyn Store>) -> Self {
        Watchdog { shared: Arc::new(Shared { store, registry: Mutex::default(), wake: Notify::new() }) }
    }

    /// Registers the lease of `context`'s key and owner, acquired by a request sent at `sent`;
    /// it is kept (renewed, if `renew`) until the registration is dropped, and `context` is
    /// marked when it is lost.
    pub(crate) fn register(&self, lease: Duration, renew: bool, sent: Instant, context: CallContext) -> Registration {
        let entry = Entry {
            lease,
            renew,
            last_sent: sent,
            deadline: sent + lease - safety_margin(lease),
            inflight: false,
            retry_at: sent,
            lost: false,
            context,
        };
        let look = entry.next_look();
        let (id, start, wake) = {
            let mut reg = self.shared.lock();
            let id = reg.leases.insert(entry);
            let start = !reg.running;
            reg.running = true;
            // Wake the loop only if this lease needs it earlier than it planned to look.
            let wake = !start && reg.next_look.is_none_or(|planned| look < planned);
            (id, start, wake)
        };
        if start {
            tokio::spawn(renewal_loop(Arc::downgrade(&self.shared)));
        } else if wake {
            self.shared.wake.notify_one();
        }
        Registration { shared: self.shared.clone(), id, finished: false }
    }
}

/// Clears `running` when the loop is dropped without ending by itself (its runtime shut down),
/// so the next registration starts a new loop. A loop that ends idle clears the flag itself,
/// under the same lock that saw no leases: a registration in between would otherwise find the
/// flag still set, start no loop, and its lease would never be renewed.
///
/// Leases still registered then were registered from other runtimes (one `Idempotency` serves
/// several: a global runtime used from several test runtimes, a blocking pool with its own): a
/// loop of the watchdog's own, on a thread of its own, takes them over until none is left. If
/// it cannot be started, they are marked lost: a lease is never left unrenewed and untold.
struct Running(Option<Weak<Shared>>);

impl Drop for Running {
    fn drop(&mut self) {
        let Some(weak) = self.0.take() else { return };
        let Some(shared) = weak.upgrade() else { return };
        let orphaned = {
            let mut reg = shared.lock();
            stopped(&mut reg);
            // Renewals in flight were dropped with the loop: due again.
            reg.leases.iter_mut().for_each(|(_, e)| e.inflight = false);
            let orphaned = !reg.leases.is_empty();
            reg.running = orphaned;
            orphaned
        };
        if orphaned {
            adopt(weak);
        }
    }
}

/// Runs the renewal loop on a thread of the watchdog's own (see [`Running`]).
fn adopt(weak: Weak<Shared>) {
    let loop_weak = weak.clone();
    let started = std::thread::Builder::new().name("idempotency-watchdog".into()).spawn(move || {
        match tokio::runtime::Builder::new_current_thread().enable_time().build() {
            Ok(rt) => rt.block_on(renewal_loop(loop_weak)),
            Err(_) => lose_all(&loop_weak),
        }
    });
    if started.is_err() {
        lose_all(&weak);
    }
}

/// Marks every registered lease lost: nothing can renew them.
fn lose_all(weak: &Weak<Shared>) {
    let Some(shared) = weak.upgrade() else { return };
    let mut reg = shared.lock();
    stopped(&mut reg);
    for (_, e) in reg.leases.iter_mut().filter(|(_, e)| !e.lost) {
        e.mark_lost("the watchdog's renewal loop could not run");
    }
}

fn stopped(reg: &mut Registry) {
    reg.running = false;
    reg.next_look = None;
}

async fn renewal_loop(weak: Weak<Shared>) {
    let mut running = Running(Some(weak.clone()));
    let mut inflight: JoinSet<Renewed> = JoinSet::new();
    let mut idle_since: Option<Instant> = None;
    loop {
        let Some(shared) = weak.upgrade() else { return };
        let now = Instant::now();
        let mut batches: Vec<Batch> = Vec::new();
        let next = {
            let mut reg = shared.lock();
            if reg.leases.is_empty() && inflight.is_empty() {
                // Linger a while before ending: short calls come and go, and a loop per call
                // would cost a task spawn each.
                let since = *idle_since.get_or_insert(now);
                if now >= since + LINGER {
                    stopped(&mut reg);
                    running.0 = None;
                    return;
                }
            } else {
                idle_since = None;
            }
            // With nothing due sooner, look again after IDLE_LOOK: a registration then wakes the
            // loop only if its lease needs a look before that.
            let mut next = now + IDLE_LOOK;
            for (id, e) in reg.leases.iter_mut().filter(|(_, e)| !e.lost) {
                if now >= e.deadline {
                    e.mark_lost("no renewal was confirmed before the lease ran out");
                    continue;
                }
                if e.renew && !e.inflight && now >= e.due() {
                    e.inflight = true;
                    if batches.last().is_none_or(|b| b.ids.len() >= BATCH) {
                        batches.push(Batch { ids: Vec::new(), leases: Vec::new() });
                    }
                    let batch = batches.last_mut().expect("just pushed");
                    batch.ids.push(id);
                    batch.leases.push((e.context.key().to_owned(), e.context.owner().to_owned(), e.lease));
                }
                next = next.min(e.next_look());
            }
            reg.next_look = Some(next);
            next
        };
        for batch in batches {
            let store = shared.store.clone();
            inflight.spawn(async move {
                let sent = Instant::now();
                let leases: Vec<Lease<'_>> =
                    batch.leases.iter().map(|(key, owner, lease)| Lease { key, owner, lease: *lease }).collect();
                let result = store.renew(&leases).await;
                Renewed { sent, ids: batch.ids, result }
            });
        }
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = shared.wake.notified() => {}
            Some(done) = inflight.join_next() => {
                if let Ok(renewed) = done {
                    apply(&shared, renewed);
                }
            }
        }
    }
}

/// Records a batch's outcome: confirmed leases move their deadline, refused ones are lost,
/// and on a store error they stay due, to be retried on the next look.
fn apply(shared: &Shared, renewed: Renewed) {
    let mut reg = shared.lock();
    match renewed.result {
        Ok(flags) => {
            let confirmed = flags.iter().filter(|ok| **ok).count();
            record::renewals("renewed", confirmed);
            record::renewals("refused", flags.len() - confirmed);
            tracing::debug!(renewed = confirmed, refused = flags.len() - confirmed, "idempotency leases renewed");
            for (id, ok) in renewed.ids.iter().zip(flags) {
                let Some(e) = reg.leases.get_mut(*id) else { continue };
                e.inflight = false;
                if e.lost {
                    continue;
                }
                if ok {
                    e.last_sent = renewed.sent;
                    e.deadline = renewed.sent + e.lease - safety_margin(e.lease);
                } else {
                    e.mark_lost("the record expired or another owner holds it");
                }
            }
        }
        Err(error) => {
            record::renewals("failed", renewed.ids.len());
            tracing::warn!(%error, leases = renewed.ids.len(), "idempotency lease renewal failed; retrying");
            let now = Instant::now();
            for id in &renewed.ids {
                if let Some(e) = reg.leases.get_mut(*id) {
                    e.inflight = false;
                    e.retry_at = now + (e.lease / 20).max(Duration::from_millis(5));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Entry {
        let now = Instant::now();
        Entry {
            lease: Duration::from_secs(1),
            renew: true,
            last_sent: now,
            deadline: now,
            inflight: false,
            retry_at: now,
            lost: false,
            context: CallContext::new(
                "k".into(),
                crate::ids::owner_id(),
                1,
                1,
                Arc::new(crate::store::memory::MemoryStore::new()),
            ),
        }
    }

    #[test]
    fn a_reused_slot_does_not_answer_to_the_old_id() {
        let mut leases = Leases::default();
        let a = leases.insert(entry());
        leases.remove(a);
        let b = leases.insert(entry());
        assert_eq!(a as u32, b as u32, "the slot was not reused");
        assert!(leases.get_mut(a).is_none(), "a stale id reached the new lease");
        assert!(leases.get_mut(b).is_some());
        leases.remove(a);
        assert!(!leases.is_empty(), "removing a stale id removed the new lease");
        assert_eq!(leases.iter_mut().count(), 1);
    }
}

#[cfg(test)]
mod renewal_tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::store::memory::MemoryStore;
    use crate::store::{AcquireOutcome, AcquireRequest, CommitRequest, StoreFuture, Transition, Watcher};
    use crate::{Call, Error, Idempotency};

    /// A `MemoryStore` that counts its renewal calls.
    struct Counting(MemoryStore, Arc<AtomicUsize>);

    impl Store for Counting {
        fn acquire<'a>(&'a self, r: AcquireRequest<'a>) -> StoreFuture<'a, Result<AcquireOutcome, StoreError>> {
            self.0.acquire(r)
        }
        fn renew<'a>(&'a self, leases: &'a [Lease<'a>]) -> StoreFuture<'a, Result<Vec<bool>, StoreError>> {
            self.1.fetch_add(1, Ordering::SeqCst);
            self.0.renew(leases)
        }
        fn commit<'a>(&'a self, r: CommitRequest<'a>) -> StoreFuture<'a, Result<Transition, StoreError>> {
            self.0.commit(r)
        }
        fn release<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, Result<Transition, StoreError>> {
            self.0.release(key, owner)
        }
        fn watch<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<Watcher, StoreError>> {
            self.0.watch(key)
        }
    }

    async fn renewals_for(idem: &Idempotency, renewals: &AtomicUsize, key: &str, body: Duration) -> usize {
        let before = renewals.load(Ordering::SeqCst);
        let call = Call::new(key).ttl(Duration::from_millis(900));
        let r: Result<(), Error> = idem
            .run(call, || async move {
                tokio::time::sleep(body).await;
                Ok(())
            })
            .await;
        r.unwrap();
        renewals.load(Ordering::SeqCst) - before
    }

    /// A call shorter than a third of its lease costs no renewal; a longer one is renewed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_calls_longer_than_a_third_of_the_lease_are_renewed() {
        let renewals = Arc::new(AtomicUsize::new(0));
        let idem = Idempotency::new(Counting(MemoryStore::new(), renewals.clone()));
        for i in 0..20 {
            let n = renewals_for(&idem, &renewals, &format!("short:{i}"), Duration::from_millis(20)).await;
            assert_eq!(n, 0, "a 20 ms call under a 900 ms lease was renewed");
        }
        let n = renewals_for(&idem, &renewals, "long", Duration::from_millis(700)).await;
        assert!(n >= 1, "a 700 ms call under a 900 ms lease was never renewed");
    }
}
