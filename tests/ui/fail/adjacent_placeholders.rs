//! Two placeholders with nothing between them could be cut two ways ("ab" + "c" and "a" + "bc"
//! make one key): an error on the template. So is text between them starting with `%`, the
//! escape character.

use idempotency::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idempotency::Error> for AppError {
    fn from(_: idempotency::Error) -> Self {
        AppError
    }
}

#[idempotent(key = "order:{a}{b}")]
async fn f(a: u32, b: u32) -> Result<u32, AppError> {
    Ok(a + b)
}

#[idempotent(key = "order:{a}%{b}")]
async fn g(a: u32, b: u32) -> Result<u32, AppError> {
    Ok(a + b)
}

fn main() {
    let _ = f(1, 2);
    let _ = g(1, 2);
}
