//! The replay cache: an optional, bounded, in-process copy of completed results, so a hot
//! duplicate is answered without a round trip. It never holds a key in progress, and an entry
//! lives no longer than the record it copies: the caller gives each entry an end on this
//! process's monotonic clock, from what the store reported at read time. It follows the
//! store's purges (a record an operator forgot goes from every process's cache), and caches
//! nothing while it cannot.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use crate::telemetry::record;

const SHARDS: usize = 16;

/// A completed result as cached.
#[derive(Clone)]
pub(crate) struct Cached {
    pub(crate) fingerprint: Option<Arc<str>>,
    pub(crate) result: Arc<[u8]>,
    expires_at: Instant,
}

pub(crate) struct ReplayCache {
    shards: Vec<Mutex<Shard>>,
    /// Purges are followed: entries may be cached.
    live: AtomicBool,
    /// Following purges was started.
    started: AtomicBool,
    /// Counts purges (and losses of the purge channel): a reply read before a purge may copy
    /// the purged record, so it is cached only if no purge came while it was in flight.
    generation: AtomicU64,
}

struct Shard {
    map: HashMap<String, Cached>,
    /// Insertion order, for eviction (first in, first out): exactly the map's keys.
    order: VecDeque<String>,
    capacity: usize,
}

impl ReplayCache {
    /// A cache of about `capacity` entries (at least one per shard).
    pub(crate) fn new(capacity: usize) -> Self {
        let per_shard = capacity.div_ceil(SHARDS).max(1);
        let shards = (0..SHARDS)
            .map(|_| Mutex::new(Shard { map: HashMap::new(), order: VecDeque::new(), capacity: per_shard }))
            .collect();
        ReplayCache {
            shards,
            live: AtomicBool::new(false),
            started: AtomicBool::new(false),
            generation: AtomicU64::new(0),
        }
    }

    /// Whether the caller is the first to ask: it then starts following purges.
    pub(crate) fn start_following(&self) -> bool {
        !self.started.swap(true, Ordering::AcqRel)
    }

    /// Purges are followed (or not): while not, nothing is cached.
    pub(crate) fn set_live(&self, live: bool) {
        self.live.store(live, Ordering::Release);
        if !live {
            self.generation.fetch_add(1, Ordering::AcqRel);
            self.clear();
        }
    }

    /// The purge generation: read before a read or a commit is sent, and given to
    /// [`put`](Self::put) with its reply.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Drops `key`'s entry (it was forgotten), and keeps out of the cache every reply in flight
    /// now.
    pub(crate) fn forget(&self, key: &str) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        // Expired in place: entries leave the map only through the queue.
        if let Some(entry) = self.shard(key).map.get_mut(key) {
            entry.expires_at = Instant::now();
        }
    }

    /// Drops every entry.
    pub(crate) fn clear(&self) {
        for shard in &self.shards {
            let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            record::cache_entries(-(shard.map.len() as f64));
            shard.map.clear();
            shard.order.clear();
        }
    }

    fn shard(&self, key: &str) -> std::sync::MutexGuard<'_, Shard> {
        let h = crate::hash::fnv1a(key.as_bytes()) as usize;
        self.shards[h % SHARDS].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The live entry for `key`. An expired one stays until eviction or a new `put` replaces
    /// it: entries leave the map only through the queue, so the two never disagree.
    pub(crate) fn get(&self, key: &str) -> Option<Cached> {
        self.shard(key).map.get(key).filter(|c| c.expires_at > Instant::now()).cloned()
    }

    /// Caches a completed result until `expires_at` (no later than the record's end), read by a
    /// request sent at purge generation `generation`: if a purge came since, the reply may copy
    /// the purged record, and it is not cached.
    pub(crate) fn put(
        &self,
        key: &str,
        fingerprint: Option<&str>,
        result: &[u8],
        expires_at: Instant,
        generation: u64,
    ) {
        if expires_at <= Instant::now() || !self.live.load(Ordering::Acquire) || self.generation() != generation {
            return;
        }
        let entry = Cached { fingerprint: fingerprint.map(Arc::from), result: Arc::from(result), expires_at };
        let mut shard = self.shard(key);
        // A purge between the check above and here: its `forget` found no entry to drop.
        if self.generation() != generation {
            return;
        }
        let mut added = 0.0;
        if shard.map.insert(key.to_owned(), entry).is_none() {
            shard.order.push_back(key.to_owned());
            added += 1.0;
        }
        while shard.map.len() > shard.capacity {
            let Some(oldest) = shard.order.pop_front() else { break };
            shard.map.remove(&oldest);
            added -= 1.0;
        }
        drop(shard);
        if added != 0.0 {
            record::cache_entries(added);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn bounded_and_expiring() {
        let cache = ReplayCache::new(32);
        cache.set_live(true);
        let at = |d: Duration| Instant::now() + d;
        for i in 0..1000 {
            cache.put(&format!("k{i}"), None, b"1", at(Duration::from_secs(60)), cache.generation());
        }
        let live = (0..1000).filter(|i| cache.get(&format!("k{i}")).is_some()).count();
        assert!(live <= 32 + SHARDS, "{live} entries kept");
        assert!(cache.get("k999").is_some(), "the newest entry was evicted");
        cache.put("short", None, b"1", at(Duration::from_millis(1)), cache.generation());
        std::thread::sleep(Duration::from_millis(5));
        assert!(cache.get("short").is_none(), "an entry outlived its record");
        cache.put("never", None, b"1", at(Duration::ZERO), cache.generation());
        assert!(cache.get("never").is_none());
        let before = cache.generation();
        cache.forget("k999");
        assert!(cache.get("k999").is_none(), "a forgotten entry is still answered");
        cache.put("k999", None, b"1", at(Duration::from_secs(60)), before);
        assert!(cache.get("k999").is_none(), "a reply read before a purge was cached after it");
        cache.set_live(false);
        assert!(cache.get("k998").is_none(), "entries outlived the end of purge following");
        cache.put("while-not-following", None, b"1", at(Duration::from_secs(60)), cache.generation());
        assert!(cache.get("while-not-following").is_none());
    }
}
