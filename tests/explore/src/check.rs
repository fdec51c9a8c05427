//! The checker: reads a history and holds it to the guarantees of `docs/guarantees.md`.
//!
//! - **I1** no two bodies of one key overlap: an effect of a body that has not been told its
//!   lease is lost never happens while another body of the key holds it untold; with
//!   `abort_on_lease_lost`, a body is not polled after it was told; every waiter on a lock's
//!   `lost()` resolves.
//! - **I2** at most one successful execution per key while its record is kept: no acquisition
//!   lands between a confirmed commit and `keep` after it.
//! - **I3** a replay returns the value of the execution whose record is current: a value some
//!   body of the key returned, read before that record surely ended (another acquisition, a
//!   purge, its `keep`).
//! - **I4** fences strictly increase across successive holders of a key.
//! - **I5** no stuck key: once faults are over and leases have run out, every key can be taken.
//! - **I6** every call ends within its bound (besides its body's own time).
//! - **I7** nothing lost silently: every `Ok` a body returned is stored, or its caller or body
//!   was told.
//! - **I8** what no store can hold is refused before the body runs (`InvalidCall`), and a
//!   genuine token is taken by every process on the store (never `InvalidToken`).
//! - **I9** a batch whose effects commit with its records in one transaction commits only what
//!   held its key from its acquisition to its commit: no acquisition sent after its own was
//!   answered was answered before its body ended. (Its body's effects, real only if it commits,
//!   are left out of I1.)
//! - **I10** a held key never runs again until resolved: a body under `on_crash = hold` that
//!   stopped without a word (dropped, panicked, its process gone: no commit, failure or release
//!   sent) keeps every other body of its key from starting while its record is surely kept, unless
//!   an operator resolved it or the record was taken away.
//! - **I11** attempts never go backwards: a body that acquired its key after another body of the
//!   key had acquired it is not an earlier attempt, while that one's record is surely kept.
//! - **I12** a key given up never runs: once a failure that gave up on the key is confirmed, no
//!   body of the key starts while its record is surely kept.
//!
//! Windows are judged by what the history proves, never by a guess: a store command landed
//! somewhere between its sending and its answer, so a violation is reported only when every
//! order consistent with the history breaks the invariant. The documented exceptions (a record
//! the store lost, an operator's forced purge, a commit through an outage longer than the lease,
//! a caller that dropped its call during a commit that a later holder overtook) are counted by
//! name, not reported.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

use crate::history::{BodyEnd, CallId, Event, Micros, OpKind, OpResult, Returned};

/// A broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub invariant: &'static str,
    pub key: String,
    pub what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on {}: {}", self.invariant, self.key, self.what)
    }
}

/// What the checker found.
#[derive(Debug, Default)]
pub struct Report {
    pub violations: Vec<Violation>,
    /// Documented exceptions met, by name.
    pub exceptions: BTreeMap<&'static str, usize>,
}

#[derive(Debug, Default, Clone)]
struct Body {
    start: Micros,
    owner: String,
    /// Which attempt of its key it was.
    attempt: u32,
    /// Its fencing token, once known (a lock's at its start, a body's when it read it).
    fence: Option<u64>,
    /// The body's effects (its start first) and whether it knew its lease lost at each.
    effects: Vec<(Micros, bool)>,
    told: Option<Micros>,
    end: Option<(Micros, BodyEnd)>,
}

#[derive(Debug, Default, Clone)]
struct CallInfo {
    id: CallId,
    key: String,
    keep: Duration,
    lock: bool,
    abort: bool,
    probe: bool,
    unholdable: bool,
    token: bool,
    /// Its body's effects commit with its record in one transaction, or not at all.
    transactional: bool,
    ttl: Duration,
    hold: bool,
    give_up: Option<u32>,
    bound: Duration,
    proc: usize,
    invoke: Micros,
    body: Option<Body>,
    lock_lost: Option<u8>,
    returned: Option<(Micros, Returned)>,
}

impl CallInfo {
    /// Until when the body held the key believing it exclusive: its end, or when it was told.
    fn claimed_until(&self) -> Micros {
        let Some(b) = &self.body else { return 0 };
        let end = b.end.as_ref().map_or(Micros::MAX, |(t, _)| *t);
        b.told.map_or(end, |t| t.min(end))
    }
}

#[derive(Debug, Clone)]
struct Op {
    proc: usize,
    kind: OpKind,
    key: String,
    owner: String,
    sent: Micros,
    answer: Option<(Micros, OpResult)>,
}

impl Op {
    /// Whether the command may have landed after `t`: not answered by then, or answered "no
    /// reply" (its caller stopped waiting, and the command, still on its way, lands when it
    /// lands).
    fn may_land_after(&self, t: Micros) -> bool {
        match &self.answer {
            None | Some((_, OpResult::NoReply)) => true,
            Some((at, _)) => *at > t,
        }
    }
}

/// What the checker reads off a history.
struct Reading {
    calls: Vec<CallInfo>,
    ops: Vec<Op>,
    /// Purges: key, when sent, when answered, forced, deleted.
    purges: Vec<(String, Micros, Micros, bool, bool)>,
    /// Purge broadcasts received: process, key, when.
    delivered: Vec<(usize, String, Micros)>,
    losses: Vec<(String, Micros)>,
    /// Processes crashed: which, when.
    crashes: Vec<(usize, Micros)>,
    /// Operators' resolutions: key, when sent, when answered, the value (completed), done.
    resolutions: Vec<(String, Micros, Micros, Option<String>, bool)>,
}

/// Times inside the checker: microseconds times 1024, plus the event's rank among those of the
/// same microsecond, so that events at one instant of the paused clock keep their order.
const TICK: Micros = 1024;

/// A duration in the checker's time.
fn span(d: Duration) -> Micros {
    d.as_micros() as Micros * TICK
}

/// A checker time as microseconds, for messages.
fn us(t: Micros) -> Micros {
    t / TICK
}

fn read(events: &[(Micros, Event)]) -> Reading {
    let mut calls: BTreeMap<CallId, CallInfo> = BTreeMap::new();
    let mut ops: Vec<Op> = Vec::new();
    let mut op_index: HashMap<(usize, u64), usize> = HashMap::new();
    let mut purges = Vec::new();
    let mut delivered = Vec::new();
    let mut losses = Vec::new();
    let mut crashes = Vec::new();
    let mut resolutions = Vec::new();
    let (mut last, mut rank) = (Micros::MAX, 0);
    for (t, e) in events {
        rank = if *t == last { (rank + 1).min(TICK - 1) } else { 0 };
        last = *t;
        let t = *t * TICK + rank;
        match e {
            Event::Invoke {
                call,
                proc,
                key,
                keep,
                lock,
                abort,
                bound,
                probe,
                unholdable,
                token,
                transactional,
                ttl,
                hold,
                give_up,
            } => {
                calls.insert(
                    *call,
                    CallInfo {
                        id: *call,
                        key: key.clone(),
                        keep: *keep,
                        lock: *lock,
                        abort: *abort,
                        probe: *probe,
                        unholdable: *unholdable,
                        token: *token,
                        transactional: *transactional,
                        ttl: *ttl,
                        hold: *hold,
                        give_up: *give_up,
                        bound: *bound,
                        proc: *proc,
                        invoke: t,
                        ..CallInfo::default()
                    },
                );
            }
            Event::BodyStart { call, owner, fence, attempt, lost } => {
                if let Some(c) = calls.get_mut(call) {
                    c.body = Some(Body {
                        start: t,
                        owner: owner.clone(),
                        attempt: *attempt,
                        fence: *fence,
                        effects: vec![(t, *lost)],
                        ..Body::default()
                    });
                }
            }
            Event::FenceRead { call, fence } => {
                if let (Some(b), Some(fence)) = (calls.get_mut(call).and_then(|c| c.body.as_mut()), fence) {
                    b.fence = Some(*fence);
                }
            }
            Event::Effect { call, lost } => {
                if let Some(b) = calls.get_mut(call).and_then(|c| c.body.as_mut()) {
                    b.effects.push((t, *lost));
                }
            }
            Event::Told { call, .. } => {
                if let Some(b) = calls.get_mut(call).and_then(|c| c.body.as_mut()) {
                    b.told.get_or_insert(t);
                }
            }
            Event::BodyEnd { call, end } => {
                if let Some(b) = calls.get_mut(call).and_then(|c| c.body.as_mut()) {
                    b.end = Some((t, end.clone()));
                }
            }
            Event::LockLost { call, woken } => {
                if let Some(c) = calls.get_mut(call) {
                    c.lock_lost = Some(*woken);
                }
            }
            Event::Return { call, returned } => {
                if let Some(c) = calls.get_mut(call) {
                    c.returned = Some((t, returned.clone()));
                }
            }
            Event::OpSent { proc, id, kind, key, owner } => {
                op_index.insert((*proc, *id), ops.len());
                ops.push(Op {
                    proc: *proc,
                    kind: kind.clone(),
                    key: key.clone(),
                    owner: owner.clone(),
                    sent: t,
                    answer: None,
                });
            }
            Event::OpAnswered { proc, id, result } => {
                if let Some(&i) = op_index.get(&(*proc, *id)) {
                    ops[i].answer = Some((t, result.clone()));
                }
            }
            Event::Purge { key, force, sent, deleted } => purges.push((key.clone(), *sent * TICK, t, *force, *deleted)),
            Event::PurgeDelivered { proc, key } => delivered.push((*proc, key.clone(), t)),
            Event::Lose { key } => losses.push((key.clone(), t)),
            Event::Crash { proc } => crashes.push((*proc, t)),
            Event::Resolve { key, sent, value, done } => {
                resolutions.push((key.clone(), *sent * TICK, t, value.clone(), *done))
            }
        }
    }
    Reading { calls: calls.into_values().collect(), ops, purges, delivered, losses, crashes, resolutions }
}

