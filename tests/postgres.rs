//! PostgreSQL-only behaviour: the transactional mode (exactly-once effects inside the database,
//! shown by SIGKILLing child processes mid-call), and faults: the server restarted mid-body (a
//! cluster of the test's own), connections killed, a statement timeout. The semantic suite runs on
//! `PgStore` from tests/semantics.rs and tests/operations.rs.

#[macro_use]
mod support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use idempotency::store::postgres::sqlx::{self, Row};
use idempotency::store::postgres::PgTransaction;
use idempotency::store::{Inspected, RecordState};
use idempotency::{Call, CallContext, Error, Force, Idempotency, OnConflict, PgStore, StoreErrorKind};
use support::postgres::{shared_database, unique_schema, PgCluster};
use support::proxy::{Direction, Proxy};
use support::{eventually, ms, AppError, R};
use tokio::time::Instant;

/// A store on the test process's database, its table in a schema of its own, with an `effects`
/// table beside it (one row per execution of a body: no unique key, so duplicates show).
async fn store_with_effects(url: &str, schema: &str, timeout: Duration) -> PgStore {
    effects_store(PgStore::builder(url).timeout(timeout), schema).await
}

/// The store `builder` makes, its table and an `effects` table in `schema`.
async fn effects_store(builder: idempotency::PgStoreBuilder, schema: &str) -> PgStore {
    let store = builder.schema(schema).migrate().connect().await.expect("connect");
    let create = format!("CREATE TABLE IF NOT EXISTS \"{schema}\".effects (key text NOT NULL, fence bigint NOT NULL)");
    sqlx::query(&create).execute(store.pool()).await.expect("create effects");
    store
}

async fn shared_store(timeout: Duration) -> (PgStore, String) {
    let url = tokio::task::block_in_place(shared_database);
    let schema = unique_schema();
    (store_with_effects(url, &schema, timeout).await, schema)
}

/// Rows of `effects` per key.
async fn effects(store: &PgStore, schema: &str) -> BTreeMap<String, i64> {
    let query = format!("SELECT key, count(*) FROM \"{schema}\".effects GROUP BY key");
    let rows = sqlx::query(&query).fetch_all(store.pool()).await.expect("count effects");
    rows.iter().map(|r| (r.get::<String, _>(0), r.get::<i64, _>(1))).collect()
}

fn insert_effect(schema: &str) -> String {
    format!("INSERT INTO \"{schema}\".effects (key, fence) VALUES ($1, $2)")
}

/// `result` is an `Error::Store` of `kind`; prints it as the caller sees it, after `label`.
fn expect_store_error<T: std::fmt::Debug>(result: &R<T>, kind: StoreErrorKind, label: &str) {
    match result {
        Err(AppError::Idem(e @ Error::Store { source, .. })) => {
            assert_eq!(source.kind(), kind, "{source}");
            println!("{label}{e}");
        }
        other => panic!("expected a {kind:?} store error, got {other:?}"),
    }
}

fn db_error(e: sqlx::Error) -> AppError {
    AppError::Idem(Error::InvalidCall { key: String::new(), reason: e.to_string() })
}

/// A transactional body that inserts its key's effect row, then does `then`.
async fn insert_then<T>(
    tx: &mut idempotency::store::postgres::PgTransaction,
    schema: &str,
    then: impl std::future::Future<Output = R<T>>,
) -> R<T> {
    let ctx = CallContext::current().expect("in a call");
    sqlx::query(&insert_effect(schema))
        .bind(ctx.key())
        .bind(ctx.fence().await? as i64)
        .execute(&mut **tx)
        .await
        .map_err(db_error)?;
    then.await
}

