//! The inbox pattern on PostgreSQL (`PgStore::run_batch_in_transaction`): a batch's writes and its
//! records commit in one transaction. A failed body's writes go with its savepoint; a record that
//! is not the batch's any more at the commit, or a batch dropped before it, leaves nothing; and
//! through kill -9 at random points every key's effect happens exactly once.

mod support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use idempotency::store::postgres::sqlx::{self, Row};
use idempotency::store::postgres::PgTransaction;
use idempotency::store::{Inspected, RecordState};
use idempotency::{Batch, Call, CallContext, Error, Idempotency, PgStore, Settled};
use support::postgres::{delete_record, shared_database, unique_schema};
use support::proxy::Proxy;
use support::{ms, AppError, R};

/// A store in a schema of its own, with an `effects` table beside it (one row per body that ran:
/// no unique key, so a duplicate shows).
async fn store(url: &str, schema: &str) -> PgStore {
    let store = PgStore::builder(url).schema(schema).migrate().connect().await.expect("connect");
    let create = format!("CREATE TABLE IF NOT EXISTS \"{schema}\".effects (key text NOT NULL, fence bigint NOT NULL)");
    sqlx::query(&create).execute(store.pool()).await.expect("create effects");
    store
}

async fn shared_store() -> (PgStore, String) {
    let url = tokio::task::block_in_place(shared_database);
    let schema = unique_schema();
    (store(url, &schema).await, schema)
}

/// Rows of `effects` per key.
async fn effects(store: &PgStore, schema: &str) -> BTreeMap<String, i64> {
    let query = format!("SELECT key, count(*) FROM \"{schema}\".effects GROUP BY key");
    let rows = sqlx::query(&query).fetch_all(store.pool()).await.expect("count effects");
    rows.iter().map(|r| (r.get::<String, _>(0), r.get::<i64, _>(1))).collect()
}

/// Inserts the current item's effect row in `tx`.
async fn insert_effect(tx: &mut PgTransaction, schema: &str) -> R<()> {
    let ctx = CallContext::current().expect("in an item's context");
    let sql = format!("INSERT INTO \"{schema}\".effects (key, fence) VALUES ($1, $2)");
    let fence = ctx.fence().await? as i64;
    sqlx::query(&sql)
        .bind(ctx.key())
        .bind(fence)
        .execute(&mut **tx)
        .await
        .map_err(|e| AppError::Idem(Error::InvalidCall { key: ctx.key().to_owned(), reason: e.to_string() }))?;
    Ok(())
}

/// Runs `batch` in one transaction, each body writing its effect and answering its index.
async fn run_writing(store: &PgStore, schema: &str, batch: Batch<u32>) -> Vec<Settled<u32, AppError>> {
    store
        .run_batch_in_transaction(batch, |mut tx, i, _| {
            let schema = schema.to_owned();
            async move {
                let out = insert_effect(&mut tx, &schema).await.map(|()| i as u32);
                (tx, out)
            }
        })
        .await
}

fn calls(keys: &[&str], ttl: Duration) -> Vec<Call> {
    keys.iter().map(|k| Call::new(*k).scope("inbox").ttl(ttl)).collect()
}

fn names<T, E>(settled: &[Settled<T, E>]) -> Vec<&'static str> {
    settled
        .iter()
        .map(|s| match s {
            Settled::Executed { stored: true, .. } => "executed",
            Settled::Executed { stored: false, .. } => "executed, not stored",
            Settled::Replayed(_) => "replayed",
            Settled::InProgress => "in progress",
            Settled::Failed(_) => "failed",
            Settled::GaveUp { .. } => "gave up",
            Settled::Held(_) => "held",
            Settled::Refused(_) => "refused",
            Settled::Unavailable(_) => "unavailable",
        })
        .collect()
}

