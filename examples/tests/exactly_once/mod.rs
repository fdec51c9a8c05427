//! What the exactly-once consumers' kill -9 tests share (JetStream, RabbitMQ): a database of the
//! test's own (the suite's PostgreSQL fixture, included from `tests/support`) with an effects
//! table without a unique key, so that a duplicate shows; the body each consumer process runs
//! (its effect in the batch's transaction, or outside it for the control); the run itself (300
//! orders, 60 published twice, three consumers killed mid-batch, a fourth draining); and what
//! the run left, checked.
// Each test crate that includes the module uses part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use idempotency::store::postgres::{sqlx, PgTransaction};
use idempotency::store::{Inspected, RecordState};
use idempotency::{Idempotency, PgStore};
use idempotency_examples::orders::{self, ApplyError, EffectFuture, Order, OrderConsumer, Polled};

use crate::consumer_process;

#[path = "../../../tests/support/process.rs"]
mod process;
use process::LIVE;
pub use process::{free_port, spawn_tied};
#[path = "../../../tests/support/postgres.rs"]
#[allow(dead_code)]
mod postgres;

/// Orders published, each once.
pub const ORDERS: usize = 300;
/// Orders published a second time.
pub const REPUBLISHED: usize = 60;
/// Each key's lease in the consumers: short, so that a killed consumer's keys are free soon.
pub const LEASE: Duration = Duration::from_secs(1);

/// The test's database and schema, with the records table and the effects table in it.
pub struct Database {
    /// The database's URL.
    pub url: String,
    /// The schema of the records and the effects.
    pub schema: String,
    /// The store on it.
    pub store: PgStore,
}

impl Database {
    /// A schema of its own in the test process's database, with `effects (key, amount)`.
    pub async fn create() -> Database {
        let url = tokio::task::spawn_blocking(postgres::shared_database).await.unwrap().to_owned();
        let schema = postgres::unique_schema();
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        let sql = format!(
            "CREATE SCHEMA \"{schema}\"; CREATE TABLE \"{schema}\".effects (key text NOT NULL, amount bigint NOT NULL)"
        );
        sqlx::raw_sql(&sql).execute(&pool).await.unwrap();
        let store = PgStore::builder(&url).schema(&schema).migrate().connect().await.unwrap();
        Database { url, schema, store }
    }

    /// The effects written, as (key, amount), in no set order.
    pub async fn effects(&self) -> Vec<(String, i64)> {
        let sql = format!("SELECT key, amount FROM \"{}\".effects", self.schema);
        sqlx::query_as(&sql).fetch_all(self.store.pool()).await.unwrap()
    }
}

/// A unique name for a broker's namespace (a vhost).
pub fn unique_name() -> String {
    postgres::unique_schema()
}

/// The orders the kill -9 test publishes, in order: every fifth order is published again a
/// little later (a producer's retried publish).
pub fn published() -> Vec<Vec<u8>> {
    let order = |n: usize| Order { key: format!("order-{n}"), amount: 1 }.payload();
    let mut payloads = Vec::new();
    for i in 0..ORDERS {
        payloads.push(order(i));
        if i % 5 == 4 {
            payloads.push(order(i - 3));
        }
    }
    payloads
}

