//! `on_error = store` with an error that serializes compiles and keeps the error.

use idempotency::{idempotent, Idempotency, MemoryStore};
use serde::{Deserialize, Serialize};

#[derive(Debug, PartialEq, Serialize, Deserialize)]
enum AppError {
    Declined,
    Idem(String),
}

impl From<idempotency::Error> for AppError {
    fn from(e: idempotency::Error) -> Self {
        AppError::Idem(e.to_string())
    }
}

#[idempotent(key = "{id}", on_error = store, store = idem)]
async fn f(idem: &Idempotency, id: u32) -> Result<u32, AppError> {
    let _ = id;
    Err(AppError::Declined)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let idem = Idempotency::new(MemoryStore::new());
    assert_eq!(f(&idem, 1).await, Err(AppError::Declined));
    assert_eq!(f(&idem, 1).await, Err(AppError::Declined));
}