/// Each body writes its effect; the third also fails after its write. The batch commits four
/// effects with their records; the failed one's write is gone with its savepoint and its key is
/// free: claimed again, the four are replayed (nothing written) and the failed one runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_commits_its_writes_with_its_records() {
    let (store, schema) = shared_store().await;
    let idem = Idempotency::new(store.clone());
    let keys = ["m0", "m1", "m2", "m3", "m4", "m1"];
    let batch = idem.claim::<u32>(calls(&keys, Duration::from_secs(10))).await;
    let settled = store
        .run_batch_in_transaction(batch, |mut tx, i, _| {
            let schema = schema.clone();
            async move {
                let out = match insert_effect(&mut tx, &schema).await {
                    Ok(()) if i == 2 => Err(AppError::Failed("the third body fails after its write")),
                    Ok(()) => Ok(i as u32),
                    Err(e) => Err(e),
                };
                (tx, out)
            }
        })
        .await;
    assert_eq!(names(&settled), ["executed", "executed", "failed", "executed", "executed", "in progress"]);
    let once: BTreeMap<String, i64> = ["inbox:m0", "inbox:m1", "inbox:m3", "inbox:m4"].map(|k| (k.into(), 1)).into();
    let found = effects(&store, &schema).await;
    assert_eq!(found, once, "the four effects, and not the failed body's write");

    let again = idem.claim::<u32>(calls(&keys[..5], Duration::from_secs(10))).await;
    assert_eq!(again.to_run(), 1, "only the failed item's key is free");
    let settled = store
        .run_batch_in_transaction(again, |mut tx, i, _| {
            let schema = schema.clone();
            async move {
                let out = insert_effect(&mut tx, &schema).await.map(|()| i as u32 + 100);
                (tx, out)
            }
        })
        .await;
    assert_eq!(names(&settled), ["replayed", "replayed", "executed", "replayed", "replayed"]);
    assert!(matches!(settled[1], Settled::Replayed(Ok(1))), "{:?}", settled[1]);
    let found = effects(&store, &schema).await;
    assert_eq!((found.len(), found.values().all(|&n| n == 1)), (5, true), "{found:?}");
}

/// While the first body runs, an operator deletes the second item's record: at the commit it is
/// not the batch's any more, so the whole transaction rolls back (the first item's write too),
/// both items are unavailable, the second as a lost lease, and both keys are free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_lost_before_the_commit_rolls_back_the_whole_batch() {
    let (store, schema) = shared_store().await;
    let idem = Idempotency::new(store.clone());
    let batch = idem.claim::<u32>(calls(&["a", "b"], Duration::from_secs(10))).await;
    let settled = store
        .run_batch_in_transaction(batch, |mut tx, i, _| {
            let (schema, store) = (schema.clone(), store.clone());
            async move {
                let out = insert_effect(&mut tx, &schema).await.map(|()| i as u32);
                if i == 0 {
                    tokio::task::block_in_place(|| delete_record(&store, "inbox:b"));
                }
                (tx, out)
            }
        })
        .await;
    assert_eq!(names(&settled), ["unavailable", "unavailable"]);
    match &settled[1] {
        Settled::Unavailable(Error::LeaseLost { key, .. }) => assert_eq!(key, "inbox:b"),
        other => panic!("expected the second item's lease lost, got {other:?}"),
    }
    match &settled[0] {
        Settled::Unavailable(e @ Error::Store { key, .. }) => {
            assert_eq!(key, "inbox:a");
            assert!(e.to_string().contains("inbox:b"), "the error names the key whose lease was lost: {e}");
        }
        other => panic!("expected the first item rolled back with the batch, got {other:?}"),
    }
    assert!(effects(&store, &schema).await.is_empty(), "a write of the rolled-back batch stayed");
    let again = idem.claim::<u32>(calls(&["a", "b"], Duration::from_secs(10))).await;
    assert_eq!(again.to_run(), 2, "both keys are free again");
}