/// The body of a test's consumer: writes its effect (a row) and prints `RUN key`, then takes 20
/// ms more (a kill lands inside bodies). In the batch's transaction, or, for the control
/// (`outside`), on a connection of its own, as a consumer that stores its records apart from its
/// effects does.
pub fn effect(
    schema: &str,
    outside: Option<sqlx::PgPool>,
    print: bool,
) -> impl Fn(PgTransaction, Order) -> EffectFuture {
    let insert = format!("INSERT INTO \"{schema}\".effects (key, amount) VALUES ($1, $2)");
    move |mut tx: PgTransaction, order: Order| {
        let (insert, outside) = (insert.clone(), outside.clone());
        Box::pin(async move {
            let query = sqlx::query(&insert).bind(&order.key).bind(order.amount);
            let done = match outside {
                Some(pool) => query.execute(&pool).await,
                None => query.execute(&mut *tx).await,
            };
            if print {
                println!("RUN {}", order.key);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (tx, done.map(|_| ()).map_err(ApplyError::from))
        })
    }
}

/// What a consumer process is told (by its environment).
pub struct ChildEnv {
    /// The broker's URL.
    pub broker: String,
    /// The database's URL.
    pub pg: String,
    /// The schema.
    pub schema: String,
    /// Whether its effects go outside the batch's transaction (the control).
    pub outside: bool,
}

impl ChildEnv {
    /// The environment of a consumer process; `None` in the test process itself.
    pub fn read() -> Option<ChildEnv> {
        let var = |name: &str| std::env::var(name).ok();
        Some(ChildEnv {
            broker: var("EO_BROKER")?,
            pg: var("EO_PG")?,
            schema: var("EO_SCHEMA")?,
            outside: var("EO_OUTSIDE").is_some(),
        })
    }
}

/// A consumer process's life, in this test binary's `consumer_child` (the environment of
/// [`ChildEnv`]; nothing in the test process itself): connects the consumer `open` makes on the
/// store, prints READY, then `RUN key` as each body has written its effect and `STORED key...`
/// after each poll, and `DRAINED` with the redeliveries it got once nothing is left, which a
/// consumer killed mid-batch never reaches.
pub fn run_child<C, Open>(open: impl FnOnce(String, PgStore) -> Open)
where
    C: OrderConsumer,
    Open: std::future::Future<Output = C>,
{
    let Some(env) = ChildEnv::read() else { return };
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let store = PgStore::builder(&env.pg).schema(&env.schema).connect().await.unwrap();
        let outside = env.outside.then(|| store.pool().clone());
        let mut consumer = open(env.broker, store).await;
        println!("READY");
        let stored = |polled: &Polled| println!("STORED {}", polled.executed.join(" "));
        let polls = orders::drain(&mut consumer, effect(&env.schema, outside, true), stored).await.unwrap();
        println!("DRAINED {}", polls.redelivered);
    });
}

/// The dead-letter tests' run, once the three [`bad_messages`] are published: drained (within
/// 30 s); `o1` applied once, with its first amount, and two dead letters reported.
pub async fn dead_letter_run<C: OrderConsumer>(consumer: &mut C, db: &Database) -> Polled {
    let drained = orders::drain(consumer, effect(&db.schema, None, false), |_| {});
    let polls = tokio::time::timeout(Duration::from_secs(30), drained)
        .await
        .expect("the consumer drained the messages within 30 s")
        .unwrap();
    assert_eq!(db.effects().await, [("o1".to_owned(), 10)], "o1 applied once, with its first amount");
    assert_eq!(polls.dead, 2, "the polls reported the two dead letters");
    polls
}

