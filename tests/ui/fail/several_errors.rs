//! Every mistake in the function is reported at once, each on its own token.

use idempotency::idempotent;

#[idempotent(key = "{user}", fingerprint = payload)]
fn f(id: u32) -> Result<u32, String> {
    Ok(id)
}

fn main() {
    let _ = f(1);
}
