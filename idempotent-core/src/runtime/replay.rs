//! The replay cache's side of a call: filling it with what a read or a commit brought back
//! (unless a purge came since it was sent), and following the store's purges.

use std::sync::Arc;

use tokio::time::Instant;

use crate::store::{PurgeEvent, PurgeHandler};

use super::Inner;

impl Inner {
    /// Caches a completed result (when the cache is on and follows purges).
    /// `generation` is the replay cache's purge generation when the request that read or wrote
    /// the result was sent ([`Inner::cache_generation`]): a purge since keeps it out.
    pub(super) fn cache_put(
        &self,
        key: &str,
        fingerprint: Option<&str>,
        result: &[u8],
        until: Instant,
        generation: u64,
    ) {
        if let Some(cache) = &self.cache {
            self.follow_purges();
            cache.put(key, fingerprint, result, until, generation);
        }
    }

    /// The replay cache's purge generation (0 without a cache), read before a request whose
    /// reply may be cached is sent.
    pub(super) fn cache_generation(&self) -> u64 {
        self.cache.as_ref().map_or(0, |c| c.generation())
    }

    /// Starts following the store's purges for the replay cache, once, from a task of the
    /// current tokio runtime (without one, a later call starts it). Until it follows them the
    /// cache caches nothing.
    pub(super) fn follow_purges(&self) {
        let Some(cache) = &self.cache else { return };
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        if !cache.start_following() {
            return;
        }
        let (store, followed) = (self.store.clone(), Arc::downgrade(cache));
        let handler: PurgeHandler = Arc::new(move |event| {
            let Some(cache) = followed.upgrade() else { return };
            match event {
                PurgeEvent::Forgotten(key) => cache.forget(key),
                PurgeEvent::Missed => cache.set_live(false),
                PurgeEvent::Following => cache.set_live(true),
            }
        });
        rt.spawn(async move {
            match store.follow_purges(handler).await {
                Ok(true) => {}
                Ok(false) => tracing::debug!("the store cannot tell purges: the replay cache stays off"),
                Err(e) => tracing::warn!(error = %e, "cannot follow the store's purges: the replay cache stays off"),
            }
        });
    }
}
