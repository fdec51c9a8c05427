//! An error type without `From<idempotency::Error>` is an error on the return type.

use idempotency::idempotent;

#[derive(Debug)]
struct PlainError;

#[idempotent(key = "{id}")]
async fn f(id: u32) -> Result<u32, PlainError> {
    Ok(id)
}

fn main() {
    let _ = f(1);
}
