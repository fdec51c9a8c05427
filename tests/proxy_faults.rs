//! `RedisStore` through a fault-injecting TCP proxy: 200 ms added to every command, connections
//! cut in the middle of an acquire, a commit or a release (the client re-sends the command, so
//! the transitions' retry-safety is what keeps a caller from conflicting with itself), connections
//! dropped under a renewed lease, and a black-holed holder that must learn its lease is lost
//! before anyone else acquires the key, with a fencing "bank" downstream.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotency::store::redis::CommitPath;
use idempotency::{Call, CallContext, Error, Idempotency, OnConflict, RedisStore};
use support::proxy::{CutAt, Direction, Proxy};
use support::{counter, eventually, ms, wait_for, AppError, Monitor, RedisServer, R};
use tokio::time::Instant;

async fn store(url: &str, timeout: Duration) -> RedisStore {
    RedisStore::builder(url).timeout(timeout).connect().await.expect("connect")
}

/// The monitor these tests count commands with stops when it is dropped. Left open, the server
/// writes every later command to it and its reader keeps every line: the benchmark, whose
/// round-trip checks start one per path, grew by about 1 KB per command and ran its timed cases
/// with a dozen monitors attached.
#[test]
fn a_dropped_monitor_stops_monitoring() {
    let server = RedisServer::start();
    let monitors = || {
        let clients = server.command(&["CLIENT", "LIST"]).expect("CLIENT LIST");
        clients
            .lines()
            .filter(|c| c.split(' ').any(|f| f.strip_prefix("flags=").is_some_and(|v| v.contains('O'))))
            .count()
    };
    let monitor = Monitor::start(server.port());
    assert_eq!(monitors(), 1, "the monitor is not listed as one");
    drop(monitor);
    wait_for(Duration::from_secs(5), "the dropped monitor's connection to close", || match monitors() {
        0 => Ok(()),
        n => Err(format!("{n} monitor(s) still attached")),
    });
}

