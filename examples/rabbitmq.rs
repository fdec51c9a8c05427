//! A RabbitMQ consumer's loop around a batch whose effects commit with its records in one
//! PostgreSQL transaction, shared by the `rabbitmq_consumer` example and its kill -9 test
//! (`tests/rabbitmq_consumer.rs`). Feature `rabbitmq`.
//!
//! The consumer's channel has a prefetch of one batch: each poll waits up to 200 ms for a first
//! delivery and takes what else has arrived, up to the batch. RabbitMQ delivers again (marked
//! `redelivered`) what a consumer whose connection died had not acked. The batch's keys are
//! claimed in one round trip; the bodies of the items won run in one transaction, each in a
//! savepoint of its own, and write their effects in it; the records are written in it before its
//! `COMMIT` ([`PgStore::run_batch_in_transaction`]). Then each delivery is acked, handed back
//! (`basic.nack` with requeue, after `requeue_after`: RabbitMQ delivers a requeued message again
//! at once, and a key held by a crashed consumer stays held until its lease ends), or published
//! to the dead-letter queue and acked, as the batch's plan says.

use std::future::Future;
use std::time::Duration;

use futures_util::StreamExt;
use idempotency::store::postgres::PgTransaction;
use idempotency::PgStore;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

pub use crate::orders::{ApplyError, Inbox, Order, OrderConsumer, Polled};

/// What a poll's broker commands can fail with.
pub type BrokerError = lapin::Error;

/// A consumer of one queue.
pub struct Consumer {
    /// The connection's channel the consumer takes, acks and publishes on.
    pub channel: Channel,
    deliveries: lapin::Consumer,
    /// Where the batches go (the keys' scope is the queue's name).
    pub inbox: Inbox,
    /// The queue the orders are published to.
    pub queue: String,
    /// Where refused orders are published (`<queue>.dead`).
    pub dead_queue: String,
    /// Deliveries per poll (the channel's prefetch).
    pub batch: u16,
    /// How long a poll waits before it hands deliveries back.
    pub requeue_after: Duration,
    _connection: Connection,
}

/// The connection's settings: lapin on the caller's tokio runtime.
fn properties() -> ConnectionProperties {
    ConnectionProperties::default()
}

/// Declares `queue` (durable) and its dead-letter queue on `channel`.
pub async fn declare(channel: &Channel, queue: &str) -> Result<(), BrokerError> {
    for name in [queue.to_owned(), format!("{queue}.dead")] {
        let durable = QueueDeclareOptions { durable: true, ..QueueDeclareOptions::default() };
        channel.queue_declare(name.as_str().into(), durable, FieldTable::default()).await?;
    }
    Ok(())
}

/// Publishes `payload` to `queue` through the default exchange and waits for the broker's
/// confirmation (the channel in confirm mode) or for the message to be written.
pub async fn publish(channel: &Channel, queue: &str, payload: &[u8]) -> Result<(), BrokerError> {
    let options = BasicPublishOptions::default();
    channel.basic_publish("".into(), queue.into(), options, payload, BasicProperties::default()).await?.await?;
    Ok(())
}

impl Consumer {
    /// Connects to `url` (`amqp://USER:PASSWORD@HOST:PORT/VHOST`), declares `queue` and its
    /// dead-letter queue, and starts consuming with a prefetch of `batch`.
    pub async fn open(
        url: &str,
        queue: &str,
        store: PgStore,
        batch: u16,
        lease: Duration,
        requeue_after: Duration,
    ) -> Result<Consumer, BrokerError> {
        let connection = Connection::connect(url, properties()).await?;
        let channel = connection.create_channel().await?;
        declare(&channel, queue).await?;
        channel.basic_qos(batch, BasicQosOptions::default()).await?;
        let deliveries = channel
            .basic_consume(queue.into(), "".into(), BasicConsumeOptions::default(), FieldTable::default())
            .await?;
        Ok(Consumer {
            channel,
            deliveries,
            inbox: Inbox::new(store, queue, lease),
            queue: queue.to_owned(),
            dead_queue: format!("{queue}.dead"),
            batch,
            requeue_after,
            _connection: connection,
        })
    }