/// The body's writes and the record commit together: a replay runs nothing and writes nothing; an
/// `Err`, a panic or a cancelled call roll the writes back and free the key; a mutex (`keep = 0`)
/// commits its writes and deletes its row in the same transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_body_commits_with_its_record() {
    let (store, schema) = shared_store(Duration::from_secs(2)).await;
    let idem = Idempotency::new(store.clone());
    let runs = Arc::new(AtomicUsize::new(0));
    let call = |key: &str| Call::new(key).scope("tx").ttl(Duration::from_secs(30));
    for expected in [1, 1] {
        let (r, schema) = (runs.clone(), schema.clone());
        let got: R<u32> = store
            .run_in_transaction(&idem, call("ok"), |tx| {
                Box::pin(async move {
                    insert_then(tx, &schema, async {
                        r.fetch_add(1, SeqCst);
                        Ok(7)
                    })
                    .await
                })
            })
            .await;
        assert_eq!(got.unwrap(), 7);
        assert_eq!(runs.load(SeqCst), expected);
    }
    let Inspected::Record(record) = idem.inspect("tx", "ok").await.unwrap() else { panic!("no record") };
    assert_eq!(record.state, RecordState::Completed);

    // Err: rolled back, key free.
    let s = schema.clone();
    let failed: R<u32> = store
        .run_in_transaction(&idem, call("err"), |tx| {
            Box::pin(async move { insert_then(tx, &s, async { Err(AppError::Failed("declined")) }).await })
        })
        .await;
    assert!(matches!(failed, Err(AppError::Failed("declined"))), "{failed:?}");
    // Panic: rolled back, key free, the panic reaches the caller.
    let (st, id, s) = (store.clone(), idem.clone(), schema.clone());
    let panicked = tokio::spawn(async move {
        let _: R<u32> = st
            .run_in_transaction(&id, call("panic"), |tx| {
                Box::pin(async move {
                    insert_then(tx, &s, async {
                        if std::hint::black_box(true) {
                            panic!("boom in the transaction");
                        }
                        Ok(1)
                    })
                    .await
                })
            })
            .await;
    })
    .await;
    assert!(panicked.is_err(), "the panic did not reach the caller");
    // Cancelled mid-body: rolled back, key released in the background.
    let s = schema.clone();
    let cancelled = tokio::time::timeout(
        ms(300),
        store.run_in_transaction(&idem, call("cancel"), |tx| {
            Box::pin(async move {
                insert_then(tx, &s, async {
                    tokio::time::sleep(Duration::from_secs(20)).await;
                    R::Ok(1u32)
                })
                .await
            })
        }),
    )
    .await;
    assert!(cancelled.is_err());
    for key in ["err", "panic", "cancel"] {
        let s = schema.clone();
        let again: u32 = eventually(Duration::from_secs(5), "the key to be free after a rollback", || {
            let (store, idem, s) = (store.clone(), idem.clone(), s.clone());
            async move {
                let r: R<u32> = store
                    .run_in_transaction(&idem, call(key), |tx| {
                        Box::pin(async move { insert_then(tx, &s, async { Ok(2) }).await })
                    })
                    .await;
                match r {
                    Ok(v) => Some(v),
                    Err(AppError::Idem(Error::Conflict { .. })) => None,
                    Err(e) => panic!("{key}: {e:?}"),
                }
            }
        })
        .await;
        assert_eq!(again, 2);
    }
    // A mutex: the writes commit, the row goes, the next call runs again.
    for _ in 0..2 {
        let s = schema.clone();
        let r: R<()> = store
            .run_in_transaction(&idem, call("mutex").keep(Duration::ZERO), |tx| {
                Box::pin(async move { insert_then(tx, &s, async { Ok(()) }).await })
            })
            .await;
        r.unwrap();
    }
    assert_eq!(idem.inspect("tx", "mutex").await.unwrap(), Inspected::Absent);
    let counts = effects(&store, &schema).await;
    let expected: BTreeMap<String, i64> =
        [("tx:ok", 1), ("tx:err", 1), ("tx:panic", 1), ("tx:cancel", 1), ("tx:mutex", 2)]
            .into_iter()
            .map(|(k, n)| (k.to_owned(), n))
            .collect();
    assert_eq!(counts, expected, "rolled-back writes stayed, or a replay wrote");
}

/// A body under REPEATABLE READ that outlives a third of its lease: the watchdog renews the
/// record after the transaction's snapshot, and the record's UPDATE at commit is refused as a
/// serialization failure. The call fails with that kind, nothing of the body stays, and the key is
/// free at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serialization_failure_at_commit_is_a_clear_error_and_frees_the_key() {
    let (store, schema) = shared_store(Duration::from_secs(2)).await;
    let idem = Idempotency::new(store.clone());
    let call = || Call::new("serial").ttl(ms(600));
    let s = schema.clone();
    let failed: R<u32> = store
        .run_in_transaction(&idem, call(), |tx| {
            Box::pin(async move {
                sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    .execute(&mut **tx)
                    .await
                    .map_err(db_error)?;
                insert_then(tx, &s, async {
                    tokio::time::sleep(ms(500)).await; // a renewal at 200 to 300 ms
                    Ok(1)
                })
                .await
            })
        })
        .await;
    expect_store_error(&failed, StoreErrorKind::Serialization, "as the caller sees it: ");
    assert!(effects(&store, &schema).await.is_empty(), "the body's write stayed");
    let again: R<u32> = idem.run(call(), || async { Ok(2) }).await;
    assert_eq!(again.unwrap(), 2, "the key was not released");
}

/// A runtime on another store cannot complete a key in this table: the transaction's owner-checked
/// UPDATE finds no row of its, rolls back, and the call says the key was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_on_another_store_cannot_complete_a_key_here() {
    let (store, schema) = shared_store(Duration::from_secs(2)).await;
    let elsewhere = Idempotency::new(idempotency::MemoryStore::new());
    let s = schema.clone();
    let got: R<u32> = store
        .run_in_transaction(&elsewhere, Call::new("astray"), |tx| {
            Box::pin(async move { insert_then(tx, &s, async { Ok(1) }).await })
        })
        .await;
    assert!(matches!(got, Err(AppError::Idem(Error::LeaseLost { .. }))), "{got:?}");
    assert!(effects(&store, &schema).await.is_empty());
}

const EO_LEASE: Duration = Duration::from_millis(1000);
const EO_RUNS: usize = 50;