/// While the first body runs, the second item's record is lost and another holder (a second
/// consumer) claims its key: at the commit the record is there but not the batch's, so the whole
/// transaction rolls back and the other holder's claim stands, not overwritten by this batch's
/// completed record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_another_holder_took_before_the_commit_rolls_back_the_batch() {
    let (store, schema) = shared_store().await;
    let idem = Idempotency::new(store.clone());
    let other = Idempotency::new(store.clone());
    let taken = std::sync::Arc::new(tokio::sync::Mutex::new(None));
    let batch = idem.claim::<u32>(calls(&["x", "y"], Duration::from_secs(10))).await;
    let settled = store
        .run_batch_in_transaction(batch, |mut tx, i, _| {
            let (schema, store, other, taken) = (schema.clone(), store.clone(), other.clone(), taken.clone());
            async move {
                let out = insert_effect(&mut tx, &schema).await.map(|()| i as u32);
                if i == 0 {
                    tokio::task::block_in_place(|| delete_record(&store, "inbox:y"));
                    let theirs = other.claim::<u32>(calls(&["y"], Duration::from_secs(10))).await;
                    assert_eq!(theirs.to_run(), 1, "the other holder takes the free key");
                    *taken.lock().await = Some(theirs);
                }
                (tx, out)
            }
        })
        .await;
    assert_eq!(names(&settled), ["unavailable", "unavailable"]);
    assert!(effects(&store, &schema).await.is_empty(), "a write of the rolled-back batch stayed");
    match idem.inspect("inbox", "y").await.unwrap() {
        Inspected::Record(r) => assert_eq!(r.state, RecordState::InProgress, "the other holder's claim stands: {r:?}"),
        other => panic!("the other holder's record is gone: {other:?}"),
    }
    drop(taken);
}

/// A batch dropped after its first body ran and while its second runs (a consumer shutting down,
/// a timeout): the transaction rolls back, so the first item's record must not be stored as
/// completed either. Its key is released, and run again it writes its effect once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_dropped_before_its_commit_stores_no_record() {
    let (store, schema) = shared_store().await;
    let idem = Idempotency::new(store.clone());
    let batch = idem.claim::<u32>(calls(&["first", "second"], Duration::from_secs(10))).await;
    let (ran_tx, ran) = tokio::sync::oneshot::channel::<()>();
    let mut ran_tx = Some(ran_tx);
    let schema1 = schema.clone();
    let running = store.run_batch_in_transaction(batch, move |mut tx, i, _| {
        let schema = schema1.clone();
        let signal = if i == 1 { ran_tx.take() } else { None };
        async move {
            let out = insert_effect(&mut tx, &schema).await.map(|()| i as u32);
            if let Some(signal) = signal {
                let _ = signal.send(());
                tokio::time::sleep(Duration::from_secs(30)).await;
            }
            (tx, out)
        }
    });
    tokio::select! {
        _ = running => panic!("the second body does not finish"),
        _ = ran => {}
    }
    // Dropped: released in the background.
    let mut first = None;
    for _ in 0..100 {
        match idem.inspect("inbox", "first").await.unwrap() {
            Inspected::Record(r) if r.state == RecordState::Completed => panic!("the dropped batch stored a record"),
            Inspected::Record(_) => tokio::time::sleep(ms(20)).await,
            other => {
                first = Some(other);
                break;
            }
        }
    }
    assert!(first.is_some(), "the first item's key was not released");
    let schema2 = schema.clone();
    let again = idem.claim::<u32>(calls(&["first", "second"], Duration::from_secs(10))).await;
    assert_eq!(again.to_run(), 2, "both keys are free again");
    let settled = store
        .run_batch_in_transaction(again, move |mut tx, i, _| {
            let schema = schema2.clone();
            async move {
                let out = insert_effect(&mut tx, &schema).await.map(|()| i as u32);
                (tx, out)
            }
        })
        .await;
    assert_eq!(names(&settled), ["executed", "executed"]);
    let found = effects(&store, &schema).await;
    let once: BTreeMap<String, i64> = ["inbox:first", "inbox:second"].map(|k| (k.into(), 1)).into();
    assert_eq!(found, once);
}

const KILL_LEASE: Duration = Duration::from_millis(1000);
const KILL_RUNS: usize = 12;
const PER_BATCH: usize = 8;

