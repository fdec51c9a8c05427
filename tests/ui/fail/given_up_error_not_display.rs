//! With `give_up_after(N)` the error's text is kept: an error type without `Display` is refused
//! on the return type.

use idempotency::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idempotency::Error> for AppError {
    fn from(_: idempotency::Error) -> Self {
        AppError
    }
}

#[idempotent(key = "{id}", on_error = give_up_after(3))]
async fn f(id: u32) -> Result<u32, AppError> {
    Ok(id)
}

fn main() {
    let _ = f(1);
}