/// Not a test: the child process of `exactly_once_effects_through_kill_9`. Connects, says READY,
/// and runs one call of `IDEM_EO_KEY` whose body inserts the key's effect row, then sleeps a little
/// (`IDEM_EO_PAUSE_MS`): in a transaction with the record (`IDEM_EO_MODE=tx`), or on a connection
/// of its own (`plain`).
#[test]
#[ignore = "child process of another test"]
fn exactly_once_child() {
    let Ok(url) = std::env::var("IDEM_EO_URL") else { return };
    let schema = std::env::var("IDEM_EO_SCHEMA").unwrap();
    let key = std::env::var("IDEM_EO_KEY").unwrap();
    let pause = ms(std::env::var("IDEM_EO_PAUSE_MS").unwrap().parse().unwrap());
    let transactional = std::env::var("IDEM_EO_MODE").unwrap() == "tx";
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = PgStore::builder(&url).schema(&schema).connect().await.unwrap();
        let idem = Idempotency::new(store.clone());
        // A connection at hand, so that the kill's timing is about the call, not the connect.
        sqlx::query("SELECT 1").execute(store.pool()).await.unwrap();
        println!("READY");
        let _ = run_once(&store, &idem, &schema, &key, pause, transactional).await;
        println!("DONE");
    });
}

/// One call of `key` whose body inserts its effect row and pauses: transactional or not.
async fn run_once(
    store: &PgStore,
    idem: &Idempotency,
    schema: &str,
    key: &str,
    pause: Duration,
    transactional: bool,
) -> R<u64> {
    let call = Call::new(key).ttl(EO_LEASE);
    if transactional {
        let schema = schema.to_owned();
        store
            .run_in_transaction(idem, call, |tx| {
                Box::pin(async move {
                    insert_then(tx, &schema, async {
                        tokio::time::sleep(pause).await;
                        Ok(CallContext::current().unwrap().fence().await?)
                    })
                    .await
                })
            })
            .await
    } else {
        let (pool, sql) = (store.pool().clone(), insert_effect(schema));
        idem.run(call, || async move {
            let ctx = CallContext::current().unwrap();
            sqlx::query(&sql).bind(ctx.key()).bind(ctx.fence().await? as i64).execute(&pool).await.map_err(db_error)?;
            tokio::time::sleep(pause).await;
            Ok(ctx.fence().await?)
        })
        .await
    }
}

/// A tiny deterministic generator (xorshift), seeded per run: the kill points.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// What one mode of `exactly_once_effects_through_kill_9` saw.
#[derive(Debug)]
struct KillRun {
    /// Children killed before they printed DONE.
    killed: usize,
    /// Keys whose effect row is there more than once, after the retries.
    duplicates: usize,
    /// Keys without their effect row, after the retries.
    missing: usize,
    /// Keys whose record is not COMPLETED after the retries.
    not_completed: usize,
}

async fn kill_run(transactional: bool, seed: u64) -> KillRun {
    let url = tokio::task::block_in_place(shared_database).to_owned();
    let schema = unique_schema();
    let store = store_with_effects(&url, &schema, Duration::from_secs(2)).await;
    let idem = Idempotency::new(store.clone());
    let mode = if transactional { "tx" } else { "plain" };
    let mut rng = Rng(seed | 1);
    let mut killed = 0;
    for i in 0..EO_RUNS {
        let key = format!("eo:{i}");
        let pause = 5 + rng.below(25);
        // Aimed at the call, which takes the pause plus a few milliseconds (acquire, insert,
        // commit): the kill lands before, inside or just after the body, mid-commit, or after
        // the call. A window not tied to the pause (0-45 ms) let about half the children finish
        // first on a quiet machine, under the run's own bound of a half killed.
        let kill_after = rng.below(pause + 10);
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["exactly_once_child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env("IDEM_EO_URL", &url)
            .env("IDEM_EO_SCHEMA", &schema)
            .env("IDEM_EO_KEY", &key)
            .env("IDEM_EO_PAUSE_MS", pause.to_string())
            .env("IDEM_EO_MODE", mode)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the child");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        tokio::task::block_in_place(|| {
            assert!(lines.any(|l| l.is_ok_and(|l| l.contains("READY"))), "the child never got ready");
            std::thread::sleep(ms(kill_after));
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap();
        });
        if !lines.any(|l| l.is_ok_and(|l| l.contains("DONE"))) {
            killed += 1;
        }
    }
    // Every lease a killed child held runs out; then each key is called again (a retry).
    tokio::time::sleep(EO_LEASE + ms(300)).await;
    for i in 0..EO_RUNS {
        let key = format!("eo:{i}");
        run_once(&store, &idem, &schema, &key, Duration::ZERO, transactional)
            .await
            .unwrap_or_else(|e| panic!("{key} after every lease ran out: {e:?}"));
    }
    let counts = effects(&store, &schema).await;
    let mut run = KillRun { killed, duplicates: 0, missing: 0, not_completed: 0 };
    for i in 0..EO_RUNS {
        let key = format!("eo:{i}");
        match counts.get(&key).copied().unwrap_or(0) {
            0 => run.missing += 1,
            1 => {}
            _ => run.duplicates += 1,
        }
        match idem.inspect("", &key).await.unwrap() {
            Inspected::Record(r) if r.state == RecordState::Completed => {}
            _ => run.not_completed += 1,
        }
    }
    run
}

/// 50 children each run one call of their own key and are SIGKILLed at a random point (before,
/// during or after the body, mid-commit); after the leases and a retry of every key, the
/// transactional mode has exactly one effect row per key and every record completed. The control,
/// the same with the insert outside the record's transaction, must show duplicates: a child
/// killed between its insert and its commit leaves the row, and the retry inserts another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_effects_through_kill_9() {
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let tx = kill_run(true, seed).await;
    println!("transactional: {EO_RUNS} calls, seed {seed}: {tx:?}");
    assert_eq!((tx.duplicates, tx.missing, tx.not_completed), (0, 0, 0), "{tx:?}");
    assert!(tx.killed >= EO_RUNS / 2, "too few children were killed mid-call for the run to mean anything: {tx:?}");
    let plain = kill_run(false, seed ^ 0x9e37_79b9).await;
    println!("plain run, insert on its own connection: {EO_RUNS} calls: {plain:?}");
    assert_eq!((plain.missing, plain.not_completed), (0, 0), "{plain:?}");
    assert!(plain.duplicates >= 1, "the control saw no duplicate: the kills missed the window it shows ({plain:?})");
}

