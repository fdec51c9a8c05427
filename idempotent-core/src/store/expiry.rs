//! Expiry bookkeeping for `MemoryStore`: which keys are due to expire, cheaply.
//!
//! Records that live a fixed time from their write (a completed record's `keep`, a token's
//! lifetime) go into one first-in-first-out queue per lifetime: a queue's entries then expire in
//! order, so finding the due ones costs nothing but its front. Anything else (a token put back
//! to ISSUED until an absolute time, or more distinct lifetimes than queues) goes into a heap.
//! In-progress records are not queued at all: their holder commits or releases them, and one
//! whose holder vanished is treated as absent when next read and swept out with the others
//! when the store has doubled since the last sweep.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

/// Distinct lifetimes with a queue of their own; more go to the heap.
const QUEUES: usize = 16;

#[derive(Default)]
pub(crate) struct Expiries {
    queues: Vec<(Duration, VecDeque<(Instant, String)>)>,
    heap: BinaryHeap<Reverse<(Instant, String)>>,
}

impl Expiries {
    /// `key` expires at `at`, `lifetime` after now.
    pub(crate) fn after(&mut self, key: &str, lifetime: Duration, at: Instant) {
        if let Some((_, q)) = self.queues.iter_mut().find(|(d, _)| *d == lifetime) {
            q.push_back((at, key.to_owned()));
        } else if self.queues.len() < QUEUES {
            self.queues.push((lifetime, VecDeque::from([(at, key.to_owned())])));
        } else {
            self.at(key, at);
        }
    }

    /// `key` expires at `at`.
    pub(crate) fn at(&mut self, key: &str, at: Instant) {
        self.heap.push(Reverse((at, key.to_owned())));
    }

    /// Takes up to `budget` keys whose queued time has come (their records may have been
    /// replaced since: the caller checks).
    pub(crate) fn due(&mut self, now: Instant, budget: usize, mut take: impl FnMut(String)) {
        let mut left = budget;
        for (_, q) in &mut self.queues {
            while left > 0 && q.front().is_some_and(|(at, _)| *at <= now) {
                if let Some((_, key)) = q.pop_front() {
                    take(key);
                    left -= 1;
                }
            }
        }
        while left > 0 && self.heap.peek().is_some_and(|Reverse((at, _))| *at <= now) {
            if let Some(Reverse((_, key))) = self.heap.pop() {
                take(key);
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
            e.after(&format!("k{i}"), d, now + d);
        }
        e.at("late", now + Duration::from_secs(60));
        let mut out = Vec::new();
        e.due(now + Duration::from_millis(9), 1000, |k| out.push(k));
        assert_eq!(out.len(), 20, "{out:?}");
        e.due(now + Duration::from_millis(19), 5, |k| out.push(k));
        assert_eq!(out.len(), 25, "the budget was not respected");
        e.due(now + Duration::from_millis(19), 1000, |k| out.push(k));
        assert_eq!(out.len(), 40);
        assert!(!out.contains(&"late".to_owned()));
    }
}
