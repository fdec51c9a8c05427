//! A fingerprint naming something that is not an argument is an error on that name.

use idempotency::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idempotency::Error> for AppError {
    fn from(_: idempotency::Error) -> Self {
        AppError
    }
}

#[idempotent(key = "{id}", fingerprint = (id, amount))]
async fn f(id: u32, amont: u64) -> Result<u64, AppError> {
    Ok(amont + id as u64)
}

fn main() {
    let _ = f(1, 2);
}
