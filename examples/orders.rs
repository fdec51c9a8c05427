//! What the exactly-once consumers' examples share (JetStream, RabbitMQ): an order, the payload
//! of a message (JSON); what a poll did; the error of a body that writes its effect in a batch's
//! PostgreSQL transaction; and the examples' effect, balances in a schema of their own, with the
//! orders their producers publish.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use idempotency::store::postgres::{sqlx, PgTransaction};
use idempotency::{AckPlan, Call, Idempotency, PgStore, Settled};
use serde::{Deserialize, Serialize};

/// A message's payload as the producer wrote it (JSON). A payload that does not parse becomes an
/// order without a key (`Order::parse`), which the batch refuses as invalid and the poll dead-letters.
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

impl std::fmt::Display for ApplyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApplyError::Idempotency(e) => e.fmt(f),
            ApplyError::Database(e) => write!(f, "the order's statement failed: {e}"),
        }
    }
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

impl Order {
    /// The order a message's payload holds; one that does not parse, an order without a key.
    pub fn parse(payload: &[u8]) -> Order {
        serde_json::from_slice(payload).unwrap_or_default()
    }

    /// The order as a message's payload.
    pub fn payload(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an order serializes")
    }
}

/// What one poll did, by message (or, summed, what a consumer's polls did).
#[derive(Debug, Default)]
pub struct Polled {
    /// Messages taken.
    pub taken: usize,
    /// How many of them the broker had delivered before.
    pub redelivered: usize,
    /// Keys whose body ran and whose record was committed with its effect.
    pub executed: Vec<String>,
    /// Messages acked (their body ran now, or their key completed before).
    pub acked: usize,
    /// Messages handed back, to be delivered again.
    pub requeued: usize,
    /// Messages published to the dead-letter destination and settled.
    pub dead: usize,
}

impl Polled {
    fn add(&mut self, poll: Polled) {
        self.taken += poll.taken;
        self.redelivered += poll.redelivered;
        self.executed.extend(poll.executed);
        self.acked += poll.acked;
        self.requeued += poll.requeued;
        self.dead += poll.dead;
    }
}

/// A body's future: the transaction handed back, with the body's answer.
pub type EffectFuture = Pin<Box<dyn Future<Output = (PgTransaction, Result<(), ApplyError>)> + Send>>;

/// Where a consumer's batches go: the runtime and its PostgreSQL store, the keys' scope, and
/// each key's lease while its body runs.
#[derive(Clone)]
pub struct Inbox {
    /// The runtime whose store holds the keys.
    pub idem: Idempotency,
    /// The same store, for the batch's transaction.
    pub store: PgStore,
    /// The keys' scope.
    pub scope: String,
    /// Each key's lease while its body runs.
    pub lease: Duration,
}

impl Inbox {
    /// An inbox on `store`.
    pub fn new(store: PgStore, scope: &str, lease: Duration) -> Inbox {
        Inbox { idem: Idempotency::new(store.clone()), store, scope: scope.to_owned(), lease }
    }

    /// Claims the orders' keys in one round trip and runs the bodies won with `body` in one
    /// transaction with their records ([`PgStore::run_batch_in_transaction`]): each item's
    /// answer, the plan for the messages, and the keys whose records were committed.
    pub async fn run<F, Fut>(
        &self,
        orders: &[Order],
        mut body: F,
    ) -> (Vec<Settled<(), ApplyError>>, AckPlan, Vec<String>)
    where
        F: FnMut(PgTransaction, Order) -> Fut,
        Fut: Future<Output = (PgTransaction, Result<(), ApplyError>)> + Send + 'static,
    {
        let scope = self.scope.as_str();
        let calls = orders.iter().map(|o| Call::new(&o.key).scope(scope).ttl(self.lease).fingerprint(&o.amount));
        let claimed = self.idem.claim::<()>(calls).await;
        let settled = self.store.run_batch_in_transaction(claimed, |tx, i, _context| body(tx, orders[i].clone())).await;
        let executed = orders
            .iter()
            .zip(&settled)
            .filter(|(_, item)| matches!(item, Settled::Executed { stored: true, .. }))
            .map(|(order, _)| order.key.clone())
            .collect();
        let plan = AckPlan::of(&settled);
        (settled, plan, executed)
    }
}

/// A consumer of orders on a broker, as the examples' loop drives it.
#[allow(async_fn_in_trait)]
pub trait OrderConsumer {
    /// What its broker's commands fail with.
    type Error: std::fmt::Debug;

