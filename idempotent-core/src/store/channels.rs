//! Per-key change channels behind the stores' `watch`: a waiter subscribes to its key's
//! channel, a commit or release bumps it, and the channel goes when its last waiter does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

use super::Watcher;

/// Channels by key, each with a piece of state `S` of the store's (whether the Redis store's
/// subscription is confirmed, say).
pub(crate) struct Channels<S = ()> {
    map: Arc<Mutex<HashMap<String, Channel<S>>>>,
}

struct Channel<S> {
    tx: watch::Sender<u64>,
    state: S,
}

impl<S> Clone for Channels<S> {
    fn clone(&self) -> Self {
        Channels { map: self.map.clone() }
    }
}

impl<S> Default for Channels<S> {
    fn default() -> Self {
        Channels { map: Arc::default() }
    }
}

impl<S: Clone + Default + Send + Sync + 'static> Channels<S> {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Channel<S>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A watcher on `key`'s channel (made if new) and the channel's state. When the watcher is
    /// dropped as the channel's last, the channel goes and `last_out(key)` runs.
    pub(crate) fn watch(&self, key: &str, last_out: impl FnOnce(String) + Send + Sync + 'static) -> (Watcher, S) {
        let (rx, state) = {
            let mut map = self.lock();
            let ch =
                map.entry(key.to_owned()).or_insert_with(|| Channel { tx: watch::channel(0).0, state: S::default() });
            (ch.tx.subscribe(), ch.state.clone())
        };
        let guard = LastOut { channels: self.clone(), key: key.to_owned(), last_out: Some(Box::new(last_out)) };
        (Watcher::new(rx).with_guard(guard), state)
    }

    /// Wakes the watchers of `key`.
    pub(crate) fn notify(&self, key: &str) {
        if let Some(ch) = self.lock().get(key) {
            ch.tx.send_modify(|n| *n += 1);
        }
    }

    /// Wakes every watcher (changes may have been missed).
    #[cfg(any(feature = "redis", feature = "postgres"))]
    pub(crate) fn notify_all(&self) {
        self.lock().values().for_each(|ch| ch.tx.send_modify(|n| *n += 1));
    }

    /// Whether `key` has a channel (a watcher).
    #[cfg(any(feature = "redis", test))]
    pub(crate) fn contains(&self, key: &str) -> bool {
        self.lock().contains_key(key)
    }
}

/// Removes a channel when its last watcher is dropped.
struct LastOut<S: Clone + Default + Send + Sync + 'static> {
    channels: Channels<S>,
    key: String,
    last_out: Option<Box<dyn FnOnce(String) + Send + Sync>>,
}

impl<S: Clone + Default + Send + Sync + 'static> Drop for LastOut<S> {
    fn drop(&mut self) {
        // The watcher's receiver is dropped before its guard: no receiver, no watcher.
        let gone = {
            let mut map = self.channels.lock();
            let last = map.get(&self.key).is_some_and(|ch| ch.tx.receiver_count() == 0);
            last && map.remove(&self.key).is_some()
        };
        if let (true, Some(last_out)) = (gone, self.last_out.take()) {
            last_out(std::mem::take(&mut self.key));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn a_channel_lives_as_long_as_its_watchers() {
        let channels: Channels = Channels::default();
        let outs = Arc::new(AtomicUsize::new(0));
        let counted = |outs: Arc<AtomicUsize>| {
            move |_: String| {
                outs.fetch_add(1, Ordering::SeqCst);
            }
        };
        let (mut a, ()) = channels.watch("k", counted(outs.clone()));
        let (b, ()) = channels.watch("k", counted(outs.clone()));
        channels.notify("k");
        tokio::time::timeout(std::time::Duration::from_secs(1), a.changed()).await.expect("not woken");
        drop(b);
        assert!(channels.contains("k"), "the channel went with a watcher left");
        assert_eq!(outs.load(Ordering::SeqCst), 0);
        drop(a);
        assert!(!channels.contains("k"));
        assert_eq!(outs.load(Ordering::SeqCst), 1, "last_out must run once, for the last watcher");
    }
}
