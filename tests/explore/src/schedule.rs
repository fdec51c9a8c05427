//! A schedule: the simulated processes, the calls they make (with their policies, bodies,
//! errors, panics and cancellations), the faults on their connections, the operator's purges and
//! the records the store loses, each at a time. [`schedule`] is the proptest strategy that makes
//! them; shrinking drops calls and faults and shortens times, down to the smallest schedule that
//! still breaks an invariant.

use std::fmt;

use proptest::prelude::*;

/// How a body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Ok,
    Err,
    Panic,
}

/// One call (or lock) of a schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallSpec {
    pub at_ms: u64,
    pub proc: usize,
    pub key: usize,
    /// A lock guard (`Idempotency::lock`) instead of a guarded call.
    pub lock: bool,
    /// Through a batch (`Idempotency::claim`, then `Batch::run`) instead of `run`, of one call or
    /// of several (`with_previous`): the
    /// store's batch transitions and the batch's own windows (its claim, its drop guard, its
    /// commit) under the faults. A batch never waits (`wait_ms` is `None`), and a process with a
    /// replay cache makes none (a batch's item does not say whether its replay came from it).
    pub batch: bool,
    /// A batch whose body's effects commit with its record in one transaction of the store's
    /// (PostgreSQL's inbox pattern, `PgStore::run_batch_in_transaction`), where the layer playing
    /// the schedule has such a store; elsewhere a plain batch.
    pub in_transaction: bool,
    /// Claimed in the same batch as the call before it in the schedule's list (a batch of
    /// several, up to [`MAX_BATCH`] items, copies of one key among them): the store's batch
    /// transitions over many keys (pipelines, batch scripts, statements over arrays) under the
    /// faults. Such a batch's calls are plain batches of one process, at the first one's time,
    /// whose bodies neither panic nor are cancelled (a batch settles its items together).
    pub with_previous: bool,
    /// Token mode: the call's key is a token process 0 issued for key `key` at the start (every
    /// process must take it: they share the store's token secret).
    pub token: bool,
    pub ttl_ms: u64,
    pub keep_ms: u64,
    /// `OnConflict::Wait` with this patience (else `Reject`).
    pub wait_ms: Option<u64>,
    pub reject_duplicates: bool,
    pub abort_on_lease_lost: bool,
    pub renew: bool,
    /// The body asks for its fencing token this long after it starts (never: `None`, and then
    /// the acquisition leaves it unread on Redis).
    pub fence_ms: Option<u64>,
    /// The body's steps: it sleeps each, and does something after each.
    pub steps_ms: Vec<u64>,
    pub end: End,
    /// The caller drops the call this long after invoking it.
    pub cancel_ms: Option<u64>,
    /// `on_crash = hold`: a holder that stops without a word leaves the key unknown.
    pub hold: bool,
    /// `give_up_after(N)`.
    pub give_up: Option<u32>,
}

/// What goes wrong on a process's connections while a fault lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// Commands sent meanwhile reach the store this much later.
    DelayUp(u64),
    /// Replies produced meanwhile reach the process this much later.
    DelayDown(u64),
    /// Replies produced meanwhile never arrive (the commands did land).
    LoseReplies,
    /// Commands sent meanwhile fail at once and never land.
    Refuse,
    /// A plain acquire landing meanwhile is split: the `TIME` behind a lock's `SET NX GET` lands
    /// this much after it (a stall in the middle of a pipeline).
    Split(u64),
    /// Purge broadcasts and change notifications reach the process this much later.
    PubsubDelay(u64),
    /// The pub/sub connection is down: purges are missed (and the process is told so).
    PubsubDown,
}

/// A fault on one process's connections, for a while.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub proc: usize,
    pub from_ms: u64,
    pub len_ms: u64,
    pub kind: FaultKind,
}

/// An operator's `forget` of a key (`force`: in progress too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Purge {
    pub at_ms: u64,
    pub key: usize,
    pub force: bool,
}

/// An operator resolves a key's unknown outcome: completed (with a value of its own) or not done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolution {
    pub at_ms: u64,
    pub key: usize,
    pub completed: bool,
}

/// The store loses a key's record (a failover, a restart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loss {
    pub at_ms: u64,
    pub key: usize,
}

