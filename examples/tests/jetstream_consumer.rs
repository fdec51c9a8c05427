//! The JetStream consumer (`idempotency_examples::jetstream`, the `jetstream_consumer` example's
//! loop) through kill -9, on a `nats-server` of the test's own and a PostgreSQL database of its
//! own: 300 orders published, 60 of them twice; three consumers killed (SIGKILL) one after the
//! other in the middle of a batch, each after a number of bodies had written their effects in the
//! batch's transaction; then one more consumer drains the stream. Every order's effect is there
//! exactly once: a killed batch's transaction is rolled back with its effects, its messages come
//! back after the consumer's `ack_wait`, and its keys are free again after their lease.

mod consumer_process;

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use idempotency::store::postgres::{sqlx, PgTransaction};
use idempotency::store::{Inspected, RecordState};
use idempotency::PgStore;
use idempotency_examples::jetstream::{ApplyError, Consumer, Order, Source};

// The suite's PostgreSQL fixture (a database of this test process's own, or a cluster of its own
// where no server answers), with the process helpers it is built on (it takes them from its
// parent module, here the crate's root).
#[path = "../../tests/support/process.rs"]
mod process;
use process::{free_port, spawn_tied, LIVE};
#[path = "../../tests/support/postgres.rs"]
#[allow(dead_code)]
mod postgres;

const ORDERS: usize = 300;
const REPUBLISHED: usize = 60;
const LEASE: Duration = Duration::from_secs(1);
const ACK_WAIT: Duration = Duration::from_secs(1);

/// A `nats-server` with JetStream on a free port, its store in a directory of its own; killed
/// and its directory removed when dropped.
struct NatsServer {
    child: Child,
    port: u16,
    dir: std::path::PathBuf,
}

