//! A form submitted with a one-time token (token mode): a double click creates one order, a
//! used or unknown token is refused, and a failed attempt leaves its token usable for a retry.
//!
//! ```text
//! cargo run --example order_submit                               # in-memory store
//! cargo run --example order_submit -- --redis redis://127.0.0.1:6379
//! ```

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idempotency::{idempotent, Error};
use serde::{Deserialize, Serialize};

/// The service's error type: it takes the library's errors in.
#[derive(Debug)]
enum AppError {
    Idempotency(Error),
    CardDeclined,
}

impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        AppError::Idempotency(e)
    }
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppError::Idempotency(e) => write!(f, "{e}"),
            AppError::CardDeclined => f.write_str("card declined"),
        }
    }
}

impl std::error::Error for AppError {}

/// The form's content.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct NewOrder {
    item: String,
    qty: u32,
    card: String,
}

/// The created order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    id: u32,
    item: String,
    qty: u32,
}

/// Orders written to the "database".
static ORDERS: AtomicU32 = AtomicU32::new(0);

/// Runs once per token the page was served with. A second submit of a used token is refused
/// (`on_duplicate = reject`): the page shows "already submitted" instead of a second order.
#[idempotent(mode = Token, key = "{token}", ttl = "10s", keep = "1h", on_duplicate = reject)]
async fn submit_order(token: &str, order: &NewOrder) -> Result<Order, AppError> {
    tokio::time::sleep(Duration::from_millis(200)).await; // charging the card
    if order.card == "4000-0000-0000-0002" {
        return Err(AppError::CardDeclined);
    }
    let id = ORDERS.fetch_add(1, Ordering::SeqCst) + 1;
    Ok(Order { id, item: order.item.clone(), qty: order.qty })
}

/// `Ok: value` or `Err: message`, for the printout.
fn show(r: &Result<Order, AppError>) -> String {
    match r {
        Ok(o) => format!("Ok: order #{} ({} x {})", o.id, o.qty, o.item),
        Err(e) => format!("Err: {e}"),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let idem = common::runtime("order_submit").await?;
    idempotency::init(idem).expect("initialized once, at start-up");
    let page_token = || idempotency::global().issue_token(Duration::from_secs(600));

    let order = NewOrder { item: "teapot".into(), qty: 1, card: "4242-4242-4242-4242".into() };
    let token = page_token()?;
    println!("1. the order page is served with token {token}");

    let (first, second) = tokio::join!(submit_order(&token, &order), submit_order(&token, &order));
    println!("2. double click, first request:  {}", show(&first));
    println!("   double click, second request: {}", show(&second));
    let conflict = |r: &Result<Order, AppError>| matches!(r, Err(AppError::Idempotency(Error::Conflict { .. })));
    assert!(first.is_ok() && conflict(&second) || second.is_ok() && conflict(&first), "the double click ran twice");

    let again = submit_order(&token, &order).await;
    println!("3. the used token sent again:     {}", show(&again));
    assert!(matches!(again, Err(AppError::Idempotency(Error::Duplicate { .. }))));

    let forged = submit_order("made-up-token", &order).await;
    println!("4. a token never issued:          {}", show(&forged));
    assert!(matches!(forged, Err(AppError::Idempotency(Error::InvalidToken { .. }))));

    let token = page_token()?;
    let declined = NewOrder { card: "4000-0000-0000-0002".into(), ..order.clone() };
    let failed = submit_order(&token, &declined).await;
    println!("5. a new page, the card declined: {}", show(&failed));
    assert!(matches!(failed, Err(AppError::CardDeclined)));
    let retried = submit_order(&token, &order).await;
    println!("   retry, same token, other card: {}", show(&retried));
    assert!(retried.is_ok(), "a failed attempt used the token up");

    let created = ORDERS.load(Ordering::SeqCst);
    println!("orders created: {created} (one per page, whatever the clicks)");
    assert_eq!(created, 2);
    Ok(())
}