    /// Up to a batch of deliveries: waits up to 200 ms for a first one, then takes those that
    /// have arrived (the prefetch has them on their way), a few milliseconds apart at most.
    async fn take(&mut self) -> Result<Vec<Delivery>, BrokerError> {
        let mut taken = Vec::new();
        let mut wait = Duration::from_millis(200);
        while taken.len() < usize::from(self.batch) {
            match tokio::time::timeout(wait, self.deliveries.next()).await {
                Ok(Some(delivery)) => taken.push(delivery?),
                Ok(None) | Err(_) => break,
            }
            wait = Duration::from_millis(5);
        }
        Ok(taken)
    }

    /// Messages ready in the queue (not delivered to a consumer now).
    pub async fn ready(&self) -> Result<u32, BrokerError> {
        let passive = QueueDeclareOptions { passive: true, ..QueueDeclareOptions::default() };
        let queue = self.channel.queue_declare(self.queue.as_str().into(), passive, FieldTable::default()).await?;
        Ok(queue.message_count())
    }

    /// Messages in the dead-letter queue.
    pub async fn dead_letters(&self) -> Result<u32, BrokerError> {
        let passive = QueueDeclareOptions { passive: true, ..QueueDeclareOptions::default() };
        let queue = self.channel.queue_declare(self.dead_queue.as_str().into(), passive, FieldTable::default()).await?;
        Ok(queue.message_count())
    }
}

impl OrderConsumer for Consumer {
    type Error = BrokerError;

    /// One poll: takes a batch, runs the bodies of the keys it wins with `body` in one
    /// transaction with their records, and acks, hands back (`basic.nack` with requeue, after
    /// `requeue_after`) or dead-letters (a copy to the dead-letter queue, then `basic.ack`) each
    /// delivery as the batch's plan says.
    async fn poll<F, Fut>(&mut self, body: F) -> Result<Polled, BrokerError>
    where
        F: FnMut(PgTransaction, Order) -> Fut,
        Fut: Future<Output = (PgTransaction, Result<(), ApplyError>)> + Send + 'static,
    {
        let deliveries = self.take().await?;
        let mut polled = Polled { taken: deliveries.len(), ..Polled::default() };
        if deliveries.is_empty() {
            return Ok(polled);
        }
        polled.redelivered = deliveries.iter().filter(|d| d.redelivered).count();
        let orders: Vec<Order> = deliveries.iter().map(|d| Order::parse(&d.data)).collect();
        let (settled, plan, executed) = self.inbox.run(&orders, body).await;
        polled.executed = executed;
        for &i in &plan.dead_letter {
            let mut headers = FieldTable::default();
            headers.insert("dead-reason".into(), AMQPValue::LongString(format!("{:?}", settled[i]).into()));
            let properties = BasicProperties::default().with_headers(headers);
            let options = BasicPublishOptions::default();
            let dead = self.dead_queue.as_str();
            self.channel.basic_publish("".into(), dead.into(), options, &deliveries[i].data, properties).await?.await?;
            deliveries[i].ack(BasicAckOptions::default()).await?;
        }
        for &i in &plan.ack {
            deliveries[i].ack(BasicAckOptions::default()).await?;
        }
        if !plan.requeue.is_empty() {
            tokio::time::sleep(self.requeue_after).await;
        }
        for &i in &plan.requeue {
            deliveries[i].nack(BasicNackOptions { requeue: true, multiple: false }).await?;
        }
        polled.acked = plan.ack.len();
        polled.requeued = plan.requeue.len();
        polled.dead = plan.dead_letter.len();
        Ok(polled)
    }

    /// Nothing ready in the queue (this consumer settles every delivery it takes in its poll).
    async fn drained(&self) -> Result<bool, BrokerError> {
        Ok(self.ready().await? == 0)
    }
}
