//! Change notifications for waiting callers: one pub/sub connection per store, subscribed to the
//! channels (named like the records) that callers in this process wait on, routing each message
//! to the waiters of its channel.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use fred::clients::SubscriberClient;
use fred::prelude::*;
use tokio::sync::{broadcast::error::RecvError, watch, OnceCell};
use tokio::task::JoinHandle;

use crate::error::StoreError;
use crate::store::Watcher;

type Channels = Arc<Mutex<HashMap<String, Channel>>>;

struct Channel {
    tx: watch::Sender<u64>,
    /// Set once the server confirmed the subscription.
    subscribed: Arc<OnceCell<()>>,
}

pub(crate) struct Subscriptions {
    client: SubscriberClient,
    channels: Channels,
    tasks: Vec<JoinHandle<()>>,
}

fn lock(channels: &Channels) -> std::sync::MutexGuard<'_, HashMap<String, Channel>> {
    channels.lock().unwrap_or_else(|p| p.into_inner())
}

impl Subscriptions {
    /// Connects the subscriber and starts routing its messages.
    pub(crate) async fn start(client: SubscriberClient) -> Result<Self, Error> {
        let mut messages = client.message_rx();
        client.init().await?;
        let channels: Channels = Arc::default();
        let routed = channels.clone();
        let router = tokio::spawn(async move {
            loop {
                match messages.recv().await {
                    Ok(message) => {
                        if let Some(ch) = lock(&routed).get(&*message.channel) {
                            ch.tx.send_modify(|n| *n += 1);
                        }
                    }
                    // Messages were missed: wake every waiter; each re-reads its key.
                    Err(RecvError::Lagged(_)) => lock(&routed).values().for_each(|ch| ch.tx.send_modify(|n| *n += 1)),
                    Err(RecvError::Closed) => break,
                }
            }
        });
        // Re-subscribes every channel after a reconnection.
        let resubscriber = client.manage_subscriptions();
        let resubscribe = tokio::spawn(async move {
            let _ = resubscriber.await;
        });
        Ok(Subscriptions { client, channels, tasks: vec![router, resubscribe] })
    }

    /// A watcher on `channel`, subscribed before this returns.
    pub(crate) async fn watch(&self, channel: &str) -> Result<Watcher, StoreError> {
        let (rx, subscribed) = {
            let mut channels = lock(&self.channels);
            let ch = channels
                .entry(channel.to_owned())
                .or_insert_with(|| Channel { tx: watch::channel(0).0, subscribed: Arc::default() });
            (ch.tx.subscribe(), ch.subscribed.clone())
        };
        // Made before subscribing, so an error below still drops the entry when unused.
        let watcher = Watcher::new(rx).with_guard(Unsubscribe {
            client: self.client.clone(),
            channels: self.channels.clone(),
            channel: channel.to_owned(),
        });
        subscribed
            .get_or_try_init(|| async {
                self.client.subscribe(channel).await.map_err(|e| super::store_error("subscribe", e))
            })
            .await?;
        Ok(watcher)
    }
}

impl Subscriptions {
    pub(crate) async fn quit(&self) {
        let _ = self.client.quit().await;
    }
}

impl Drop for Subscriptions {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        let client = self.client.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = client.quit().await;
            });
        }
    }
}

/// Unsubscribes a channel when its last watcher is dropped.
struct Unsubscribe {
    client: SubscriberClient,
    channels: Channels,
    channel: String,
}

impl Drop for Unsubscribe {
    fn drop(&mut self) {
        let mut channels = lock(&self.channels);
        // The watcher's receiver is dropped before this guard: no receiver, no watcher.
        if channels.get(&self.channel).is_some_and(|ch| ch.tx.receiver_count() == 0) {
            channels.remove(&self.channel);
            let (client, channels) = (self.client.clone(), self.channels.clone());
            let channel = std::mem::take(&mut self.channel);
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    // A new watcher may have come for the channel meanwhile; it keeps it.
                    if !lock(&channels).contains_key(&channel) {
                        let _ = client.unsubscribe(channel).await;
                    }
                });
            }
        }
    }
}
