//! `on_crash = hold` through a real crash (issue 26): a process running a payout under
//! `on_crash = hold` is SIGKILLed mid-body, after its effect and before its commit. After its
//! lease the key is unknown: calls get `Error::OutcomeUnknown` and the body never runs again; the
//! operator's `idempotency inspect` shows it, and `idempotency resolve` settles it, as completed
//! (calls replay the value given) or not done (the next call runs, as attempt 2). On a Redis
//! server of the test's own and on PostgreSQL.

#[path = "../../tests/support/mod.rs"]
#[macro_use]
mod support;

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use idempotency::store::{Inspected, RecordState};
use idempotency::{Call, CallContext, Error, Idempotency, OnCrash, PgStore, RedisStore, Store};
use support::{ms, AppError, RedisServer, R};

const BIN: &str = env!("CARGO_BIN_EXE_idempotency");
const LEASE: Duration = Duration::from_millis(1000);

/// The payout call: held on a crash, a lease of a second.
fn payout(key: &str) -> Call {
    Call::new(key).scope("payouts").on_crash(OnCrash::Hold).ttl(LEASE)
}

/// Where the test's records are, as the library and the CLI reach them.
struct Place {
    store: Arc<dyn Store>,
    cli_args: Vec<String>,
    child_env: Vec<(&'static str, String)>,
    _server: Option<RedisServer>,
}

impl Place {
    async fn redis() -> Place {
        let server = RedisServer::start();
        let store = RedisStore::connect(&server.url()).await.unwrap();
        Place {
            store: Arc::new(store),
            cli_args: vec!["--url".into(), server.url()],
            child_env: vec![("IDEM_HOLD_REDIS", server.url())],
            _server: Some(server),
        }
    }

    async fn postgres() -> Place {
        let url = tokio::task::block_in_place(support::postgres::shared_database);
        let schema = support::postgres::unique_schema();
        let store = support::postgres::connect_clients(url, &schema, 1).await.remove(0);
        Place {
            store: Arc::new(store),
            cli_args: vec!["--url".into(), url.into(), "--schema".into(), schema.clone()],
            child_env: vec![("IDEM_HOLD_POSTGRES", url.into()), ("IDEM_HOLD_SCHEMA", schema)],
            _server: None,
        }
    }

    /// Runs `idempotency <args>` on this place: its exit code and stdout (stderr after it).
    fn cli(&self, args: &[&str]) -> (i32, String) {
        let mut all: Vec<OsString> = self.cli_args.iter().map(OsString::from).collect();
        all.extend(args.iter().map(OsString::from));
        let mut cmd = Command::new(BIN);
        for (name, _) in std::env::vars() {
            if name.starts_with("IDEMPOTENCY_") {
                cmd.env_remove(name);
            }
        }
        cmd.args(all).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let out = support::output_within(cmd, Duration::from_secs(30)).expect("the CLI ran");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!text.contains("panicked"), "{text}");
        (out.status.code().unwrap_or(-1), text)
    }

    /// A child process that takes `key` under `on_crash = hold`, has its effect (prints EFFECT),
    /// and waits forever; SIGKILLed once it has. Returns when it is dead.
    fn payout_then_kill(&self, key: &str) {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["hold_child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env("IDEM_HOLD_KEY", key)
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        for (name, value) in &self.child_env {
            cmd.env(name, value);
        }
        let mut child = support::spawn_tied(cmd).expect("spawn the child");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        tokio::task::block_in_place(|| {
            assert!(lines.any(|l| l.is_ok_and(|l| l.contains("EFFECT"))), "the child never had its effect");
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap();
        });
    }
}

/// Not a test: the child of the tests below. Pays out `IDEM_HOLD_KEY` under `on_crash = hold`,
/// says EFFECT once the money is gone, and never gets to its commit.
#[test]
#[ignore = "child process of another test"]
fn hold_child() {
    let Ok(key) = std::env::var("IDEM_HOLD_KEY") else { return };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store: Arc<dyn Store> = match std::env::var("IDEM_HOLD_REDIS") {
            Ok(url) => Arc::new(RedisStore::connect(&url).await.unwrap()),
            Err(_) => {
                let url = std::env::var("IDEM_HOLD_POSTGRES").unwrap();
                let schema = std::env::var("IDEM_HOLD_SCHEMA").unwrap();
                Arc::new(PgStore::builder(&url).schema(&schema).connect().await.unwrap())
            }
        };
        let idem = Idempotency::builder_shared(store).build();
        let _: R<String> = idem
            .run(payout(&key), || async {
                println!("EFFECT");
                std::future::pending::<()>().await;
                Ok("never".to_owned())
            })
            .await;
    });
}