/// Not a test: the child process of `every_effect_once_through_kill_9`. Claims the batch of
/// `IDEM_INBOX_KEYS` and runs it in one transaction, each body inserting its effect and pausing
/// `IDEM_INBOX_PAUSE_MS`; prints READY before and DONE after.
#[test]
#[ignore = "child process of another test"]
fn inbox_child() {
    let Ok(url) = std::env::var("IDEM_INBOX_URL") else { return };
    let schema = std::env::var("IDEM_INBOX_SCHEMA").unwrap();
    let keys: Vec<String> = std::env::var("IDEM_INBOX_KEYS").unwrap().split(',').map(str::to_owned).collect();
    let pause = ms(std::env::var("IDEM_INBOX_PAUSE_MS").unwrap().parse().unwrap());
    let transactional = std::env::var("IDEM_INBOX_MODE").unwrap() == "tx";
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = PgStore::builder(&url).schema(&schema).connect().await.unwrap();
        let idem = Idempotency::new(store.clone());
        sqlx::query("SELECT 1").execute(store.pool()).await.unwrap();
        println!("READY");
        run_batch(&store, &idem, &schema, &keys, pause, transactional).await;
        println!("DONE");
    });
}

/// The batch of `keys`, its bodies inserting their effects and pausing: in one transaction with
/// the records (`transactional`), or each insert on a connection of its own and the records
/// committed after (`Batch::run`, the control).
async fn run_batch(
    store: &PgStore,
    idem: &Idempotency,
    schema: &str,
    keys: &[String],
    pause: Duration,
    transactional: bool,
) -> Vec<&'static str> {
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let batch = idem.claim::<u64>(calls(&keys, KILL_LEASE)).await;
    if !transactional {
        let settled = batch
            .run(1, |_, context| {
                let pool = store.pool().clone();
                let sql = format!("INSERT INTO \"{schema}\".effects (key, fence) VALUES ($1, $2)");
                async move {
                    let fence = context.fence().await? as i64;
                    sqlx::query(&sql).bind(context.key()).bind(fence).execute(&pool).await.map_err(|e| {
                        AppError::Idem(Error::InvalidCall { key: context.key().to_owned(), reason: e.to_string() })
                    })?;
                    tokio::time::sleep(pause).await;
                    R::Ok(fence as u64)
                }
            })
            .await;
        return names(&settled);
    }
    let settled = store
        .run_batch_in_transaction(batch, |mut tx, _, context| {
            let schema = schema.to_owned();
            async move {
                let out = match insert_effect(&mut tx, &schema).await {
                    Ok(()) => {
                        tokio::time::sleep(pause).await;
                        context.fence().await.map_err(AppError::from)
                    }
                    Err(e) => Err(e),
                };
                (tx, out)
            }
        })
        .await;
    names(&settled)
}

/// What one mode of `every_effect_once_through_kill_9` saw.
#[derive(Debug)]
struct KillRun {
    /// Children killed before they printed DONE.
    killed: usize,
    /// Keys with more than one effect row, after the re-runs.
    duplicates: usize,
    /// Keys without their effect row, or whose record is not completed, after the re-runs.
    wrong: Vec<String>,
}

/// 12 children each run a batch of 8 keys of their own in one transaction and are SIGKILLed at a
/// random point (before the claim, between bodies, mid-commit, after). After the leases, each
/// batch is run again until every key is completed: every key has exactly one effect row. The
/// control, the same with each insert outside the records' transaction, must show duplicates: a
/// child killed after an insert and before its batch's commit leaves the row, and the re-run
/// inserts another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_effect_once_through_kill_9() {
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let tx = kill_run(true, seed).await;
    println!("transactional: {KILL_RUNS} batches of {PER_BATCH}, seed {seed}: {tx:?}");
    assert_eq!((tx.duplicates, tx.wrong.len()), (0, 0), "{tx:?}");
    assert!(tx.killed >= KILL_RUNS / 2, "too few children were killed mid-batch for the run to mean anything: {tx:?}");
    let plain = kill_run(false, seed ^ 0x9e37_79b9).await;
    println!("control, inserts on their own connections: {plain:?}");
    assert!(plain.wrong.is_empty(), "{plain:?}");
    assert!(plain.duplicates >= 1, "the control saw no duplicate: the kills missed the window it shows ({plain:?})");
}