/// Checks `events` (a history, in time order) against I1 to I12.
pub fn check(events: &[(Micros, Event)]) -> Report {
    let r = read(events);
    let mut report = Report::default();
    let mut violation = |invariant: &'static str, key: &str, what: String| {
        report.violations.push(Violation { invariant, key: key.to_owned(), what })
    };
    let mut exceptions: BTreeMap<&'static str, usize> = BTreeMap::new();
    let bodies: Vec<&CallInfo> = r.calls.iter().filter(|c| c.body.is_some()).collect();
    // A record of `key` taken away between `from` and `to` by the store or a forced purge.
    // The call returned `Cancelled` because its process crashed (the real-server layer), not
    // because its caller went away: its runtime went with it, and it was told nothing.
    let crashed = |x: &CallInfo| {
        matches!(&x.returned, Some((at, Returned::Cancelled))
            if r.crashes.iter().any(|(p, t)| *p == x.proc && x.invoke <= *t && *t <= *at))
    };
    let taken_away = |key: &str, from: Micros, to: Micros| {
        r.losses.iter().any(|(k, t)| k == key && from <= *t && *t <= to)
            || r.purges.iter().any(|(k, sent, done, force, _)| k == key && *force && *done >= from && *sent <= to)
    };

    // I1: overlapping bodies.
    let mut reported = std::collections::HashSet::new();
    for x in &bodies {
        let xb = x.body.as_ref().expect("bodies have a body");
        for y in &bodies {
            if x.id == y.id || x.key != y.key {
                continue;
            }
            // A transactional body's effects exist only if its transaction commits: I9 holds
            // those to the key.
            if x.transactional {
                continue;
            }
            let yb = y.body.as_ref().expect("bodies have a body");
            let (y_from, y_until) = (yb.start, y.claimed_until());
            let Some(&(t, _)) = xb.effects.iter().find(|(t, lost)| !lost && y_from <= *t && *t < y_until) else {
                continue;
            };
            // Each pair once.
            if !reported.insert((x.id.min(y.id), x.id.max(y.id))) {
                continue;
            }
            if taken_away(&x.key, x.invoke.min(y.invoke), t) {
                *exceptions.entry("record taken away (store loss or forced purge)").or_default() += 1;
                continue;
            }
            violation(
                "I1",
                &x.key,
                format!(
                    "call #{} acted at {} us while call #{} (since {} us) held the key and was not told its lease was lost",
                    x.id,
                    us(t),
                    y.id,
                    us(y_from)
                ),
            );
        }
        // A transactional body is not stopped on a loss (it holds the transaction): its
        // effects are rolled back with it, which I9 holds it to.
        if x.abort && !x.transactional {
            if let Some(told) = xb.told {
                let after = xb
                    .effects
                    .iter()
                    .map(|(t, _)| *t)
                    .chain(xb.end.iter().filter(|(_, e)| *e != BodyEnd::Dropped).map(|(t, _)| *t));
                if let Some(t) = after.filter(|t| *t > told).min() {
                    violation(
                        "I1",
                        &x.key,
                        format!(
                            "call #{} aborts on lease loss, was told at {} us and still ran at {} us",
                            x.id,
                            us(told),
                            us(t)
                        ),
                    );
                }
            }
        }
        if let Some(woken) = x.lock_lost {
            if woken < 2 {
                violation("I1", &x.key, format!("lock #{} was lost and {woken} of its 2 lost() waiters woke", x.id));
            }
        }
    }

    let acquired = |owner: &str| -> Option<(Micros, Micros)> {
        r.ops
            .iter()
            .rev()
            .filter(|o| o.kind == OpKind::Acquire && o.owner == owner)
            .filter_map(|o| match &o.answer {
                Some((at, OpResult::Acquired { .. })) => Some((o.sent, *at)),
                _ => None,
            })
            .next()
    };
    // I9: a transactional call whose effects committed held its key from its acquisition to its
    // commit: no acquisition sent after its own was answered was answered before its body ended
    // (that acquisition took the key, and the commit, later, must have found it another's).
    for x in bodies.iter().filter(|c| c.transactional) {
        let Some((_, Returned::Ok { replayed: false, stored: true, .. })) = &x.returned else { continue };
        let xb = x.body.as_ref().expect("a body");
        let Some((_, x_acquired)) = acquired(&xb.owner) else { continue };
        let Some((body_end, _)) = xb.end else { continue };
        let other = r.ops.iter().find(|o| {
            o.key == x.key
                && o.kind == OpKind::Acquire
                && o.owner != xb.owner
                && o.sent > x_acquired
                && matches!(&o.answer, Some((at, OpResult::Acquired { .. })) if *at < body_end)
        });
        if let Some(o) = other {
            if taken_away(&x.key, x_acquired, body_end) {
                *exceptions.entry("record taken away (store loss or forced purge)").or_default() += 1;
                continue;
            }
            violation(
                "I9",
                &x.key,
                format!(
                    "call #{}'s transaction committed its effects, though another acquisition (sent at {} us) took \
                     the key after its own and before its body ended at {} us",
                    x.id,
                    us(o.sent),
                    us(body_end)
                ),
            );
        }
    }

    fn commits<'r>(ops: &'r [Op], owner: &'r str) -> impl Iterator<Item = &'r Op> + 'r {
        ops.iter().filter(move |o| o.kind == OpKind::Commit && o.owner == owner)
    }
    // When the first commit of `owner` was confirmed, and when its first commit was sent.
    let confirmed = |owner: &str| -> Option<(Micros, Micros)> {
        let first_sent = commits(&r.ops, owner).map(|o| o.sent).min()?;
        let done = commits(&r.ops, owner).filter_map(|o| match &o.answer {
            Some((at, OpResult::Done)) => Some(*at),
            _ => None,
        });
        done.min().map(|d| (first_sent, d))
    };
    // A purge that may have landed after `after` (its answer came later) and before `before` (it
    // was sent earlier): a purge waits in a client's queue while its connection is down, and
    // lands when it is back.
    let purged = |key: &str, after: Micros, before: Micros| {
        r.purges.iter().any(|(k, sent, done, _, _)| k == key && *done > after && *sent < before)
    };

    // I2: a second execution while the first's record is surely kept.
    for x in bodies.iter().filter(|c| !c.lock) {
        let xb = x.body.as_ref().expect("a body");
        if !matches!(xb.end, Some((_, BodyEnd::Ok(_)))) || x.keep.is_zero() {
            continue;
        }
        let Some((first_sent, done)) = confirmed(&xb.owner) else { continue };
        let kept_until = first_sent + span(x.keep);
        for y in bodies.iter().filter(|c| c.key == x.key && c.id != x.id) {
            let Some((sent, answered)) = acquired(&y.body.as_ref().expect("a body").owner) else { continue };
            if sent > done && answered + span(Duration::from_millis(1)) < kept_until {
                if taken_away(&x.key, first_sent, answered) || purged(&x.key, first_sent, answered) {
                    *exceptions.entry("record taken away (store loss or purge)").or_default() += 1;
                    continue;
                }
                violation(
                    "I2",
                    &x.key,
                    format!(
                        "call #{} ran again (acquired {}..{} us) while call #{}'s record, stored at {} us, was kept until {} us",
                        y.id,
                        us(sent),
                        us(answered),
                        x.id,
                        us(done),
                        us(kept_until)
                    ),
                );
            }
        }
    }

    // I3: replays.
    let value_of = |key: &str, value: &str| {
        bodies.iter().find(|c| {
            c.key == key && matches!(&c.body.as_ref().expect("a body").end, Some((_, BodyEnd::Ok(v))) if v == value)
        })
    };
    // A purge of `c`'s key sent after `done` and before `before` (so that it may have landed
    // before an acquisition answered then), whose broadcast had not reached `c`'s process when `c`
    // was answered.
    // A purge that may have deleted the record stored from `after` on (it was answered later),
    // sent before `before`, whose broadcast had not reached `c`'s process when `c` was invoked.
    let undelivered_purge = |c: &CallInfo, after: Micros, before: Micros| {
        r.purges.iter().any(|(k, sent, at, _, _)| {
            *k == c.key
                && *at > after
                && *sent < before
                && !r.delivered.iter().any(|(p, dk, dt)| *p == c.proc && dk == k && *dt > *sent && *dt < c.invoke)
        })
    };
    for c in r.calls.iter().filter(|c| !c.lock) {
        let Some((_, Returned::Ok { value, replayed: true, cached, .. })) = &c.returned else { continue };
        // A value an operator resolved the key with, sent before the call was answered.
        let resolved_with = r.resolutions.iter().any(|(k, sent, _, v, _)| {
            *k == c.key
                && v.as_deref() == Some(value.as_str())
                && c.returned.as_ref().is_some_and(|(at, _)| *sent < *at)
        });
        if resolved_with {
            continue;
        }
        let Some(x) = value_of(&c.key, value) else {
            violation("I3", &c.key, format!("call #{} replayed {value:?}, which no body of the key returned", c.id));
            continue;
        };
        let xb = x.body.as_ref().expect("a body");
        let read = c.invoke;
        let Some((first_sent, done)) = confirmed(&xb.owner) else { continue };
        let ended = if done + span(x.keep) + span(Duration::from_millis(1)) < read {
            Some(format!("its keep of {:?} after it was stored at {} us", x.keep, us(done)))
        } else if let Some(y) = r.ops.iter().find(|o| {
            o.key == c.key
                && o.kind == OpKind::Acquire
                && o.sent > done
                && matches!(&o.answer, Some((at, OpResult::Acquired { .. })) if *at < read)
                // A cached copy answers until a purge's broadcast reaches its process: an
                // acquisition the purge made possible does not end it before that.
                && !(*cached && o.answer.as_ref().is_some_and(|(at, _)| undelivered_purge(c, first_sent, *at)))
        }) {
            Some(format!("another acquisition, sent at {} us, found the key free", us(y.sent)))
        } else if let Some((_, sent, at, _, _)) = r.purges.iter().find(|(k, sent, at, _, deleted)| {
            // A store read after the purge was answered; a cached answer after its broadcast
            // reached the process (until then the cache cannot know). Only a purge that says it
            // deleted a record surely ended one: one that failed (a connection lost to a
            // restart) or found nothing to delete may have left it current.
            *deleted
                && *k == c.key
                && *sent > done
                && if *cached {
                    r.delivered.iter().any(|(p, dk, dt)| *p == c.proc && dk == k && *dt > *sent && *dt < read)
                } else {
                    *at < read
                }
        }) {
            Some(format!(
                "a purge ({}..{} us){}",
                us(*sent),
                us(*at),
                if *cached { ", its broadcast received" } else { "" }
            ))
        } else {
            None
        };
        if ended.is_some() && taken_away(&c.key, first_sent, read) {
            // A record lost by the store (not purged) stays in a replay cache: documented.
            *exceptions.entry("replayed from a cache after the store lost the record").or_default() += 1;
            continue;
        }
        if let Some(why) = ended {
            violation(
                "I3",
                &c.key,
                format!(
                    "call #{} at {} us replayed call #{}'s {value:?}, whose record had ended: {why}",
                    c.id,
                    us(read),
                    x.id
                ),
            );
        }
    }

    // I4: fences of successive holders (those that know theirs: a body that never read its
    // fence has none).
    for x in &bodies {
        for y in &bodies {
            let (xb, yb) = (x.body.as_ref().expect("a body"), y.body.as_ref().expect("a body"));
            let (Some(xf), Some(yf)) = (xb.fence, yb.fence) else { continue };
            if x.key == y.key && xb.start < y.invoke && xf >= yf {
                violation(
                    "I4",
                    &x.key,
                    format!("call #{} (fence {yf}) came after call #{} (fence {xf}) started", y.id, x.id),
                );
            }
        }
    }

    for c in &r.calls {
        let Some((returned_at, returned)) = &c.returned else {
            violation("I6", &c.key, format!("call #{} never returned", c.id));
            continue;
        };
        // I8: refused what cannot be held, taken what is genuine. A caller gone before it heard
        // (its process crashed while the batch it was claimed in still ran its other items) is
        // told nothing; its body never ran all the same.
        let refused = matches!(returned, Returned::Err(e) if e == "InvalidCall") || crashed(c);
        if c.unholdable && (c.body.is_some() || !refused) {
            violation(
                "I8",
                &c.key,
                format!("call #{} asked for a duration no store can hold and got {returned:?}", c.id),
            );
        }
        if c.token && matches!(returned, Returned::Err(e) if e == "InvalidToken") {
            violation("I8", &c.key, format!("call #{}'s genuine token was refused as invalid", c.id));
        }
        // I5: probes after the faults. A probe that failed with a store error is tried again
        // (`run::probe_every_key`); only the last try of a key by a process counts.
        let retried = || r.calls.iter().any(|p| p.probe && p.key == c.key && p.proc == c.proc && p.id > c.id);
        // An earlier probe of the key returned before its commit was confirmed (`stored: false`:
        // the commit goes on in the background past its deadline), and either its record
        // completed only after this probe was invoked, or this probe came within that probe's
        // lease (its acquire may have landed as late as its body's start), before the history
        // ends and shows the commit: the key was held by that commit in flight, not stuck.
        let behind_a_commit = || {
            r.calls.iter().any(|p| {
                let unconfirmed =
                    matches!(&p.returned, Some((at, Returned::Ok { stored: false, .. })) if *at <= c.invoke);
                p.probe
                    && p.key == c.key
                    && unconfirmed
                    && p.body.as_ref().is_some_and(|b| {
                        let done = |o: &Op, after: bool| {
                            matches!(&o.answer, Some((at, OpResult::Done)) if (*at > c.invoke) == after)
                        };
                        let within_lease = c.invoke < b.start.saturating_add(span(p.ttl));
                        commits(&r.ops, &b.owner).any(|o| done(o, true))
                            || (within_lease && !commits(&r.ops, &b.owner).any(|o| done(o, false)))
                    })
            })
        };
        // A documented state of the key, which a call of the schedule asked for: held unknown
        // (`on_crash = hold`) or given up (`give_up_after`). I10 and I12 hold them to that.
        // A call under `hold` leaves its key unknown when its holder stops without a word: once its
        // body started, or, without a body, when its process crashed before it heard its acquire
        // (which may have landed: nobody is left to release it).
        let held_by_policy = |e: &str| {
            r.calls.iter().any(|x| {
                x.key == c.key
                    && ((e == "OutcomeUnknown" && x.hold && (x.body.is_some() || crashed(x)))
                        || (e == "GaveUp" && x.give_up.is_some()))
            })
        };
        if c.probe {
            if let Returned::Err(e) = returned {
                if held_by_policy(e) {
                    *exceptions
                        .entry("a probe found the key held unknown or given up, as its policy says")
                        .or_default() += 1;
                } else if e == "Conflict" && behind_a_commit() {
                    *exceptions.entry("a probe behind an earlier probe's commit still on its way").or_default() += 1;
                } else if !(e == "Store" && retried()) {
                    violation("I5", &c.key, format!("the probe #{} after every fault and lease got {e}", c.id));
                }
            }
        }
        // I6: bounded calls.
        let body_time = c.body.as_ref().map_or(0, |b| b.end.as_ref().map_or(0, |(t, _)| t - b.start));
        let took = returned_at - c.invoke - body_time.min(returned_at - c.invoke);
        if took > span(c.bound) {
            violation(
                "I6",
                &c.key,
                format!("call #{} took {} us besides its body, over its bound of {:?}", c.id, us(took), c.bound),
            );
        }
    }

    // Whether an operator's resolution of `key` may have landed between `from` and `to`.
    let resolved = |key: &str, from: Micros, to: Micros| {
        r.resolutions.iter().any(|(k, sent, at, _, _)| k == key && *at >= from && *sent <= to)
    };
    // What may have ended `key`'s record between `from` and `to`: the store, a purge, a resolution.
    let ended = |key: &str, from: Micros, to: Micros| {
        taken_away(key, from, to) || purged(key, from, to) || resolved(key, from, to)
    };
    // The owner's commands after its acquisition that say what became of its attempt.
    let said = |owner: &str| {
        r.ops.iter().any(|o| {
            o.owner == owner && matches!(o.kind, OpKind::Commit | OpKind::Release | OpKind::Fail | OpKind::GiveUp)
        })
    };

    // A command of `key` that may have ended its count between `from` and `to` (sent before `to`,
    // not answered before `from`): a commit that succeeded (the key completed, its count done
    // with), or a failure or release of a call that keeps nothing (`keep` zero: no count kept).
    // The shortest `keep` `owner`'s call may have: its body's call's, or, for an owner whose body
    // never started (an acquire its caller gave up on, or answered too late), the shortest of the
    // calls of its process in flight when it sent its first command.
    let owner_keep = |owner: &str| -> Duration {
        if let Some(c) = bodies.iter().find(|c| c.body.as_ref().is_some_and(|b| b.owner == owner)) {
            return c.keep;
        }
        let Some((proc, first)) = r.ops.iter().find(|o| o.owner == owner).map(|o| (o.proc, o.sent)) else {
            return Duration::ZERO;
        };
        r.calls
            .iter()
            .filter(|c| c.proc == proc && c.invoke <= first && c.returned.as_ref().is_none_or(|(at, _)| *at >= first))
            .map(|c| c.keep)
            .min()
            .unwrap_or(Duration::ZERO)
    };
    let keeps_nothing = |owner: &str| owner_keep(owner).is_zero();
    let count_ended = |key: &str, from: Micros, to: Micros| {
        r.ops.iter().any(|o| {
            o.key == key
                && o.sent < to
                && o.may_land_after(from)
                && match o.kind {
                    OpKind::Commit => !matches!(&o.answer, Some((_, OpResult::Lost))),
                    OpKind::Fail | OpKind::Release => keeps_nothing(&o.owner),
                    _ => false,
                }
        })
    };

    // I10: a held key whose holder stopped without a word is not run again until resolved.
    for x in bodies.iter().filter(|c| c.hold && !c.lock) {
        let xb = x.body.as_ref().expect("a body");
        let stopped = matches!(xb.end, None | Some((_, BodyEnd::Dropped | BodyEnd::Panicked)));
        if !stopped || said(&xb.owner) {
            continue;
        }
        let Some((x_sent, x_answered)) = acquired(&xb.owner) else { continue };
        // Its record lives at least its lease and `keep` from when its acquire landed.
        let kept_until = x_sent + span(x.ttl) + span(x.keep);
        for y in bodies.iter().filter(|c| c.key == x.key && c.id != x.id && !c.lock) {
            let Some((y_sent, y_answered)) = acquired(&y.body.as_ref().expect("a body").owner) else { continue };
            if y_sent > x_answered && y_answered + span(Duration::from_millis(1)) < kept_until {
                if ended(&x.key, x_sent, y_answered) {
                    *exceptions.entry("held key resolved or taken away").or_default() += 1;
                    continue;
                }
                violation(
                    "I10",
                    &x.key,
                    format!(
                        "call #{} ran (acquired {}..{} us) though call #{} (on_crash = hold) stopped without a word \
                         holding the key, and nobody resolved it",
                        y.id,
                        us(y_sent),
                        us(y_answered),
                        x.id
                    ),
                );
            }
        }
    }

    // I11: attempts never go backwards while the count is surely kept.
    for x in bodies.iter().filter(|c| !c.lock) {
        let xb = x.body.as_ref().expect("a body");
        let Some((x_sent, x_answered)) = acquired(&xb.owner) else { continue };
        for y in bodies.iter().filter(|c| c.key == x.key && c.id != x.id && !c.lock) {
            let yb = y.body.as_ref().expect("a body");
            let Some((y_sent, y_answered)) = acquired(&yb.owner) else { continue };
            // The count is carried by the record of each acquisition of the key in between (its
            // body run or not), for its own `keep`: surely kept only until the shortest ends.
            let kept_until = r
                .ops
                .iter()
                .filter(|o| o.kind == OpKind::Acquire && o.key == x.key && o.owner != xb.owner && o.owner != yb.owner)
                .filter(|o| o.sent < y_answered && o.may_land_after(x_answered))
                .map(|o| o.sent + span(owner_keep(&o.owner)))
                .fold(x_sent + span(x.keep), Micros::min);
            if y_sent > x_answered
                && y_answered + span(Duration::from_millis(1)) < kept_until
                && yb.attempt < xb.attempt
            {
                if ended(&x.key, x_sent, y_answered) {
                    *exceptions.entry("count taken away with its record").or_default() += 1;
                    continue;
                }
                if count_ended(&x.key, x_sent, y_answered) {
                    *exceptions.entry("count ended by a success, or by a failure kept for no time").or_default() += 1;
                    continue;
                }
                violation(
                    "I11",
                    &x.key,
                    format!(
                        "call #{} ran as attempt {} after call #{} had run as attempt {}",
                        y.id, yb.attempt, x.id, xb.attempt
                    ),
                );
            }
        }
    }

    // I12: a key given up never runs while its record is surely kept.
    for g in r.ops.iter().filter(|o| o.kind == OpKind::GiveUp) {
        let Some((g_answered, OpResult::Done)) = &g.answer else { continue };
        let Some(giver) = bodies.iter().find(|c| c.body.as_ref().is_some_and(|b| b.owner == g.owner)) else { continue };
        let kept_until = g.sent + span(giver.keep);
        for y in bodies.iter().filter(|c| c.key == g.key && !c.lock) {
            let Some((y_sent, y_answered)) = acquired(&y.body.as_ref().expect("a body").owner) else { continue };
            if y_sent > *g_answered && y_answered + span(Duration::from_millis(1)) < kept_until {
                if ended(&g.key, g.sent, y_answered) {
                    *exceptions.entry("given-up key taken away").or_default() += 1;
                    continue;
                }
                violation(
                    "I12",
                    &g.key,
                    format!(
                        "call #{} ran (acquired {}..{} us) after call #{} gave up on the key at {} us",
                        y.id,
                        us(y_sent),
                        us(y_answered),
                        giver.id,
                        us(*g_answered)
                    ),
                );
            }
        }
    }

    // I7: a body's Ok is stored, or someone was told.
    for x in bodies.iter().filter(|c| !c.lock) {
        let xb = x.body.as_ref().expect("a body");
        let Some((_, BodyEnd::Ok(value))) = &xb.end else { continue };
        if confirmed(&xb.owner).is_some() || xb.told.is_some() {
            continue;
        }
        match &x.returned {
            Some((_, Returned::Ok { stored: false, .. } | Returned::Err(_) | Returned::Panicked)) => continue,
            Some((cancelled_at, Returned::Cancelled)) => {
                // Its process crashed: its runtime went with it, commit and all. The key comes
                // free after its lease and a retry may run the body again, as after any crash
                // between a body's effect and its commit (docs/guarantees.md).
                if crashed(x) {
                    *exceptions.entry("process crashed between a body's Ok and its commit").or_default() += 1;
                    continue;
                }
                // Its commit goes on in the background: judged below like any other, unless a
                // later holder took the key first (nobody is left to tell). A commit never sent
                // again after the caller went away was dropped with it: the key comes free after
                // its lease, for a retry to run the body a second time.
                if commits(&r.ops, &xb.owner).any(|o| matches!(&o.answer, Some((_, OpResult::Lost)))) {
                    *exceptions
                        .entry("caller dropped its call during the commit; a later holder took the key")
                        .or_default() += 1;
                    continue;
                }
                // Still on its way after the caller went away: sent after, or answered after. (A
                // "no reply" before the cancel, never sent again, is a commit the runtime dropped,
                // though the command itself may land: not `may_land_after`.)
                let went_on = commits(&r.ops, &xb.owner)
                    .any(|o| o.sent > *cancelled_at || o.answer.as_ref().is_none_or(|(at, _)| *at > *cancelled_at));
                let ended_at = xb.end.as_ref().map_or(Micros::MAX, |(t, _)| *t);
                if !went_on && !taken_away(&x.key, x.invoke, ended_at) {
                    violation(
                        "I7",
                        &x.key,
                        format!(
                            "call #{}'s body returned {value:?}, its caller dropped the call during the commit, and the \
                             commit was dropped with it",
                            x.id
                        ),
                    );
                    continue;
                }
            }
            _ => {}
        }
        let ended_at = xb.end.as_ref().map_or(Micros::MAX, |(t, _)| *t);
        if taken_away(&x.key, x.invoke, ended_at) {
            *exceptions.entry("record taken away (store loss or forced purge)").or_default() += 1;
            continue;
        }
        let failed = commits(&r.ops, &xb.owner)
            .any(|o| matches!(&o.answer, Some((_, OpResult::Error | OpResult::NoReply)) | None));
        if failed {
            *exceptions.entry("commit through an outage longer than the lease").or_default() += 1;
            continue;
        }
        violation("I7", &x.key, format!("call #{}'s body returned {value:?}, never stored, and nobody was told", x.id));
    }
    report.exceptions = exceptions;
    report
}

