//! The exact counts (`--check`, run by scripts/test.sh): round trips and script calls per call of
//! each path, counted by the servers themselves, against their targets.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idempotency::store::redis::fred::prelude::*;
use idempotency::{Call, Error, Idempotency};

use crate::ops::{complete_keys, hold_keys, R};
use crate::pg_rows::{pg_count, pg_tx_first, Pg};
use crate::support;

/// Counts the commands clients send, not those scripts run, from the server's `MONITOR` stream
/// (`support::Monitor`, a connection of its own): commands a script runs are shown there as
/// `[0 lua]`, on Redis and Valkey alike (their slow logs differ: Valkey logs a script's commands
/// with its caller's address).
pub struct TopLevel {
    pub host: String,
    pub port: u16,
}

impl TopLevel {
    pub fn of(client: &Client) -> TopLevel {
        let server = client.active_connections().into_iter().next().expect("a connected client");
        TopLevel { host: server.host.to_string(), port: server.port }
    }

    /// Top-level commands about idempotency records (`keys` is their Redis key prefix), and
    /// `TIME` (a fencing token read next to an acquire), sent while `f` ran, and how many of
    /// them were script calls. Other commands (the counting's own) are left out.
    pub async fn count<Fut: Future<Output = ()>>(&self, keys: &str, f: Fut) -> (u64, u64) {
        let monitor = support::Monitor::start_at(&self.host, self.port);
        f.await;
        let commands = tokio::task::block_in_place(|| monitor.client_commands_about(keys, &["TIME"]));
        let scripts = commands
            .iter()
            .filter(|l| l.split_once("] \"").is_some_and(|(_, c)| c.to_ascii_uppercase().starts_with("EVAL")))
            .count();
        (commands.len() as u64, scripts as u64)
    }
}

/// Sequential, exact: the commands each path costs, counted by Redis (top-level commands, `TIME`
/// included), and, as `"<path>: scripts"`, how many of them are script calls (the rest are plain
/// commands: a parameter-mode acquire is a `SET NX GET` that leaves the fencing token unread, so
/// a replay or a conflict is one command and runs no script; a commit is a `SET IFEQ` where the
/// server has it). A body that reads its fence pays one command more (`fence.lua`), in a row of
/// its own. `scripts_first`: the script calls a first execution should make on this server.
pub async fn check_round_trips(
    idem: &Idempotency,
    client: &Client,
    scripts_first: f64,
) -> Vec<(&'static str, f64, f64)> {
    const N: u64 = 200;
    let per = |n: u64| n as f64 / N as f64;
    // Warm the script cache so no NOSCRIPT fallback is counted.
    complete_keys(idem, "warm:", 1).await;
    let _: R<()> = idem
        .run(Call::new("warm:err"), || async { Err(Error::Conflict { key: String::new(), retry_after: None }) })
        .await;
    let top = TopLevel::of(client);
    let records = format!("{}:", idempotency::store::redis::DEFAULT_PREFIX);
    let mut out = Vec::new();

    let (n, scripts) = top.count(&records, complete_keys(idem, "rt-first:", N)).await;
    out.push(("first execution", per(n), 2.0));
    out.push(("first execution: scripts", per(scripts), scripts_first));

    let (n, scripts) = top.count(&records, complete_keys(idem, "rt-first:", N)).await;
    out.push(("replay", per(n), 1.0));
    out.push(("replay: scripts", per(scripts), 0.0));

    let (n, scripts) = top
        .count(&records, async {
            for i in 0..N {
                let _: R<u64> = idem
                    .run(Call::new(format!("rt-fenced:{i}")), || async {
                        idempotency::CallContext::current().expect("in a call").fence().await
                    })
                    .await;
            }
        })
        .await;
    out.push(("first execution, the body reads its fence", per(n), 3.0));
    out.push(("first execution, the body reads its fence: scripts", per(scripts), scripts_first + 1.0));

    let release = Arc::new(AtomicBool::new(false));
    let holders = hold_keys(idem, "rt-held:", 1, release.clone());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (n, scripts) = top
        .count(&records, async {
            for _ in 0..N {
                let r: R<()> = idem.run(Call::new("rt-held:0"), || async { Ok(()) }).await;
                assert!(matches!(r, Err(Error::Conflict { .. })), "{r:?}");
            }
        })
        .await;
    out.push(("conflict", per(n), 1.0));
    out.push(("conflict: scripts", per(scripts), 0.0));
    release.store(true, Ordering::Relaxed);
    for h in holders {
        h.await.unwrap();
    }

    let (n, scripts) = top
        .count(&records, async {
            for i in 0..N {
                let _: R<()> = idem
                    .run(Call::new(format!("rt-err:{i}")), || async {
                        Err(Error::Conflict { key: String::new(), retry_after: None })
                    })
                    .await;
            }
        })
        .await;
    // Acquire plus release: the release itself costs one less (and is the script).
    out.push(("release after an error", per(n) - 1.0, 1.0));
    out.push(("release after an error: scripts", per(scripts), 1.0));
    out
}

