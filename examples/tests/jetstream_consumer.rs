//! The JetStream consumer (`idempotency_examples::jetstream`, the `jetstream_consumer` example's
//! loop) through kill -9, on a `nats-server` of the test's own and a PostgreSQL database of its
//! own: 300 orders published, 60 of them twice; three consumers killed (SIGKILL) one after the
//! other in the middle of a batch, each after a number of bodies had written their effects in the
//! batch's transaction; then one more consumer drains the stream. Every order's effect is there
//! exactly once: a killed batch's transaction is rolled back with its effects, its messages come
//! back after the consumer's `ack_wait`, and its keys are free again after their lease.

mod consumer_process;
mod exactly_once;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use exactly_once::{Database, LEASE};
use idempotency::PgStore;
use idempotency_examples::jetstream::{Consumer, Source};

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
        let port = exactly_once::free_port();
        let dir = std::env::temp_dir().join(format!("idem-nats-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut command = Command::new(&binary);
        command
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = exactly_once::spawn_tied(command)
            .unwrap_or_else(|e| panic!("start {binary} (scripts/install-nats.sh installs it): {e}"));
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

/// The stream, with a short `ack_wait`: a killed consumer's messages come back within a second.
fn source() -> Source {
    Source {
        stream: "ORDERS".into(),
        subject: "orders.new".into(),
        dead_subject: "orders.dead".into(),
        durable: "billing".into(),
        ack_wait: Duration::from_secs(1),
    }
}

async fn consumer(nats: &str, store: PgStore, batch: usize) -> Consumer {
    let client = async_nats::connect(nats).await.unwrap();
    Consumer::open(client, &source(), store, batch, LEASE).await.unwrap()
}

async fn publish(consumer: &Consumer, payloads: impl IntoIterator<Item = Vec<u8>>) {
    for payload in payloads {
        consumer.jetstream.publish("orders.new", payload.into()).await.unwrap().await.unwrap();
    }
}

/// Not a test: a consumer process of `every_effect_once_through_kill_9` (`exactly_once::run_child`).
#[test]
#[ignore = "child process of another test"]
fn consumer_child() {
    exactly_once::run_child(|broker, store| async move { consumer(&broker, store, 50).await });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_effect_once_through_kill_9() {
    exactly_once::every_effect_once("JetStream", |transactional| async move {
        let server = NatsServer::start();
        let db = Database::create().await;
        publish(&consumer(&server.url(), db.store.clone(), 50).await, exactly_once::published()).await;
        exactly_once::kill_run(&server.url(), &db, "billing", transactional).await
    })
    .await;
}

/// The example's two bad messages: an order re-used with another amount (the same key, another
/// fingerprint) and a payload that is not an order. Each is published to the dead-letter subject
/// and terminated, not handed back for ever; the re-used order's first amount is the one applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reused_and_unreadable_messages_are_dead_lettered() {
    let server = NatsServer::start();
    let db = Database::create().await;
    let mut consumer = consumer(&server.url(), db.store.clone(), 10).await;
    publish(&consumer, exactly_once::bad_messages()).await;
    exactly_once::dead_letter_run(&mut consumer, &db).await;
    let mut stream = consumer.jetstream.get_stream("ORDERS").await.unwrap();
    let dead = stream.info().await.unwrap().state.messages - 3;
    assert_eq!(dead, 2, "two messages published to the dead-letter subject");
    assert_eq!(consumer.outstanding().await.unwrap(), (0, 0), "nothing is left outstanding");
}