async fn kill_run(transactional: bool, seed: u64) -> KillRun {
    let url = tokio::task::block_in_place(shared_database).to_owned();
    let schema = unique_schema();
    let store = store(&url, &schema).await;
    let idem = Idempotency::new(store.clone());
    let mut rng = seed | 1;
    let mut below = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let mut killed = 0;
    let batches: Vec<Vec<String>> =
        (0..KILL_RUNS).map(|b| (0..PER_BATCH).map(|i| format!("k{b}-{i}")).collect()).collect();
    for keys in &batches {
        let pause = 2 + below(6);
        // The batch takes about PER_BATCH pauses plus a few round trips: killed within it.
        let kill_after = below(PER_BATCH as u64 * (pause + 2) + 10);
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["inbox_child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env("IDEM_INBOX_URL", &url)
            .env("IDEM_INBOX_SCHEMA", &schema)
            .env("IDEM_INBOX_KEYS", keys.join(","))
            .env("IDEM_INBOX_PAUSE_MS", pause.to_string())
            .env("IDEM_INBOX_MODE", if transactional { "tx" } else { "plain" })
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
    // Every lease a killed child held runs out; each batch is run again until all of it is done.
    tokio::time::sleep(KILL_LEASE + ms(300)).await;
    for keys in &batches {
        for attempt in 0.. {
            let got = run_batch(&store, &idem, &schema, keys, Duration::ZERO, transactional).await;
            if got.iter().all(|s| matches!(*s, "executed" | "replayed")) {
                break;
            }
            assert!(attempt < 5, "{keys:?} after every lease ran out: {got:?}");
        }
    }
    let counts = effects(&store, &schema).await;
    let mut run = KillRun { killed, duplicates: 0, wrong: Vec::new() };
    for key in batches.iter().flatten() {
        let full = format!("inbox:{key}");
        match counts.get(&full).copied().unwrap_or(0) {
            0 => run.wrong.push(format!("{full}: no effect")),
            1 => {}
            _ => run.duplicates += 1,
        }
        match idem.inspect("inbox", key).await.unwrap() {
            Inspected::Record(r) if r.state == RecordState::Completed => {}
            other => run.wrong.push(format!("{full} not completed: {other:?}")),
        }
    }
    run
}

/// A consumer runs its loop in a task of its own: the batch's future is `Send`, so that
/// `tokio::spawn` takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_in_a_transaction_runs_in_a_spawned_task() {
    let (store, schema) = shared_store().await;
    let idem = Idempotency::new(store.clone());
    let task = tokio::spawn(async move {
        let batch = idem.claim::<u32>(calls(&["s0", "s1"], Duration::from_secs(10))).await;
        let settled = store
            .run_batch_in_transaction(batch, |mut tx, i, _| {
                let schema = schema.clone();
                async move {
                    let out = insert_effect(&mut tx, &schema).await.map(|()| i as u32);
                    (tx, out)
                }
            })
            .await;
        names(&settled)
    });
    assert_eq!(task.await.unwrap(), ["executed", "executed"]);
}

/// A body longer than its lease: the watchdog renews the lease while the transaction is open,
/// and the batch commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_longer_than_its_lease_commits() {
    let (store, schema) = shared_store().await;
    let idem = Idempotency::new(store.clone());
    let batch = idem.claim::<u32>(calls(&["long"], ms(300))).await;
    let settled = store
        .run_batch_in_transaction(batch, |mut tx, i, _| {
            let schema = schema.clone();
            async move {
                let out = insert_effect(&mut tx, &schema).await.map(|()| i as u32);
                tokio::time::sleep(ms(1200)).await;
                (tx, out)
            }
        })
        .await;
    assert!(matches!(settled[0], Settled::Executed { stored: true, .. }), "{:?}", settled[0]);
}