/// The acquires each hand-over of a lock costs when 10 and 100 callers of one runtime wait for
/// it (`support::handover`, counted at the `Store` boundary), against the target: at most 2.
/// Before the waiters were in line, every release woke every waiter, and each sent an acquire.
pub async fn check_lock_handovers(store: &idempotency::RedisStore) -> Vec<(&'static str, f64, f64)> {
    let mut out = Vec::new();
    for (path, n) in
        [("acquires per lock hand-over, 10 waiters", 10), ("acquires per lock hand-over, 100 waiters", 100)]
    {
        let seen = support::handover::hand_over(Arc::new(store.clone()), &format!("handover-{n}"), n).await;
        assert_eq!(seen.order, (0..n).collect::<Vec<_>>(), "{path}: not in the order they came");
        out.push((path, seen.acquires as f64 / n as f64, 2.0));
    }
    out
}

/// Sequential, exact: the round trips each PostgreSQL path costs, counted by the server
/// (`pg_stat_statements`: statements, less the `SET LOCAL` sent in one message with `BEGIN`).
pub async fn check_pg_round_trips(pg: &Pg) -> Vec<(&'static str, f64, f64)> {
    const N: u64 = 200;
    let per = |n: u64| n as f64 / N as f64;
    // Each connection prepares a statement the first time it runs it (not a counted call).
    complete_keys(&pg.idem, "warm:", 50).await;
    let mut out = Vec::new();
    let n = pg_count(&pg.counters, complete_keys(&pg.idem, "rt-first:", N)).await;
    out.push(("pg first execution", per(n), 2.0));
    let n = pg_count(&pg.counters, complete_keys(&pg.idem, "rt-first:", N)).await;
    out.push(("pg replay", per(n), 1.0));
    let release = Arc::new(AtomicBool::new(false));
    let holders = hold_keys(&pg.idem, "rt-held:", 1, release.clone());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let n = pg_count(&pg.counters, async {
        for _ in 0..N {
            let r: R<()> = pg.idem.run(Call::new("rt-held:0"), || async { Ok(()) }).await;
            assert!(matches!(r, Err(Error::Conflict { .. })), "{r:?}");
        }
    })
    .await;
    out.push(("pg conflict", per(n), 1.0));
    release.store(true, Ordering::Relaxed);
    for h in holders {
        h.await.unwrap();
    }
    let n = pg_count(&pg.counters, async {
        for i in 0..N {
            let _: R<()> = pg
                .idem
                .run(Call::new(format!("rt-err:{i}")), || async {
                    Err(Error::Conflict { key: String::new(), retry_after: None })
                })
                .await;
        }
    })
    .await;
    out.push(("pg release after an error", per(n) - 1.0, 1.0));
    for i in 0..20 {
        pg_tx_first(&pg.store, &pg.idem, format!("warm-tx:{i}"), i).await;
    }
    let n = pg_count(&pg.counters, async {
        for i in 0..N {
            assert!(pg_tx_first(&pg.store, &pg.idem, format!("rt-tx:{i}"), i).await);
        }
    })
    .await;
    // acquire; BEGIN (with its SET LOCAL); the body's INSERT; the record's UPDATE; COMMIT.
    out.push(("pg transactional first execution", per(n), 5.0));
    let n = pg_count(&pg.counters, async {
        for i in 0..N {
            assert!(pg_tx_first(&pg.store, &pg.idem, format!("rt-tx:{i}"), i).await);
        }
    })
    .await;
    out.push(("pg transactional replay", per(n), 1.0));
    out
}

