//! Security against a real `redis-server`: tokens that cost the store nothing until used (and
//! forged, tampered or expired ones refused without a command), a used token never run twice
//! while it is valid, key rotation, the least-privilege ACL user of docs/security.md and a clear
//! error when a permission is missing, AUTH in the URL with the password kept out of errors,
//! `Debug` and logs, and the bounds on what an attacker controls.

mod support;

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use idempotency::{Call, Error, Idempotency, OnConflict, RedisStore, StoreErrorKind, TokenKeys};
use support::{counter, create_acl_user, ms, AppError, RedisServer, ACL_RULES, R};

/// Everything the processes' loggers print (our tracing events and fred's `log` records, at
/// every level), for the checks that a password never appears in a log line.
fn captured() -> &'static Mutex<Vec<u8>> {
    static LOG: OnceLock<Mutex<Vec<u8>>> = OnceLock::new();
    static INIT: OnceLock<()> = OnceLock::new();
    let log = LOG.get_or_init(|| Mutex::new(Vec::new()));
    INIT.get_or_init(|| {
        struct Sink;
        impl Write for Sink {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                LOG.get().unwrap().lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_writer(|| Sink)
            .with_ansi(false)
            .try_init()
            .expect("one subscriber per test binary");
    });
    log
}

/// The server's command counts (`INFO commandstats`), without the test's own `INFO` and `DBSIZE`.
fn command_counts(server: &RedisServer) -> Vec<String> {
    let info = server.command(&["INFO", "commandstats"]).unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info:") && !l.starts_with("cmdstat_dbsize:"))
        .map(|l| l.split(",usec=").next().unwrap().to_owned())
        .collect()
}

/// How many records the server holds (the keys with the store's hash tag: not the shared token
/// secret beside them).
fn records(server: &RedisServer) -> usize {
    server.command(&["KEYS", "idem:{*"]).unwrap().lines().filter(|l| !l.is_empty() && *l != "(nil)").count()
}

async fn store(server: &RedisServer) -> RedisStore {
    RedisStore::builder(&server.url()).timeout(Duration::from_secs(2)).connect().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issuing_tokens_writes_nothing_and_bad_tokens_cost_no_command() {
    let server = RedisServer::start();
    let idem = Idempotency::builder(store(&server).await).token_keys(support::test_token_keys()).build();
    let before = (server.command(&["DBSIZE"]).unwrap(), command_counts(&server));

    let tokens: Vec<String> = (0..10_000).map(|_| idem.issue_token(Duration::from_secs(600)).unwrap()).collect();
    let after_issue = (server.command(&["DBSIZE"]).unwrap(), command_counts(&server));
    assert_eq!(after_issue, before, "issuing 10,000 tokens touched the store");

    let runs = counter();
    let body = |runs: Arc<AtomicUsize>| move || async move { R::Ok(runs.fetch_add(1, SeqCst)) };
    let invalid = |r: &R<usize>| matches!(r, Err(AppError::Idem(Error::InvalidToken { .. })));
    // 1,000 forged: made up, tampered with (one character changed), too long, for another scope.
    let other_scope = idem.issue_token_scoped("elsewhere", Duration::from_secs(600)).unwrap();
    for i in 0..1_000 {
        let forged = match i % 4 {
            0 => format!("{:A<56}", i),
            1 => {
                let mut t = tokens[i].clone().into_bytes();
                t[i % 56] = if t[i % 56] == b'x' { b'y' } else { b'x' };
                String::from_utf8(t).unwrap()
            }
            2 => "z".repeat(10_000),
            _ => other_scope.clone(),
        };
        assert!(invalid(&idem.run(Call::token(forged), body(runs.clone())).await));
    }
    // 1,000 expired.
    let short: Vec<String> = (0..1_000).map(|_| idem.issue_token(ms(10)).unwrap()).collect();
    tokio::time::sleep(ms(50)).await;
    for t in &short {
        assert!(invalid(&idem.run(Call::token(t), body(runs.clone())).await));
    }
    assert_eq!(runs.load(SeqCst), 0);
    let after_refusals = (server.command(&["DBSIZE"]).unwrap(), command_counts(&server));
    assert_eq!(after_refusals, before, "refusing forged or expired tokens sent commands to the store");
    // Only a token's first use creates a record.
    assert_eq!(idem.run(Call::token(&tokens[0]), body(runs.clone())).await.unwrap(), 0);
    assert_eq!(records(&server), 1);
}

/// `keep` is 300 ms, the token lives 3 s: the token is still not run a second time after the
/// call's keep ran out, and its record goes once the token has expired (plus the allowed skew).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_used_token_is_not_run_again_while_it_is_valid() {
    let server = RedisServer::start();
    let idem = Idempotency::builder(store(&server).await).token_skew(ms(500)).build();
    let token = idem.issue_token(Duration::from_secs(3)).unwrap();
    let runs = counter();
    let call = || Call::token(&token).keep(ms(300));
    let body = |runs: Arc<AtomicUsize>| move || async move { R::Ok(runs.fetch_add(1, SeqCst)) };
    assert_eq!(idem.run(call(), body(runs.clone())).await.unwrap(), 0);
    tokio::time::sleep(ms(1000)).await;
    assert_eq!(idem.run(call(), body(runs.clone())).await.unwrap(), 0, "the used token ran again past keep");
    assert_eq!(runs.load(SeqCst), 1);
    assert_eq!(records(&server), 1);
    tokio::time::sleep(ms(3000)).await;
    assert_eq!(records(&server), 0, "a used token's record outlived the token");
}

