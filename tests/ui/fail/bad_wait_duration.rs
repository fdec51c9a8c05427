//! A malformed wait duration is an error on its literal.

use idempotent::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idempotent::Error> for AppError {
    fn from(_: idempotent::Error) -> Self {
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