/// The server restarted as after a crash (`-m immediate`) while a transactional body runs: the
/// call fails with an `Unavailable` store error (its transaction died with the server), nothing of
/// the body stays, and the key is free again within its lease; a plain call in flight at the same
/// time gets its value, its commit retried until the server is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_mid_body_leaves_no_effect_and_no_stuck_key() {
    let mut cluster = tokio::task::block_in_place(PgCluster::start);
    let schema = "restart";
    let store = store_with_effects(&cluster.url("postgres"), schema, ms(800)).await;
    let idem = Idempotency::new(store.clone());
    let lease = Duration::from_secs(3);
    let (inserted_tx, inserted) = tokio::sync::oneshot::channel();
    let (st, id) = (store.clone(), idem.clone());
    let transactional = tokio::spawn(async move {
        st.run_in_transaction(&id, Call::new("tx").ttl(lease), |tx| {
            Box::pin(async move {
                insert_then(tx, schema, async {
                    let _ = inserted_tx.send(());
                    tokio::time::sleep(ms(1500)).await;
                    R::Ok(1u32)
                })
                .await
            })
        })
        .await
    });
    let id = idem.clone();
    let (running_tx, running) = tokio::sync::oneshot::channel();
    let plain = tokio::spawn(async move {
        id.run(Call::new("plain").ttl(lease), || async {
            let _ = running_tx.send(());
            tokio::time::sleep(ms(1500)).await;
            R::Ok(2u32)
        })
        .await
    });
    // Both bodies run (their keys taken) before the server goes.
    inserted.await.unwrap();
    running.await.unwrap();
    let restarted = Instant::now();
    tokio::task::block_in_place(|| cluster.restart_immediate());
    println!("restarted in {:?}", restarted.elapsed());
    let failed = transactional.await.unwrap();
    expect_store_error(&failed, StoreErrorKind::Unavailable, "the transactional call: ");
    assert_eq!(plain.await.unwrap().unwrap(), 2, "the plain call lost its value");
    let replay: R<u32> = idem.run(Call::new("plain").ttl(lease), || async { Ok(3) }).await;
    assert_eq!(replay.unwrap(), 2, "the plain call's commit did not land after the restart");
    let freed = eventually(lease + Duration::from_secs(3), "the transactional key to be free", || {
        let (store, idem) = (store.clone(), idem.clone());
        async move {
            let r: R<u32> = store
                .run_in_transaction(&idem, Call::new("tx").ttl(lease), |tx| {
                    Box::pin(async move { insert_then(tx, schema, async { Ok(4) }).await })
                })
                .await;
            match r {
                Ok(v) => Some((v, restarted.elapsed())),
                Err(AppError::Idem(Error::Conflict { .. } | Error::Store { .. })) => None,
                Err(e) => panic!("{e:?}"),
            }
        }
    })
    .await;
    assert_eq!(freed.0, 4);
    println!("the transactional key ran again {:?} after the restart began (lease {lease:?})", freed.1);
    let counts = effects(&store, schema).await;
    assert_eq!(counts.get("tx"), Some(&1), "{counts:?}");
}

/// Opening a connection can take longer than a call may wait: after a restart on a loaded machine
/// the server is slow to take connections, and under a short store timeout (here 100 ms, while
/// the relay holds each new connection for 200 ms) no call can open one in time. The pools were
/// emptied by the restart and stayed empty: every call failed, and a running body's renewals too,
/// until its lease was lost. A connection is opened within the connect timeout whether the call
/// that needed it still waits or not: the calls right after the restart fail, the next ones
/// succeed, and the body that ran across the restart keeps its lease and commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_the_pools_refill_though_connecting_takes_longer_than_a_call_may_wait() {
    let mut cluster = tokio::task::block_in_place(PgCluster::start);
    let relay = Proxy::start(cluster.port());
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", relay.port());
    let builder = PgStore::builder(&url).timeout(ms(100)).connect_timeout(Duration::from_secs(5));
    let store = builder.schema("refill").migrate().connect().await.expect("connect");
    let idem = Idempotency::new(store.clone());
    let before: R<u32> = idem.run(Call::new("before"), || async { Ok(1) }).await;
    assert_eq!(before.unwrap(), 1);

    let (running_tx, running) = tokio::sync::oneshot::channel();
    let id = idem.clone();
    let across = tokio::spawn(async move {
        id.run(Call::new("across").ttl(Duration::from_secs(2)), || async {
            let _ = running_tx.send(());
            tokio::time::sleep(Duration::from_secs(4)).await;
            R::Ok(2u32)
        })
        .await
    });
    running.await.unwrap();
    relay.set_connect_delay(ms(200));
    tokio::task::block_in_place(|| cluster.restart_immediate());

    let mut failed = Vec::new();
    loop {
        let call = Call::new(format!("after-{}", failed.len()));
        match idem.run(call, || async { R::Ok(3u32) }).await {
            Ok(v) => break assert_eq!(v, 3),
            Err(AppError::Idem(Error::Store { source, .. })) => failed.push(source.to_string()),
            Err(e) => panic!("{e:?}"),
        }
        // A call every 150 ms; the refill the first failure starts has its connection about 200 ms
        // later, so the third or fourth call succeeds: ten failures mean no refill.
        assert!(failed.len() < 10, "10 calls after the restart failed; the last: {}", failed[9]);
        tokio::time::sleep(ms(50)).await;
    }
    println!("{} calls failed after the restart before one succeeded: {failed:?}", failed.len());
    assert_eq!(across.await.unwrap().unwrap(), 2, "the body that ran across the restart lost its lease");
    let replay: R<u32> = idem.run(Call::new("across"), || async { Ok(4) }).await;
    assert_eq!(replay.unwrap(), 2, "the commit after the restart did not land");
}

