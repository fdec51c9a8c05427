//! A key value that is not `Display` is an error on the template.

use idempotency::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idempotency::Error> for AppError {
    fn from(_: idempotency::Error) -> Self {
        AppError
    }
}

#[derive(Debug)]
struct Order {
    id: u64,
}

#[idempotent(key = "order:{order}")]
async fn f(order: Order) -> Result<u64, AppError> {
    Ok(order.id)
}

fn main() {
    let _ = f(Order { id: 1 });
}
