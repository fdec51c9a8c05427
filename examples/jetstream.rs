//! A NATS JetStream pull consumer's loop around a batch whose effects commit with its records in
//! one PostgreSQL transaction, shared by the `jetstream_consumer` example and its kill -9 test
//! (`tests/jetstream_consumer.rs`). Feature `jetstream`.
//!
//! Each poll fetches up to `batch` messages: new ones, and the ones JetStream delivers again after
//! the consumer's `ack_wait` because a consumer crashed before its ack, or after the delay this
//! one asked for when it handed them back. Their keys are claimed in one round trip; the bodies
//! of the items won run in one transaction, each in a savepoint of its own, and write their
//! effects in it; the records are written in it before its `COMMIT`
//! ([`PgStore::run_batch_in_transaction`]), so an effect and its record are durable together or
//! not at all, whatever kills the consumer. Then each message is acked, handed back (`NAK` with a
//! delay), or published to the dead-letter subject and terminated (`TERM`), as the batch's plan
//! says.

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::PullConsumer, AckKind};
use futures_util::StreamExt;
use idempotency::store::postgres::PgTransaction;
use idempotency::PgStore;

pub use crate::orders::{ApplyError, Inbox, Order, OrderConsumer, Polled};

/// What a poll's broker commands can fail with (fetch, ack, publish: each has an error type of
/// its own in `async-nats`).
pub type BrokerError = Box<dyn std::error::Error + Send + Sync>;

/// A durable pull consumer on one subject of one stream.
pub struct Consumer {
    /// The connection the consumer fetches, acks and publishes with.
    pub client: async_nats::Client,
    /// JetStream on that connection.
    pub jetstream: jetstream::Context,
    /// The durable consumer the polls fetch from.
    pub consumer: PullConsumer,
    /// Where the batches go (the keys' scope is the durable consumer's name).
    pub inbox: Inbox,
    /// Where refused messages are published (a subject of the same stream).
    pub dead_subject: String,
    /// Messages per poll.
    pub batch: usize,
    /// How long a message handed back waits before JetStream delivers it again.
    pub requeue_after: Duration,
}

/// Where a consumer reads: the stream (created if missing, holding `subject` and `dead_subject`),
/// the durable consumer's name, and how long a delivered message may stay unacked before
/// JetStream delivers it again.
#[derive(Debug, Clone)]
pub struct Source {
    /// The stream's name.
    pub stream: String,
    /// The subject orders are published on.
    pub subject: String,
    /// The subject refused orders are published on.
    pub dead_subject: String,
    /// The durable consumer's name, shared by every process of the consumer.
    pub durable: String,
    /// How long a delivered message may stay unacked (a crashed consumer's messages come back
    /// after it).
    pub ack_wait: Duration,
}

impl Consumer {
    /// Connects the consumer of `source`, creating its stream and its durable consumer where they
    /// do not exist.
    pub async fn open(
        client: async_nats::Client,
        source: &Source,
        store: PgStore,
        batch: usize,
        lease: Duration,
    ) -> Result<Consumer, BrokerError> {
        let js = jetstream::new(client.clone());
        let stream = js
            .get_or_create_stream(jetstream::stream::Config {
                name: source.stream.clone(),
                subjects: vec![source.subject.clone(), source.dead_subject.clone()],
                ..Default::default()
            })
            .await?;
        let consumer = stream
            .get_or_create_consumer(
                &source.durable,
                jetstream::consumer::pull::Config {
                    durable_name: Some(source.durable.clone()),
                    filter_subject: source.subject.clone(),
                    ack_policy: jetstream::consumer::AckPolicy::Explicit,
                    ack_wait: source.ack_wait,
                    ..Default::default()
                },
            )
            .await?;
        Ok(Consumer {
            client,
            jetstream: js,
            consumer,
            inbox: Inbox::new(store, &source.durable, lease),
            dead_subject: source.dead_subject.clone(),
            batch,
            requeue_after: source.ack_wait,
        })
    }

    /// Messages of the consumer not delivered yet, and delivered but not acked.
    pub async fn outstanding(&self) -> Result<(u64, usize), BrokerError> {
        let mut consumer = self.consumer.clone();
        let info = consumer.info().await?;
        Ok((info.num_pending, info.num_ack_pending))
    }
}

impl OrderConsumer for Consumer {
    type Error = BrokerError;

    /// One poll: fetches a batch (waiting up to 200 ms for a first message), runs the bodies of
    /// the keys it wins with `body` in one transaction with their records, and acks, hands back
    /// (`NAK` with a delay) or dead-letters (a copy to the dead-letter subject, then `TERM`) each
    /// message as the batch's plan says.
    async fn poll<F, Fut>(&mut self, body: F) -> Result<Polled, BrokerError>
    where
        F: FnMut(PgTransaction, Order) -> Fut,
        Fut: Future<Output = (PgTransaction, Result<(), ApplyError>)> + Send + 'static,
    {
        let mut fetched =
            self.consumer.fetch().max_messages(self.batch).expires(Duration::from_millis(200)).messages().await?;
        let mut messages = Vec::new();
        while let Some(message) = fetched.next().await {
            messages.push(message?);
        }
        let mut polled = Polled { taken: messages.len(), ..Polled::default() };
        if messages.is_empty() {
            return Ok(polled);
        }
        polled.redelivered = messages.iter().filter(|m| m.info().is_ok_and(|i| i.delivered > 1)).count();
        let orders: Vec<Order> = messages.iter().map(|m| Order::parse(&m.payload)).collect();
        let (settled, plan, executed) = self.inbox.run(&orders, body).await;
        polled.executed = executed;
        for &i in &plan.dead_letter {
            let reason = format!("{:?}", settled[i]);
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Dead-Reason", reason.as_str());
            let sent = self
                .jetstream
                .publish_with_headers(self.dead_subject.clone(), headers, messages[i].payload.clone())
                .await?;
            sent.await?;
            messages[i].ack_with(AckKind::Term).await?;
        }
        for &i in &plan.requeue {
            messages[i].ack_with(AckKind::Nak(Some(self.requeue_after))).await?;
        }
        for &i in &plan.ack {
            messages[i].ack().await?;
        }
        // The acks are messages without a reply: sent before the next fetch.
        self.client.flush().await?;
        polled.acked = plan.ack.len();
        polled.requeued = plan.requeue.len();
        polled.dead = plan.dead_letter.len();
        Ok(polled)
    }

    /// Nothing pending and nothing delivered but unacked.
    async fn drained(&self) -> Result<bool, BrokerError> {
        Ok(self.outstanding().await? == (0, 0))
    }
}
