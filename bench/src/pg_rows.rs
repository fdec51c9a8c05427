//! The rows on PostgreSQL: a cluster of the benchmark's own, ours against the naive baselines
//! (plain and transactional).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idempotency::store::postgres::sqlx::{self, Row as _};
use idempotency::{Call, CallContext, Error, Idempotency, PgStore};

use crate::counters::PgCounters;
use crate::harness::Bench;
use crate::ops::{complete_keys, conflict_op, first_op, hold_keys, receipt, replay_op, Receipt, R};
use crate::support;

/// PostgreSQL: a cluster of the benchmark's own with `pg_stat_statements` loaded (or the server at
/// `--postgres`), the store on it, and the naive baseline's tables beside the store's.
pub struct Pg {
    pub _cluster: Option<support::postgres::PgCluster>,
    pub store: PgStore,
    pub idem: Idempotency,
    pub counters: PgCounters,
}

pub async fn pg_setup(server: Option<&str>) -> Pg {
    let (cluster, url) = match server {
        Some(url) => (None, url.to_owned()),
        None => {
            let settings = ["shared_preload_libraries=pg_stat_statements", "pg_stat_statements.track_utility=on"];
            let cluster = tokio::task::block_in_place(|| support::postgres::PgCluster::start_with(&settings));
            let url = cluster.url("postgres");
            (Some(cluster), url)
        }
    };
    // The reaper off: its statements would count as the cases'.
    let store = PgStore::builder(&url)
        .schema("bench")
        .pool_size(40)
        .reap(Duration::ZERO, 1)
        .migrate()
        .connect()
        .await
        .expect("connect to PostgreSQL");
    sqlx::raw_sql(
        "CREATE EXTENSION IF NOT EXISTS pg_stat_statements;
         CREATE TABLE IF NOT EXISTS bench.naive (key text PRIMARY KEY, result bytea, expires_at timestamptz NOT NULL);
         CREATE TABLE IF NOT EXISTS bench.effects (key text NOT NULL, fence bigint NOT NULL);
         TRUNCATE bench.naive, bench.effects, bench.idempotency;",
    )
    .execute(store.pool())
    .await
    .expect("set up the benchmark's tables (and pg_stat_statements)");
    let counters = PgCounters { pool: store.pool().clone(), postmaster: cluster.as_ref().map(|c| c.pid()) };
    Pg { _cluster: cluster, idem: Idempotency::new(store.clone()), store, counters }
}

pub const NAIVE_INSERT: &str =
    "INSERT INTO bench.naive (key, expires_at) VALUES ($1, now() + interval '30 seconds') ON CONFLICT DO NOTHING";
pub const NAIVE_UPDATE: &str =
    "UPDATE bench.naive SET result = $2, expires_at = now() + interval '1 day' WHERE key = $1";
pub const EFFECT_INSERT: &str = "INSERT INTO bench.effects (key, fence) VALUES ($1, $2)";

/// A transactional first execution of `key`: the body inserts its effect row.
pub async fn pg_tx_first(pg: &PgStore, idem: &Idempotency, key: String, i: u64) -> bool {
    let r: R<Receipt> = pg
        .run_in_transaction(idem, Call::new(key), |tx| {
            Box::pin(async move {
                let ctx = CallContext::current().expect("in a call");
                sqlx::query(EFFECT_INSERT)
                    .bind(ctx.key())
                    .bind(ctx.fence().await? as i64)
                    .execute(&mut **tx)
                    .await
                    .map_err(|e| Error::InvalidCall { key: String::new(), reason: e.to_string() })?;
                Ok(receipt(i))
            })
        })
        .await;
    r.is_ok()
}

/// The naive transactional baseline: the body's insert and the record in one transaction, with no
/// owner, lease or fence.
pub async fn naive_tx_first(pool: &sqlx::PgPool, key: String, i: u64) -> bool {
    let Ok(mut tx) = pool.begin().await else { return false };
    let result = serde_json::to_vec(&receipt(i)).unwrap();
    let ok = sqlx::query(NAIVE_INSERT).bind(&key).execute(&mut *tx).await.is_ok()
        && sqlx::query(EFFECT_INSERT).bind(&key).bind(i as i64).execute(&mut *tx).await.is_ok()
        && sqlx::query(NAIVE_UPDATE).bind(&key).bind(result).execute(&mut *tx).await.is_ok();
    ok && tx.commit().await.is_ok()
}