/// 100 ms each way on every command: calls stay correct (one execution, replays, conflicts, a
/// renewed lease, a waiter woken), only slower; the timings are printed. The first call on the
/// fresh server also pays NOSCRIPT round trips (EVALSHA, then EVAL) for each script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_of_200ms_on_every_command() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    proxy.set_latency(Direction::Up, ms(100));
    proxy.set_latency(Direction::Down, ms(100));
    let slow = Idempotency::new(store(&proxy.url(), Duration::from_secs(2)).await);
    let direct = Idempotency::new(store(&server.url(), Duration::from_secs(2)).await);
    let runs = counter();

    let t = Instant::now();
    let r = runs.clone();
    let first = slow.run(Call::new("slow:1"), || async move { R::Ok(r.fetch_add(1, SeqCst) + 10) }).await;
    let first_took = t.elapsed();
    assert_eq!(first.unwrap(), 10);
    assert!(first_took >= ms(400), "acquire and commit took {first_took:?}: the latency was not applied");

    let t = Instant::now();
    let r = runs.clone();
    let replay = slow.run(Call::new("slow:1"), || async move { R::Ok(r.fetch_add(1, SeqCst) + 10) }).await;
    let replay_took = t.elapsed();
    assert_eq!(replay.unwrap(), 10);
    assert!(replay_took >= ms(200), "{replay_took:?}");

    // Ten racing callers through the slow link: one execution.
    let t = Instant::now();
    let mut racers = Vec::new();
    for i in 0..10 {
        let (slow, r) = (slow.clone(), runs.clone());
        racers.push(tokio::spawn(async move {
            slow.run(Call::new("slow:race"), || async move {
                r.fetch_add(1, SeqCst);
                tokio::time::sleep(ms(100)).await;
                R::Ok(i)
            })
            .await
        }));
    }
    let mut winners = Vec::new();
    for racer in racers {
        match racer.await.unwrap() {
            Ok(v) => winners.push(v),
            Err(AppError::Idem(Error::Conflict { .. })) => {}
            Err(e) => panic!("{e:?}"),
        }
    }
    let race_took = t.elapsed();
    assert!(!winners.is_empty() && winners.iter().all(|w| *w == winners[0]), "{winners:?}");
    assert_eq!(runs.load(SeqCst), 2);

    // A body outliving its lease twice: renewals over the slow link keep it. (The lease must
    // leave room for the round trips: the watchdog renews at a third to half of the lease and
    // counts the lease lost at nine tenths of it without a confirmed renewal, and the first
    // renewal on a server pays a second round trip, EVALSHA's NOSCRIPT then EVAL. Two seconds
    // leave 800 ms for at most 400 ms.)
    let lost = Arc::new(AtomicBool::new(true));
    let (s, l, r) = (slow.clone(), lost.clone(), runs.clone());
    let t = Instant::now();
    let held = tokio::spawn(async move {
        s.run(Call::new("slow:long").ttl(ms(2000)), || async move {
            r.fetch_add(1, SeqCst);
            tokio::time::sleep(ms(4000)).await;
            l.store(CallContext::current().unwrap().is_lease_lost(), SeqCst);
            R::Ok(String::from("long done"))
        })
        .await
    });
    tokio::time::sleep(ms(400)).await;
    // A waiter through the slow link gets the holder's result when it commits.
    let (s, r) = (slow.clone(), runs.clone());
    let waiter = tokio::spawn(async move {
        s.run(
            Call::new("slow:long").ttl(ms(2000)).on_conflict(OnConflict::Wait(Duration::from_secs(10))),
            || async move {
                r.fetch_add(1, SeqCst);
                R::Ok(String::from("waiter ran"))
            },
        )
        .await
    });
    for _ in 0..12 {
        let dup = direct.run(Call::new("slow:long"), || async { R::Ok(String::from("duplicate ran")) }).await;
        assert!(matches!(dup, Err(AppError::Idem(Error::Conflict { .. }))), "{dup:?} at {:?}", t.elapsed());
        tokio::time::sleep(ms(300)).await;
    }
    assert_eq!(held.await.unwrap().unwrap(), "long done");
    let long_took = t.elapsed();
    assert_eq!(waiter.await.unwrap().unwrap(), "long done", "the waiter did not get the holder's result");
    let waited = t.elapsed();
    assert!(!lost.load(SeqCst), "the lease was lost over the slow link");
    assert_eq!(runs.load(SeqCst), 3);
    println!(
        "200 ms per command: first call {first_took:?}, replay {replay_took:?}, 10 racers {race_took:?}, \
         4 s body under a 2 s lease {long_took:?} (waiter answered {:?} after the holder)",
        waited.saturating_sub(long_took)
    );
}

/// The connection is cut once in the middle of one command or of its reply, then the call
/// goes on: fred reconnects and re-sends the command. Returns the call's result, how many
/// times the body ran, and how many commands about the key the server ran for the call (each a
/// transition: a script, or the plain SET of an acquire).
async fn cut_once(
    server: &RedisServer,
    proxy: &Proxy,
    key: &str,
    during: &'static str,
    at: CutAt,
) -> (R<String>, usize, u64) {
    let store = store(&proxy.url(), Duration::from_secs(3)).await;
    let idem = Idempotency::new(store.clone());
    let record = store.record_key(key).into_bytes();
    let runs = counter();
    let cuts = proxy.stats().cuts;
    let monitor = Monitor::start(server.port());
    if during == "acquire" {
        proxy.cut_on(&record, at);
    }
    let (r, p, rec) = (runs.clone(), proxy, record.clone());
    let body = || async move {
        r.fetch_add(1, SeqCst);
        // The next command about this key is the commit or the release.
        if during != "acquire" {
            p.cut_on(&rec, at);
        }
        if during == "release" {
            Err(AppError::Failed("declined"))
        } else {
            R::Ok(format!("{key} done"))
        }
    };
    let got = idem.run(Call::new(key).ttl(Duration::from_secs(30)), body).await;
    assert_eq!(proxy.stats().cuts, cuts + 1, "{during}/{at:?}: the cut did not fire");
    (got, runs.load(SeqCst), monitor.client_commands_on(&store.record_key(key)) as u64)
}

