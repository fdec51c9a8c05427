//! A bound on the store work that outlives its caller: releases of calls that gave up
//! ([`Store::abandon`](super::Store::abandon)) and commits the runtime goes on retrying past the
//! commit deadline. Each retries until its lease has passed, so in a long outage every abandoned
//! call leaves one such task for a lease's length; past [`MAX_BACKGROUND`] in the process, no more
//! are started (a key left held frees itself when its lease ends), a warning says so once per
//! outage, and the metrics count them (`idempotency_background_tasks`,
//! `idempotency_background_dropped_total`).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::telemetry::record;

/// The most background tasks in flight in one process.
pub const MAX_BACKGROUND: usize = 10_000;

static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
/// A warning was logged since the count was last below the bound.
static WARNED: AtomicBool = AtomicBool::new(false);

/// A place for one background task, given back when dropped.
pub(crate) struct Slot(());

/// A place for a background task of kind `what` (`release`, `commit`), or `None` when
/// [`MAX_BACKGROUND`] are in flight.
pub(crate) fn slot(what: &'static str) -> Option<Slot> {
    slot_within(what, MAX_BACKGROUND)
}

fn slot_within(what: &'static str, max: usize) -> Option<Slot> {
    if IN_FLIGHT.fetch_add(1, Ordering::AcqRel) >= max {
        IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
        record::background_dropped(what);
        if !WARNED.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                max,
                what,
                "idempotency: too much store work in the background (the store is away?); not starting more: \
                 keys left held free themselves when their leases end"
            );
        }
        return None;
    }
    record::background(1.0);
    Some(Slot(()))
}

impl Drop for Slot {
    fn drop(&mut self) {
        if IN_FLIGHT.fetch_sub(1, Ordering::AcqRel) <= MAX_BACKGROUND / 2 {
            WARNED.store(false, Ordering::Release);
        }
        record::background(-1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_bound_nothing_more_starts_and_places_come_back() {
        let base = IN_FLIGHT.load(Ordering::Acquire);
        let max = base + 3;
        let held: Vec<Slot> = (0..3).map(|_| slot_within("release", max).expect("under the bound")).collect();
        assert!(slot_within("release", max).is_none(), "a task started past the bound");
        drop(held);
        assert!(slot_within("release", max).is_some(), "places were not given back");
    }
}
