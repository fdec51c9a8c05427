//! The RabbitMQ consumer (`idempotency_examples::rabbitmq`, the `rabbitmq_consumer` example's
//! loop) through kill -9, on a vhost of the test's own (on the broker at `$IDEM_AMQP_URL`, default
//! `amqp://guest:guest@127.0.0.1:5672`, made and deleted with `rabbitmqctl`) and a PostgreSQL
//! database of its own: 300 orders published, 60 of them twice; three consumers killed (SIGKILL)
//! one after the other in the middle of a batch, each after a number of bodies had written their
//! effects in the batch's transaction; then one more consumer drains the queue. Every order's
//! effect is there exactly once: a killed batch's transaction is rolled back with its effects,
//! RabbitMQ delivers its messages again when its connection dies, and its keys are free again
//! after their lease.

mod consumer_process;
mod exactly_once;

use std::process::Command;
use std::time::Duration;

use exactly_once::{Database, LEASE};
use idempotency::PgStore;
use idempotency_examples::rabbitmq::{self, Consumer};

const QUEUE: &str = "orders";

/// A vhost of the test's own on the broker, deleted when dropped.
struct Vhost {
    name: String,
}

impl Vhost {
    fn create() -> Vhost {
        let name = format!("idem_test_{}", exactly_once::unique_name());
        rabbitmqctl(&["add_vhost", &name]);
        rabbitmqctl(&["set_permissions", "-p", &name, "guest", ".*", ".*", ".*"]);
        Vhost { name }
    }

    fn url(&self) -> String {
        let base = std::env::var("IDEM_AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672".into());
        format!("{base}/{}", self.name)
    }
}

impl Drop for Vhost {
    fn drop(&mut self) {
        let _ = Command::new("rabbitmqctl").args(["delete_vhost", &self.name]).output();
    }
}

fn rabbitmqctl(args: &[&str]) {
    let out = Command::new("rabbitmqctl").args(args).output().unwrap_or_else(|e| {
        panic!("rabbitmqctl {args:?} (scripts/install-rabbitmq.sh installs and starts RabbitMQ): {e}")
    });
    assert!(out.status.success(), "rabbitmqctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A consumer with deliveries handed back after 100 ms.
async fn consumer(amqp: &str, store: PgStore, batch: u16) -> Consumer {
    Consumer::open(amqp, QUEUE, store, batch, LEASE, Duration::from_millis(100)).await.unwrap()
}

/// Publishes on a connection of its own (a consumer's channel would take deliveries).
async fn publish(amqp: &str, payloads: impl IntoIterator<Item = Vec<u8>>) {
    let connection = lapin::Connection::connect(amqp, lapin::ConnectionProperties::default()).await.unwrap();
    let channel = connection.create_channel().await.unwrap();
    rabbitmq::declare(&channel, QUEUE).await.unwrap();
    for payload in payloads {
        rabbitmq::publish(&channel, QUEUE, &payload).await.unwrap();
    }
    connection.close(200, "published".into()).await.unwrap();
}

/// Not a test: a consumer process of `every_effect_once_through_kill_9` (`exactly_once::run_child`).
#[test]
#[ignore = "child process of another test"]
fn consumer_child() {
    exactly_once::run_child(|broker, store| async move { consumer(&broker, store, 50).await });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_effect_once_through_kill_9() {
    exactly_once::every_effect_once("RabbitMQ", |transactional| async move {
        let vhost = Vhost::create();
        let db = Database::create().await;
        publish(&vhost.url(), exactly_once::published()).await;
        exactly_once::kill_run(&vhost.url(), &db, QUEUE, transactional).await
    })
    .await;
}

/// The example's two bad messages: an order re-used with another amount (the same key, another
/// fingerprint) and a payload that is not an order. Each is published to the dead-letter queue
/// and acked, not handed back for ever; the re-used order's first amount is the one applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reused_and_unreadable_messages_are_dead_lettered() {
    let vhost = Vhost::create();
    let db = Database::create().await;
    let mut consumer = consumer(&vhost.url(), db.store.clone(), 10).await;
    publish(&vhost.url(), exactly_once::bad_messages()).await;
    exactly_once::dead_letter_run(&mut consumer, &db).await;
    assert_eq!(consumer.dead_letters().await.unwrap(), 2, "two messages in the dead-letter queue");
    assert_eq!(consumer.ready().await.unwrap(), 0, "nothing is left in the queue");
}
