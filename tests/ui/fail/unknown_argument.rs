//! An unknown argument is an error on its name; the function is still emitted (main compiles).

use idempotent::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idempotent::Error> for AppError {
    fn from(_: idempotent::Error) -> Self {
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
