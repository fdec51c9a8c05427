//! Acquires in flight, and the fate of those that failed: an acquire that timed out may still
//! land later, so its release waits for whoever learns what became of it (see
//! `PgStore::abandon`).

use super::*;

/// A failed acquire, and whether its statement may still land (it was sent, and no answer
/// says it failed).
pub(super) struct Failed {
    pub(super) error: StoreError,
    pub(super) maybe_landed: bool,
}

impl Failed {
    pub(super) fn unsent(error: StoreError) -> Failed {
        Failed { error, maybe_landed: false }
    }
}

/// Acquires in flight, by owner, and acquires that failed in a way that may still land, until
/// their callers abandon them.
#[derive(Default)]
pub(super) struct Flights {
    map: Mutex<HashMap<String, Flight>>,
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Flight {
    /// The statement runs; `abandoned` once its caller gave up.
    Running { abandoned: bool },
    /// It failed and may still land: `abandon` releases until the row shows up or the lease
    /// has passed. When it was noted, to bound how long unclaimed notes stay.
    MayLand(Instant),
}

/// Notes of failed acquires kept beyond this many are dropped when older than a minute (their
/// callers never abandoned them: not the runtime).
pub(super) const MAX_NOTES: usize = 1024;

impl Flights {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Flight>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn start(&self, owner: &str) {
        self.lock().insert(owner.to_owned(), Flight::Running { abandoned: false });
    }

    /// The acquire of `owner` is done; whether its caller had abandoned it. A failed one that may
    /// still land is noted for `abandon`.
    pub(super) fn finish(&self, owner: &str, maybe_landed: bool) -> bool {
        let mut map = self.lock();
        let abandoned = matches!(map.remove(owner), Some(Flight::Running { abandoned: true }));
        if maybe_landed && !abandoned {
            if map.len() >= MAX_NOTES {
                map.retain(|_, f| !matches!(f, Flight::MayLand(at) if at.elapsed() > Duration::from_secs(60)));
            }
            map.insert(owner.to_owned(), Flight::MayLand(Instant::now()));
        }
        abandoned
    }

    /// The caller gave up on `owner`: `Some(may_land_later)` when the store must release now,
    /// `None` when the acquire's task will (it still runs).
    pub(super) fn abandon(&self, owner: &str) -> Option<bool> {
        let mut map = self.lock();
        match map.get_mut(owner) {
            Some(Flight::Running { abandoned }) => {
                *abandoned = true;
                None
            }
            Some(Flight::MayLand(_)) => {
                map.remove(owner);
                Some(true)
            }
            None => Some(false),
        }
    }
}
