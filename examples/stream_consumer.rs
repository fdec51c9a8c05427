//! A Redis Streams consumer that applies each message once however often it is delivered: a
//! producer that published a message twice, a consumer that crashed before its ack (its entries
//! are taken again by another with `XAUTOCLAIM`). Each poll claims its whole batch of keys in one
//! round trip (`Idempotency::claim`), runs the bodies of the keys it won, commits them in one more,
//! and acks, hands back or dead-letters each entry as the batch's plan says.
//!
//! ```text
//! cargo run --example stream_consumer -- --redis redis://127.0.0.1:6379
//! ```
//!
//! It uses a stream and a group of its own (named after its process id) and deletes them at the
//! end. The loop itself is `idempotency_examples::streams` (examples/streams.rs), which the kill -9
//! test (examples/tests/stream_consumer.rs) runs too.

use std::time::Duration;

use fred::prelude::*;
use idempotency::{Idempotency, RedisStore};
use idempotency_examples::streams::{Consumer, Delivery};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = match (args.next().as_deref(), args.next()) {
        (Some("--redis"), Some(url)) => url,
        _ => {
            eprintln!("usage: stream_consumer --redis redis://HOST:PORT (Redis Streams need a Redis server)");
            std::process::exit(2)
        }
    };
    let client = Client::new(Config::from_url(&url)?, None, None, None);
    client.init().await?;
    let stream = format!("demo:orders:{}", std::process::id());
    let consumer = Consumer {
        client: client.clone(),
        idem: Idempotency::new(RedisStore::connect(&url).await?),
        stream: stream.clone(),
        group: "billing".into(),
        name: "consumer-1".into(),
        redeliver_after: Duration::from_secs(5),
        batch: 100,
        lease: Duration::from_secs(30),
        // A message that fails three times is dead-lettered, not redelivered forever.
        give_up_after: Some(3),
    };
    consumer.create_group().await?;

    // The producer: six orders, two of them published twice (a retried publish), one re-used
    // with another amount, and one without its key.
    let published = [("o1", 10), ("o2", 20), ("o3", 30), ("o2", 20), ("o4", 40), ("o5", 50), ("o6", 60), ("o5", 50)];
    for (key, amount) in published {
        let _: String = client
            .xadd(&stream, false, None, "*", vec![("key", key.to_string()), ("amount", amount.to_string())])
            .await?;
    }
    let _: String = client.xadd(&stream, false, None, "*", vec![("key", "o3"), ("amount", "31")]).await?;
    let _: String = client.xadd(&stream, false, None, "*", vec![("amount", "5")]).await?;
    println!("published {} entries on {stream}", published.len() + 2);

    // The effect: each order's amount added to its account once.
    let balances = format!("{stream}:balances");
    let apply = |d: &Delivery| {
        let (client, balances, key, amount) = (client.clone(), balances.clone(), d.key.clone(), d.amount);
        async move { client.hincrby::<i64, _, _>(&balances, &key, amount).await.map(|_| ()) }
    };
    loop {
        let polled = consumer.poll(8, apply).await?;
        if polled.taken == 0 && consumer.pending().await? == 0 {
            break;
        }
        println!(
            "poll: {} entries, ran {:?}, {} acked, {} handed back, {} dead-lettered",
            polled.taken, polled.executed, polled.acked, polled.requeued, polled.dead
        );
    }
    let mut applied: Vec<(String, i64)> =
        client.hgetall::<std::collections::HashMap<String, i64>, _>(&balances).await?.into_iter().collect();
    applied.sort();
    println!("applied once each: {applied:?}");
    let dead: u64 = client.xlen(format!("{stream}:dead")).await?;
    println!("dead-lettered: {dead} (o3 re-used with another amount; an entry without a key)");
    let _: u64 = client.del(vec![stream.clone(), balances, format!("{stream}:dead")]).await?;
    Ok(())
}
