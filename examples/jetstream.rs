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
use idempotency::{AckPlan, Call, Idempotency, PgStore, Settled};
use serde::{Deserialize, Serialize};

/// What a poll's broker commands can fail with (fetch, ack, publish: each has an error type of
/// its own in `async-nats`).
pub type BrokerError = Box<dyn std::error::Error + Send + Sync>;

/// A message's payload as the producer wrote it (JSON). A payload that does not parse becomes an
/// order without a key, which the batch refuses as invalid and the poll dead-letters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    /// The order's own id, the same in every copy a producer published: the idempotency key.
    #[serde(default)]
    pub key: String,
    /// The order's amount: the payload's fingerprint, so that a key re-used with another
    /// amount is refused.
    #[serde(default)]
    pub amount: i64,
}

/// What a body that writes its effect in the batch's transaction can fail with.
#[derive(Debug)]
pub enum ApplyError {
    /// The runtime's answer for the item (the body did not run, or its record was not stored).
    Idempotency(idempotency::Error),
    /// The body's own statement failed.
    Database(idempotency::store::postgres::sqlx::Error),
}

impl From<idempotency::Error> for ApplyError {
    fn from(e: idempotency::Error) -> Self {
        ApplyError::Idempotency(e)
    }
}

impl From<idempotency::store::postgres::sqlx::Error> for ApplyError {
    fn from(e: idempotency::store::postgres::sqlx::Error) -> Self {
        ApplyError::Database(e)
    }
}

/// A durable pull consumer on one subject of one stream.
pub struct Consumer {
    /// The connection the consumer fetches, acks and publishes with.
    pub client: async_nats::Client,
    /// JetStream on that connection.
    pub jetstream: jetstream::Context,
    /// The durable consumer the polls fetch from.
    pub consumer: PullConsumer,
    /// The runtime whose store holds the keys.
    pub idem: Idempotency,
    /// The same store, for the batch's transaction.
    pub store: PgStore,
    /// Where refused messages are published (a subject of the same stream).
    pub dead_subject: String,
    /// The keys' scope.
    pub scope: String,
    /// Messages per poll.
    pub batch: usize,
    /// Each key's lease while its body runs.
    pub lease: Duration,
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

/// What one poll did, by message.
#[derive(Debug, Default)]
pub struct Polled {
    /// Messages taken.
    pub taken: usize,
    /// How many of them JetStream had delivered before.
    pub redelivered: usize,
    /// Keys whose body ran and whose record was committed with its effect.
    pub executed: Vec<String>,
    /// Messages acked (their body ran now, or their key completed before).
    pub acked: usize,
    /// Messages handed back, to be delivered again after `requeue_after`.
    pub requeued: usize,
    /// Messages published to the dead-letter subject and terminated.
    pub dead: usize,
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
            idem: Idempotency::new(store.clone()),
            store,
            dead_subject: source.dead_subject.clone(),
            scope: source.durable.clone(),
            batch,
            lease,
            requeue_after: source.ack_wait,
        })
    }

    /// One poll: fetches a batch (waiting up to 200 ms for a first message), runs the bodies of
    /// the keys it wins with `body` in one transaction with their records, and acks, hands back
    /// or dead-letters each message as the batch's plan says.
    ///
    /// `body` gets the batch's transaction and the item's order, writes the order's effect in the
    /// transaction, and gives the transaction back with its answer.
    pub async fn poll<F, Fut>(&self, mut body: F) -> Result<Polled, BrokerError>
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
        let orders: Vec<Order> =
            messages.iter().map(|m| serde_json::from_slice(&m.payload).unwrap_or_default()).collect();
        let calls =
            orders.iter().map(|o| Call::new(&o.key).scope(self.scope.as_str()).ttl(self.lease).fingerprint(&o.amount));
        let claimed = self.idem.claim::<()>(calls).await;
        let settled: Vec<Settled<(), ApplyError>> =
            self.store.run_batch_in_transaction(claimed, |tx, i, _context| body(tx, orders[i].clone())).await;
        for (order, item) in orders.iter().zip(&settled) {
            if matches!(item, Settled::Executed { stored: true, .. }) {
                polled.executed.push(order.key.clone());
            }
        }
        let plan = AckPlan::of(&settled);
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

    /// Messages of the consumer not delivered yet, and delivered but not acked.
    pub async fn outstanding(&self) -> Result<(u64, usize), BrokerError> {
        let mut consumer = self.consumer.clone();
        let info = consumer.info().await?;
        Ok((info.num_pending, info.num_ack_pending))
    }
}
