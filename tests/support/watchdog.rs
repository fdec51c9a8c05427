//! A bound on one test's whole run: a test still running after its limit names itself on the
//! process's real stderr and aborts the binary, so that a hang fails the suite within minutes
//! and says where, instead of holding the run until CI's own limit.

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long any one test of the suites may run (none of them ran a minute in CI's logs).
pub const TEST_LIMIT: Duration = Duration::from_secs(300);

/// Watches one test from its creation to its drop.
pub struct Watchdog {
    done: Arc<(Mutex<bool>, Condvar)>,
}

impl Watchdog {
    /// Watches the test `name` for [`TEST_LIMIT`].
    pub fn test(name: &'static str) -> Watchdog {
        Watchdog::new(name, TEST_LIMIT)
    }

    /// Starts watching the test `name`: if this is not dropped within `limit`, the process aborts.
    pub fn new(name: &'static str, limit: Duration) -> Watchdog {
        let done = Arc::new((Mutex::new(false), Condvar::new()));
        let watched = done.clone();
        let started = Instant::now();
        std::thread::spawn(move || {
            let (lock, woken) = &*watched;
            let guard = lock.lock().unwrap_or_else(|p| p.into_inner());
            let (guard, _) = woken.wait_timeout_while(guard, limit, |done| !*done).unwrap_or_else(|p| p.into_inner());
            if !*guard {
                // Straight to the file descriptor: the test harness captures `eprintln!`.
                let _ = writeln!(
                    std::io::stderr(),
                    "\nWATCHDOG: test {name} still running after {:?} (its limit is {limit:?}): aborting the binary",
                    started.elapsed()
                );
                std::process::abort();
            }
        });
        Watchdog { done }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let (lock, woken) = &*self.done;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        woken.notify_all();
    }
}
