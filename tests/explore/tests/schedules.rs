//! Hand-written schedules: the windows issue 22 names, each played on both deterministic stores
//! and held to every invariant, so that each stays found (they failed before their fixes).

use idempotent_explore::check::check;
use idempotent_explore::history::Event;
use idempotent_explore::run::{play, Store};
use idempotent_explore::schedule::{CallSpec, End, Fault, FaultKind, Loss, Purge, Resolution, Schedule};

fn call(at_ms: u64, proc: usize) -> CallSpec {
    CallSpec {
        at_ms,
        proc,
        key: 0,
        lock: false,
        batch: false,
        in_transaction: false,
        with_previous: false,
        token: false,
        ttl_ms: 1000,
        keep_ms: 5000,
        wait_ms: None,
        reject_duplicates: false,
        abort_on_lease_lost: false,
        renew: true,
        fence_ms: Some(0),
        steps_ms: Vec::new(),
        end: End::Ok,
        cancel_ms: None,
        hold: false,
        give_up: None,
    }
}

fn holds(schedule: &Schedule) {
    for store in [Store::Memory, Store::Model] {
        let history = play(schedule, store);
        let report = check(&history.events());
        if !report.violations.is_empty() {
            let events: Vec<String> = history.events().iter().map(|(t, e)| format!("{t:>9} {e:?}")).collect();
            panic!("{store:?}: {:?}\nschedule:\n{schedule}\nhistory:\n{}", report.violations, events.join("\n"));
        }
    }
}

fn faults(list: &[(usize, u64, u64, FaultKind)]) -> Vec<Fault> {
    list.iter().map(|&(proc, from_ms, len_ms, kind)| Fault { proc, from_ms, len_ms, kind }).collect()
}

/// A purge that overtakes a read: the read's reply is held back, the purge and its broadcast go
/// by, the key runs again elsewhere; the late reply must not fill the cache.
#[test]
fn a_purge_that_overtakes_a_read_keeps_it_out_of_the_cache() {
    holds(&Schedule {
        caches: vec![true, false],
        timeouts_ms: vec![1000, 1000],
        calls: vec![call(0, 1), call(100, 0), call(300, 1), call(700, 0), call(800, 0)],
        faults: faults(&[(0, 100, 100, FaultKind::DelayDown(500))]),
        purges: vec![Purge { at_ms: 200, key: 0, force: false }],
        losses: Vec::<Loss>::new(),
        resolutions: Vec::new(),
    });
}

/// A commit whose reply is slower than the store's timeout is retried; the retry finds the
/// record completed by this acquisition. The cached copy must not outlive the first commit's
/// record: after it expires and the key runs again elsewhere, the cache answers no more.
#[test]
fn a_retried_commit_does_not_stretch_the_cache() {
    let mut first = call(0, 0);
    first.keep_ms = 1500;
    first.steps_ms = vec![50];
    let mut again = call(1600, 1);
    again.keep_ms = 5000;
    holds(&Schedule {
        caches: vec![true, false],
        timeouts_ms: vec![100, 100],
        calls: vec![first, again, call(1700, 0), call(1900, 0)],
        faults: faults(&[(0, 40, 20, FaultKind::DelayDown(600))]),
        purges: Vec::new(),
        losses: Vec::new(),
        resolutions: Vec::new(),
    });
}

/// An acquire whose reply arrives after its lease ended: another process took the key
/// meanwhile; the late one's body must not start.
#[test]
fn a_body_never_starts_after_its_lease_ended() {
    let mut late = call(0, 0);
    late.ttl_ms = 300;
    late.steps_ms = vec![500];
    let mut direct = call(400, 1);
    direct.ttl_ms = 300;
    direct.steps_ms = vec![800];
    holds(&Schedule {
        caches: vec![false, false],
        timeouts_ms: vec![2000, 2000],
        calls: vec![late, direct],
        faults: faults(&[(0, 0, 10, FaultKind::DelayDown(700))]),
        purges: Vec::new(),
        losses: Vec::new(),
        resolutions: Vec::new(),
    });
}

