//! Change notifications for waiting callers: one pub/sub connection per store, subscribed to the
//! channels (named like the records) that callers in this process wait on, routing each message
//! to the waiters of its channel.

use std::sync::Arc;

use fred::clients::SubscriberClient;
use fred::prelude::*;
use tokio::sync::{broadcast::error::RecvError, OnceCell};
use tokio::task::JoinHandle;

use crate::error::StoreError;
use crate::store::channels::Channels;
use crate::store::Watcher;

/// Each channel's state: set once the server confirmed the subscription.
type Subscribed = Arc<OnceCell<()>>;

pub(crate) struct Subscriptions {
    client: SubscriberClient,
    channels: Channels<Subscribed>,
    tasks: Vec<JoinHandle<()>>,
}

impl Subscriptions {
    /// Connects the subscriber and starts routing its messages.
    pub(crate) async fn start(client: SubscriberClient) -> Result<Self, Error> {
        let mut messages = client.message_rx();
        client.init().await?;
        let channels: Channels<Subscribed> = Channels::default();
        let routed = channels.clone();
        let router = tokio::spawn(async move {
            loop {
                match messages.recv().await {
                    Ok(message) => routed.notify(&message.channel),
                    // Messages were missed: wake every waiter; each re-reads its key.
                    Err(RecvError::Lagged(_)) => routed.notify_all(),
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

    /// A watcher on `channel`, subscribed before this returns; the last watcher of a channel
    /// unsubscribes it.
    pub(crate) async fn watch(&self, channel: &str) -> Result<Watcher, StoreError> {
        let (client, channels) = (self.client.clone(), self.channels.clone());
        let (watcher, subscribed) = self.channels.watch(channel, move |channel| {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    // A new watcher may have come for the channel meanwhile; it keeps it.
                    if !channels.contains(&channel) {
                        let _ = client.unsubscribe(channel).await;
                    }
                });
            }
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