#[cfg(test)]
mod tests {
    //! A hand-written history for each invariant that breaks it, and the checker reports it.

    use super::*;

    const MS: Micros = 1000;

    /// Builds a history in time order.
    #[derive(Default)]
    struct H(Vec<(Micros, Event)>, u64);

    impl H {
        fn at(mut self, t: Micros, e: Event) -> Self {
            self.0.push((t, e));
            self
        }
        fn invoke(self, t: Micros, call: CallId, keep_ms: u64) -> Self {
            self.at(
                t,
                Event::Invoke {
                    call,
                    proc: call % 2,
                    key: "k".into(),
                    keep: Duration::from_millis(keep_ms),
                    lock: false,
                    abort: false,
                    bound: Duration::from_millis(500),
                    probe: false,
                    unholdable: false,
                    token: false,
                    transactional: false,
                    ttl: Duration::from_millis(100),
                    hold: false,
                    give_up: None,
                },
            )
        }
        /// `invoke`, the call under `on_crash = hold` or giving up after `give_up` failures.
        fn invoke_with(mut self, t: Micros, call: CallId, keep_ms: u64, hold: bool, give_up: Option<u32>) -> Self {
            self = self.invoke(t, call, keep_ms);
            if let Some((_, Event::Invoke { hold: h, give_up: g, .. })) = self.0.last_mut() {
                (*h, *g) = (hold, give_up);
            }
            self
        }
        fn op(mut self, t: Micros, answered: Micros, call: CallId, kind: OpKind, result: OpResult) -> Self {
            let id = self.1;
            self.1 += 1;
            let owner = format!("o{call}");
            self.0.push((t, Event::OpSent { proc: 9, id, kind, key: "k".into(), owner }));
            self.0.push((answered, Event::OpAnswered { proc: 9, id, result }));
            self
        }
        fn body(self, start: Micros, end: Micros, call: CallId, fence: u64) -> Self {
            self.body_at(start, end, call, fence, 1, BodyEnd::Ok(format!("v{call}")))
        }
        /// A body that ran as `attempt` and ended as `ended`.
        fn body_at(self, start: Micros, end: Micros, call: CallId, fence: u64, attempt: u32, ended: BodyEnd) -> Self {
            let owner = format!("o{call}");
            self.at(start, Event::BodyStart { call, owner, fence: Some(fence), attempt, lost: false })
                .at(end, Event::BodyEnd { call, end: ended })
        }
        fn ret(self, t: Micros, call: CallId, returned: Returned) -> Self {
            self.at(t, Event::Return { call, returned })
        }
        /// A whole successful call: acquire, body, commit confirmed, value returned.
        fn ran(self, t: Micros, call: CallId, fence: u64, body_ms: Micros, keep_ms: u64) -> Self {
            let end = t + body_ms * MS;
            self.invoke(t, call, keep_ms)
                .op(t, t, call, OpKind::Acquire, OpResult::Acquired { fence })
                .body(t, end, call, fence)
                .op(end, end, call, OpKind::Commit, OpResult::Done)
                .ret(
                    end,
                    call,
                    Returned::Ok { value: format!("v{call}"), replayed: false, cached: false, stored: true },
                )
        }
        fn check(mut self) -> Vec<&'static str> {
            self.0.sort_by_key(|(t, _)| *t);
            let mut found: Vec<&'static str> = check(&self.0).violations.iter().map(|v| v.invariant).collect();
            found.dedup();
            found
        }
    }

    fn replayed(value: &str, cached: bool) -> Returned {
        Returned::Ok { value: value.into(), replayed: true, cached, stored: true }
    }

    #[test]
    fn a_clean_history_holds() {
        let h = H::default().ran(0, 0, 1, 10, 0).ran(20 * MS, 1, 2, 10, 1000);
        assert_eq!(h.check(), Vec::<&str>::new());
    }

    /// Call 0 holds its key under `on_crash = hold` and is dropped mid-body without a word (its
    /// lease 100 ms, its record kept 1 s past it); call 1 takes the key 300 ms in and runs.
    fn held_then_run(resolved: bool) -> H {
        let h = H::default()
            .invoke_with(0, 0, 1000, true, None)
            .op(0, MS, 0, OpKind::Acquire, OpResult::Acquired { fence: 1 })
            .body_at(MS, 20 * MS, 0, 1, 1, BodyEnd::Dropped)
            .ret(20 * MS, 0, Returned::Cancelled);
        let h = if resolved {
            h.at(250 * MS, Event::Resolve { key: "k".into(), sent: 240 * MS, value: None, done: true })
        } else {
            h
        };
        h.ran(300 * MS, 1, 2, 10, 1000)
    }

    #[test]
    fn i10_a_held_key_runs_again_without_a_resolution() {
        assert_eq!(held_then_run(false).check(), vec!["I10"]);
        assert_eq!(held_then_run(true).check(), Vec::<&str>::new(), "resolved between");
        // A holder that failed said so: its key was free for the next.
        let failed = H::default()
            .invoke_with(0, 0, 1000, true, None)
            .op(0, MS, 0, OpKind::Acquire, OpResult::Acquired { fence: 1 })
            .body_at(MS, 20 * MS, 0, 1, 1, BodyEnd::Failed)
            .op(20 * MS, 21 * MS, 0, OpKind::Fail, OpResult::Done)
            .ret(21 * MS, 0, Returned::BodyErr)
            .ran(300 * MS, 1, 2, 10, 1000);
        assert_eq!(failed.check(), Vec::<&str>::new());
    }

    #[test]
    fn i11_an_attempt_after_a_later_one() {
        let h = |attempt: u32, start: Micros| {
            H::default()
                .invoke(0, 0, 1000)
                .op(0, MS, 0, OpKind::Acquire, OpResult::Acquired { fence: 1 })
                .body_at(MS, 10 * MS, 0, 1, 3, BodyEnd::Failed)
                .op(10 * MS, 11 * MS, 0, OpKind::Fail, OpResult::Done)
                .ret(11 * MS, 0, Returned::BodyErr)
                .invoke(start, 1, 1000)
                .op(start, start + MS, 1, OpKind::Acquire, OpResult::Acquired { fence: 2 })
                .body_at(start + MS, start + 2 * MS, 1, 2, attempt, BodyEnd::Failed)
                .op(start + 2 * MS, start + 3 * MS, 1, OpKind::Fail, OpResult::Done)
                .ret(start + 3 * MS, 1, Returned::BodyErr)
        };
        assert_eq!(h(1, 50 * MS).check(), vec!["I11"]);
        assert_eq!(h(4, 50 * MS).check(), Vec::<&str>::new());
        assert_eq!(h(1, 1500 * MS).check(), Vec::<&str>::new(), "after the count's keep it may start again");
    }

    /// An acquire its caller stopped waiting for ("no reply") may land later, after the failure
    /// it was answered before, and restart the count's `keep` with its own call's (here none):
    /// not a violation. One refused (never sent) cannot.
    #[test]
    fn i11_an_acquire_answered_no_reply_may_land_later_with_its_own_keep() {
        let h = |late: OpResult| {
            H::default()
                .invoke(0, 2, 0)
                .op(0, MS / 2, 2, OpKind::Acquire, late)
                .ret(MS / 2, 2, Returned::Err("Store".into()))
                .invoke(0, 0, 1000)
                .op(0, MS, 0, OpKind::Acquire, OpResult::Acquired { fence: 1 })
                .body_at(MS, 10 * MS, 0, 1, 3, BodyEnd::Failed)
                .op(10 * MS, 11 * MS, 0, OpKind::Fail, OpResult::Done)
                .ret(11 * MS, 0, Returned::BodyErr)
                .invoke(50 * MS, 1, 1000)
                .op(50 * MS, 51 * MS, 1, OpKind::Acquire, OpResult::Acquired { fence: 3 })
                .body_at(51 * MS, 52 * MS, 1, 3, 1, BodyEnd::Failed)
                .op(52 * MS, 53 * MS, 1, OpKind::Fail, OpResult::Done)
                .ret(53 * MS, 1, Returned::BodyErr)
        };
        assert_eq!(h(OpResult::NoReply).check(), Vec::<&str>::new());
        assert_eq!(h(OpResult::Error).check(), vec!["I11"]);
    }

    #[test]
    fn i12_a_key_given_up_runs_again() {
        let h = |start: Micros, purge: bool| {
            let h = H::default()
                .invoke_with(0, 0, 1000, false, Some(1))
                .op(0, MS, 0, OpKind::Acquire, OpResult::Acquired { fence: 1 })
                .body_at(MS, 10 * MS, 0, 1, 1, BodyEnd::Failed)
                .op(10 * MS, 11 * MS, 0, OpKind::GiveUp, OpResult::Done)
                .ret(11 * MS, 0, Returned::BodyErr);
            let h = if purge {
                h.at(30 * MS, Event::Purge { key: "k".into(), force: false, sent: 20 * MS, deleted: true })
            } else {
                h
            };
            h.ran(start, 1, 2, 10, 1000)
        };
        assert_eq!(h(50 * MS, false).check(), vec!["I12"]);
        assert_eq!(h(50 * MS, true).check(), Vec::<&str>::new(), "an operator forgot it");
        assert_eq!(h(1500 * MS, false).check(), Vec::<&str>::new(), "its keep ended");
    }

    #[test]
    fn i1_two_bodies_at_once() {
        let h = H::default().ran(0, 0, 1, 100, 0).ran(50 * MS, 1, 2, 100, 0);
        assert!(h.check().contains(&"I1"));
    }

    /// Call `call`'s invocation marked transactional.
    fn transactional(mut h: H, call: CallId) -> H {
        for (_, e) in &mut h.0 {
            if let Event::Invoke { call: c, transactional, .. } = e {
                if *c == call {
                    *transactional = true;
                }
            }
        }
        h
    }

    #[test]
    fn i1_leaves_a_rolled_back_transaction_out_and_i9_holds_a_committed_one() {
        // Call 1 acts while call 0 holds the key: its effects count unless they were rolled back.
        let overlapping = |returned: Returned| {
            let h = H::default().ran(0, 0, 1, 100, 0).invoke(50 * MS, 1, 0);
            let h = h.op(50 * MS, 50 * MS, 1, OpKind::Acquire, OpResult::Acquired { fence: 2 });
            h.body(50 * MS, 150 * MS, 1, 2).ret(150 * MS, 1, returned)
        };
        let rolled_back = || Returned::Err("LeaseLost".into());
        assert!(overlapping(rolled_back()).check().contains(&"I1"));
        assert_eq!(transactional(overlapping(rolled_back()), 1).check(), Vec::<&str>::new());

        // Call 0's transaction commits though call 1 took the key while its body ran.
        let took_meanwhile = |returned: Returned| {
            let h = H::default().invoke(0, 0, 1000).op(0, 0, 0, OpKind::Acquire, OpResult::Acquired { fence: 1 });
            let h = h.at(0, Event::BodyStart { call: 0, owner: "o0".into(), fence: None, attempt: 1, lost: false });
            let h = h.op(50 * MS, 50 * MS, 1, OpKind::Acquire, OpResult::Acquired { fence: 2 });
            let h = h.at(100 * MS, Event::BodyEnd { call: 0, end: BodyEnd::Ok("v0".into()) });
            let commit = if matches!(returned, Returned::Ok { .. }) { OpResult::Done } else { OpResult::Lost };
            let h = h.op(100 * MS, 120 * MS, 0, OpKind::Commit, commit);
            transactional(h.ret(120 * MS, 0, returned), 0)
        };
        let committed = Returned::Ok { value: "v0".into(), replayed: false, cached: false, stored: true };
        assert_eq!(took_meanwhile(committed).check(), vec!["I9"]);
        assert_eq!(took_meanwhile(rolled_back()).check(), Vec::<&str>::new());
    }

    #[test]
    fn i1_told_before_the_other_started_is_fine_but_not_polled_after_with_abort() {
        let told =
            H::default().ran(0, 0, 1, 100, 0).at(40 * MS, Event::Told { call: 0, which: 0 }).ran(50 * MS, 1, 2, 10, 0);
        assert_eq!(told.check(), Vec::<&str>::new());
        let mut aborting = H::default()
            .ran(0, 0, 1, 100, 0)
            .at(40 * MS, Event::Told { call: 0, which: 0 })
            .at(60 * MS, Event::Effect { call: 0, lost: true });
        if let Event::Invoke { abort, .. } = &mut aborting.0[0].1 {
            *abort = true;
        }
        assert_eq!(aborting.check(), vec!["I1"]);
        let waiters = H::default().ran(0, 0, 1, 10, 0).at(5 * MS, Event::LockLost { call: 0, woken: 1 });
        assert_eq!(waiters.check(), vec!["I1"]);
    }

    #[test]
    fn i2_a_second_success_while_the_record_is_kept() {
        let h = H::default().ran(0, 0, 1, 10, 1000).ran(500 * MS, 1, 2, 10, 1000);
        assert!(h.check().contains(&"I2"));
        let after_keep = H::default().ran(0, 0, 1, 10, 100).ran(500 * MS, 1, 2, 10, 1000);
        assert_eq!(after_keep.check(), Vec::<&str>::new());
        let purged = H::default()
            .ran(0, 0, 1, 10, 1000)
            .at(300 * MS, Event::Purge { key: "k".into(), force: false, sent: 290 * MS, deleted: true })
            .ran(500 * MS, 1, 2, 10, 1000);
        assert_eq!(purged.check(), Vec::<&str>::new());
    }

    #[test]
    fn i3_a_replay_of_an_ended_record() {
        // Another execution took the key after the record, then a cached replay of the old one.
        let h = H::default().ran(0, 0, 1, 10, 100).ran(200 * MS, 2, 2, 10, 1000).invoke(300 * MS, 4, 0).ret(
            300 * MS,
            4,
            replayed("v0", true),
        );
        assert_eq!(h.check(), vec!["I3"]);
        let unknown = H::default().invoke(0, 4, 0).ret(0, 4, replayed("v9", false));
        assert_eq!(unknown.check(), vec!["I3"]);
        // A purge whose broadcast reached the process before the cached answer.
        let purged = H::default()
            .ran(0, 0, 1, 10, 1000)
            .at(100 * MS, Event::Purge { key: "k".into(), force: false, sent: 100 * MS, deleted: true })
            .at(150 * MS, Event::PurgeDelivered { proc: 0, key: "k".into() })
            .invoke(200 * MS, 4, 0)
            .ret(200 * MS, 4, replayed("v0", true));
        assert_eq!(purged.check(), vec!["I3"]);
        // The same replay after a purge that failed (it deleted nothing): the record may be current.
        let failed = H::default()
            .ran(0, 0, 1, 10, 1000)
            .at(100 * MS, Event::Purge { key: "k".into(), force: false, sent: 100 * MS, deleted: false })
            .invoke(200 * MS, 4, 0)
            .ret(200 * MS, 4, replayed("v0", false));
        assert_eq!(failed.check(), Vec::<&str>::new());
    }

    #[test]
    fn i2_a_purge_queued_before_the_commit_may_land_after_it() {
        // The purge was sent at 90 ms, before the record's commit (100 ms), and answered at 130
        // ms (it waited in a client's queue): it may have deleted that record, so the second
        // execution at 150 ms is not a violation. Answered before the commit was sent, it could
        // not have been.
        let h = |answered: Micros| {
            H::default()
                .ran(90 * MS, 0, 1, 10, 1000)
                .at(answered, Event::Purge { key: "k".into(), force: false, sent: 90 * MS, deleted: true })
                .ran(150 * MS, 1, 2, 10, 1000)
        };
        assert_eq!(h(130 * MS).check(), Vec::<&str>::new());
        assert!(h(95 * MS).check().contains(&"I2"));
    }

    #[test]
    fn i3_a_commit_answered_after_a_purge_fills_the_cache_until_the_broadcast() {
        // The commit was sent at 10 ms and answered at 60; a purge sent at 50 ms deleted the
        // record; another acquisition took the key at 70; the cached copy answers at 80. Before
        // the broadcast reaches the process (90 ms) that is the documented bound; after it (78
        // ms), a violation.
        let base = || {
            H::default()
                .invoke(0, 0, 1000)
                .op(0, 0, 0, OpKind::Acquire, OpResult::Acquired { fence: 1 })
                .body(0, 10 * MS, 0, 1)
                .op(10 * MS, 60 * MS, 0, OpKind::Commit, OpResult::Done)
                .ret(60 * MS, 0, Returned::Ok { value: "v0".into(), replayed: false, cached: false, stored: true })
                .at(55 * MS, Event::Purge { key: "k".into(), force: false, sent: 50 * MS, deleted: true })
                .op(70 * MS, 72 * MS, 2, OpKind::Acquire, OpResult::Acquired { fence: 2 })
                .invoke(80 * MS, 4, 0)
                .ret(80 * MS, 4, replayed("v0", true))
        };
        let late = base().at(90 * MS, Event::PurgeDelivered { proc: 0, key: "k".into() });
        assert_eq!(late.check(), Vec::<&str>::new());
        let early = base().at(78 * MS, Event::PurgeDelivered { proc: 0, key: "k".into() });
        assert_eq!(early.check(), vec!["I3"]);
    }

    #[test]
    fn i3_a_cached_copy_answers_until_the_purge_broadcast_arrives() {
        // A purge at 100 ms lets another acquisition (sent before it, landing after it) take the
        // key; the cached copy answers at 150 ms, before the broadcast reached its process at
        // 160 ms: the documented bound, not a violation. After the broadcast it would be one.
        let purge = Event::Purge { key: "k".into(), force: false, sent: 100 * MS, deleted: true };
        let base = || {
            H::default()
                .ran(0, 0, 1, 10, 1000)
                .op(90 * MS, 120 * MS, 2, OpKind::Acquire, OpResult::Acquired { fence: 2 })
                .at(100 * MS, purge.clone())
        };
        let before = base().at(160 * MS, Event::PurgeDelivered { proc: 0, key: "k".into() }).invoke(150 * MS, 4, 0);
        assert_eq!(before.ret(150 * MS, 4, replayed("v0", true)).check(), Vec::<&str>::new());
        let after = base().at(140 * MS, Event::PurgeDelivered { proc: 0, key: "k".into() }).invoke(150 * MS, 4, 0);
        assert_eq!(after.ret(150 * MS, 4, replayed("v0", true)).check(), vec!["I3"]);
    }

    #[test]
    fn i4_a_smaller_fence_after_a_holder() {
        let h = H::default().ran(0, 0, 5, 10, 0).ran(100 * MS, 1, 3, 10, 0);
        assert_eq!(h.check(), vec!["I4"]);
    }

    #[test]
    fn i5_a_stuck_key() {
        let mut h = H::default().invoke(0, 0, 0).ret(MS, 0, Returned::Err("Conflict".into()));
        if let Event::Invoke { probe, .. } = &mut h.0[0].1 {
            *probe = true;
        }
        assert_eq!(h.check(), vec!["I5"]);
    }

    /// A call under `hold` whose process crashed before it heard its acquire (which landed) leaves
    /// the key unknown: the probe after it finds it so, as its policy says. Had its caller merely
    /// gone away, the runtime would have released the key: the probe's answer is I5.
    #[test]
    fn i5_a_held_acquire_unheard_by_a_crashed_process_is_the_keys_policy() {
        let unheard = |crash: bool| {
            let h = H::default().invoke_with(0, 0, 1000, true, None);
            let h = if crash { h.at(10 * MS, Event::Crash { proc: 0 }) } else { h };
            let mut h = h.ret(10 * MS, 0, Returned::Cancelled).invoke(500 * MS, 2, 0).ret(
                501 * MS,
                2,
                Returned::Err("OutcomeUnknown".into()),
            );
            if let Event::Invoke { probe, .. } = &mut h.0.iter_mut().rev().nth(1).unwrap().1 {
                *probe = true;
            }
            h
        };
        assert_eq!(unheard(true).check(), Vec::<&str>::new());
        assert_eq!(unheard(false).check(), vec!["I5"]);
    }

    /// Probe 0 returns with its commit unconfirmed (it goes on in the background); probe 1 finds
    /// the key in progress, then probe 0's commit lands: not a stuck key. Nor is it when the
    /// history ends before the commit is confirmed and probe 1 came within probe 0's lease (the
    /// commit still in flight: a PostgreSQL run whose every commit of the probe waited out the
    /// pool while connections were slow to open). Had the commit landed before probe 1 asked, or
    /// never while probe 1 came after the lease, the conflict is I5.
    #[test]
    fn i5_a_probe_behind_an_earlier_probes_commit_in_flight_is_not_a_stuck_key() {
        let probes = |commit_lands: Micros| {
            let mut h = H::default()
                .invoke(0, 0, 1000)
                .op(0, MS, 0, OpKind::Acquire, OpResult::Acquired { fence: 1 })
                .body(MS, 2 * MS, 0, 1)
                .op(2 * MS, commit_lands, 0, OpKind::Commit, OpResult::Done)
                .ret(3 * MS, 0, Returned::Ok { value: "v0".into(), replayed: false, cached: false, stored: false })
                .invoke(4 * MS, 1, 1000)
                .op(4 * MS, 5 * MS, 1, OpKind::Acquire, OpResult::InProgress)
                .ret(5 * MS, 1, Returned::Err("Conflict".into()));
            for (_, e) in &mut h.0 {
                if let Event::Invoke { probe, .. } = e {
                    *probe = true;
                }
            }
            h
        };
        assert_eq!(probes(6 * MS).check(), Vec::<&str>::new());
        assert_eq!(probes(3 * MS).check(), vec!["I5"]);
        // The commit unconfirmed to the end: probe 1 within the lease (100 ms from the body's
        // start at 1 ms, its acquire's answer), or after it.
        let unconfirmed = |probe_at: Micros| {
            let mut h = H::default()
                .invoke(0, 0, 1000)
                .op(0, MS, 0, OpKind::Acquire, OpResult::Acquired { fence: 1 })
                .body(MS, 2 * MS, 0, 1)
                .op(2 * MS, 3 * MS, 0, OpKind::Commit, OpResult::Error)
                .ret(3 * MS, 0, Returned::Ok { value: "v0".into(), replayed: false, cached: false, stored: false })
                .invoke(probe_at, 1, 1000)
                .op(probe_at, probe_at + MS, 1, OpKind::Acquire, OpResult::InProgress)
                .ret(probe_at + MS, 1, Returned::Err("Conflict".into()));
            for (_, e) in &mut h.0 {
                if let Event::Invoke { probe, .. } = e {
                    *probe = true;
                }
            }
            h
        };
        assert_eq!(unconfirmed(50 * MS).check(), Vec::<&str>::new());
        assert_eq!(unconfirmed(150 * MS).check(), vec!["I5"]);
    }

    #[test]
    fn i5_a_store_error_tried_again_is_not_a_stuck_key_unless_the_last_try_fails() {
        let probe = |mut h: H| {
            for (_, e) in &mut h.0 {
                if let Event::Invoke { probe, proc, .. } = e {
                    (*probe, *proc) = (true, 0);
                }
            }
            h
        };
        let store = || Returned::Err("Store".into());
        let recovered = probe(H::default().invoke(0, 0, 0).ret(MS, 0, store()).ran(2 * MS, 1, 1, 1, 0));
        assert_eq!(recovered.check(), Vec::<&str>::new());
        let stuck =
            probe(H::default().invoke(0, 0, 0).ret(MS, 0, store()).invoke(2 * MS, 1, 0).ret(3 * MS, 1, store()));
        assert_eq!(stuck.check(), vec!["I5"]);
        let held = Returned::Err("Conflict".into());
        let conflict = probe(H::default().invoke(0, 0, 0).ret(MS, 0, held).ran(2 * MS, 1, 1, 1, 0));
        assert_eq!(conflict.check(), vec!["I5"], "only a store error is tried again");
    }

    #[test]
    fn i6_an_unbounded_call() {
        let h = H::default().invoke(0, 0, 0).ret(900 * MS, 0, Returned::Err("Timeout".into()));
        assert_eq!(h.check(), vec!["I6"]);
        let never = H::default().invoke(0, 0, 0);
        assert_eq!(never.check(), vec!["I6"]);
    }

    #[test]
    fn i8_an_unholdable_duration_runs_or_a_genuine_token_is_refused() {
        let mut unholdable = H::default().ran(0, 0, 1, 10, 0);
        if let Event::Invoke { unholdable: u, .. } = &mut unholdable.0[0].1 {
            *u = true;
        }
        assert!(unholdable.check().contains(&"I8"));
        // Claimed in a batch whose process crashed before the batch settled: told nothing, run never.
        let gone = |crash: bool| {
            let h = H::default().invoke(0, 0, 0);
            let mut h = if crash { h.at(MS, Event::Crash { proc: 0 }) } else { h }.ret(MS, 0, Returned::Cancelled);
            if let Event::Invoke { unholdable: u, .. } = &mut h.0[0].1 {
                *u = true;
            }
            h
        };
        assert_eq!(gone(true).check(), Vec::<&str>::new());
        assert_eq!(gone(false).check(), vec!["I8"], "a caller that went away is no crash");
        let mut answered = H::default().invoke(0, 0, 0).ret(MS, 0, Returned::Err("Conflict".into()));
        if let Event::Invoke { unholdable: u, .. } = &mut answered.0[0].1 {
            *u = true;
        }
        assert_eq!(answered.check(), vec!["I8"]);
        let mut refused = H::default().invoke(0, 0, 0).ret(MS, 0, Returned::Err("InvalidToken".into()));
        if let Event::Invoke { token, .. } = &mut refused.0[0].1 {
            *token = true;
        }
        assert_eq!(refused.check(), vec!["I8"]);
    }

    #[test]
    fn i7_an_ok_lost_silently() {
        let h = H::default()
            .invoke(0, 0, 1000)
            .op(0, 0, 0, OpKind::Acquire, OpResult::Acquired { fence: 1 })
            .body(0, 10 * MS, 0, 1)
            .op(10 * MS, 20 * MS, 0, OpKind::Commit, OpResult::Lost)
            .ret(20 * MS, 0, Returned::Ok { value: "v0".into(), replayed: false, cached: false, stored: true });
        assert_eq!(h.check(), vec!["I7"]);
        let told = H::default()
            .invoke(0, 0, 1000)
            .op(0, 0, 0, OpKind::Acquire, OpResult::Acquired { fence: 1 })
            .body(0, 10 * MS, 0, 1)
            .op(10 * MS, 20 * MS, 0, OpKind::Commit, OpResult::Lost)
            .ret(20 * MS, 0, Returned::Ok { value: "v0".into(), replayed: false, cached: false, stored: false });
        assert_eq!(told.check(), Vec::<&str>::new());
    }

    #[test]
    fn i7_a_commit_dropped_with_its_caller() {
        let dropped = |then: Option<OpResult>| {
            let h = H::default()
                .invoke(0, 0, 1000)
                .op(0, 0, 0, OpKind::Acquire, OpResult::Acquired { fence: 1 })
                .body(0, 10 * MS, 0, 1)
                .op(10 * MS, 15 * MS, 0, OpKind::Commit, OpResult::NoReply)
                .ret(15 * MS, 0, Returned::Cancelled);
            match then {
                Some(result) => h.op(40 * MS, 45 * MS, 0, OpKind::Commit, result),
                None => h,
            }
        };
        assert_eq!(dropped(None).check(), vec!["I7"], "the commit was not sent again");
        // An attempt answered after the caller went away went on without it: through an outage
        // longer than the lease here.
        let went_on = H::default()
            .invoke(0, 0, 1000)
            .op(0, 0, 0, OpKind::Acquire, OpResult::Acquired { fence: 1 })
            .body(0, 10 * MS, 0, 1)
            .op(10 * MS, 1500 * MS, 0, OpKind::Commit, OpResult::NoReply)
            .ret(15 * MS, 0, Returned::Cancelled);
        assert_eq!(went_on.check(), Vec::<&str>::new());
        assert_eq!(dropped(Some(OpResult::Done)).check(), Vec::<&str>::new(), "stored in the background");
        assert_eq!(dropped(Some(OpResult::Lost)).check(), Vec::<&str>::new(), "a later holder took the key");
        // Not its caller but its process went away (the real-server layer's crash): the runtime
        // went with it, commit and all.
        let crashed = |proc: usize| {
            H::default()
                .invoke(0, 0, 1000)
                .op(0, 0, 0, OpKind::Acquire, OpResult::Acquired { fence: 1 })
                .body(0, 10 * MS, 0, 1)
                .op(10 * MS, 14 * MS, 0, OpKind::Commit, OpResult::NoReply)
                .at(15 * MS, Event::Crash { proc })
                .ret(15 * MS, 0, Returned::Cancelled)
        };
        assert_eq!(crashed(0).check(), Vec::<&str>::new());
        assert_eq!(crashed(1).check(), vec!["I7"], "another process crashed");
    }
}