#[tokio::test]
async fn a_rotated_key_still_accepts_tokens_signed_with_the_previous_one() {
    let old = TokenKeys::new(b"last month's token secret, 32 bytes+").unwrap();
    let new = || TokenKeys::new(b"this month's token secret, 32 bytes+").unwrap();
    let store = Arc::new(idempotency::MemoryStore::new());
    let before = Idempotency::builder_shared(store.clone()).token_keys(old).build();
    let token = before.issue_token(Duration::from_secs(60)).unwrap();
    let rotated = Idempotency::builder_shared(store.clone())
        .token_keys(new().previous(b"last month's token secret, 32 bytes+").unwrap())
        .build();
    let ran: Result<u8, Error> = rotated.run(Call::token(&token), || async { Ok(1) }).await;
    assert_eq!(ran.unwrap(), 1);
    let fresh = rotated.issue_token(Duration::from_secs(60)).unwrap();
    // Once the old key is dropped, its tokens are refused; the new key's are taken.
    let dropped = Idempotency::builder_shared(store).token_keys(new()).build();
    let refused: Result<u8, Error> = dropped.run(Call::token(&token), || async { Ok(2) }).await;
    assert!(matches!(refused, Err(Error::InvalidToken { .. })), "{refused:?}");
    let ran: Result<u8, Error> = dropped.run(Call::token(&fresh), || async { Ok(3) }).await;
    assert_eq!(ran.unwrap(), 3);
}

/// The ACL user that the semantics suite runs as (`acl::` tests) is the one docs/security.md
/// shows, rule for rule.
#[test]
fn the_documented_acl_user_is_the_tested_one() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/security.md")).unwrap();
    assert!(doc.contains(&format!("ACL SETUSER idem {ACL_RULES}")), "docs/security.md does not show the tested rules");
}

/// A user without a permission the store needs gets an error that names it: `info` at connect,
/// `set` at the first call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_permission_is_a_clear_error_naming_it() {
    let server = RedisServer::start();
    let url = format!("redis://idem:s3cret@127.0.0.1:{}", server.port());
    create_acl_user(server.port(), &ACL_RULES.replace(" +info", ""));
    let e = RedisStore::connect(&url).await.expect_err("connected without +info");
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert!(e.to_string().contains("NOPERM") && e.to_string().contains("'info'"), "{e}");
    assert!(!e.to_string().contains("s3cret"), "{e}");

    create_acl_user(server.port(), "reset");
    create_acl_user(server.port(), &ACL_RULES.replace(" +set", ""));
    let idem = Idempotency::new(RedisStore::connect(&url).await.unwrap());
    let got: R<u8> = idem.run(Call::new("k"), || async { Ok(1) }).await;
    match got {
        Err(AppError::Idem(Error::Store { source, .. })) => {
            assert_eq!(source.kind(), StoreErrorKind::Config, "{source}");
            assert!(source.to_string().contains("NOPERM") && source.to_string().contains("'set'"), "{source}");
        }
        other => panic!("expected a permission error, got {other:?}"),
    }
}