/// Cut mid-acquire and mid-commit (and mid-release), before Redis got the command and after it
/// ran it: the re-sent acquire finds its own owner and reports "acquired" (never a conflict
/// with itself), the re-sent commit finds its own completed record and reports "ok", the
/// re-sent release finds nothing to release and reports "ok"; the body runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_cut_mid_acquire_commit_and_release() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let direct_store = store(&server.url(), Duration::from_secs(2)).await;
    let compare_and_set = direct_store.commit_path() == CommitPath::CompareAndSet;
    let direct = Idempotency::new(direct_store);
    // Load every script into the server's cache, so that each call below costs no NOSCRIPT
    // round trip and the commands counted are exactly the call's.
    direct.run(Call::new("warm:commit"), || async { R::Ok(()) }).await.unwrap();
    let _ = direct.run(Call::new("warm:release"), || async { R::<()>::Err(AppError::Failed("warm-up")) }).await;
    let mut lines = Vec::new();
    for during in ["acquire", "commit", "release"] {
        for at in [CutAt::Request, CutAt::Reply] {
            let key = format!("cut:{during}:{at:?}");
            let (got, runs, commands) = cut_once(&server, &proxy, &key, during, at).await;
            assert_eq!(runs, 1, "{key}: the body ran {runs} times");
            match (during, got) {
                ("release", Err(AppError::Failed("declined"))) => {
                    // Released: the key is free for a retry at once.
                    let retry = direct.run(Call::new(key.as_str()), || async { R::Ok(String::from("retried")) }).await;
                    assert_eq!(retry.unwrap(), "retried", "{key}: the re-sent release left the key held");
                }
                ("release", other) => panic!("{key}: expected the body's error, got {other:?}"),
                (_, Ok(v)) => {
                    assert_eq!(v, format!("{key} done"));
                    let replay =
                        direct.run(Call::new(key.as_str()), || async { R::Ok(String::from("ran again")) }).await;
                    assert_eq!(replay.unwrap(), v, "{key}: the result was not stored");
                }
                (_, Err(e)) => panic!("{key}: {e:?} (the caller's own lease turned against it?)"),
            }
            // Acquire plus commit or release; one more when Redis ran the cut command before
            // the connection dropped (its reply was lost and fred re-sent it). A re-sent
            // `SET IFEQ` commit finds the record completed already, not pending: the commit
            // script then says it is this commit's (one command more).
            let resent = at == CutAt::Reply;
            let expected = 2 + u64::from(resent) + u64::from(resent && during == "commit" && compare_and_set);
            assert_eq!(commands, expected, "{key}: commands run on the server");
            lines.push(format!("{during} cut at the {at:?}: ok, body ran once, {commands} commands run"));
        }
    }
    println!("{}", lines.join("\n"));
}

/// Every connection dropped four times under a body holding a 600 ms lease for 2 s: the
/// renewals are re-sent after each reconnection and the lease is never lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_connections_under_a_renewed_lease() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let idem = Idempotency::new(store(&proxy.url(), Duration::from_secs(2)).await);
    let direct = Idempotency::new(store(&server.url(), Duration::from_secs(2)).await);
    let lost = Arc::new(AtomicBool::new(true));
    let l = lost.clone();
    let held = tokio::spawn(async move {
        idem.run(Call::new("dropped").ttl(ms(600)), || async move {
            tokio::time::sleep(ms(2000)).await;
            l.store(CallContext::current().unwrap().is_lease_lost(), SeqCst);
            R::Ok(1u8)
        })
        .await
    });
    let mut dropped = 0;
    for _ in 0..4 {
        tokio::time::sleep(ms(350)).await;
        dropped += proxy.drop_all();
        let dup = direct.run(Call::new("dropped"), || async { R::Ok(2u8) }).await;
        assert!(matches!(dup, Err(AppError::Idem(Error::Conflict { .. }))), "{dup:?}");
    }
    assert_eq!(held.await.unwrap().unwrap(), 1);
    assert!(!lost.load(SeqCst), "the lease was lost across dropped connections");
    assert!(dropped >= 4, "only {dropped} connections were dropped");
    assert_eq!(direct.run(Call::new("dropped"), || async { R::Ok(3u8) }).await.unwrap(), 1);
}