/// A whole schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    /// Per process: whether its runtime has a replay cache.
    pub caches: Vec<bool>,
    /// Per process: its store's timeout (the bound on each command), in milliseconds.
    pub timeouts_ms: Vec<u64>,
    pub calls: Vec<CallSpec>,
    pub faults: Vec<Fault>,
    pub purges: Vec<Purge>,
    pub losses: Vec<Loss>,
    pub resolutions: Vec<Resolution>,
}

impl Schedule {
    /// How many keys the schedule's calls use.
    pub fn keys(&self) -> usize {
        self.calls.iter().map(|c| c.key + 1).max().unwrap_or(1)
    }

    /// When the last fault ends, and what it left queued on a connection has landed and been
    /// answered (delays add up, and a connection lands its commands in order).
    pub fn faults_end_ms(&self) -> u64 {
        let backlog: u64 = self
            .faults
            .iter()
            .map(|f| match f.kind {
                FaultKind::DelayUp(d) | FaultKind::DelayDown(d) | FaultKind::Split(d) | FaultKind::PubsubDelay(d) => d,
                _ => 0,
            })
            .sum();
        self.faults.iter().map(|f| f.from_ms + f.len_ms).max().unwrap_or(0) + backlog
    }
}

/// The most calls a schedule claims in one batch.
pub const MAX_BATCH: usize = 3;

impl Schedule {
    /// The schedule's batches and lone calls, by index in `calls`, in order: each call in one
    /// group, a batch of several (`with_previous`) as one group.
    pub fn groups(&self) -> Vec<Vec<usize>> {
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for (i, c) in self.calls.iter().enumerate() {
            match groups.last_mut() {
                Some(group) if c.with_previous => group.push(i),
                _ => groups.push(vec![i]),
            }
        }
        groups
    }
}

/// Times on a 10 ms grid, so that events of one schedule fall on the same instants often.
fn at(max_ms: u64) -> impl Strategy<Value = u64> {
    (0..=max_ms / 10).prop_map(|t| t * 10)
}

/// A duration no store can hold (`Duration::from_millis(u64::MAX)`): the call must be refused
/// before its body runs.
pub const FOREVER_MS: u64 = u64::MAX;

fn ttl() -> impl Strategy<Value = u64> {
    prop_oneof![10 => Just(50u64), 10 => Just(100), 10 => Just(300), 10 => Just(1000), 1 => Just(FOREVER_MS)]
}

fn keep() -> impl Strategy<Value = u64> {
    prop_oneof![8 => Just(0u64), 24 => Just(300), 24 => Just(1000), 8 => Just(5000), 1 => Just(FOREVER_MS)]
}

fn end() -> impl Strategy<Value = End> {
    prop_oneof![6 => Just(End::Ok), 2 => Just(End::Err), 1 => Just(End::Panic)]
}

fn call(procs: usize, keys: usize) -> impl Strategy<Value = CallSpec> {
    (
        (
            at(2000),
            0..procs,
            0..keys,
            prop_oneof![
                17 => Just((false, false, false)),
                3 => Just((true, false, false)),
                3 => Just((false, true, false)),
                3 => Just((false, false, true)),
                1 => Just((false, true, true)),
            ],
        ),
        (ttl(), keep(), prop::option::weighted(0.3, at(1500)), prop::bool::weighted(0.15)),
        (prop::bool::weighted(0.3), prop::bool::weighted(0.9), prop::option::weighted(0.6, at(600))),
        (prop::collection::vec(at(1200), 0..3), end(), prop::option::weighted(0.15, at(1500))),
        (prop::bool::weighted(0.15), prop::option::weighted(0.15, 2..=3u32), prop::bool::weighted(0.5)),
    )
        .prop_map(
            |(
                (at_ms, proc, key, (lock, token, batch)),
                (ttl_ms, keep_ms, wait_ms, reject),
                (abort, renew, fence_ms),
                (steps_ms, end, cancel_ms),
                (hold, give_up, with_previous),
            )| {
                CallSpec {
                    at_ms,
                    proc,
                    key,
                    lock,
                    batch,
                    // Half the batches, by their time's parity on its 10 ms grid (`at_ms` itself
                    // is always even: every batch was in a transaction).
                    in_transaction: batch && (at_ms / 10) % 2 == 0,
                    // Decided with the schedule (`grouped`): whether it may join the call before.
                    with_previous,
                    token,
                    ttl_ms,
                    keep_ms,
                    wait_ms,
                    reject_duplicates: reject,
                    abort_on_lease_lost: abort,
                    renew,
                    fence_ms,
                    steps_ms,
                    end,
                    cancel_ms,
                    hold: hold && !lock,
                    give_up: give_up.filter(|_| !lock),
                }
            },
        )
}

