//! The batch rows (`--batches`): messages per second through a claim–run–commit cycle with an
//! empty body, for batches of 1, 10, 100 and 1,000 keys at one task, against per-message `run` and
//! against a naive pipelined baseline on the same server (Redis, Valkey: `SET NX` for each key in
//! one pipeline, then `SET` for each in another; PostgreSQL: one `INSERT ... ON CONFLICT` over
//! arrays, then one `UPDATE` over arrays). A row's op is one batch; the table shows messages.

use std::future::Future;
use std::pin::Pin;

use idempotency::store::postgres::sqlx;
use idempotency::store::redis::fred::prelude::*;
use idempotency::{Call, Idempotency, Settled};

use crate::harness::{Bench, Row};
use crate::ops::{receipt, Receipt};

/// The batch sizes measured.
pub const SIZES: [usize; 4] = [1, 10, 100, 1000];

type Op = Box<dyn Fn(usize, u64) -> Pin<Box<dyn Future<Output = bool> + Send>> + Send + Sync>;

/// One batch of `n` fresh keys `{prefix}:{i}:{j}` claimed, run (an empty body) and committed:
/// true when every item ran.
fn batch_op(idem: Idempotency, prefix: String, n: usize) -> Op {
    Box::new(move |_, i| {
        let (idem, prefix) = (idem.clone(), prefix.clone());
        Box::pin(async move {
            let batch = idem.claim::<Receipt>((0..n).map(|j| Call::new(format!("{prefix}:{i}:{j}")))).await;
            let settled = batch.run(1, |j, _| async move { Ok::<_, &str>(receipt(j as u64)) }).await;
            settled.iter().all(|s| matches!(s, Settled::Executed { .. }))
        })
    })
}

/// `n` first executions through `run`, one after the other: the per-message baseline.
fn per_message_op(idem: Idempotency, prefix: String, n: usize) -> Op {
    Box::new(move |_, i| {
        let (idem, prefix) = (idem.clone(), prefix.clone());
        Box::pin(async move {
            let mut all = true;
            for j in 0..n {
                let r: Result<Receipt, idempotency::Error> =
                    idem.run(Call::new(format!("{prefix}:{i}:{j}")), || async move { Ok(receipt(j as u64)) }).await;
                all &= r.is_ok();
            }
            all
        })
    })
}

/// The naive pipelined baseline on Redis: one pipeline of `SET NX EX 30`, one of `SET EX 86400`.
fn naive_redis_op(client: Client, prefix: String, n: usize) -> Op {
    Box::new(move |_, i| {
        let (client, prefix) = (client.clone(), prefix.clone());
        Box::pin(async move {
            let keys: Vec<String> = (0..n).map(|j| format!("{prefix}:{i}:{j}")).collect();
            let claims = client.pipeline();
            for k in &keys {
                let _: Result<(), _> = claims.set(k, "1", Some(Expiration::EX(30)), Some(SetOptions::NX), false).await;
            }
            let Ok(taken) = claims.all::<Vec<Value>>().await else { return false };
            let commits = client.pipeline();
            for (j, (k, taken)) in keys.iter().zip(taken).enumerate() {
                if taken.is_null() {
                    continue;
                }
                let body = serde_json::to_string(&receipt(j as u64)).unwrap();
                let _: Result<(), _> = commits.set(k, body, Some(Expiration::EX(86_400)), None, false).await;
            }
            commits.all::<Vec<Value>>().await.is_ok()
        })
    })
}

