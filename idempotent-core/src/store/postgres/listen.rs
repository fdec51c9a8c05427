//! Change notifications for waiting callers and purges for replay caches: one `LISTEN` connection
//! per store, on two channels (the store's watch channel, whose payload is the full key of a
//! watched record that was committed or released, and its purge channel, whose payload is the full
//! key of a forgotten record), routing each notification to the waiters of its key or to the
//! replay caches. When the connection drops, every waiter is woken (each reads its key again) and
//! the caches are told purges may have been missed; the connection is made again, with backoff,
//! and both channels listened to again.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool};
use tokio::sync::watch;

use crate::error::{StoreError, StoreErrorKind};
use crate::store::channels::Channels;
use crate::store::{PurgeEvent, PurgeHandler, Watcher};

pub(crate) struct Listener {
    shared: Arc<Shared>,
    /// Whether both channels are listened to now.
    listening: watch::Receiver<bool>,
    task: tokio::task::JoinHandle<()>,
}

struct Shared {
    channels: Channels,
    purges: Mutex<Purges>,
    listening: watch::Sender<bool>,
}

#[derive(Default)]
struct Purges {
    handlers: Vec<PurgeHandler>,
    following: bool,
}

impl Shared {
    /// The connection is listening again (`true`) or was lost (`false`): either way changes may
    /// have been missed, so every waiter reads its key again, and the caches hear of it.
    fn set_listening(&self, listening: bool) {
        {
            let mut purges = self.purges.lock().unwrap_or_else(|p| p.into_inner());
            purges.following = listening;
            let event = if listening { PurgeEvent::Following } else { PurgeEvent::Missed };
            purges.handlers.iter().for_each(|h| h(event));
        }
        self.listening.send_replace(listening);
        self.channels.notify_all();
    }

    fn purged(&self, key: &str) {
        let purges = self.purges.lock().unwrap_or_else(|p| p.into_inner());
        purges.handlers.iter().for_each(|h| h(PurgeEvent::Forgotten(key)));
    }
}

impl Listener {
    /// Starts listening on `watch_channel` and `purge_channel` from a task of its own, each
    /// connection opened within `connect_timeout` (whoever waits for it waits less: `ready`).
    pub(crate) fn start(
        pool: PgPool,
        watch_channel: String,
        purge_channel: String,
        connect_timeout: Duration,
    ) -> Listener {
        let (tx, listening) = watch::channel(false);
        let shared = Arc::new(Shared { channels: Channels::default(), purges: Mutex::default(), listening: tx });
        let task = tokio::spawn(run(pool, watch_channel, purge_channel, connect_timeout, shared.clone()));
        Listener { shared, listening, task }
    }

    /// Waits (at most `bound`) until the channels are listened to.
    pub(crate) async fn ready(&self, bound: Duration) -> Result<(), StoreError> {
        let mut listening = self.listening.clone();
        let listening = tokio::time::timeout(bound, async move { listening.wait_for(|l| *l).await.is_ok() }).await;
        match listening {
            Ok(true) => Ok(()),
            _ => Err(StoreError::new(
                StoreErrorKind::Unavailable,
                format!("listen: not listening for notifications within {bound:?} (is the database up?)"),
            )),
        }
    }

    /// A watcher on `key` (as stored): woken by the next notification naming it (or by a
    /// reconnection).
    pub(crate) fn watch(&self, key: &str) -> Watcher {
        self.shared.channels.watch(key, |_| {}).0
    }

    /// Calls `handler` with purges from now on; `Following` at once while the channel is listened
    /// to.
    pub(crate) fn follow_purges(&self, handler: PurgeHandler) {
        let mut purges = self.shared.purges.lock().unwrap_or_else(|p| p.into_inner());
        if purges.following {
            handler(PurgeEvent::Following);
        }
        purges.handlers.push(handler);
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn run(pool: PgPool, watch_channel: String, purge_channel: String, timeout: Duration, shared: Arc<Shared>) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let connect = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            // A lost connection is ours to make again (below), with the waiters told.
            listener.eager_reconnect(false);
            listener.listen_all([watch_channel.as_str(), purge_channel.as_str()]).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let mut listener = match tokio::time::timeout(timeout, connect).await {
            Ok(Ok(listener)) => listener,
            failed => {
                let why = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("no answer within {timeout:?}"),
                };
                tracing::debug!(error = %why, "idempotency listener: cannot listen yet; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        backoff = Duration::from_millis(50);
        shared.set_listening(true);
        loop {
            match listener.try_recv().await {
                Ok(Some(n)) if n.channel() == watch_channel => shared.channels.notify(n.payload()),
                Ok(Some(n)) if n.channel() == purge_channel => shared.purged(&super::unstored(n.payload())),
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        tracing::debug!("idempotency listener: connection lost; listening again");
        shared.set_listening(false);
    }
}
