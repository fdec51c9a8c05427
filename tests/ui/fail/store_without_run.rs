//! A `store` whose value has no `run` method is an error naming its type (on the return type,
//! where every error the call of `run` finds is reported).

use idempotent::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idempotent::Error> for AppError {
    fn from(_: idempotent::Error) -> Self {
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
