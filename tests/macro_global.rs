//! The attribute without `store`: calls go through the global runtime, fail with
//! `NotConfigured` before `idempotency::init`, and run once per key after it. (One test in its own
//! binary: the global runtime is set once per process.)

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use idempotency::{idempotent, Error, Idempotency, MemoryStore};

#[derive(Debug)]
enum AppError {
    Idem(Error),
}

impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        AppError::Idem(e)
    }
}

static RUNS: AtomicUsize = AtomicUsize::new(0);

#[idempotent(key = "welcome:{user_id}", keep = "1h")]
async fn send_welcome_email(user_id: u64) -> Result<String, AppError> {
    let n = RUNS.fetch_add(1, SeqCst) + 1;
    Ok(format!("email #{n} to user {user_id}"))
}

#[tokio::test]
async fn global_runtime_is_the_default_store() {
    match send_welcome_email(1).await {
        Err(AppError::Idem(Error::NotConfigured { key })) => {
            assert_eq!(key, "macro_global::send_welcome_email:welcome:1");
        }
        other => panic!("expected NotConfigured before init, got {other:?}"),
    }
    assert_eq!(RUNS.load(SeqCst), 0, "the body ran without a runtime");

    idempotency::init(Idempotency::new(MemoryStore::new())).unwrap();
    assert_eq!(send_welcome_email(1).await.unwrap(), "email #1 to user 1");
    assert_eq!(send_welcome_email(1).await.unwrap(), "email #1 to user 1");
    assert_eq!(send_welcome_email(2).await.unwrap(), "email #2 to user 2");
    assert_eq!(RUNS.load(SeqCst), 2);
}
