//! `give_up_after` takes a whole number of attempts from 1 to 100, and nothing else.

use idempotency::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idempotency::Error> for AppError {
    fn from(_: idempotency::Error) -> Self {
        AppError
    }
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("app error")
    }
}

#[idempotent(key = "{id}", on_error = give_up_after(0))]
async fn none(id: u32) -> Result<u32, AppError> {
    Ok(id)
}

#[idempotent(key = "{id}", on_error = give_up_after)]
async fn unsaid(id: u32) -> Result<u32, AppError> {
    Ok(id)
}

#[idempotent(key = "{id}", mode = Token, on_error = give_up_after(3))]
async fn token(id: String) -> Result<u32, AppError> {
    Ok(id.len() as u32)
}

fn main() {
    let _ = (none(1), unsaid(1), token(String::new()));
}
