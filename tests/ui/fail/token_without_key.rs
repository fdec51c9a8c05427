//! Token mode without a key is an error on `Token`.

use idempotency::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idempotency::Error> for AppError {
    fn from(_: idempotency::Error) -> Self {
        AppError
    }
}

#[idempotent(mode = Token, ttl = "10s")]
async fn submit(token: String) -> Result<u32, AppError> {
    Ok(token.len() as u32)
}

fn main() {
    let _ = submit(String::new());
}
