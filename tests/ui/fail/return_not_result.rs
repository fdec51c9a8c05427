//! A return type that is not `Result<T, E>` is an error on the return type that says what is needed.

use idempotency::idempotent;

#[idempotent(key = "{id}")]
async fn f(id: u32) -> u32 {
    id
}

fn main() {
    let _ = f(1);
}