impl NatsServer {
    fn start() -> NatsServer {
        let binary = std::env::var("NATS_SERVER").unwrap_or_else(|_| {
            let packaged = "/usr/sbin/nats-server";
            if std::path::Path::new(packaged).exists() {
                packaged.into()
            } else {
                "nats-server".into()
            }
        });
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("idem-nats-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut command = Command::new(&binary);
        command
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child =
            spawn_tied(command).unwrap_or_else(|e| panic!("start {binary} (scripts/install-nats.sh installs it): {e}"));
        let server = NatsServer { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "{binary} did not listen on {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn source() -> Source {
    Source {
        stream: "ORDERS".into(),
        subject: "orders.new".into(),
        dead_subject: "orders.dead".into(),
        durable: "billing".into(),
        ack_wait: ACK_WAIT,
    }
}

/// The consumer a child process runs: short leases and redelivery, so that a killed one's
/// messages come back within a second or two.
async fn consumer(nats: &str, pg: &str, schema: &str) -> Consumer {
    let client = async_nats::connect(nats).await.unwrap();
    let store = PgStore::builder(pg).schema(schema).connect().await.unwrap();
    Consumer::open(client, &source(), store, 50, LEASE).await.unwrap()
}

/// Not a test: the consumer process of `every_effect_once_through_kill_9`. Prints READY, then
/// `RUN key` as each body has written its effect (in the batch's transaction, not committed) and
/// `STORED key...` after each poll; with `JS_DRAIN` it exits once nothing is outstanding.
#[test]
#[ignore = "child process of another test"]
fn consumer_child() {
    let Ok(nats) = std::env::var("JS_NATS") else { return };
    let (pg, schema) = (std::env::var("JS_PG").unwrap(), std::env::var("JS_SCHEMA").unwrap());
    let drain = std::env::var("JS_DRAIN").is_ok();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let consumer = consumer(&nats, &pg, &schema).await;
        println!("READY");
        let insert = format!("INSERT INTO \"{schema}\".effects (key) VALUES ($1)");
        // The control writes each effect on a connection of its own, outside the batch's
        // transaction, as a consumer that stores its records apart from its effects does.
        let outside = std::env::var("JS_OUTSIDE").is_ok().then(|| consumer.store.pool().clone());
        let apply = |mut tx: PgTransaction, order: Order| {
            let (insert, outside) = (insert.clone(), outside.clone());
            async move {
                let query = sqlx::query(&insert).bind(&order.key);
                let done = match outside {
                    Some(pool) => query.execute(&pool).await,
                    None => query.execute(&mut *tx).await,
                };
                println!("RUN {}", order.key);
                tokio::time::sleep(Duration::from_millis(20)).await;
                (tx, done.map(|_| ()).map_err(ApplyError::from))
            }
        };
        let mut redelivered = 0;
        loop {
            let polled = consumer.poll(apply).await.unwrap();
            redelivered += polled.redelivered;
            println!("STORED {}", polled.executed.join(" "));
            if drain && polled.taken == 0 && consumer.outstanding().await.unwrap() == (0, 0) {
                println!("DRAINED {redelivered}");
                return;
            }
        }
    });
}

fn spawn_consumer(nats: &str, pg: &str, schema: &str, drain: bool, transactional: bool) -> Child {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["consumer_child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env("JS_NATS", nats)
        .env("JS_PG", pg)
        .env("JS_SCHEMA", schema)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if drain {
        command.env("JS_DRAIN", "1");
    }
    if !transactional {
        command.env("JS_OUTSIDE", "1");
    }
    command.spawn().expect("spawn the consumer")
}

/// What one run through kill -9 left.
#[derive(Debug)]
struct KillRun {
    /// Effects written by a killed consumer's bodies whose batch had not committed.
    rolled_back: usize,
    /// Messages the last consumer got that had been delivered before.
    redelivered: usize,
    /// Orders whose effect is there more than once.
    duplicates: Vec<String>,
    /// Orders without an effect, or without a completed record.
    wrong: Vec<String>,
}

/// The consumer's effects in the batch's transaction: every order's effect is there exactly
/// once. The control, the same consumer writing each effect outside the transaction, must show
/// duplicates (an effect a killed batch wrote stays, and the order runs again after its lease),
/// or the kills missed the window the test is about.
#[test]
fn every_effect_once_through_kill_9() {
    let run = kill_run(true);
    println!(
        "{ORDERS} orders ({} messages, {REPUBLISHED} published twice), 3 consumers killed mid-batch with {} \
         effects written and rolled back; {} messages delivered again; every order applied exactly once",
        ORDERS + REPUBLISHED,
        run.rolled_back,
        run.redelivered
    );
    assert!(run.wrong.is_empty(), "{run:?}");
    assert!(run.duplicates.is_empty(), "orders applied more than once: {run:?}");
    assert!(run.redelivered > 0, "no message a killed consumer had taken was delivered again: {run:?}");
    let control = kill_run(false);
    println!("control, effects outside the transaction: {} orders applied twice", control.duplicates.len());
    assert!(control.wrong.is_empty(), "{control:?}");
    assert!(!control.duplicates.is_empty(), "the control saw no duplicate: the kills missed the window ({control:?})");
}

fn kill_run(transactional: bool) -> KillRun {
    let server = NatsServer::start();
    let nats = server.url();
    let pg = postgres::shared_database().to_owned();
    let schema = postgres::unique_schema();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(async {
        let pool = sqlx::PgPool::connect(&pg).await.unwrap();
        sqlx::raw_sql(&format!("CREATE SCHEMA \"{schema}\"; CREATE TABLE \"{schema}\".effects (key text NOT NULL)"))
            .execute(&pool)
            .await
            .unwrap();
        let store = PgStore::builder(&pg).schema(&schema).migrate().connect().await.unwrap();
        let publisher = Consumer::open(async_nats::connect(&nats).await.unwrap(), &source(), store.clone(), 50, LEASE)
            .await
            .unwrap();
        // Every fifth order is published again a little later: a producer's retried publish.
        for i in 0..ORDERS {
            let order = |n: usize| serde_json::to_vec(&Order { key: format!("order-{n}"), amount: 1 }).unwrap();
            publisher.jetstream.publish("orders.new", order(i).into()).await.unwrap().await.unwrap();
            if i % 5 == 4 {
                publisher.jetstream.publish("orders.new", order(i - 3).into()).await.unwrap().await.unwrap();
            }
        }
        store
    });

    // Three consumers killed one after the other, each once some bodies have written their
    // effects: the kill lands inside a batch, during a body (each takes 20 ms after its RUN).
    let mut rolled_back = 0;
    for (n, bodies) in [25, 40, 55].into_iter().enumerate() {
        let seen = consumer_process::kill_after(spawn_consumer(&nats, &pg, &schema, false, transactional), bodies);
        let killed_mid_batch = seen.in_flight();
        assert!(!killed_mid_batch.is_empty(), "consumer {n} was not killed inside a batch");
        rolled_back += killed_mid_batch.len();
    }

    // The last consumer takes what the killed ones left unacked (after ack_wait and their
    // leases) and the rest.
    let last =
        consumer_process::run_to_end(spawn_consumer(&nats, &pg, &schema, true, transactional), Duration::from_secs(90));
    let drained = last.drained.expect("the last consumer stopped before the stream was drained");
    let redelivered: usize = drained.parse().expect("DRAINED and a count");

    let (counts, not_completed) = rt.block_on(async {
        let rows: Vec<(String, i64)> =
            sqlx::query_as(&format!("SELECT key, count(*) FROM \"{schema}\".effects GROUP BY key"))
                .fetch_all(store.pool())
                .await
                .unwrap();
        let idem = idempotency::Idempotency::new(store.clone());
        let mut not_completed = Vec::new();
        for i in 0..ORDERS {
            let key = format!("order-{i}");
            match idem.inspect("billing", &key).await.unwrap() {
                Inspected::Record(r) if r.state == RecordState::Completed => {}
                other => not_completed.push(format!("{key}: {other:?}")),
            }
        }
        (rows.into_iter().collect::<BTreeMap<_, _>>(), not_completed)
    });
    let mut run = KillRun { rolled_back, redelivered, duplicates: Vec::new(), wrong: not_completed };
    for i in 0..ORDERS {
        let key = format!("order-{i}");
        match counts.get(&key).copied().unwrap_or(0) {
            0 => run.wrong.push(format!("{key}: no effect")),
            1 => {}
            _ => run.duplicates.push(key),
        }
    }
    run
}

/// The example's two bad messages: an order re-used with another amount (the same key, another
/// fingerprint) and a payload that is not an order. Each is published to the dead-letter subject
/// and terminated, not handed back for ever; the re-used order's first amount is the one applied.
#[test]
fn reused_and_unreadable_messages_are_dead_lettered() {
    let server = NatsServer::start();
    let pg = postgres::shared_database().to_owned();
    let schema = postgres::unique_schema();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let pool = sqlx::PgPool::connect(&pg).await.unwrap();
        sqlx::raw_sql(&format!(
            "CREATE SCHEMA \"{schema}\"; CREATE TABLE \"{schema}\".effects (key text NOT NULL, amount bigint NOT NULL)"
        ))
        .execute(&pool)
        .await
        .unwrap();
        let store = PgStore::builder(&pg).schema(&schema).migrate().connect().await.unwrap();
        let consumer = Consumer::open(async_nats::connect(&server.url()).await.unwrap(), &source(), store, 10, LEASE)
            .await
            .unwrap();
        let payloads = [
            serde_json::to_vec(&Order { key: "o1".into(), amount: 10 }).unwrap(),
            serde_json::to_vec(&Order { key: "o1".into(), amount: 11 }).unwrap(),
            b"not an order".to_vec(),
        ];
        for payload in payloads {
            consumer.jetstream.publish("orders.new", payload.into()).await.unwrap().await.unwrap();
        }
        let insert = format!("INSERT INTO \"{schema}\".effects (key, amount) VALUES ($1, $2)");
        let apply = |mut tx: PgTransaction, order: Order| {
            let insert = insert.clone();
            async move {
                let done = sqlx::query(&insert).bind(&order.key).bind(order.amount).execute(&mut *tx).await;
                (tx, done.map(|_| ()).map_err(ApplyError::from))
            }
        };
        let mut dead_in_polls = 0;
        for _ in 0..40 {
            let polled = consumer.poll(apply).await.unwrap();
            dead_in_polls += polled.dead;
            if polled.taken == 0 && consumer.outstanding().await.unwrap() == (0, 0) {
                break;
            }
        }
        let applied: Vec<(String, i64)> =
            sqlx::query_as(&format!("SELECT key, amount FROM \"{schema}\".effects")).fetch_all(&pool).await.unwrap();
        assert_eq!(applied, [("o1".to_owned(), 10)], "o1 applied once, with its first amount");
        assert_eq!(dead_in_polls, 2, "the polls reported the two dead letters");
        let mut stream = consumer.jetstream.get_stream("ORDERS").await.unwrap();
        let dead = stream.info().await.unwrap().state.messages - 3;
        assert_eq!(dead, 2, "two messages published to the dead-letter subject");
        assert_eq!(consumer.outstanding().await.unwrap(), (0, 0), "nothing is left outstanding");
    });
}
