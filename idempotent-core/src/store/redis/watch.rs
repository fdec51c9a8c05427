//! Change notifications for waiting callers, and purges for replay caches: one pub/sub
//! connection per store, subscribed to the channels (named like the records) that callers in this
//! process wait on, routing each message to the waiters of its channel; and, once a replay cache
//! follows purges, to the store's purge channel, whose messages name the keys forgotten.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::clients::SubscriberClient;
use fred::prelude::*;
use tokio::sync::{broadcast::error::RecvError, oneshot, OnceCell};
use tokio::task::JoinHandle;

use crate::error::{StoreError, StoreErrorKind};
use crate::store::channels::Channels;
use crate::store::{PurgeEvent, PurgeHandler, Watcher};

/// Each channel's state: set once the server confirmed the subscription.
type Subscribed = Arc<OnceCell<()>>;

/// The replay caches following purges, and the channel that carries them.
struct Purges {
    channel: String,
    handlers: Mutex<Vec<PurgeHandler>>,
    /// The purge channel is subscribed (and re-subscribed after each reconnection).
    followed: OnceCell<()>,
    /// Sends the messages that check the subscription (a subscribed connection cannot publish).
    publisher: Client,
    /// The checks under way: the message each waits for, and whom to tell.
    probes: Mutex<Vec<(String, oneshot::Sender<()>)>>,
    /// How long a check waits for its message.
    bound: Duration,
}

impl Purges {
    fn tell(&self, event: PurgeEvent<'_>) {
        for handler in self.handlers.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            handler(event);
        }
    }

    /// Whether `message` answers a check under way (it then goes no further).
    fn answers_probe(&self, message: &str) -> bool {
        let mut probes = self.probes.lock().unwrap_or_else(|p| p.into_inner());
        match probes.iter().position(|(probe, _)| probe == message) {
            Some(i) => {
                let _ = probes.swap_remove(i).1.send(());
                true
            }
            None => false,
        }
    }

    /// Checks that the purge channel's messages reach this process: publishes a message of its
    /// own on it and waits for it to come back. fred 10 sends SUBSCRIBE without waiting for its
    /// answer, so a refused subscription (a user without `+subscribe` or the channel) looks like
    /// a good one, and a replay cache would replay results that other processes forgot. For the
    /// same reason a message published right after SUBSCRIBE may reach the server before it and
    /// be lost: the message is published again, more slowly each time, until one comes back or
    /// the bound is over.
    async fn check_delivery(&self) -> Result<(), StoreError> {
        let probe = format!("{}:probe:{}", self.channel, crate::ids::owner_id().as_str());
        let (tx, mut rx) = oneshot::channel();
        self.probes.lock().unwrap_or_else(|p| p.into_inner()).push((probe.clone(), tx));
        let deadline = tokio::time::Instant::now() + self.bound;
        let mut pause = Duration::from_millis(10);
        let delivered = loop {
            let published: Result<Value, Error> = self.publisher.publish(self.channel.as_str(), probe.as_str()).await;
            if let Err(e) = published {
                self.probes.lock().unwrap_or_else(|p| p.into_inner()).retain(|(p, _)| *p != probe);
                return Err(super::store_error("publish", e));
            }
            let until = deadline.min(tokio::time::Instant::now() + pause);
            match tokio::time::timeout_at(until, &mut rx).await {
                Ok(answer) => break answer.is_ok(),
                Err(_) if tokio::time::Instant::now() >= deadline => break false,
                Err(_) => pause = (pause * 2).min(Duration::from_millis(200)),
            }
        };
        if delivered {
            return Ok(());
        }
        self.probes.lock().unwrap_or_else(|p| p.into_inner()).retain(|(p, _)| *p != probe);
        Err(StoreError::new(
            StoreErrorKind::Config,
            format!(
                "subscribe: a message published on {} did not come back within {:?}: the server refused \
                 the subscription, or delivers nothing on it (a user needs +subscribe and the channel: \
                 docs/security.md lists the permissions the store needs)",
                self.channel, self.bound
            ),
        ))
    }
}

pub(crate) struct Subscriptions {
    client: SubscriberClient,
    channels: Channels<Subscribed>,
    purges: Arc<Purges>,
    tasks: Vec<JoinHandle<()>>,
}

impl Subscriptions {
    /// Connects the subscriber and starts routing its messages; `purge_channel` carries purges,
    /// `publisher` checks that they arrive, waiting at most `bound`.
    pub(crate) async fn start(
        client: SubscriberClient,
        purge_channel: String,
        publisher: Client,
        bound: Duration,
    ) -> Result<Self, Error> {
        let mut messages = client.message_rx();
        let mut errors = client.error_rx();
        let mut reconnects = client.reconnect_rx();
        client.init().await?;
        let channels: Channels<Subscribed> = Channels::default();
        let purges = Arc::new(Purges {
            channel: purge_channel,
            handlers: Mutex::default(),
            followed: OnceCell::new(),
            publisher,
            probes: Mutex::default(),
            bound,
        });
        let (routed, purged) = (channels.clone(), purges.clone());
        let router = tokio::spawn(async move {
            loop {
                match messages.recv().await {
                    Ok(message) if *message.channel == *purged.channel => {
                        if let Some(key) = message.value.as_str() {
                            if !purged.answers_probe(&key) {
                                purged.tell(PurgeEvent::Forgotten(&key));
                            }
                        }
                    }
                    Ok(message) => routed.notify(&message.channel),
                    // Messages were missed: wake every waiter (each re-reads its key), and drop
                    // every cached copy.
                    Err(RecvError::Lagged(_)) => {
                        routed.notify_all();
                        purged.tell(PurgeEvent::Missed);
                        purged.tell(PurgeEvent::Following);
                    }
                    Err(RecvError::Closed) => break,
                }
            }
        });
        // Re-subscribes every channel after a reconnection.
        let resubscriber = client.manage_subscriptions();
        let resubscribe = tokio::spawn(async move {
            let _ = resubscriber.await;
        });
        // While the connection is down purges are missed: caches drop everything and cache
        // nothing until the purge channel is subscribed again.
        let (purged, subscriber) = (purges.clone(), client.clone());
        let follower = tokio::spawn(async move {
            loop {
                tokio::select! {
                    event = errors.recv() => if matches!(event, Err(RecvError::Closed)) { break },
                    event = reconnects.recv() => if matches!(event, Err(RecvError::Closed)) { break },
                }
                // An error or a reconnection: purges may have been missed. Follow again once the
                // purge channel is subscribed again (the subscribe waits for the connection).
                purged.tell(PurgeEvent::Missed);
                if purged.followed.initialized()
                    && subscriber.subscribe(purged.channel.as_str()).await.is_ok()
                    && purged.check_delivery().await.is_ok()
                {
                    purged.tell(PurgeEvent::Following);
                }
            }
        });
        Ok(Subscriptions { client, channels, purges, tasks: vec![router, resubscribe, follower] })
    }

    /// Calls `handler` with purges from now on (subscribing the purge channel the first time,
    /// and checking that its messages arrive).
    pub(crate) async fn follow_purges(&self, handler: PurgeHandler) -> Result<(), StoreError> {
        self.purges
            .followed
            .get_or_try_init(|| async {
                self.client
                    .subscribe(self.purges.channel.as_str())
                    .await
                    .map_err(|e| super::store_error("subscribe", e))?;
                self.purges.check_delivery().await
            })
            .await?;
        handler(PurgeEvent::Following);
        self.purges.handlers.lock().unwrap_or_else(|p| p.into_inner()).push(handler);
        Ok(())
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