fn fault(procs: usize) -> impl Strategy<Value = Fault> {
    let kind = prop_oneof![
        2 => (1..=150u64).prop_map(|d| FaultKind::DelayUp(d * 10)),
        3 => (1..=150u64).prop_map(|d| FaultKind::DelayDown(d * 10)),
        1 => Just(FaultKind::LoseReplies),
        1 => Just(FaultKind::Refuse),
        1 => (1..=80u64).prop_map(|d| FaultKind::Split(d * 10)),
        1 => (1..=100u64).prop_map(|d| FaultKind::PubsubDelay(d * 10)),
        1 => Just(FaultKind::PubsubDown),
    ];
    (0..procs, at(2000), (1..=150u64).prop_map(|l| l * 10), kind).prop_map(|(proc, from_ms, len_ms, kind)| Fault {
        proc,
        from_ms,
        len_ms,
        kind,
    })
}

/// Makes batches of several: a call that asked to join the call before it (`with_previous`)
/// does when that one is a plain batch (of a process without a replay cache, not in a
/// transaction), at most [`MAX_BATCH`] to a batch. It becomes a plain batch of that process at
/// that time, on its own key or a copy of another; the batch's bodies neither panic nor are
/// cancelled (a batch settles its items together). Every other call's `with_previous` is cleared.
fn grouped(calls: &mut [CallSpec]) {
    let mut size = 1;
    for i in 0..calls.len() {
        let prev = i.checked_sub(1).map(|p| calls[p].clone());
        let joins = match &prev {
            Some(p) => calls[i].with_previous && p.batch && !p.in_transaction && !p.lock && size < MAX_BATCH,
            None => false,
        };
        calls[i].with_previous = joins;
        let Some(prev) = prev.filter(|_| joins) else {
            size = 1;
            continue;
        };
        size += 1;
        let c = &mut calls[i];
        (c.proc, c.at_ms) = (prev.proc, prev.at_ms);
        (c.batch, c.lock, c.in_transaction, c.wait_ms) = (true, false, false, None);
        for c in [i - 1, i] {
            calls[c].cancel_ms = None;
            if calls[c].end == End::Panic {
                calls[c].end = End::Err;
            }
        }
    }
}

/// The strategy: 2 or 3 processes, 1 or 2 keys, up to 15 calls, 4 faults, 3 purges and a loss, in
/// two seconds. One schedule in seven is a line of lock waiters: every call a lock that waits,
/// so that the callers of one process queue for one lock (`runtime/turns.rs`) under the faults.
pub fn schedule() -> impl Strategy<Value = Schedule> {
    (2..=3usize, prop_oneof![3 => Just(1usize), 1 => Just(2)]).prop_flat_map(|(procs, keys)| {
        (
            prop::collection::vec(prop::bool::weighted(0.6), procs),
            prop::collection::vec(prop_oneof![Just(100u64), Just(1000)], procs),
            prop::collection::vec(call(procs, keys), 1..16),
            prop::collection::vec(fault(procs), 0..5),
            prop::collection::vec((at(2000), 0..keys, prop::bool::weighted(0.3)), 0..4),
            prop::collection::vec((at(2000), 0..keys), 0..2),
            prop::bool::weighted(1.0 / 7.0),
            prop::collection::vec((at(2500), 0..keys, prop::bool::ANY), 0..3),
        )
            .prop_map(|(caches, timeouts_ms, mut calls, faults, purges, losses, lock_line, resolutions)| {
                Schedule {
                    caches: caches.clone(),
                    timeouts_ms,
                    calls: {
                        for c in &mut calls {
                            if lock_line {
                                c.lock = true;
                                c.token = false;
                                c.batch = false;
                                c.in_transaction = false;
                                c.wait_ms.get_or_insert(800);
                                c.hold = false;
                                c.give_up = None;
                            }
                            if c.batch {
                                c.wait_ms = None;
                                c.batch = !caches[c.proc];
                                c.in_transaction &= c.batch;
                            }
                        }
                        grouped(&mut calls);
                        calls
                    },
                    faults,
                    purges: purges.into_iter().map(|(at_ms, key, force)| Purge { at_ms, key, force }).collect(),
                    // Losses are rare: most schedules hold the store to every guarantee.
                    losses: losses.into_iter().take(1).map(|(at_ms, key)| Loss { at_ms, key }).collect(),
                    resolutions: resolutions
                        .into_iter()
                        .map(|(at_ms, key, completed)| Resolution { at_ms, key, completed })
                        .collect(),
                }
            })
    })
}

