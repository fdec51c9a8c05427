//! Which commands the transitions use on which server, by exact counts the server keeps
//! (`INFO commandstats`), each test on a Redis 7.0 and on a Valkey 8.1 in turn: on Valkey a
//! first execution is a `SET NX GET` and a `SET IFEQ`, no script (a body that reads its fence
//! adds one script call, with the server's `TIME` in it); a commit that does
//! not find exactly its own pending record (a waiter marked it, the lease was lost) runs the
//! script and decides as on Redis; on Redis 7.0 every commit is the script. A batch's claim and
//! commit are the same commands per key, pipelined.

#[macro_use]
mod support;

use std::time::Duration;

use idempotency::store::redis::CommitPath;
use idempotency::{Call, Idempotency, OnConflict, RedisStore};
use support::{ms, AppError, RedisServer, R};

/// The two servers, started fresh: (what `RedisStore::server()` should start with, the server).
fn servers() -> Vec<(&'static str, RedisServer)> {
    vec![
        ("redis 7.", RedisServer::start_binary("redis-server")),
        ("valkey 8.1.", RedisServer::start_binary(&support::valkey_server_binary())),
    ]
}

fn count(stats: &std::collections::HashMap<String, u64>, name: &str) -> u64 {
    stats.get(name).copied().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_executions_use_plain_commands_where_the_server_has_compare_and_set() {
    for (expected, server) in servers() {
        let store = RedisStore::connect(&server.url()).await.unwrap();
        assert!(store.server().starts_with(expected), "{} is not {expected}*", store.server());
        let valkey = expected.starts_with("valkey");
        let path = if valkey { CommitPath::CompareAndSet } else { CommitPath::Script };
        assert_eq!(store.commit_path(), path, "{}", store.server());
        assert!(format!("{store:?}").contains(&format!("commit_path: {path:?}")));
        let idem = Idempotency::new(store.clone());

        server.command(&["CONFIG", "RESETSTAT"]).unwrap();
        for i in 0..20u32 {
            let got: R<u32> = idem.run(Call::new(format!("first:{i}")), || async move { Ok(i) }).await;
            assert_eq!(got.unwrap(), i);
        }
        // Commands a script runs count too: on Redis the commit script's GET and SET.
        let stats = server.command_calls();
        let scripts = count(&stats, "evalsha") + count(&stats, "eval");
        let counted = (count(&stats, "set"), count(&stats, "time"), scripts, count(&stats, "get"));
        // The fencing token is left unread (no body here asks for it): no `TIME`.
        if valkey {
            // SET NX GET, SET IFEQ: no script, nothing read back.
            assert_eq!(counted, (40, 0, 0, 0), "{expected}: {stats:?}");
        } else {
            assert_eq!(counted, (40, 0, 20, 20), "{expected}: {stats:?}");
        }
        // A replay is its SET NX GET alone.
        server.command(&["CONFIG", "RESETSTAT"]).unwrap();
        for i in 0..20u32 {
            let got: R<u32> = idem.run(Call::new(format!("first:{i}")), || async move { Ok(0) }).await;
            assert_eq!(got.unwrap(), i);
        }
        let stats = server.command_calls();
        let scripts = count(&stats, "evalsha") + count(&stats, "eval");
        assert_eq!((count(&stats, "set"), count(&stats, "time"), scripts), (20, 0, 0), "{expected}: {stats:?}");
        // A body that reads its fence pays one script call, which reads the server's clock.
        server.command(&["CONFIG", "RESETSTAT"]).unwrap();
        for i in 0..20u32 {
            let got: R<u64> = idem
                .run(Call::new(format!("fenced:{i}")), || async {
                    Ok(idempotency::CallContext::current().unwrap().fence().await?)
                })
                .await;
            assert!(got.unwrap() > 0);
        }
        let stats = server.command_calls();
        let scripts = count(&stats, "evalsha") + count(&stats, "eval");
        let want_scripts = if valkey { 20 } else { 40 };
        assert_eq!((count(&stats, "time"), scripts), (20, want_scripts), "{expected}: {stats:?}");
        // And they replay as themselves.
        let replayed: R<u32> = idem.run(Call::new("first:7"), || async { Ok(0) }).await;
        assert_eq!(replayed.unwrap(), 7);
        let stored = server.command(&["GET", &store.record_key(&Call::new("first:7").full_key())]).unwrap();
        assert!(stored.starts_with("C|") && stored.ends_with("|7"), "{stored}");
    }
}

/// A waiter marks the holder's record: the compare-and-set does not match, the commit runs the
/// script, which publishes the result, and the waiter replays it at once.
/// A batch of 100: its claim is a plain `SET NX GET` per key (one pipeline) on both servers; its
/// commit a `SET IFEQ` per key (one pipeline) on Valkey and one script call on Redis 7. An item
/// whose record another caller took while its body ran is not `SET` by the compare-and-set: the
/// script decides for it alone, and it is not stored, while the others are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_plain_commands_where_the_server_has_them() {
    for (expected, server) in servers() {
        let store = RedisStore::connect(&server.url()).await.unwrap();
        let valkey = expected.starts_with("valkey");
        let idem = Idempotency::new(store.clone());
        server.command(&["CONFIG", "RESETSTAT"]).unwrap();
        let batch = idem.claim::<u32>((0..100).map(|i| Call::new(format!("batch:{i}")))).await;
        assert_eq!(batch.to_run(), 100);
        let settled = batch.run(4, |i, _| async move { R::Ok(i as u32) }).await;
        assert!(settled.iter().all(|s| matches!(s, idempotency::Settled::Executed { stored: true, .. })));
        let stats = server.command_calls();
        let scripts = count(&stats, "evalsha") + count(&stats, "eval");
        let counted = (count(&stats, "set"), scripts, count(&stats, "get"));
        let want = if valkey { (200, 0, 0) } else { (200, 1, 100) };
        assert_eq!(counted, want, "{expected}: {stats:?}");

        // Item 3's record is deleted and taken by another caller while its body runs.
        let record = store.record_key("taken:3");
        let batch = idem.claim::<u32>((0..10).map(|i| Call::new(format!("taken:{i}")))).await;
        server.command(&["CONFIG", "RESETSTAT"]).unwrap();
        let settled = batch
            .run(1, |i, _| {
                let (server, record) = (&server, record.clone());
                async move {
                    if i == 3 {
                        server.command(&["SET", &record, "someone else's", "PX", "30000"]).unwrap();
                    }
                    R::Ok(i as u32)
                }
            })
            .await;
        for (i, item) in settled.iter().enumerate() {
            let stored = matches!(item, idempotency::Settled::Executed { stored: true, .. });
            assert_eq!(stored, i != 3, "{expected}: item {i}: {item:?}");
        }
        assert_eq!(server.command(&["GET", &record]).unwrap(), "someone else's", "{expected}");
        let stats = server.command_calls();
        let scripts = count(&stats, "evalsha") + count(&stats, "eval");
        // Valkey: ten SET IFEQ (one not set), then the script for that one key.
        let want = if valkey { (11, 1) } else { (10, 1) };
        assert_eq!((count(&stats, "set"), scripts), want, "{expected}: {stats:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_that_finds_a_waiter_runs_the_script_and_wakes_it() {
    for (expected, server) in servers() {
        let idem = Idempotency::new(RedisStore::connect(&server.url()).await.unwrap());
        let (finish, holder) = support::hold(&idem, Call::new("waited"), false);
        server.command(&["CONFIG", "RESETSTAT"]).unwrap();
        let waiter = tokio::spawn({
            let idem = idem.clone();
            async move {
                let call = Call::new("waited").on_conflict(OnConflict::Wait(Duration::from_secs(10)));
                let r: R<u32> = idem.run(call, || async { Ok(2) }).await;
                r
            }
        });
        // The waiter's acquire marked the record watched.
        support::eventually(Duration::from_secs(5), "the waiter's acquire", || {
            let stats = server.command_calls();
            std::future::ready((count(&stats, "evalsha") + count(&stats, "eval") >= 1).then_some(()))
        })
        .await;
        finish.send(()).unwrap();
        assert_eq!(holder.await.unwrap().unwrap(), 1);
        assert_eq!(waiter.await.unwrap().unwrap(), 1, "{expected}: the waiter did not replay the holder's value");
        // The commit script published the completion (the compare-and-set never does).
        let stats = server.command_calls();
        assert_eq!(count(&stats, "publish"), 1, "{expected}: {stats:?}");
    }
}

/// A holder whose lease ran out and whose key another caller took: its commit finds another
/// owner's record, on the compare-and-set path as on the script's, and stores nothing (the
/// caller gets its body's value, as documented); the new holder keeps the key and its result is
/// the one replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_commit_stores_nothing_on_both_paths() {
    for (expected, server) in servers() {
        let store = RedisStore::connect(&server.url()).await.unwrap();
        let idem = Idempotency::new(store.clone());
        let first = tokio::spawn({
            let idem = idem.clone();
            async move {
                let r: R<u32> = idem
                    .run(Call::new("lost").ttl(ms(300)).renew(false), || async {
                        tokio::time::sleep(ms(700)).await;
                        Ok(0)
                    })
                    .await;
                r
            }
        });
        tokio::time::sleep(ms(450)).await;
        // The second holder's body answers 1 once released.
        let (finish, second) = support::hold(&idem, Call::new("lost"), false);
        assert_eq!(first.await.unwrap().unwrap(), 0, "{expected}");
        let record = server.command(&["GET", &store.record_key(&Call::new("lost").full_key())]).unwrap();
        assert!(record.starts_with("P|"), "{expected}: the late commit overwrote the holder's record: {record}");
        finish.send(()).unwrap();
        assert_eq!(second.await.unwrap().unwrap(), 1, "{expected}");
        let replay: R<u32> = idem.run(Call::new("lost"), || async { Ok(3) }).await;
        assert_eq!(replay.unwrap(), 1, "{expected}");
    }
}

/// A waiter that takes the key after its holder gave it back (its call dropped: not a failure,
/// which would leave its count) does so with the acquire script, which writes the same pending
/// record as a plain acquire (no fence in it, nobody marked as waiting): its commit is the
/// compare-and-set where the server has it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_taken_by_the_acquire_script_commits_without_it() {
    for (expected, server) in servers() {
        let store = RedisStore::connect(&server.url()).await.unwrap();
        let idem = Idempotency::new(store.clone());
        let record_key = store.record_key(&Call::new("handed-over").full_key());
        let (_fail, holder) = support::hold(&idem, Call::new("handed-over"), true);
        let (running_tx, running) = tokio::sync::oneshot::channel();
        let (finish, finish_rx) = tokio::sync::oneshot::channel::<()>();
        let waiter = tokio::spawn({
            let idem = idem.clone();
            async move {
                let call = Call::new("handed-over").on_conflict(OnConflict::Wait(Duration::from_secs(10)));
                let r: R<u32> = idem
                    .run(call, || async move {
                        running_tx.send(()).unwrap();
                        finish_rx.await.unwrap();
                        Ok(5)
                    })
                    .await;
                r
            }
        });
        let fields = |record: &str| record.split('|').map(str::to_owned).collect::<Vec<_>>();
        support::eventually(Duration::from_secs(5), "the waiter marks the record", || {
            let record = server.command(&["GET", &record_key]).unwrap_or_default();
            std::future::ready((fields(&record).get(5).map(String::as_str) == Some("1")).then_some(()))
        })
        .await;
        holder.abort();
        assert!(holder.await.unwrap_err().is_cancelled());
        running.await.unwrap();
        let record = fields(&server.command(&["GET", &record_key]).unwrap());
        assert_eq!(
            (record[0].as_str(), record[1].as_str(), record[5].as_str()),
            ("P", "0", ""),
            "{expected}: {record:?}"
        );
        server.command(&["CONFIG", "RESETSTAT"]).unwrap();
        finish.send(()).unwrap();
        assert_eq!(waiter.await.unwrap().unwrap(), 5, "{expected}");
        let stats = server.command_calls();
        let scripts = count(&stats, "evalsha") + count(&stats, "eval");
        assert_eq!(scripts, if expected.starts_with("valkey") { 0 } else { 1 }, "{expected}: {stats:?}");
    }
}