/// The first item's body writes, then the server stops answering (a relay swallows every byte)
/// before its savepoint is released. That statement waited for an answer without bound: the batch
/// never answered, while every other statement of the store is bounded by its timeout. Now it
/// fails after the timeout; since no one can tell whether it ran (keeping the first item's
/// writes), the items after it do not run, nothing is committed, and every item is unavailable,
/// to be handed back. Once the leases end, the keys run again, each effect once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_savepoint_without_an_answer_fails_the_batch_within_the_store_timeout() {
    let (direct, schema) = shared_store().await;
    let url = tokio::task::block_in_place(shared_database);
    let (relay, relayed) = Proxy::in_front_of(url);
    let store = PgStore::builder(&relayed).schema(&schema).timeout(ms(200)).connect().await.expect("connect");
    let idem = Idempotency::new(store.clone());
    let ttl = Duration::from_secs(1);
    let batch = idem.claim::<u32>(calls(&["s1", "s2", "s3"], ttl)).await;
    assert_eq!(batch.to_run(), 3);
    let running = store.run_batch_in_transaction(batch, |mut tx, i, _| {
        let (schema, relay) = (schema.clone(), &relay);
        async move {
            let out = insert_effect(&mut tx, &schema).await.map(|()| i as u32);
            if i == 0 {
                relay.black_hole();
            }
            (tx, out)
        }
    });
    let settled = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the batch never answered: its savepoint's statement waited without bound");
    assert_eq!(names(&settled), ["unavailable", "unavailable", "unavailable"]);
    for (i, item) in settled.iter().enumerate().skip(1) {
        match item {
            Settled::Unavailable(e @ Error::Store { key, .. }) => {
                assert_eq!(key, &format!("inbox:s{}", i + 1));
                assert!(e.to_string().contains("not run"), "{e}");
            }
            other => panic!("expected item {i} not run, got {other:?}"),
        }
    }
    relay.heal();
    drop(store);
    // The keys' releases went into the black hole too: they are free once their leases end.
    tokio::time::sleep(ttl + ms(300)).await;
    assert!(effects(&direct, &schema).await.is_empty(), "a write of the broken batch was committed");
    let again = Idempotency::new(direct.clone()).claim::<u32>(calls(&["s1", "s2", "s3"], ttl)).await;
    assert_eq!(again.to_run(), 3, "every key runs again");
    let settled = run_writing(&direct, &schema, again).await;
    assert_eq!(names(&settled), ["executed", "executed", "executed"]);
    let counts = effects(&direct, &schema).await;
    assert!(counts.values().all(|&n| n == 1) && counts.len() == 3, "{counts:?}");
}

/// The first item's session is ended by the server (`pg_terminate_backend`) after its body: the
/// server's last word is an error, then the connection closes, so releasing the savepoint is
/// refused and undoing it fails too. The body succeeded and nothing is committed, so its item
/// goes back unavailable like the rest, no attempt counted: it was counted as a failure and,
/// under `give_up_after(1)`, given up (dead-lettered) for a body that did its work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_the_server_ends_after_a_body_counts_no_attempt() {
    let (store, schema) = shared_store().await;
    let idem = Idempotency::new(store.clone());
    let calls = || ["t1", "t2"].map(|k| Call::new(k).scope("inbox").give_up_after(1));
    let batch = idem.claim::<u32>(calls()).await;
    assert_eq!(batch.to_run(), 2);
    let settled = store
        .run_batch_in_transaction(batch, |mut tx, i, _| {
            let (schema, store) = (schema.clone(), store.clone());
            async move {
                let out = insert_effect(&mut tx, &schema).await.map(|()| i as u32);
                if i == 0 {
                    let (pid,): (i32,) =
                        sqlx::query_as("SELECT pg_backend_pid()").fetch_one(&mut *tx).await.expect("pid");
                    let (done,): (bool,) = sqlx::query_as("SELECT pg_terminate_backend($1)")
                        .bind(pid)
                        .fetch_one(store.pool())
                        .await
                        .expect("terminate");
                    assert!(done);
                    // The server's error and the connection's end reach the client first.
                    tokio::time::sleep(ms(200)).await;
                }
                (tx, out)
            }
        })
        .await;
    assert_eq!(names(&settled), ["unavailable", "unavailable"], "{settled:?}");
    assert!(effects(&store, &schema).await.is_empty(), "a write of the ended session was committed");
    let again = idem.claim::<u32>(calls()).await;
    assert_eq!(again.to_run(), 2, "a key was given up or left held");
}