/// A downstream store that remembers, per account, the highest fencing token it has seen and
/// refuses writes carrying a smaller one.
#[derive(Default)]
struct Bank {
    accounts: Mutex<HashMap<String, Account>>,
    rejected: AtomicUsize,
}

/// The highest fence seen, and the writes applied: (fence, writer).
#[derive(Default)]
struct Account {
    highest: u64,
    ledger: Vec<(u64, &'static str)>,
}

impl Bank {
    fn write(&self, account: &str, fence: u64, who: &'static str) -> Result<(), u64> {
        let mut accounts = self.accounts.lock().unwrap();
        let acct = accounts.entry(account.to_owned()).or_default();
        if fence < acct.highest {
            self.rejected.fetch_add(1, SeqCst);
            return Err(acct.highest);
        }
        acct.highest = fence;
        acct.ledger.push((fence, who));
        Ok(())
    }

    fn ledger(&self, account: &str) -> Vec<(u64, &'static str)> {
        self.accounts.lock().unwrap().get(account).map(|a| a.ledger.clone()).unwrap_or_default()
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Holder A reaches Redis through the proxy, holds the key with a 2 s lease and writes to the
/// bank with its fencing token every 50 ms; then the proxy black-holes it. B, on a direct
/// connection, tries to take the key every 20 ms. A must be told its lease is lost before B
/// acquires. With `abort` A's body is dropped at that moment; without it A's body goes on
/// writing and the bank must refuse those writes. Returns (A told, B acquired, A's result,
/// stale writes refused, ledger).
async fn black_holed_holder(abort: bool) -> (Duration, Duration, R<()>, usize, Vec<(u64, &'static str)>) {
    let server = RedisServer::start();
    let proxy = Arc::new(Proxy::start(server.port()));
    let a = Idempotency::new(store(&proxy.url(), ms(500)).await);
    let b = Idempotency::new(store(&server.url(), Duration::from_secs(2)).await);
    let bank = Arc::new(Bank::default());
    let key = if abort { "transfer:abort" } else { "transfer:runs-on" };
    let call = move || Call::new(key).ttl(ms(2000)).abort_on_lease_lost(abort);
    let holed_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let told_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let a_task = tokio::spawn({
        let (bank, proxy, holed_at, told_at) = (bank.clone(), proxy.clone(), holed_at.clone(), told_at.clone());
        async move {
            let told = told_at.clone();
            let got = a
                .run(call(), || async move {
                    let ctx = CallContext::current().unwrap();
                    // Notes the moment the context says the lease is lost.
                    let watcher = tokio::spawn({
                        let (ctx, told_at) = (ctx.clone(), told_at.clone());
                        async move {
                            while !ctx.is_lease_lost() {
                                tokio::time::sleep(ms(2)).await;
                            }
                            told_at.lock().unwrap().get_or_insert_with(Instant::now);
                        }
                    });
                    let _stop = AbortOnDrop(watcher);
                    let fence = ctx.fence().await?;
                    for i in 0..100 {
                        // The bank refuses a stale write; A's body ignores the refusal here.
                        let _ = bank.write("acct", fence, "A");
                        if i == 3 {
                            // A's lease was renewed at least once through the proxy; now
                            // nothing it sends arrives, nothing comes back.
                            proxy.black_hole();
                            *holed_at.lock().unwrap() = Some(Instant::now());
                        }
                        tokio::time::sleep(ms(50)).await;
                    }
                    R::Ok(())
                })
                .await;
            if matches!(got, Err(AppError::Idem(Error::LeaseLost { .. }))) {
                told.lock().unwrap().get_or_insert_with(Instant::now);
            }
            got
        }
    });
    let holed = eventually(Duration::from_secs(10), "the holder to be black-holed", || {
        let t = *holed_at.lock().unwrap();
        async move { t }
    })
    .await;
    let b_started: Arc<Mutex<Option<Instant>>> = Arc::default();
    let acquired = loop {
        let (bank, started) = (bank.clone(), b_started.clone());
        let got = b
            .run(Call::new(key).ttl(ms(2000)), || async move {
                *started.lock().unwrap() = Some(Instant::now());
                bank.write("acct", CallContext::current().unwrap().fence().await?, "B").expect("B's write refused");
                R::Ok(())
            })
            .await;
        match got {
            Ok(()) => break b_started.lock().unwrap().expect("B's body ran"),
            Err(AppError::Idem(Error::Conflict { .. })) => tokio::time::sleep(ms(20)).await,
            Err(e) => panic!("{e:?}"),
        }
        assert!(holed.elapsed() < Duration::from_secs(10), "B never acquired the key");
    };
    let a_result = a_task.await.unwrap();
    proxy.heal();
    let told = told_at.lock().unwrap().expect("A was never told its lease was lost");
    assert!(told < acquired, "B acquired {:?} before A was told its lease was lost", told - acquired);
    let ledger = bank.ledger("acct");
    (told - holed, acquired - holed, a_result, bank.rejected.load(SeqCst), ledger)
}

/// With `abort_on_lease_lost`, the black-holed holder's body is stopped (`LeaseLost`) before the
/// other caller acquires, so the bank sees every A write before any B write and no stale write
/// at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn black_holed_holder_is_stopped_before_another_acquires() {
    let (told, acquired, a_result, rejected, ledger) = black_holed_holder(true).await;
    assert!(matches!(a_result, Err(AppError::Idem(Error::LeaseLost { .. }))), "{a_result:?}");
    let first_b = ledger.iter().position(|w| w.1 == "B").expect("B wrote");
    assert!(ledger[first_b..].iter().all(|w| w.1 == "B"), "A wrote after B: {ledger:?}");
    assert!(ledger.windows(2).all(|w| w[0].0 <= w[1].0), "the ledger's fences go down: {ledger:?}");
    assert!(ledger[first_b].0 > ledger[0].0, "B's fence is not larger than A's: {ledger:?}");
    assert_eq!(rejected, 0, "stale writes reached the bank");
    println!(
        "black hole (abort): A told of its lost lease {told:?} after the black hole, B acquired {acquired:?} after \
         it ({:?} later); {} writes by A then {} by B, 0 stale writes",
        acquired - told,
        first_b,
        ledger.len() - first_b
    );
}

/// Without `abort_on_lease_lost`, the black-holed holder's body is still told (its context says
/// the lease is lost) before the other caller acquires, runs on, and every write it makes after
/// B's is refused by the bank's fencing check: zero stale writes recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn black_holed_holder_running_on_is_fenced_by_the_bank() {
    let (told, acquired, a_result, rejected, ledger) = black_holed_holder(false).await;
    assert!(a_result.is_ok(), "{a_result:?}");
    let first_b = ledger.iter().position(|w| w.1 == "B").expect("B wrote");
    assert!(ledger[first_b..].iter().all(|w| w.1 == "B"), "a stale write by A was recorded: {ledger:?}");
    assert!(ledger.windows(2).all(|w| w[0].0 <= w[1].0), "the ledger's fences go down: {ledger:?}");
    assert!(rejected > 0, "A's body never wrote after B took over: the test proves nothing");
    println!(
        "black hole (no abort): A's context said lost {told:?} after the black hole, B acquired {acquired:?} after \
         it; A's later writes refused by the bank: {rejected}, stale writes recorded: 0"
    );
}