/// The path of a batch of 100 fresh keys, all run and committed.
pub const BATCH_COMMITTED: &str = "batch of 100, every item committed";

/// One batch of `n` fresh keys `{prefix}:{j}`, run; the items whose index `fails` picks return
/// `Err` (released). Panics unless every item ran.
async fn one_batch(idem: &Idempotency, prefix: &str, n: usize, fails: fn(usize) -> bool) {
    let batch = idem.claim::<u64>((0..n).map(|j| Call::new(format!("{prefix}:{j}")))).await;
    let settled = batch
        .run(1, |j, _| async move {
            if fails(j) {
                Err("failed")
            } else {
                Ok(j as u64)
            }
        })
        .await;
    for (j, s) in settled.iter().enumerate() {
        let ran = matches!(s, idempotency::Settled::Executed { .. } | idempotency::Settled::Failed(_));
        assert!(ran, "batch item {prefix}:{j}: {s:?}");
    }
}

/// One batch of `n` fresh keys `{prefix}:{j}` under `give_up_after(3)` whose bodies all fail,
/// then the same keys claimed again (each holds the record of its failed attempt) and run to
/// completion. Panics unless the second claim ran every item as its second attempt.
async fn redelivered_batch(idem: &Idempotency, prefix: &str, n: usize) {
    let calls = || (0..n).map(|j| Call::new(format!("{prefix}:{j}")).give_up_after(3));
    let batch = idem.claim::<u64>(calls()).await;
    let settled = batch.run(1, |_, _| async { Err::<u64, _>("failed") }).await;
    for (j, s) in settled.iter().enumerate() {
        assert!(matches!(s, idempotency::Settled::Failed(_)), "batch item {prefix}:{j}: {s:?}");
    }
    let batch = idem.claim::<u64>(calls()).await;
    let settled = batch.run(1, |_, context| async move { Ok::<_, &str>(u64::from(context.attempt())) }).await;
    for (j, s) in settled.iter().enumerate() {
        assert!(matches!(s, idempotency::Settled::Executed { value: 2, .. }), "batch item {prefix}:{j}: {s:?}");
    }
}

/// Sequential, exact: the commands a batch of 100 costs on a standalone server (top-level
/// commands, as `check_round_trips` counts them), and how many are script calls. The claim is a
/// `SET NX GET` per key, in one pipeline; the commit a `SET IFEQ` per key in one pipeline where the
/// server has it (`compare_and_set`), else one script call; the release of failed items one
/// script call. Each transition is one pipeline or one script call on the one connection: one
/// round trip ([`BATCH_ROUND_TRIPS`]), which the server's counts cannot show.
pub async fn check_batch_round_trips(
    idem: &Idempotency,
    client: &Client,
    compare_and_set: bool,
) -> Vec<(&'static str, f64, f64)> {
    const BATCHES: usize = 10;
    one_batch(idem, "warm-batch", 4, |j| j == 0).await;
    let top = TopLevel::of(client);
    let records = format!("{}:", idempotency::store::redis::DEFAULT_PREFIX);
    let per = |n: u64| n as f64 / BATCHES as f64;
    let mut out = Vec::new();
    let (n, scripts) = top
        .count(&records, async {
            for b in 0..BATCHES {
                one_batch(idem, &format!("rt-batch:{b}"), 100, |_| false).await;
            }
        })
        .await;
    let (commands, script_calls) = if compare_and_set { (200.0, 0.0) } else { (101.0, 1.0) };
    out.push((BATCH_COMMITTED, per(n), commands));
    out.push(("batch of 100, every item committed: scripts", per(scripts), script_calls));
    let (n, scripts) = top
        .count(&records, async {
            for b in 0..BATCHES {
                one_batch(idem, &format!("rt-batch-err:{b}"), 100, |j| j % 2 == 1).await;
            }
        })
        .await;
    let (commands, script_calls) = if compare_and_set { (151.0, 1.0) } else { (102.0, 2.0) };
    out.push(("batch of 100, half the items failed", per(n), commands));
    out.push(("batch of 100, half the items failed: scripts", per(scripts), script_calls));
    // Records that keep their counts are the scripts' (claim, failures, claim, commit): one
    // script call each, not one per item.
    let (n, scripts) = top
        .count(&records, async {
            for b in 0..BATCHES {
                redelivered_batch(idem, &format!("rt-batch-again:{b}"), 100).await;
            }
        })
        .await;
    out.push(("batch of 100 under give_up_after, failed, then redelivered", per(n), 4.0));
    out.push(("batch of 100 under give_up_after, failed, then redelivered: scripts", per(scripts), 4.0));
    out
}

