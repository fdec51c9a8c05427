//! An `Ok` type that cannot be stored is an error on the return type naming `Serialize`/`Deserialize`.

use idempotency::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idempotency::Error> for AppError {
    fn from(_: idempotency::Error) -> Self {
        AppError
    }
}

struct Receipt;

#[idempotent(key = "{id}")]
async fn f(id: u32) -> Result<Receipt, AppError> {
    let _ = id;
    Ok(Receipt)
}

fn main() {
    let _ = f(1);
}
