//! Every argument of the attribute, on the global runtime, compiles and runs.

use idempotency::{idempotent, Error, Idempotency, MemoryStore};
use serde::{Deserialize, Serialize};

#[derive(Debug)]
pub struct AppError(Error);

impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        AppError(e)
    }
}

#[derive(Serialize, Deserialize)]
pub struct Callback {
    provider: String,
    txn_id: u64,
}

#[idempotent(
    key = "pay:{cb.provider}:{cb.txn_id}",
    mode = Param,
    ttl = "30s",
    keep = 86400,
    on_duplicate = replay,
    on_conflict = wait("500ms"),
    fingerprint = cb,
    scope = "payments",
    abort_on_lease_lost,
    on_crash = hold,
    store = idempotency::global(),
    crate = ::idempotency,
)]
async fn on_callback(cb: Callback) -> Result<String, AppError> {
    Ok(format!("receipt for {}", cb.txn_id))
}

#[idempotent(mode = Token, key = "{token}", on_duplicate = reject, on_conflict = reject, abort_on_lease_lost = false)]
async fn submit(token: &str, qty: u32) -> Result<u32, AppError> {
    Ok(qty)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let cb = || Callback { provider: "acme".into(), txn_id: 1 };
    assert!(matches!(on_callback(cb()).await, Err(AppError(Error::NotConfigured { .. }))));
    idempotency::init(Idempotency::new(MemoryStore::new())).unwrap();
    assert_eq!(on_callback(cb()).await.unwrap(), "receipt for 1");
    assert_eq!(on_callback(cb()).await.unwrap(), "receipt for 1");
    let token = idempotency::global().issue_token(std::time::Duration::from_secs(10)).unwrap();
    assert_eq!(submit(&token, 3).await.unwrap(), 3);
    assert!(matches!(submit(&token, 3).await, Err(AppError(Error::Duplicate { .. }))));
}