/// The round trips the server counted while `f` ran.
pub async fn pg_count(counters: &PgCounters, f: impl Future<Output = ()>) -> u64 {
    let before = counters.read().await;
    f.await;
    (counters.read().await - before).plain
}

/// The PostgreSQL rows: ours against the naive baselines, every case in turn within each round.
pub async fn pg_rows(bench: &mut Bench, pg: &Pg, rounds: usize, concurrencies: &[usize]) {
    let pool = pg.store.pool().clone();
    complete_keys(&pg.idem, "replay:", 1000).await;
    for i in 0..1000u64 {
        sqlx::query(NAIVE_INSERT).bind(format!("naive:replay:{i}")).execute(&pool).await.unwrap();
        sqlx::query(NAIVE_UPDATE)
            .bind(format!("naive:replay:{i}"))
            .bind(b"{\"id\":1}".as_slice())
            .execute(&pool)
            .await
            .unwrap();
    }
    let release = Arc::new(AtomicBool::new(false));
    let holders = hold_keys(&pg.idem, "held:", 64, release.clone());
    tokio::time::sleep(Duration::from_millis(200)).await;
    for (round, &c) in (0..rounds).flat_map(|r| concurrencies.iter().map(move |c| (r, c))) {
        let p = pool.clone();
        let naive_first = bench
            .case("naive first (INS+UPD)", "pg", c, move |t, i| {
                let p = p.clone();
                async move {
                    let key = format!("naive:first:{round}:{c}:{t}:{i}");
                    let result = serde_json::to_vec(&receipt(i)).unwrap();
                    sqlx::query(NAIVE_INSERT).bind(&key).execute(&p).await.is_ok()
                        && sqlx::query(NAIVE_UPDATE).bind(&key).bind(result).execute(&p).await.is_ok()
                }
            })
            .await;
        let first =
            bench.case("first execution", "pg", c, first_op(pg.idem.clone(), format!("first:{round}:{c}"))).await;
        bench.ratio(first, naive_first);
        let p = pool.clone();
        let naive_replay = bench
            .case("naive replay (INS+SELECT)", "pg", c, move |_, i| {
                let p = p.clone();
                async move {
                    let key = format!("naive:replay:{}", i % 1000);
                    let _ = sqlx::query(NAIVE_INSERT).bind(&key).execute(&p).await;
                    let row =
                        sqlx::query("SELECT result FROM bench.naive WHERE key = $1").bind(&key).fetch_one(&p).await;
                    row.is_ok_and(|r| r.get::<Option<Vec<u8>>, _>(0).is_some())
                }
            })
            .await;
        let replay = bench.case("replay", "pg", c, replay_op(pg.idem.clone())).await;
        bench.ratio(replay, naive_replay);
        let conflict = bench.case("conflict", "pg", c, conflict_op(pg.idem.clone())).await;
        bench.ratio(conflict, naive_replay);
        let p = pool.clone();
        let naive_tx = bench
            .case("naive tx (BEGIN..COMMIT)", "pg", c, move |t, i| {
                let p = p.clone();
                async move { naive_tx_first(&p, format!("naive:tx:{round}:{c}:{t}:{i}"), i).await }
            })
            .await;
        let (st, idem) = (pg.store.clone(), pg.idem.clone());
        let tx = bench
            .case("transactional first", "pg", c, move |t, i| {
                let (st, idem) = (st.clone(), idem.clone());
                async move { pg_tx_first(&st, &idem, format!("tx:{round}:{c}:{t}:{i}"), i).await }
            })
            .await;
        bench.ratio(tx, naive_tx);
    }
    release.store(true, Ordering::Relaxed);
    for h in holders {
        h.await.unwrap();
    }
}
