//! A RabbitMQ consumer whose effects happen exactly once, however often a message is delivered:
//! a producer that published an order twice, a consumer that crashed before its ack (RabbitMQ
//! delivers its unacked messages again when its connection dies). Each poll claims its
//! whole batch of keys in one round trip, runs the bodies of the keys it won in one PostgreSQL
//! transaction, each writing its effect there, writes their records in the same transaction
//! before its `COMMIT`, and acks, hands back or dead-letters each message as the batch's plan
//! says.
//!
//! ```text
//! cargo run --example rabbitmq_consumer --features rabbitmq -- \
//!     --amqp amqp://guest:guest@127.0.0.1:5672/%2f --postgres postgres://postgres@127.0.0.1:5432/postgres
//! ```
//!
//! It uses queues, a schema and a table of its own (named after its process id) and deletes them at
//! the end. The loop itself is `idempotency_examples::rabbitmq` (examples/rabbitmq.rs), which the
//! kill -9 test (examples/tests/rabbitmq_consumer.rs) runs too.

use std::time::Duration;

use idempotency::PgStore;
use idempotency_examples::orders::{self, Balances};
use idempotency_examples::rabbitmq::{self, Consumer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let (broker, postgres) = orders::two_urls(
        "--amqp",
        "rabbitmq_consumer --amqp amqp://USER:PASSWORD@HOST:PORT/VHOST --postgres postgres://USER@HOST:PORT/DB",
    );
    let run = std::process::id();
    let balances = Balances::create(&postgres, &format!("demo_amqp_{run}")).await?;
    let store = PgStore::builder(&postgres).schema(&balances.schema).migrate().connect().await?;
    let queue = format!("demo.orders.{run}");
    let mut consumer =
        Consumer::open(&broker, &queue, store, 100, Duration::from_secs(30), Duration::from_millis(200)).await?;
    let channel = consumer.channel.clone();

    let payloads = orders::demo_payloads();
    for payload in &payloads {
        rabbitmq::publish(&channel, &queue, payload).await?;
    }
    println!("published {} messages", payloads.len());

    let polls = orders::drain(&mut consumer, balances.apply(), orders::print_poll).await?;
    println!("applied once each: {:?}", balances.totals().await?);
    println!("dead-lettered: {} (o3 re-used with another amount; a message that is not an order)", polls.dead);
    for name in [queue.clone(), consumer.dead_queue.clone()] {
        channel.queue_delete(name.as_str().into(), Default::default()).await?;
    }
    balances.remove().await?;
    Ok(())
}
