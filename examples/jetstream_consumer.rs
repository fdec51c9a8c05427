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

use idempotency::store::postgres::{sqlx, PgTransaction};
use idempotency::PgStore;
use idempotency_examples::jetstream::{ApplyError, Consumer, Order, Source};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut args = std::env::args().skip(1);
    let (mut nats, mut postgres) = (None, None);
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--nats" => nats = args.next(),
            "--postgres" => postgres = args.next(),
            _ => nats = None,
        }
    }
    let (Some(nats), Some(postgres)) = (nats, postgres) else {
        eprintln!("usage: jetstream_consumer --nats nats://HOST:PORT --postgres postgres://USER@HOST:PORT/DB");
        std::process::exit(2)
    };
    let run = std::process::id();
    let schema = format!("demo_jetstream_{run}");
    let pool = sqlx::PgPool::connect(&postgres).await?;
    sqlx::raw_sql(&format!(
        "CREATE SCHEMA {schema}; CREATE TABLE {schema}.balances (account text PRIMARY KEY, total bigint NOT NULL)"
    ))
    .execute(&pool)
    .await?;
    let store = PgStore::builder(&postgres).schema(&schema).migrate().connect().await?;

    let client = async_nats::connect(&nats).await?;
    let source = Source {
        stream: format!("DEMO_ORDERS_{run}"),
        subject: format!("demo.{run}.orders"),
        dead_subject: format!("demo.{run}.dead"),
        durable: "billing".into(),
        ack_wait: Duration::from_secs(2),
    };
    let consumer = Consumer::open(client.clone(), &source, store, 100, Duration::from_secs(30)).await?;

    // The producer: six orders, two of them published twice (a retried publish), one re-used
    // with another amount, and one that is not an order at all.
    let published = [("o1", 10), ("o2", 20), ("o3", 30), ("o2", 20), ("o4", 40), ("o5", 50), ("o6", 60), ("o5", 50)];
    for (key, amount) in published {
        let order = Order { key: key.into(), amount };
        consumer.jetstream.publish(source.subject.clone(), serde_json::to_vec(&order)?.into()).await?.await?;
    }
    let reused = Order { key: "o3".into(), amount: 31 };
    consumer.jetstream.publish(source.subject.clone(), serde_json::to_vec(&reused)?.into()).await?.await?;
    consumer.jetstream.publish(source.subject.clone(), "not an order".into()).await?.await?;
    println!("published {} messages on {}", published.len() + 2, source.subject);

    // The effect: each order's amount added to its account, in the batch's transaction.
    let sql = format!(
        "INSERT INTO {schema}.balances (account, total) VALUES ($1, $2) \
         ON CONFLICT (account) DO UPDATE SET total = balances.total + EXCLUDED.total"
    );
    let apply = |mut tx: PgTransaction, order: Order| {
        let sql = sql.clone();
        async move {
            let done = sqlx::query(&sql).bind(&order.key).bind(order.amount).execute(&mut *tx).await;
            (tx, done.map(|_| ()).map_err(ApplyError::from))
        }
    };
    let mut dead = 0;
    loop {
        let polled = consumer.poll(apply).await?;
        dead += polled.dead;
        if polled.taken == 0 && consumer.outstanding().await? == (0, 0) {
            break;
        }
        if polled.taken > 0 {
            println!(
                "poll: {} messages, ran {:?}, {} acked, {} handed back, {} dead-lettered",
                polled.taken, polled.executed, polled.acked, polled.requeued, polled.dead
            );
        }
    }
    let applied: Vec<(String, i64)> =
        sqlx::query_as(&format!("SELECT account, total FROM {schema}.balances ORDER BY account"))
            .fetch_all(&pool)
            .await?;
    println!("applied once each: {applied:?}");
    println!("dead-lettered: {dead} (o3 re-used with another amount; a message that is not an order)");

    consumer.jetstream.delete_stream(&source.stream).await?;
    sqlx::raw_sql(&format!("DROP SCHEMA {schema} CASCADE")).execute(&pool).await?;
    Ok(())
}