/// With `abort_on_lease_lost`, a body whose lease is known lost is not polled again, and every
/// waiter on a lock's `lost()` resolves.
#[test]
fn a_lost_lease_stops_an_aborting_body_and_wakes_every_waiter() {
    let mut aborting = call(0, 0);
    aborting.ttl_ms = 50;
    aborting.renew = false;
    aborting.abort_on_lease_lost = true;
    aborting.steps_ms = vec![100];
    let mut lock = call(0, 1);
    lock.lock = true;
    lock.ttl_ms = 50;
    lock.steps_ms = vec![300];
    holds(&Schedule {
        caches: vec![false, false],
        timeouts_ms: vec![100, 100],
        calls: vec![aborting, lock],
        faults: faults(&[(1, 10, 200, FaultKind::Refuse)]),
        purges: Vec::new(),
        losses: Vec::new(),
        resolutions: Vec::new(),
    });
}

/// A plain acquire's `PTTL` that lands after the record it read has ended (a stall splits the
/// pipeline) reads the next holder's lease: the cache must not take that for the record's
/// lifetime. Found by the explorer (seed 84025 before the fix), kept as it shrank it.
#[test]
fn a_split_acquire_never_caches_another_records_lifetime() {
    let call = |at_ms, proc, ttl_ms, keep_ms, steps_ms: Vec<u64>| CallSpec {
        ttl_ms,
        keep_ms,
        renew: false,
        steps_ms,
        ..call(at_ms, proc)
    };
    holds(&Schedule {
        caches: vec![false, true],
        timeouts_ms: vec![100, 1000],
        calls: vec![
            call(1380, 0, 1000, 0, vec![270]),
            call(1080, 1, 50, 0, vec![]),
            call(1610, 1, 50, 0, vec![]),
            call(790, 0, 50, 300, vec![]),
        ],
        faults: faults(&[(1, 150, 940, FaultKind::Split(160))]),
        purges: Vec::new(),
        losses: Vec::new(),
        resolutions: Vec::new(),
    });
}

/// A body that reads its fencing token late, after the store lost its record and another caller
/// took the key: the token is read on first use (Redis leaves it unread at the acquisition), so
/// the read must be owner-checked, or the stale holder would get a token larger than the new
/// holder's (I4). The read fails, and tells the stale holder its lease is lost.
#[test]
fn a_fence_read_after_the_key_changed_hands_fails() {
    let schedule = Schedule {
        caches: vec![false, false],
        timeouts_ms: vec![1000, 1000],
        calls: vec![
            CallSpec { fence_ms: Some(300), steps_ms: vec![500], ..call(0, 0) },
            CallSpec { fence_ms: Some(0), steps_ms: vec![400], ..call(150, 1) },
        ],
        faults: Vec::new(),
        purges: Vec::new(),
        losses: vec![Loss { at_ms: 100, key: 0 }],
        resolutions: Vec::new(),
    };
    holds(&schedule);
    let history = play(&schedule, Store::Model);
    let reads: Vec<_> = history
        .events()
        .into_iter()
        .filter_map(|(_, e)| match e {
            // The schedule's two calls (the probes after it are numbered from 2).
            Event::FenceRead { call, fence } if call < 2 => Some((call, fence.is_some())),
            _ => None,
        })
        .collect();
    assert_eq!(reads, vec![(1, true), (0, false)], "the stale holder read a fence");
}

/// A holder under `on_crash = hold` whose caller drops it mid-body: its key stays held past its
/// lease (unknown), the calls after it do not run, until an operator resolves it as not done:
/// the next call runs, as the key's second attempt.
#[test]
fn a_held_key_whose_holder_stopped_runs_again_only_once_resolved() {
    let held = |at_ms: u64, proc: usize| CallSpec { hold: true, ttl_ms: 100, ..call(at_ms, proc) };
    let stopped = CallSpec { steps_ms: vec![500], cancel_ms: Some(50), ..held(0, 0) };
    holds(&Schedule {
        caches: vec![false, true],
        timeouts_ms: vec![1000, 1000],
        calls: vec![stopped, held(30, 1), held(300, 1), held(600, 0), held(900, 1), held(1200, 0)],
        faults: Vec::new(),
        purges: Vec::new(),
        losses: Vec::new(),
        resolutions: vec![Resolution { at_ms: 800, key: 0, completed: false }],
    });
}

