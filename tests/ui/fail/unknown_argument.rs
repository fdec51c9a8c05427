//! An unknown argument is an error on its name; the function is still emitted (main compiles).

use idempotency::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idempotency::Error> for AppError {
    fn from(_: idempotency::Error) -> Self {
        AppError
    }
}

#[idempotent(key = "{id}", tll = "30s")]
async fn f(id: u32) -> Result<u32, AppError> {
    Ok(id)
}

fn main() {
    let _ = f(1);
}