/// A store that found compare-and-set at connect and then reaches a server without it (here a
/// Redis 7.0 behind the same address, as a node of an older version in a cluster being
/// upgraded): the server refuses `SET ... IFEQ`, the commit runs the script instead and
/// succeeds, and the store commits with the script from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_refuses_compare_and_set_gets_the_script() {
    let valkey = RedisServer::start_binary(&support::valkey_server_binary());
    let redis = RedisServer::start_binary("redis-server");
    let proxy = support::proxy::Proxy::start(valkey.port());
    let store = RedisStore::connect(&proxy.url()).await.unwrap();
    assert_eq!(store.commit_path(), CommitPath::CompareAndSet);
    let idem = Idempotency::new(store.clone());

    proxy.set_upstream(redis.port());
    proxy.drop_all();
    let got: R<u32> = idem.run(Call::new("moved"), || async { Ok(3) }).await;
    assert_eq!(got.unwrap(), 3);
    assert_eq!(store.commit_path(), CommitPath::Script);
    // Redis refused the SET IFEQ (a failed call), then the script committed: an EVALSHA,
    // and an EVAL after it, this server's script cache being empty.
    let failed_sets = || {
        let info = redis.command(&["INFO", "commandstats"]).unwrap();
        let set = info.lines().find(|l| l.starts_with("cmdstat_set:")).unwrap_or_default().to_owned();
        set.rsplit_once("failed_calls=").and_then(|(_, n)| n.parse::<u64>().ok()).unwrap_or_else(|| panic!("{set}"))
    };
    assert_eq!(failed_sets(), 1);
    let stats = redis.command_calls();
    assert_eq!((count(&stats, "evalsha"), count(&stats, "eval")), (1, 1), "{stats:?}");
    let replayed: R<u32> = idem.run(Call::new("moved"), || async { Ok(0) }).await;
    assert_eq!(replayed.unwrap(), 3);
    // The next commit goes to the script at once: no second refusal.
    let next: R<u32> = idem.run(Call::new("moved again"), || async { Ok(4) }).await;
    assert_eq!(next.unwrap(), 4);
    assert_eq!(failed_sets(), 1);
    assert_eq!(count(&redis.command_calls(), "evalsha"), 2);
}

