//! A fingerprint expression naming something that is not an argument (nor a binding of an
//! argument's pattern) is an error on that name, listing what the function binds.

use idempotency::idempotent;

struct Wrapper<T>(T);

#[derive(Debug)]
struct AppError;

impl From<idempotency::Error> for AppError {
    fn from(_: idempotency::Error) -> Self {
        AppError
    }
}

#[idempotent(key = "order:{req}", fingerprint = (req, amount.cents))]
async fn f(Wrapper(req): Wrapper<u32>) -> Result<u32, AppError> {
    Ok(req)
}

fn main() {
    let _ = f(Wrapper(1));
}