/// Starts this test binary's `consumer_child` as a consumer process.
fn spawn(broker: &str, db: &Database, transactional: bool) -> Child {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["consumer_child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env("EO_BROKER", broker)
        .env("EO_PG", &db.url)
        .env("EO_SCHEMA", &db.schema)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if !transactional {
        command.env("EO_OUTSIDE", "1");
    }
    command.spawn().expect("spawn the consumer")
}

/// What one run through kill -9 left.
#[derive(Debug)]
pub struct KillRun {
    /// Effects written by a killed consumer's bodies whose batch had not committed.
    pub rolled_back: usize,
    /// Messages the last consumer got that had been delivered before.
    pub redelivered: usize,
    /// Orders whose effect is there more than once.
    pub duplicates: Vec<String>,
    /// Orders without an effect, or without a completed record.
    pub wrong: Vec<String>,
}

/// Three consumers killed one after the other once some bodies have written their effects (after
/// 25, 40 and 55: the kill lands inside a batch, during a body), then a fourth that drains what
/// is left (the killed ones' messages after their redelivery and their keys' leases); then every
/// order's effects counted and its record inspected in `scope`.
pub async fn kill_run(broker: &str, db: &Database, scope: &str, transactional: bool) -> KillRun {
    let mut rolled_back = 0;
    for (n, bodies) in [25, 40, 55].into_iter().enumerate() {
        let child = spawn(broker, db, transactional);
        let seen = tokio::task::spawn_blocking(move || consumer_process::kill_after(child, bodies)).await.unwrap();
        let killed_mid_batch = seen.in_flight();
        assert!(!killed_mid_batch.is_empty(), "consumer {n} was not killed inside a batch");
        rolled_back += killed_mid_batch.len();
    }
    let last = spawn(broker, db, transactional);
    let last =
        tokio::task::spawn_blocking(move || consumer_process::run_to_end(last, Duration::from_secs(90))).await.unwrap();
    let drained = last.drained.expect("the last consumer stopped before the queue was drained");
    let redelivered: usize = drained.parse().expect("DRAINED and a count");

    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for (key, _) in db.effects().await {
        *counts.entry(key).or_default() += 1;
    }
    let idem = Idempotency::new(db.store.clone());
    let mut run = KillRun { rolled_back, redelivered, duplicates: Vec::new(), wrong: Vec::new() };
    for i in 0..ORDERS {
        let key = format!("order-{i}");
        match counts.get(&key).copied().unwrap_or(0) {
            0 => run.wrong.push(format!("{key}: no effect")),
            1 => {}
            _ => run.duplicates.push(key.clone()),
        }
        match idem.inspect(scope, &key).await.unwrap() {
            Inspected::Record(r) if r.state == RecordState::Completed => {}
            other => run.wrong.push(format!("{key}: {other:?}")),
        }
    }
    run
}

/// The kill -9 test of a broker's consumer: `run(transactional)` sets up a broker and a database
/// of its own, publishes [`published`] and runs [`kill_run`]; once with the effects in the batch's
/// transaction, once outside it, then [`check`].
pub async fn every_effect_once<Fut: std::future::Future<Output = KillRun>>(broker: &str, run: impl Fn(bool) -> Fut) {
    let transactional = run(true).await;
    let control = run(false).await;
    check(broker, &transactional, &control);
}

/// The effects in the batch's transaction: every order's effect exactly once. The control, the
/// same consumers writing each effect outside the transaction, must show duplicates (an effect a
/// killed batch wrote stays, and the order runs again after its lease), or the kills missed the
/// window the test is about.
fn check(broker: &str, transactional: &KillRun, control: &KillRun) {
    println!(
        "{broker}: {ORDERS} orders ({} messages, {REPUBLISHED} published twice), 3 consumers killed mid-batch \
         with {} effects written and rolled back; {} messages delivered again; every order applied exactly once",
        ORDERS + REPUBLISHED,
        transactional.rolled_back,
        transactional.redelivered
    );
    assert!(transactional.wrong.is_empty(), "{transactional:?}");
    assert!(transactional.duplicates.is_empty(), "orders applied more than once: {transactional:?}");
    assert!(transactional.redelivered > 0, "no message a killed consumer had taken came again: {transactional:?}");
    println!("{broker}, control, effects outside the transaction: {} orders applied twice", control.duplicates.len());
    assert!(control.wrong.is_empty(), "{control:?}");
    assert!(!control.duplicates.is_empty(), "the control saw no duplicate: the kills missed the window ({control:?})");
}

/// The dead-letter tests' messages: an order, the same order re-used with another amount, and a
/// payload that is not an order.
pub fn bad_messages() -> [Vec<u8>; 3] {
    [
        Order { key: "o1".into(), amount: 10 }.payload(),
        Order { key: "o1".into(), amount: 11 }.payload(),
        b"not an order".to_vec(),
    ]
}