/// Connections killed with `pg_terminate_backend`: a transactional body's own connection (the call
/// fails as `Unavailable`, its write rolled back, the key free at once), and the store's LISTEN
/// connection (a waiter is still woken by the holder's commit: the store listens again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connections_are_clear_errors_and_listening_resumes() {
    let url = tokio::task::block_in_place(shared_database);
    let schema = unique_schema();
    // A name of its own, to find this store's LISTEN connection among the other tests'.
    let app = format!("idem-kill-{schema}");
    let store = effects_store(PgStore::builder(url).application_name(&app), &schema).await;
    let idem = Idempotency::new(store.clone());
    let killer = store.pool().clone();
    let terminate = |pid: i32| {
        let killer = killer.clone();
        async move {
            let (done,): (bool,) =
                sqlx::query_as("SELECT pg_terminate_backend($1)").bind(pid).fetch_one(&killer).await.unwrap();
            assert!(done, "backend {pid} not terminated");
        }
    };

    let (pid_tx, pid_rx) = tokio::sync::oneshot::channel::<i32>();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let (st, id, s) = (store.clone(), idem.clone(), schema.clone());
    let call = tokio::spawn(async move {
        st.run_in_transaction(&id, Call::new("killed"), |tx| {
            Box::pin(async move {
                let (pid,): (i32,) =
                    sqlx::query_as("SELECT pg_backend_pid()").fetch_one(&mut **tx).await.map_err(db_error)?;
                insert_then(tx, &s, async {
                    let _ = pid_tx.send(pid);
                    let _ = go_rx.await;
                    R::Ok(1u32)
                })
                .await
            })
        })
        .await
    });
    terminate(pid_rx.await.unwrap()).await;
    go_tx.send(()).unwrap();
    let failed = call.await.unwrap();
    expect_store_error(&failed, StoreErrorKind::Unavailable, "the call whose connection was killed: ");
    assert!(effects(&store, &schema).await.is_empty(), "the killed transaction's write stayed");
    let again: R<u32> = idem.run(Call::new("killed"), || async { Ok(2) }).await;
    assert_eq!(again.unwrap(), 2, "the key was not released at once");

    // The LISTEN connection: a waiter (no periodic re-check to save it) still hears the commit.
    let waiter_idem = Idempotency::builder(store.clone()).wait_recheck(Duration::from_secs(30)).build();
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let holder = tokio::spawn({
        let idem = idem.clone();
        async move {
            idem.run(Call::new("watched"), || async move {
                let _ = release_rx.await;
                R::Ok(String::from("from the holder"))
            })
            .await
        }
    });
    tokio::time::sleep(ms(100)).await;
    let waiter = tokio::spawn(async move {
        let call = Call::new("watched").on_conflict(OnConflict::Wait(Duration::from_secs(20)));
        let r: R<String> = waiter_idem.run(call, || async { Ok(String::from("from the waiter")) }).await;
        (r, Instant::now())
    });
    tokio::time::sleep(ms(300)).await; // the waiter listens and waits
    let (listener,): (i32,) =
        sqlx::query_as("SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND query ILIKE 'LISTEN%'")
            .bind(&app)
            .fetch_one(store.pool())
            .await
            .expect("the store's LISTEN connection");
    terminate(listener).await;
    tokio::time::sleep(ms(500)).await; // listening again
    release_tx.send(()).unwrap();
    let committed = Instant::now();
    assert_eq!(holder.await.unwrap().unwrap(), "from the holder");
    let (got, woke) = waiter.await.unwrap();
    assert_eq!(got.unwrap(), "from the holder");
    let after = woke.saturating_duration_since(committed);
    assert!(after < Duration::from_secs(2), "the waiter woke {after:?} after the commit: not by a notification");
    println!("after the LISTEN connection was killed, a waiter woke {after:?} after the holder's commit");
}