async fn call(idem: &Idempotency, key: &str, runs: &Arc<std::sync::atomic::AtomicUsize>) -> R<String> {
    idem.run(payout(key), || async {
        runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(format!("paid on attempt {}", CallContext::current().unwrap().attempt()))
    })
    .await
}

fn is_unknown(r: &R<String>) -> bool {
    matches!(r, Err(AppError::Idem(Error::OutcomeUnknown { attempt: 1, .. })))
}

async fn killed_holder_is_held_until_the_cli_resolves_it(place: Place) {
    let idem = Idempotency::builder_shared(place.store.clone()).build();
    let runs = support::counter();
    place.payout_then_kill("1");
    // While the dead holder's lease lasts: in progress. After it: unknown, and still unknown.
    let early = call(&idem, "1", &runs).await;
    assert!(matches!(early, Err(AppError::Idem(Error::Conflict { .. }))), "{early:?}");
    tokio::time::sleep(LEASE + ms(300)).await;
    for _ in 0..3 {
        let r = call(&idem, "1", &runs).await;
        assert!(is_unknown(&r), "{r:?}");
    }
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 0, "never run again on a guess");
    let (code, shown) = place.cli(&["inspect", "payouts:1"]);
    assert_eq!(code, 0, "{shown}");
    assert!(shown.contains("state        unknown") && shown.contains("until `idempotency resolve`"), "{shown}");
    // The operator checks with the provider: it went through, with this receipt.
    let (code, said) = place.cli(&["resolve", "payouts:1", "--completed", r#""receipt-1""#]);
    assert_eq!(code, 0, "{said}");
    assert!(said.contains("resolved     payouts:1"), "{said}");
    assert_eq!(call(&idem, "1", &runs).await.unwrap(), "receipt-1");
    // Resolving twice changes nothing, and says so.
    let (code, said) = place.cli(&["resolve", "payouts:1", "--release"]);
    assert_eq!(code, 8, "{said}");
    assert!(said.contains("is completed, not an unknown outcome"), "{said}");

    // Another payout killed the same way: it did not go through. Released, it runs as attempt 2.
    place.payout_then_kill("2");
    tokio::time::sleep(LEASE + ms(300)).await;
    assert!(is_unknown(&call(&idem, "2", &runs).await));
    // `stats` shows which scope holds an unknown outcome: payouts, 1 completed and 1 unknown.
    let (code, stats) = place.cli(&["stats"]);
    assert_eq!(code, 0, "{stats}");
    let row: Vec<&str> = stats
        .lines()
        .find(|l| l.starts_with("payouts "))
        .unwrap_or_else(|| panic!("no payouts row: {stats}"))
        .split_whitespace()
        .collect();
    assert_eq!(row, ["payouts", "2", "1", "0", "0", "0", "1"], "{stats}");
    let (code, said) = place.cli(&["resolve", "payouts:2", "--release"]);
    assert_eq!(code, 0, "{said}");
    assert_eq!(call(&idem, "2", &runs).await.unwrap(), "paid on attempt 2");
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
    let Inspected::Record(view) = idem.inspect("payouts", "2").await.unwrap() else { panic!() };
    assert_eq!(view.state, RecordState::Completed);
    // `list` and `stats` count unknown records (none left) and every other.
    let (code, listed) = place.cli(&["list", "--state", "unknown"]);
    assert_eq!(code, 0, "{listed}");
    assert!(listed.contains("0 records"), "{listed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_on_redis_is_held_until_the_cli_resolves_it() {
    killed_holder_is_held_until_the_cli_resolves_it(Place::redis().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_on_postgres_is_held_until_the_cli_resolves_it() {
    killed_holder_is_held_until_the_cli_resolves_it(Place::postgres().await).await;
}
