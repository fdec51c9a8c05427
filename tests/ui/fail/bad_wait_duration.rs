//! A malformed wait duration is an error on its literal.

use idempotency::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idempotency::Error> for AppError {
    fn from(_: idempotency::Error) -> Self {
        AppError
    }
}

#[idempotent(key = "{id}", on_conflict = wait("5x"))]
async fn f(id: u32) -> Result<u32, AppError> {
    Ok(id)
}

fn main() {
    let _ = f(1);
}