/// A statement that cannot finish in time (the table locked by another session): the call fails
/// within about the store's timeout with a `Timeout` store error, and once the lock goes the key
/// is not held (the acquire that timed out left nothing). The store talks through a relay that
/// holds each command 40 ms, so the server's `statement_timeout` starts 40 ms after the client's
/// clock. The client used to give up at the same bound, first: the statement, still waiting for
/// the lock, then took the key when the lock went, and held it until the background release
/// reached it (the row was there right after the rollback). Now the client waits for the server's
/// cancel (the timeout and a grace of 100 ms here), and the acquire is known to have taken nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_timeout_is_a_timeout_error_and_leaves_no_key() {
    let (direct, schema) = shared_store(ms(500)).await;
    let url = tokio::task::block_in_place(shared_database);
    let (relay, relayed) = Proxy::in_front_of(url);
    let store = PgStore::builder(&relayed).schema(&schema).timeout(ms(500)).connect().await.expect("connect");
    relay.set_latency(Direction::Up, ms(40));
    let idem = Idempotency::new(store.clone());
    let mut locker = direct.pool().begin().await.unwrap();
    sqlx::query("SET LOCAL statement_timeout = 0").execute(&mut *locker).await.unwrap();
    sqlx::query(&format!("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE", store.table())).execute(&mut *locker).await.unwrap();
    let started = Instant::now();
    let timed_out: R<u32> = idem.run(Call::new("locked").ttl(Duration::from_secs(2)), || async { Ok(1) }).await;
    let took = started.elapsed();
    expect_store_error(&timed_out, StoreErrorKind::Timeout, &format!("after {took:?}: "));
    assert!(took < ms(1500), "the call took {took:?}, past its bound");
    locker.rollback().await.unwrap();
    // Before the background release (40 ms away through the relay) could remove it.
    tokio::time::sleep(ms(10)).await;
    let rows = format!("SELECT count(*) FROM {} WHERE key LIKE '%locked'", direct.table());
    let (held,): (i64,) = sqlx::query_as(&rows).fetch_one(direct.pool()).await.unwrap();
    assert_eq!(held, 0, "the acquire the client gave up on took the key when the lock went");
    let got: R<u32> = idem.run(Call::new("locked").ttl(Duration::from_secs(2)), || async { Ok(2) }).await;
    assert_eq!(got.unwrap(), 2, "the timed-out acquire left the key held");
}

/// A replay cache on one store follows forgets made through another (its own LISTEN connection):
/// within a second of the forget, the reader answers the new result, not its cached copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_reaches_another_stores_replay_cache() {
    let url = tokio::task::block_in_place(shared_database);
    let schema = unique_schema();
    let stores = support::postgres::connect_clients(url, &schema, 2).await;
    let reader = Idempotency::builder(stores[0].clone()).replay_cache(100).build();
    let writer = Idempotency::new(stores[1].clone());
    let call = || Call::new("k").scope("purge").keep(Duration::from_secs(3600));
    let first: R<String> = reader.run(call(), || async { Ok("first".to_owned()) }).await;
    assert_eq!(first.unwrap(), "first");
    // Following purges takes a moment; a replay after it caches the result.
    tokio::time::sleep(ms(300)).await;
    let replay: R<String> = reader.run(call(), || async { Ok("reader ran".to_owned()) }).await;
    assert_eq!(replay.unwrap(), "first");
    // The stored result changed behind the runtime's back (no purge): the reader still answers
    // "first", from its cache.
    let tamper =
        format!("UPDATE {} SET result = convert_to('\"tampered\"', 'UTF8') WHERE key = 'purge:k'", stores[0].table());
    sqlx::query(&tamper).execute(stores[0].pool()).await.unwrap();
    let cached: R<String> = reader.run(call(), || async { Ok("reader ran".to_owned()) }).await;
    assert_eq!(cached.unwrap(), "first", "not answered from the cache");
    assert_eq!(
        writer.forget("purge", "k", Force::CompletedOnly).await.unwrap(),
        idempotency::store::Forgotten::Deleted(RecordState::Completed)
    );
    let forgotten = Instant::now();
    let second: R<String> = writer.run(call(), || async { Ok("second".to_owned()) }).await;
    assert_eq!(second.unwrap(), "second");
    let seen = eventually(Duration::from_secs(1), "the reader to drop its cached copy", || async {
        let got: R<String> = reader.run(call(), || async { Ok("reader ran".to_owned()) }).await;
        (got.unwrap() == "second").then(|| forgotten.elapsed())
    })
    .await;
    println!("the reader answered the new result {seen:?} after the other store forgot the key");
}

/// What a function with `tx = ...` runs on: its runtime, and the store its transaction is of.
struct Shop {
    idem: Idempotency,
    pg: PgStore,
    schema: String,
}

/// The attribute's transactional mode: `tx` is the body's transaction (callers do not pass it),
/// and the block borrows the function's other arguments (`&Shop`, `&str`).
#[idempotency::idempotent(key = "order:{order_ref}", scope = "shop", store = shop.idem, tx = shop.pg)]
async fn place_order(shop: &Shop, order_ref: &str, fail: bool, tx: &mut PgTransaction) -> R<i64> {
    let fence = CallContext::current().expect("in a call").fence().await? as i64;
    sqlx::query(&insert_effect(&shop.schema)).bind(order_ref).bind(fence).execute(&mut **tx).await.map_err(db_error)?;
    if fail {
        return Err(AppError::Failed("declined after its insert"));
    }
    Ok(fence)
}

