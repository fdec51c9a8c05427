//! A function without a return type is an error at its parameter list.

use idempotency::idempotent;

#[idempotent(key = "{id}")]
async fn f(id: u32) {
    let _ = id;
}

fn main() {
    let _ = f(1);
}
