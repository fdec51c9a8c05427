//! `give_up_after` takes a whole number of attempts from 1 to 1000, and nothing else; it does not go
//! with `on_cancel = finish` in this version.

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

#[idempotent(key = "{id}", on_cancel = finish, on_error = give_up_after(3))]
async fn finished(id: u32) -> Result<u32, AppError> {
    Ok(id)
}

fn main() {
    let _ = (none(1), unsaid(1), finished(1));
}