/// A process of the real-server layer crashes at `at_ms` (nothing more leaves it, its calls are
/// gone) and is back, a new runtime on the same server, `down_ms` later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crash {
    pub proc: usize,
    pub at_ms: u64,
    pub down_ms: u64,
}

/// The shortest lease the real-server layer plays: its 10 % safety margin (30 ms) stays well
/// above the scheduler's jitter on a loaded two-core machine, so that a body is told its lease
/// is lost before another process can take the key, as the guarantees promise for pauses shorter
/// than the margin.
pub const SERVER_MIN_TTL_MS: u64 = 300;

impl Schedule {
    /// The schedule as the real-server layer plays it, in real time: leases of at least
    /// [`SERVER_MIN_TTL_MS`] (a lock's too), everything else as it is.
    pub fn on_servers(mut self) -> Self {
        for c in &mut self.calls {
            c.ttl_ms = c.ttl_ms.max(SERVER_MIN_TTL_MS);
        }
        self
    }
}

/// A schedule for the real-server layer and its crashes (at most two).
pub fn server_schedule() -> impl Strategy<Value = (Schedule, Vec<Crash>)> {
    schedule().prop_flat_map(|s| {
        let procs = s.caches.len();
        let crash = (0..procs, at(2000), (5..=100u64).prop_map(|d| d * 10)).prop_map(|(proc, at_ms, down_ms)| Crash {
            proc,
            at_ms,
            down_ms,
        });
        (Just(s.on_servers()), prop::collection::vec(crash, 0..3))
    })
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "  processes: {} (replay cache: {:?}, store timeout: {:?} ms)",
            self.caches.len(),
            self.caches,
            self.timeouts_ms
        )?;
        for (i, c) in self.calls.iter().enumerate() {
            let what = if c.lock {
                "lock"
            } else if c.with_previous {
                "same batch as the call before"
            } else if c.batch && c.token {
                "token batch"
            } else if c.batch {
                "batch"
            } else if c.token {
                "token call"
            } else {
                "call"
            };
            write!(f, "  #{i} at {}ms p{} {what} k{} ttl {}ms keep {}ms", c.at_ms, c.proc, c.key, c.ttl_ms, c.keep_ms)?;
            if let Some(w) = c.wait_ms {
                write!(f, " wait {w}ms")?;
            }
            if c.reject_duplicates {
                write!(f, " reject-duplicates")?;
            }
            if c.abort_on_lease_lost {
                write!(f, " abort-on-lease-lost")?;
            }
            if !c.renew {
                write!(f, " no-renew")?;
            }
            write!(f, " body {:?}ms -> {:?}", c.steps_ms, c.end)?;
            if let Some(x) = c.cancel_ms {
                write!(f, " cancelled at +{x}ms")?;
            }
            if c.hold {
                write!(f, " on-crash-hold")?;
            }
            if let Some(n) = c.give_up {
                write!(f, " give-up-after-{n}")?;
            }
            writeln!(f)?;
        }
        for x in &self.faults {
            writeln!(f, "  fault p{} {:?} from {}ms for {}ms", x.proc, x.kind, x.from_ms, x.len_ms)?;
        }
        for p in &self.purges {
            writeln!(f, "  purge k{} at {}ms{}", p.key, p.at_ms, if p.force { " (force)" } else { "" })?;
        }
        for l in &self.losses {
            writeln!(f, "  store loses k{} at {}ms", l.key, l.at_ms)?;
        }
        for r in &self.resolutions {
            let how = if r.completed { "completed" } else { "not done" };
            writeln!(f, "  operator resolves k{} as {how} at {}ms", r.key, r.at_ms)?;
        }
        Ok(())
    }
}
