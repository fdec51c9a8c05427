//! A `store` whose value has no `run` method is an error naming its type (on the return type,
//! where every error the call of `run` finds is reported).

use idempotency::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idempotency::Error> for AppError {
    fn from(_: idempotency::Error) -> Self {
        AppError
    }
}

struct Config;

#[idempotent(key = "{id}", store = config)]
async fn f(config: &Config, id: u32) -> Result<u32, AppError> {
    Ok(id)
}

fn main() {
    let _ = f(&Config, 1);
}
