//! An unclosed brace in the template is an error on the template.

use idempotency::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idempotency::Error> for AppError {
    fn from(_: idempotency::Error) -> Self {
        AppError
    }
}

#[idempotent(key = "order:{id")]
async fn f(id: u32) -> Result<u32, AppError> {
    Ok(id)
}

fn main() {
    let _ = f(1);
}
