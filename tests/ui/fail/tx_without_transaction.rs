//! `tx = ...` hands the body a transaction: the function must say where it goes, with a
//! parameter `tx: &mut PgTransaction` (which its callers then do not pass). A key template
//! cannot name that parameter.

use idempotency::idempotent;

#[derive(Debug)]
struct AppError;

impl From<idempotency::Error> for AppError {
    fn from(_: idempotency::Error) -> Self {
        AppError
    }
}

struct Db;

#[idempotent(key = "order:{id}", tx = Db)]
async fn f(id: u32) -> Result<u32, AppError> {
    Ok(id)
}

fn main() {
    let _ = f(1);
}