/// `#[idempotent(tx = ...)]`: the function's writes commit with its record, once per key; an
/// `Err` after a write rolls it back and frees the key for a retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attribute_runs_a_function_in_a_transaction() {
    let (pg, schema) = shared_store(Duration::from_secs(5)).await;
    let shop = Shop { idem: Idempotency::new(pg.clone()), pg: pg.clone(), schema: schema.clone() };
    let first = place_order(&shop, "a", false).await.unwrap();
    let again = place_order(&shop, "a", false).await.unwrap();
    assert_eq!(again, first, "the duplicate was not replayed");
    assert!(matches!(place_order(&shop, "b", true).await, Err(AppError::Failed(_))));
    assert_eq!(effects(&pg, &schema).await.get("b"), None, "the failed body's insert stayed");
    let retried = place_order(&shop, "b", false).await.unwrap();
    assert!(retried > first);
    let rows = effects(&pg, &schema).await;
    assert_eq!((rows.get("a"), rows.get("b")), (Some(&1), Some(&1)), "{rows:?}");
}

/// With `pool_size(1)`: the `LISTEN` connection does not take the only connection (calls work,
/// a waiter is woken by the holder's commit and gets its value, the row is completed), and a
/// transactional body holding that connection past its lease keeps the lease (renewals have
/// connections of their own): a second caller is refused, never run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_full_of_bodies_starves_neither_notifications_nor_renewals() {
    let url = tokio::task::block_in_place(shared_database);
    let schema = unique_schema();
    let store = effects_store(PgStore::builder(url).pool_size(1).timeout(Duration::from_millis(800)), &schema).await;
    let idem = Idempotency::builder(store.clone()).replay_cache(100).build();
    let runs = Arc::new(AtomicUsize::new(0));
    let body = |n: u32| {
        let runs = runs.clone();
        move || async move {
            runs.fetch_add(1, SeqCst);
            tokio::time::sleep(ms(300)).await;
            R::Ok(n)
        }
    };
    let holder = tokio::spawn({
        let idem = idem.clone();
        let body = body(1);
        async move { idem.run(Call::new("listened"), body).await }
    });
    tokio::time::sleep(ms(100)).await;
    let waited = idem.run(Call::new("listened").on_conflict(OnConflict::Wait(Duration::from_secs(5))), body(2)).await;
    assert_eq!(holder.await.unwrap().unwrap(), 1);
    assert_eq!(waited.unwrap(), 1, "the waiter did not get the holder's value");
    assert_eq!(runs.load(SeqCst), 1);
    match idem.inspect("", "listened").await.unwrap() {
        Inspected::Record(view) => assert_eq!(view.state, RecordState::Completed),
        other => panic!("{other:?}"),
    }

    // A transactional body on the only connection, for three leases.
    let long = tokio::spawn({
        let (store, idem, schema) = (store.clone(), idem.clone(), schema.clone());
        async move {
            store
                .run_in_transaction(&idem, Call::new("held").ttl(ms(400)), |tx| {
                    Box::pin(async move {
                        insert_then(tx, &schema, async {
                            tokio::time::sleep(ms(1200)).await;
                            Ok(CallContext::current().unwrap().is_lease_lost())
                        })
                        .await
                    })
                })
                .await
        }
    });
    tokio::time::sleep(ms(200)).await;
    let seconds = Arc::new(AtomicUsize::new(0));
    while !long.is_finished() {
        let s = seconds.clone();
        // Refused (the key is held), timed out waiting for the pool's one connection, or, once
        // the first is done, its value replayed: never run.
        let _: R<bool> = idem
            .run(Call::new("held"), || async move {
                s.fetch_add(1, SeqCst);
                Ok(true)
            })
            .await;
        tokio::time::sleep(ms(100)).await;
    }
    let lost: R<bool> = long.await.unwrap();
    assert!(!lost.unwrap(), "the transactional body's lease was lost: renewals starved");
    assert_eq!(seconds.load(SeqCst), 0, "a second caller ran while the transactional body held the key");
}

/// A table of schema version 1 (before the columns of attempts), with a completed row and a held
/// one: a store connecting without migrating refuses it at connect and says what to run; after
/// `.migrate()` the old rows read as before (the completed one replays, the held one conflicts)
/// and the new states are allowed (a failure counted, a key given up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_table_is_refused_until_migrated_and_then_reads_as_before() {
    let url = tokio::task::block_in_place(shared_database);
    let schema = unique_schema();
    let v1 = include_str!("support/schema_v1.sql").replace("{schema}", &schema).replace("{table}", "idempotency");
    let admin = sqlx::PgPool::connect(url).await.unwrap();
    sqlx::raw_sql(&v1).execute(&admin).await.expect("a version 1 table");
    let rows = format!(
        "INSERT INTO \"{schema}\".idempotency (key, state, owner, fence, result, stored_at, expires_at) VALUES \
         ('orders:done', 'C', NULL, 7, convert_to('5', 'UTF8'), now(), now() + interval '1 hour'), \
         ('orders:held', 'P', 'AAAAAAAAAAAAAAAAAAAAAA', NULL, NULL, NULL, now() + interval '1 hour')"
    );
    sqlx::query(&rows).execute(&admin).await.unwrap();

    let refused = PgStore::builder(url).schema(&schema).connect().await.map(drop);
    let e = refused.expect_err("a version 1 table is refused at connect");
    assert!(e.to_string().contains("schema version 1") && e.to_string().contains("migrate"), "{e}");

    let store = PgStore::builder(url).schema(&schema).migrate().connect().await.expect("migrated");
    let idem = Idempotency::new(store);
    let call = |key: &str| Call::new(key).scope("orders");
    assert_eq!(idem.run(call("done"), || async { R::Ok(6u32) }).await.unwrap(), 5, "the old result replays");
    let held = idem.run(call("held"), || async { R::Ok(6u32) }).await;
    assert!(matches!(held, Err(AppError::Idem(Error::Conflict { .. }))), "{held:?}");
    let failed = idem.run(call("new").give_up_after(1), || async { R::<u32>::Err(AppError::Failed("no")) }).await;
    assert!(matches!(failed, Err(AppError::Failed("no"))), "{failed:?}");
    let gave_up = idem.run(call("new").give_up_after(1), || async { R::Ok(6u32) }).await;
    assert!(matches!(gave_up, Err(AppError::Idem(Error::GaveUp { attempts: 1, .. }))), "{gave_up:?}");
    // Migrating again changes nothing.
    let again = PgStore::builder(url).schema(&schema).migrate().connect().await.expect("migrated twice");
    let idem = Idempotency::new(again);
    assert_eq!(idem.run(call("done"), || async { R::Ok(6u32) }).await.unwrap(), 5);
}

