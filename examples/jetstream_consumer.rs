//! A NATS JetStream consumer whose effects happen exactly once, however often a message is
//! delivered: a producer that published an order twice, a consumer that crashed before its ack
//! (JetStream delivers its messages again after the consumer's `ack_wait`). Each poll claims its
//! whole batch of keys in one round trip, runs the bodies of the keys it won in one PostgreSQL
//! transaction, each writing its effect there, writes their records in the same transaction
//! before its `COMMIT`, and acks, hands back or dead-letters each message as the batch's plan
//! says.
//!
//! ```text
//! cargo run --example jetstream_consumer --features jetstream -- \
//!     --nats nats://127.0.0.1:4222 --postgres postgres://postgres@127.0.0.1:5432/postgres
//! ```
//!
//! It uses a stream, a schema and a table of its own (named after its process id) and deletes them
//! at the end. The loop itself is `idempotency_examples::jetstream` (examples/jetstream.rs), which
//! the kill -9 test (examples/tests/jetstream_consumer.rs) runs too.

use std::time::Duration;

use idempotency::PgStore;
use idempotency_examples::jetstream::{Consumer, Source};
use idempotency_examples::orders::{self, Balances};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let (broker, postgres) = orders::two_urls(
        "--nats",
        "jetstream_consumer --nats nats://HOST:PORT --postgres postgres://USER@HOST:PORT/DB",
    );
    let run = std::process::id();
    let balances = Balances::create(&postgres, &format!("demo_nats_{run}")).await?;
    let store = PgStore::builder(&postgres).schema(&balances.schema).migrate().connect().await?;
    let source = Source {
        stream: format!("DEMO_ORDERS_{run}"),
        subject: format!("demo.{run}.orders"),
        dead_subject: format!("demo.{run}.dead"),
        durable: "billing".into(),
        ack_wait: Duration::from_secs(2),
    };
    let client = async_nats::connect(&broker).await?;
    let mut consumer = Consumer::open(client, &source, store, 100, Duration::from_secs(30)).await?;

    let payloads = orders::demo_payloads();
    for payload in &payloads {
        consumer.jetstream.publish(source.subject.clone(), payload.clone().into()).await?.await?;
    }
    println!("published {} messages", payloads.len());

    let polls = orders::drain(&mut consumer, balances.apply(), orders::print_poll).await?;
    println!("applied once each: {:?}", balances.totals().await?);
    println!("dead-lettered: {} (o3 re-used with another amount; a message that is not an order)", polls.dead);
    consumer.jetstream.delete_stream(&source.stream).await?;
    balances.remove().await?;
    Ok(())
}
