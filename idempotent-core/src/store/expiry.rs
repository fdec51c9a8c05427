//! Expiry bookkeeping for `MemoryStore`: which keys are due to expire, cheaply.
//!
//! Records that live a fixed time from their write (a completed record's `keep`) go into one
//! first-in-first-out queue per lifetime: a queue's entries then expire in order, so finding the
//! due ones costs nothing but its front. More distinct lifetimes than queues go into a heap.
//! In-progress records are not queued at all: their holder commits or releases them, and one
//! whose holder vanished is treated as absent when next read and swept out with the others
//! when the store has doubled since the last sweep. Entries hold a key's hash, not the key: the
//! store finds the record by it, and no key is copied or read again to expire it.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

/// Distinct lifetimes with a queue of their own; more go to the heap.
const QUEUES: usize = 16;

/// A queued key: when it is due, and the key's hash (the store finds the record by it).
type Due = (Instant, u64);

#[derive(Default)]
pub(crate) struct Expiries {
    queues: Vec<(Duration, VecDeque<Due>)>,
    heap: BinaryHeap<Reverse<Due>>,
}

impl Expiries {
    /// The key hashed to `hash` expires at `at`, `lifetime` after now.
    pub(crate) fn after(&mut self, hash: u64, lifetime: Duration, at: Instant) {
        if let Some((_, q)) = self.queues.iter_mut().find(|(d, _)| *d == lifetime) {
            q.push_back((at, hash));
        } else if self.queues.len() < QUEUES {
            self.queues.push((lifetime, VecDeque::from([(at, hash)])));
        } else {
            self.at(hash, at);
        }
    }

    /// The key hashed to `hash` expires at `at` (the heap: any time, any order).
    fn at(&mut self, hash: u64, at: Instant) {
        self.heap.push(Reverse((at, hash)));
    }

    /// Takes up to `budget` key hashes whose queued time has come (their records may have
    /// been replaced since: the caller checks).
    pub(crate) fn due(&mut self, now: Instant, budget: usize, mut take: impl FnMut(u64)) {
        let mut left = budget;
        for (_, q) in &mut self.queues {
            while left > 0 && q.front().is_some_and(|(at, _)| *at <= now) {
                if let Some((_, hash)) = q.pop_front() {
                    take(hash);
                    left -= 1;
                }
            }
        }
        while left > 0 && self.heap.peek().is_some_and(|Reverse((at, _))| *at <= now) {
            if let Some(Reverse((_, hash))) = self.heap.pop() {
                take(hash);
                left -= 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_keys_come_out_in_time() {
        let now = Instant::now();
        let mut e = Expiries::default();
        for i in 0..40u64 {
            let d = Duration::from_millis(i % 20); // 20 lifetimes: 16 queues and the heap
            e.after(i, d, now + d);
        }
        e.at(1000, now + Duration::from_secs(60));
        let mut out = Vec::new();
        e.due(now + Duration::from_millis(9), 1000, |h| out.push(h));
        assert_eq!(out.len(), 20, "{out:?}");
        e.due(now + Duration::from_millis(19), 5, |h| out.push(h));
        assert_eq!(out.len(), 25, "the budget was not respected");
        e.due(now + Duration::from_millis(19), 1000, |h| out.push(h));
        assert_eq!(out.len(), 40);
        assert!(!out.contains(&1000));
    }
}