/// AUTH with a username and password in the URL works; a wrong password is a `Config` error;
/// the password is in no error, no `Debug` output and no log line, through a refused login, a
/// server killed under the store and calls failing meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_in_the_url_and_the_password_stays_secret() {
    let log = captured();
    let mut server = RedisServer::start();
    let secret = "hunter2-Very-Secret";
    create_acl_user(server.port(), &ACL_RULES.replace(">s3cret", &format!(">{secret}")));
    server.command(&["CONFIG", "SET", "requirepass", "default-password-too"]).unwrap();
    let url = format!("redis://idem:{secret}@127.0.0.1:{}", server.port());
    let builder = RedisStore::builder(&url).timeout(ms(400));
    let builder_debug = format!("{builder:?}");
    let store = builder.connect().await.expect("AUTH with username and password");
    let idem = Idempotency::new(store.clone());
    let ok: R<u8> = idem.run(Call::new("authed"), || async { Ok(1) }).await;
    assert_eq!(ok.unwrap(), 1);

    let wrong = RedisStore::builder(&format!("redis://idem:not-{secret}@127.0.0.1:{}", server.port()))
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect_err("logged in with a wrong password");
    assert_eq!(wrong.kind(), StoreErrorKind::Config, "{wrong}");

    server.kill();
    let down: R<u8> = idem.run(Call::new("down"), || async { Ok(2) }).await;
    let down = format!("{down:?}");
    server.restart();
    let texts =
        [builder_debug, format!("{store:?}"), format!("{idem:?}"), wrong.to_string(), format!("{wrong:?}"), down];
    for text in &texts {
        assert!(!text.contains(secret) && !text.contains("not-hunter2"), "the password shows: {text}");
    }
    tokio::time::sleep(ms(300)).await;
    let logged = String::from_utf8_lossy(&log.lock().unwrap()).into_owned();
    assert!(!logged.is_empty(), "nothing was logged: the check proves nothing");
    assert!(!logged.contains(secret), "the password is in a log line");
}

/// What an attacker controls is bounded: a fingerprint payload over 1 MiB is refused before it
/// is hashed; past `max_waiters_per_key`, a duplicate does not wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attacker_controlled_inputs_are_bounded() {
    let idem = Idempotency::builder(idempotency::MemoryStore::new()).max_waiters_per_key(2).build();
    let huge = "x".repeat(idempotency::MAX_FINGERPRINT_BYTES);
    let got: R<u8> = idem.run(Call::new("fp").fingerprint(&huge), || async { Ok(1) }).await;
    assert!(matches!(got, Err(AppError::Idem(Error::InvalidCall { .. }))), "{got:?}");

    let (tx, rx) = tokio::sync::oneshot::channel();
    let holder = tokio::spawn({
        let idem = idem.clone();
        async move {
            idem.run(Call::new("busy"), || async move {
                let _ = tx.send(());
                tokio::time::sleep(ms(800)).await;
                R::Ok(7u8)
            })
            .await
        }
    });
    rx.await.unwrap();
    let wait = || {
        let idem = idem.clone();
        tokio::spawn(async move {
            idem.run(Call::new("busy").on_conflict(OnConflict::Wait(Duration::from_secs(5))), || async { R::Ok(0u8) })
                .await
        })
    };
    let waiters = [wait(), wait()];
    tokio::time::sleep(ms(100)).await;
    let third =
        idem.run(Call::new("busy").on_conflict(OnConflict::Wait(Duration::from_secs(5))), || async { R::Ok(0u8) });
    let third = tokio::time::timeout(ms(200), third).await.expect("the third waiter waited");
    assert!(matches!(third, Err(AppError::Idem(Error::Conflict { .. }))), "{third:?}");
    assert_eq!(holder.await.unwrap().unwrap(), 7);
    for w in waiters {
        assert_eq!(w.await.unwrap().unwrap(), 7, "a waiter within the bound did not get the replay");
    }
}

/// Rotating the shared token secret: a store that connects after it signs with the new secret and
/// still takes tokens signed with the old one (kept as the previous); a second rotation retires
/// the old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_shared_secret_keeps_the_previous_one_accepted() {
    let server = RedisServer::start();
    let before = Idempotency::new(store(&server).await);
    let old = before.issue_token(Duration::from_secs(600)).unwrap();
    store(&server).await.rotate_token_secret().await.unwrap();
    let after = Idempotency::new(store(&server).await);
    let new = after.issue_token(Duration::from_secs(600)).unwrap();
    let run = |idem: &Idempotency, token: &str| {
        let (idem, token) = (idem.clone(), token.to_owned());
        async move { idem.run(Call::token(token), || async { R::Ok(1u8) }).await }
    };
    assert!(run(&after, &old).await.is_ok(), "a token signed before the rotation was refused after it");
    assert!(run(&after, &new).await.is_ok());
    assert!(
        matches!(run(&before, &new).await, Err(AppError::Idem(Error::InvalidToken { .. }))),
        "an instance that has not reconnected takes the new secret's tokens?"
    );
    store(&server).await.rotate_token_secret().await.unwrap();
    let later = Idempotency::new(store(&server).await);
    let old_again = before.issue_token(Duration::from_secs(600)).unwrap();
    assert!(
        matches!(run(&later, &old_again).await, Err(AppError::Idem(Error::InvalidToken { .. }))),
        "a retired secret is still accepted"
    );
}