    /// One poll: takes a batch, runs it through the inbox with `body`, and settles each message
    /// as the batch's plan says. `body` gets the batch's transaction and the item's order, writes
    /// the order's effect in the transaction, and gives the transaction back with its answer.
    async fn poll<F, Fut>(&mut self, body: F) -> Result<Polled, Self::Error>
    where
        F: FnMut(PgTransaction, Order) -> Fut,
        Fut: Future<Output = (PgTransaction, Result<(), ApplyError>)> + Send + 'static;

    /// Whether nothing is left for it: no message waiting, none delivered and not settled.
    async fn drained(&self) -> Result<bool, Self::Error>;
}

/// Polls until a poll takes nothing and nothing is left, calling `each` after every poll; what
/// the polls did, summed.
pub async fn drain<C, F>(consumer: &mut C, body: F, mut each: impl FnMut(&Polled)) -> Result<Polled, C::Error>
where
    C: OrderConsumer,
    F: Fn(PgTransaction, Order) -> EffectFuture,
{
    let mut total = Polled::default();
    loop {
        let polled = consumer.poll(&body).await?;
        each(&polled);
        let empty = polled.taken == 0;
        total.add(polled);
        if empty && consumer.drained().await? {
            return Ok(total);
        }
    }
}

/// The examples' effect: each order's amount added to its account, in a table of a schema of the
/// example's own (`<schema>.balances`), dropped by [`Balances::remove`].
pub struct Balances {
    /// The schema, which the example's records table shares.
    pub schema: String,
    /// A pool on the database.
    pub pool: sqlx::PgPool,
}

impl Balances {
    /// Creates the schema and its balances table.
    pub async fn create(postgres: &str, schema: &str) -> Result<Balances, sqlx::Error> {
        let pool = sqlx::PgPool::connect(postgres).await?;
        let sql = format!(
            "CREATE SCHEMA {schema}; CREATE TABLE {schema}.balances (account text PRIMARY KEY, total bigint NOT NULL)"
        );
        sqlx::raw_sql(&sql).execute(&pool).await?;
        Ok(Balances { schema: schema.to_owned(), pool })
    }

    /// The body: adds the order's amount to its account in the batch's transaction.
    pub fn apply(&self) -> impl Fn(PgTransaction, Order) -> EffectFuture {
        let sql = format!(
            "INSERT INTO {}.balances (account, total) VALUES ($1, $2) \
             ON CONFLICT (account) DO UPDATE SET total = balances.total + EXCLUDED.total",
            self.schema
        );
        move |mut tx: PgTransaction, order: Order| {
            let sql = sql.clone();
            Box::pin(async move {
                let done = sqlx::query(&sql).bind(&order.key).bind(order.amount).execute(&mut *tx).await;
                (tx, done.map(|_| ()).map_err(ApplyError::from))
            })
        }
    }

    /// Every account's total, by account.
    pub async fn totals(&self) -> Result<Vec<(String, i64)>, sqlx::Error> {
        let sql = format!("SELECT account, total FROM {}.balances ORDER BY account", self.schema);
        sqlx::query_as(&sql).fetch_all(&self.pool).await
    }

    /// Drops the schema, with the records table in it.
    pub async fn remove(self) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(&format!("DROP SCHEMA {} CASCADE", self.schema)).execute(&self.pool).await.map(|_| ())
    }
}

/// What the examples' producers publish: six orders, two of them twice (a retried publish), one
/// re-used with another amount, and a payload that is not an order at all.
pub fn demo_payloads() -> Vec<Vec<u8>> {
    let published = [("o1", 10), ("o2", 20), ("o3", 30), ("o2", 20), ("o4", 40), ("o5", 50), ("o6", 60), ("o5", 50)];
    let mut payloads: Vec<Vec<u8>> =
        published.iter().map(|&(key, amount)| Order { key: key.into(), amount }.payload()).collect();
    payloads.push(Order { key: "o3".into(), amount: 31 }.payload());
    payloads.push(b"not an order".to_vec());
    payloads
}

/// The values of two flags from the command line (`--broker URL --postgres URL`), or the usage
/// printed and the process ended.
pub fn two_urls(broker_flag: &str, usage: &str) -> (String, String) {
    let mut args = std::env::args().skip(1);
    let (mut broker, mut postgres) = (None, None);
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--postgres" => postgres = args.next(),
            f if f == broker_flag => broker = args.next(),
            _ => break,
        }
    }
    match (broker, postgres, args.next()) {
        (Some(broker), Some(postgres), None) => (broker, postgres),
        _ => {
            eprintln!("usage: {usage}");
            std::process::exit(2)
        }
    }
}

/// Prints what one poll did, if it took anything.
pub fn print_poll(polled: &Polled) {
    if polled.taken > 0 {
        println!(
            "poll: {} messages, ran {:?}, {} acked, {} handed back, {} dead-lettered",
            polled.taken, polled.executed, polled.acked, polled.requeued, polled.dead
        );
    }
}