/// A first execution calls the table's acquire function (schema version 3) where it is there: a
/// store that found it fails once it is dropped. A table without it (migrated by an earlier
/// version, or by hand from one) is not refused: a store connecting to it sends the statement the
/// function wraps, and gets the same answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_executions_call_the_acquire_function_and_do_without_it() {
    let url = tokio::task::block_in_place(shared_database);
    let schema = unique_schema();
    let with = PgStore::builder(url).schema(&schema).migrate().connect().await.expect("migrated");
    let idem = Idempotency::new(with.clone());
    let call = |key: &str| Call::new(key).scope("orders");
    assert_eq!(idem.run(call("a"), || async { R::Ok(1u32) }).await.unwrap(), 1);
    assert_eq!(idem.run(call("a"), || async { R::Ok(2u32) }).await.unwrap(), 1, "replayed through the function");

    let drop_function =
        format!("DROP FUNCTION \"{schema}\".idempotency_acquire(text, text, text, bigint, boolean, text, bigint)");
    sqlx::query(&drop_function).execute(with.pool()).await.expect("drop the function");
    let gone = idem.run(call("b"), || async { R::Ok(3u32) }).await;
    match gone {
        Err(AppError::Idem(Error::Store { source, .. })) => {
            assert!(source.to_string().contains("idempotency_acquire"), "{source}")
        }
        other => panic!("a store that found the function calls it: {other:?}"),
    }

    let without = PgStore::builder(url).schema(&schema).connect().await.expect("a table without the function");
    let idem = Idempotency::new(without);
    assert_eq!(idem.run(call("b"), || async { R::Ok(3u32) }).await.unwrap(), 3);
    assert_eq!(idem.run(call("b"), || async { R::Ok(4u32) }).await.unwrap(), 3, "replayed by the statement");
    assert_eq!(idem.run(call("a"), || async { R::Ok(5u32) }).await.unwrap(), 1);

    // Migrating brings it back, and a store that calls it sees the same records.
    let again = PgStore::builder(url).schema(&schema).migrate().connect().await.expect("migrated again");
    let idem = Idempotency::new(again);
    assert_eq!(idem.run(call("b"), || async { R::Ok(6u32) }).await.unwrap(), 3);
    assert_eq!(idem.run(call("c"), || async { R::Ok(7u32) }).await.unwrap(), 7);
}

/// A user who may not execute the acquire function (a database that revoked the default
/// `EXECUTE` from everyone) is not refused: its store sends the statement, with the same answers.
/// On a cluster of the test's own, as it makes a role.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_execute_on_the_acquire_function_acquires_through_the_statement() {
    let cluster = tokio::task::block_in_place(PgCluster::start);
    let admin = PgStore::builder(&cluster.url("postgres")).schema("app").migrate().connect().await.expect("migrated");
    sqlx::raw_sql(
        "CREATE ROLE app_user LOGIN;
         GRANT USAGE ON SCHEMA app TO app_user;
         GRANT SELECT, INSERT, UPDATE, DELETE ON app.idempotency, app.idempotency_secret TO app_user;
         GRANT USAGE ON SEQUENCE app.idempotency_fence TO app_user;
         REVOKE EXECUTE ON FUNCTION app.idempotency_acquire(text, text, text, bigint, boolean, text, bigint)
             FROM PUBLIC;",
    )
    .execute(admin.pool())
    .await
    .expect("a user without EXECUTE on the function");
    let url = format!("postgres://app_user@127.0.0.1:{}/postgres", cluster.port());
    let store = PgStore::builder(&url).schema("app").connect().await.expect("connect without EXECUTE");
    let idem = Idempotency::new(store);
    let call = |key: &str| Call::new(key).scope("orders");
    assert_eq!(idem.run(call("a"), || async { R::Ok(1u32) }).await.unwrap(), 1);
    assert_eq!(idem.run(call("a"), || async { R::Ok(2u32) }).await.unwrap(), 1, "replayed by the statement");
    // The function is there and refuses this user: a call of it would fail, so the store did not
    // call it.
    let call_it = "SELECT * FROM app.idempotency_acquire('k', 'o', NULL, 1000, false, '0', 0)";
    let refused = sqlx::query(call_it).execute(&sqlx::PgPool::connect(&url).await.unwrap()).await;
    assert!(refused.is_err_and(|e| e.to_string().contains("permission denied")));
}