/// A key overwritten by something that is not a record while its body runs (here a hash): the
/// commit finds it corrupt at once on both paths (Valkey answers `SET IFEQ` on a hash with
/// WRONGTYPE; the script then names what is there), stores nothing over it, and the caller gets
/// its value without waiting for the commit deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_overwritten_by_a_hash_is_corrupt_at_commit_on_both_paths() {
    for (expected, server) in servers() {
        let store = RedisStore::connect(&server.url()).await.unwrap();
        let idem = Idempotency::new(store.clone());
        let record_key = store.record_key(&Call::new("overwritten").full_key());
        let started = std::time::Instant::now();
        let got: R<u32> = idem
            .run(Call::new("overwritten"), || {
                let record_key = record_key.clone();
                let server = &server;
                async move {
                    server.command(&["DEL", &record_key]).unwrap();
                    server.command(&["HSET", &record_key, "field", "value"]).unwrap();
                    Ok(8)
                }
            })
            .await;
        assert_eq!(got.unwrap(), 8, "{expected}");
        assert!(started.elapsed() < Duration::from_secs(2), "{expected}: took {:?}", started.elapsed());
        assert_eq!(server.command(&["TYPE", &record_key]).unwrap(), "hash", "{expected}");
    }
}

/// A retry after a failure takes the key with the acquire script (the plain `SET NX GET` finds
/// the failure's record, which only the script takes), and its record keeps the count and its
/// lease's end: its commit goes to the commit script at once, with no `SET ... IFEQ` that could
/// not match. Counted on both servers: `SET`s top level and inside scripts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_failure_commits_with_the_script_alone() {
    for (expected, server) in servers() {
        let store = RedisStore::connect(&server.url()).await.unwrap();
        let idem = Idempotency::new(store.clone());
        let failed: R<u32> = idem.run(Call::new("retried"), || async { Err(AppError::Failed("no")) }).await;
        assert!(failed.is_err());
        server.command(&["CONFIG", "RESETSTAT"]).unwrap();
        let retried: R<u32> = idem
            .run(Call::new("retried"), || async { Ok(idempotency::CallContext::current().unwrap().attempt()) })
            .await;
        assert_eq!(retried.unwrap(), 2, "{expected}");
        let stats = server.command_calls();
        let scripts = count(&stats, "evalsha") + count(&stats, "eval");
        // SET NX GET; acquire.lua's SET; commit.lua's SET.
        assert_eq!((scripts, count(&stats, "set"), count(&stats, "time")), (2, 3, 1), "{expected}: {stats:?}");
    }
}