/// Failures counted across processes: two failed attempts give up on the key (`give_up_after(2)`),
/// and no call after runs, whatever its policy, until its `keep` ends.
#[test]
fn a_key_given_up_runs_no_more() {
    let poison = |at_ms: u64, proc: usize| CallSpec { give_up: Some(2), end: End::Err, ..call(at_ms, proc) };
    holds(&Schedule {
        caches: vec![false, false],
        timeouts_ms: vec![1000, 1000],
        calls: vec![poison(0, 0), poison(100, 1), poison(200, 0), call(300, 1), call(400, 0)],
        faults: faults(&[(1, 90, 50, FaultKind::DelayDown(200))]),
        purges: Vec::new(),
        losses: Vec::new(),
        resolutions: Vec::new(),
    });
}

/// A batch of several (`with_previous`): two keys and a copy of the first claimed together by one
/// process while another process's call and a failed attempt go on around them, a reply delayed
/// in the middle. Each item is held to every invariant as one call is; the copy is told the key
/// is in progress (its first copy runs), and each key's body runs once.
#[test]
fn a_batch_of_several_keys_and_a_copy_keeps_every_guarantee() {
    let batch = |at_ms: u64, key: usize, with_previous: bool| CallSpec {
        batch: true,
        with_previous,
        key,
        steps_ms: vec![100],
        ..call(at_ms, 0)
    };
    let failing = CallSpec { key: 1, end: End::Err, give_up: Some(3), ..call(0, 1) };
    let schedule = Schedule {
        caches: vec![false, false],
        timeouts_ms: vec![1000, 1000],
        calls: vec![failing, batch(50, 0, false), batch(50, 1, true), batch(50, 0, true), call(60, 1), call(400, 1)],
        faults: faults(&[(0, 40, 30, FaultKind::DelayDown(80))]),
        purges: Vec::new(),
        losses: Vec::new(),
        resolutions: Vec::new(),
    };
    assert_eq!(schedule.groups(), vec![vec![0], vec![1, 2, 3], vec![4], vec![5]]);
    holds(&schedule);
    for store in [Store::Memory, Store::Model] {
        let events = play(&schedule, store).events();
        let returned = |call: usize| {
            events.iter().find_map(|(_, e)| match e {
                Event::Return { call: c, returned } if *c == call => Some(format!("{returned:?}")),
                _ => None,
            })
        };
        let bodies = |call: usize| {
            events.iter().filter(|(_, e)| matches!(e, Event::BodyStart { call: c, .. } if *c == call)).count()
        };
        assert!(returned(1).is_some_and(|r| r.contains("Ok")), "{store:?}: {:?}", returned(1));
        assert_eq!(returned(3).as_deref(), Some("Err(\"Conflict\")"), "{store:?}");
        assert_eq!((bodies(1), bodies(2), bodies(3)), (1, 1, 0), "{store:?}");
    }
}

/// Found by the explorer (seed 646258067, I12), as it shrank it: the second attempt of a key
/// under `give_up_after(2)` and `on_crash = hold` stalls past its lease, an operator resolves it
/// as not done, then its body fails: that give-up must give up on the key (the stores answered it
/// as done and left the key released, and the next call ran it as a third attempt).
#[test]
fn a_give_up_after_an_operators_not_done_gives_up_on_the_key() {
    let quick = |at_ms: u64| CallSpec { ttl_ms: 50, keep_ms: 1000, renew: false, fence_ms: None, ..call(at_ms, 0) };
    holds(&Schedule {
        caches: vec![false, false, false],
        timeouts_ms: vec![100, 100, 100],
        calls: vec![
            CallSpec { steps_ms: vec![470], end: End::Err, hold: true, give_up: Some(2), ..quick(1230) },
            CallSpec { end: End::Err, fence_ms: Some(180), ..quick(110) },
            CallSpec { keep_ms: 0, ..quick(1710) },
        ],
        faults: Vec::new(),
        purges: Vec::new(),
        losses: Vec::new(),
        resolutions: vec![Resolution { at_ms: 1280, key: 0, completed: false }],
    });
}
