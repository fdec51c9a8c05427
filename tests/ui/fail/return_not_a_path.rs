//! A return type that cannot be a `Result` (a tuple, a reference, `impl Trait`) is an error on it.

use idempotency::idempotent;

#[idempotent(key = "{id}")]
async fn f(id: u32) -> (u32, String) {
    (id, String::new())
}

fn main() {
    let _ = f(1);
}