/// The naive baseline on PostgreSQL: one `INSERT ... ON CONFLICT DO NOTHING` over arrays, then one
/// `UPDATE` over arrays with the results of the keys it took.
fn naive_pg_op(pool: sqlx::PgPool, prefix: String, n: usize) -> Op {
    Box::new(move |_, i| {
        let (pool, prefix) = (pool.clone(), prefix.clone());
        Box::pin(async move {
            let keys: Vec<String> = (0..n).map(|j| format!("{prefix}:{i}:{j}")).collect();
            let taken: Result<Vec<(String,)>, _> = sqlx::query_as(
                "INSERT INTO bench.naive (key, expires_at) SELECT k, now() + interval '30 seconds' FROM unnest($1::text[]) k
                 ON CONFLICT DO NOTHING RETURNING key",
            )
            .bind(&keys)
            .fetch_all(&pool)
            .await;
            let Ok(taken) = taken else { return false };
            let results: Vec<Vec<u8>> =
                (0..taken.len()).map(|j| serde_json::to_vec(&receipt(j as u64)).unwrap()).collect();
            let taken: Vec<String> = taken.into_iter().map(|(k,)| k).collect();
            sqlx::query(
                "UPDATE bench.naive AS n SET result = u.result, expires_at = now() + interval '1 day'
                 FROM unnest($1::text[], $2::bytea[]) AS u(key, result) WHERE n.key = u.key",
            )
            .bind(&taken)
            .bind(&results)
            .execute(&pool)
            .await
            .is_ok()
        })
    })
}

/// A batch row as messages: ops (batches) per second times `n`, the server's and the client's
/// CPU per message; the latencies stay per batch, the round trips per batch (`round_trips`: the
/// exact count where the server cannot tell, e.g. scripts and pipelines on Redis).
fn per_message(row: &mut Row, n: usize, round_trips: Option<f64>) {
    row.ops_per_sec *= n as f64;
    row.client_us_per_op /= n as f64;
    row.server_us_per_op = row.server_us_per_op.map(|us| us / n as f64);
    row.commands_per_op = row.commands_per_op.map(|c| c / n as f64);
    if round_trips.is_some() {
        row.round_trips_per_op = round_trips;
    }
}

/// What a batch row needs of its server: the runtime, and the naive baseline's operation.
pub struct BatchTarget<'a> {
    pub label: &'static str,
    pub idem: &'a Idempotency,
    pub naive: NaiveOn,
    /// The round trips per batch of ours and of the naive baseline, where the server's counters
    /// cannot tell them (Redis: script calls and pipelines); None: counted by the server.
    pub round_trips: Option<(f64, f64)>,
}

/// Where the naive baseline runs.
pub enum NaiveOn {
    Redis(Client),
    Pg(sqlx::PgPool),
}

/// One round of the batch rows on one server.
pub async fn batch_cases(bench: &mut Bench, t: &BatchTarget<'_>, round: usize) {
    for n in SIZES {
        let prefix = |what: &str| format!("{what}:{round}:{n}");
        let naive_op = match &t.naive {
            NaiveOn::Redis(client) => naive_redis_op(client.clone(), prefix("naive:batch"), n),
            NaiveOn::Pg(pool) => naive_pg_op(pool.clone(), prefix("naive:batch"), n),
        };
        let naive = bench.case(&format!("naive pipelined, {n}"), t.label, 1, naive_op).await;
        per_message(&mut bench.rows[naive], n, t.round_trips.map(|r| r.1));
        let each = bench
            .case(&format!("run per message, {n}"), t.label, 1, per_message_op(t.idem.clone(), prefix("each"), n))
            .await;
        per_message(&mut bench.rows[each], n, t.round_trips.map(|_| 2.0 * n as f64));
        let ours = bench.case(&format!("batch of {n}"), t.label, 1, batch_op(t.idem.clone(), prefix("batch"), n)).await;
        per_message(&mut bench.rows[ours], n, t.round_trips.map(|r| r.0));
        bench.ratio(ours, naive);
        bench.ratio(each, naive);
    }
}

/// Each batch row's ratio to per-message `run` of the same size on the same server, for the
/// table's last lines (the rows themselves carry the ratio to the naive baseline).
pub fn against_per_message(rows: &[Row]) -> Vec<String> {
    let mut out = Vec::new();
    for r in rows.iter().filter(|r| r.case.starts_with("batch of ")) {
        let n = &r.case["batch of ".len()..];
        let each = rows.iter().find(|e| e.store == r.store && e.case == format!("run per message, {n}"));
        if let Some(each) = each {
            out.push(format!(
                "{}, batch of {n}: {:.1}× per-message run ({:.0} against {:.0} messages/s)",
                r.store,
                r.ops_per_sec / each.ops_per_sec,
                r.ops_per_sec,
                each.ops_per_sec
            ));
        }
    }
    out
}
