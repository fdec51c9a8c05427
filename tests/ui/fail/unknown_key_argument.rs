//! A template naming something that is not an argument is an error on the template, listing the arguments.

use idempotency::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idempotency::Error> for AppError {
    fn from(_: idempotency::Error) -> Self {
        AppError
    }
}

struct Order {
    id: u64,
}

#[idempotent(key = "order:{order.id}")]
async fn f(ord: &Order) -> Result<u64, AppError> {
    Ok(ord.id)
}

fn main() {
    let _ = f(&Order { id: 1 });
}