/// The round trips of a batch of 100 committed on a standalone Redis server: its claim's
/// pipeline and its commit's pipeline or script call.
pub const BATCH_ROUND_TRIPS: f64 = 2.0;

/// Sequential, exact: the round trips a batch of 100 costs on PostgreSQL, counted by the server:
/// one statement over arrays to claim, one to commit, one more to release when some items failed.
pub async fn check_pg_batch_round_trips(pg: &Pg) -> Vec<(&'static str, f64, f64)> {
    const BATCHES: usize = 5;
    one_batch(&pg.idem, "warm-batch", 50, |j| j == 0).await;
    let per = |n: u64| n as f64 / BATCHES as f64;
    let n = pg_count(&pg.counters, async {
        for b in 0..BATCHES {
            one_batch(&pg.idem, &format!("rt-batch:{b}"), 100, |_| false).await;
        }
    })
    .await;
    let failing = pg_count(&pg.counters, async {
        for b in 0..BATCHES {
            one_batch(&pg.idem, &format!("rt-batch-err:{b}"), 100, |j| j % 2 == 1).await;
        }
    })
    .await;
    // Every item's record keeps its count: the claims are the same one statement (no statement
    // per item), the failures one, the commit one.
    let redelivered = pg_count(&pg.counters, async {
        for b in 0..BATCHES {
            redelivered_batch(&pg.idem, &format!("rt-batch-again:{b}"), 100).await;
        }
    })
    .await;
    one_tx_batch(&pg.store, &pg.idem, "warm-tx-batch", 10).await;
    let tx = pg_count(&pg.counters, async {
        for b in 0..BATCHES {
            one_tx_batch(&pg.store, &pg.idem, &format!("rt-tx-batch:{b}"), 100).await;
        }
    })
    .await;
    vec![
        ("pg batch of 100, every item committed", per(n), 2.0),
        ("pg batch of 100, half the items failed", per(failing), 3.0),
        ("pg batch of 100 under give_up_after, failed, then redelivered", per(redelivered), 4.0),
        // The claim; BEGIN (with the first savepoint); one per item (its savepoint released, the
        // next opened); the records' statement; COMMIT. Bodies that write nothing.
        ("pg transactional batch of 100 (inbox)", per(tx), 104.0),
    ]
}

/// One batch of `n` fresh keys `{prefix}:{j}` run in one transaction with its records
/// (`PgStore::run_batch_in_transaction`), bodies that write nothing. Panics unless every item ran.
async fn one_tx_batch(store: &idempotency::PgStore, idem: &Idempotency, prefix: &str, n: usize) {
    let batch = idem.claim::<u64>((0..n).map(|j| Call::new(format!("{prefix}:{j}")))).await;
    let settled =
        store.run_batch_in_transaction(batch, |tx, j, _| async move { (tx, Ok::<u64, Error>(j as u64)) }).await;
    for (j, s) in settled.iter().enumerate() {
        assert!(matches!(s, idempotency::Settled::Executed { stored: true, .. }), "batch item {prefix}:{j}: {s:?}");
    }
}
