//! Param mode without a key is an error on the attribute.

use idempotency::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idempotency::Error> for AppError {
    fn from(_: idempotency::Error) -> Self {
        AppError
    }
}

#[idempotent(ttl = "10s")]
async fn f(id: u32) -> Result<u32, AppError> {
    Ok(id)
}

fn main() {
    let _ = f(1);
}
