//! The attribute on something other than a function is an error; the item is still emitted.

use idempotency::idempotent;

#[idempotent(key = "k")]
struct Order;

fn main() {
    let _ = Order;
}
