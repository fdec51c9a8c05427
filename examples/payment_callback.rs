//! A payment provider re-sends the same callback five times, three of them at once: one receipt
//! is created, and every delivery gets that receipt back.
//!
//! ```text
//! cargo run --example payment_callback                               # in-memory store
//! cargo run --example payment_callback -- --redis redis://127.0.0.1:6379
//! ```

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idempotency::{idempotent, Error};
use serde::{Deserialize, Serialize};

/// The service's error type: it takes the library's errors in.
#[derive(Debug)]
enum AppError {
    Idempotency(Error),
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
        }
    }
}

impl std::error::Error for AppError {}

/// What the provider posts.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Callback {
    provider: String,
    txn_id: String,
    amount_cents: u64,
}

/// What the callback creates, once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    number: u32,
    txn_id: String,
    amount_cents: u64,
}

/// Receipts written to the "database".
static RECEIPTS: AtomicU32 = AtomicU32::new(0);

/// One receipt per provider transaction. A delivery that arrives while the first is still being
/// handled waits for it (`on_conflict = wait`); a later one gets the stored receipt. The whole
/// payload is fingerprinted: a reused transaction id with another amount is refused.
#[idempotent(
    key = "pay:{cb.provider}:{cb.txn_id}",
    ttl = "30s",
    keep = "24h",
    on_conflict = wait("5s"),
    fingerprint = cb
)]
async fn on_payment_callback(cb: Callback) -> Result<Receipt, AppError> {
    tokio::time::sleep(Duration::from_millis(300)).await; // the database write is slow
    let number = RECEIPTS.fetch_add(1, Ordering::SeqCst) + 1;
    println!("  (body) creating receipt #{number} for {} ({} cents)", cb.txn_id, cb.amount_cents);
    Ok(Receipt { number, txn_id: cb.txn_id, amount_cents: cb.amount_cents })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let idem = common::runtime("payment_callback").await?;
    idempotency::init(idem).expect("initialized once, at start-up");

    // A fresh transaction id per run, so that a second run against the same Redis starts clean.
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
    let cb = Callback { provider: "acme-pay".into(), txn_id: format!("txn_{nanos}"), amount_cents: 4_200 };

    println!("deliveries 1-3 arrive at the same time:");
    let (a, b, c) =
        tokio::join!(on_payment_callback(cb.clone()), on_payment_callback(cb.clone()), on_payment_callback(cb.clone()));
    let mut receipts = Vec::new();
    for (i, r) in [a, b, c].into_iter().enumerate() {
        let receipt = r?;
        println!("  delivery {}: receipt #{}", i + 1, receipt.number);
        receipts.push(receipt);
    }
    println!("deliveries 4-5 arrive later:");
    for i in 4..=5 {
        let receipt = on_payment_callback(cb.clone()).await?;
        println!("  delivery {i}: receipt #{} (replayed)", receipt.number);
        receipts.push(receipt);
    }

    let forged = Callback { amount_cents: 1, ..cb.clone() };
    match on_payment_callback(forged).await {
        Err(AppError::Idempotency(e @ Error::KeyReused { .. })) => println!("same txn id, other amount: {e}"),
        other => panic!("a reused transaction id with another amount was not refused: {other:?}"),
    }

    let created = RECEIPTS.load(Ordering::SeqCst);
    println!("receipts created: {created}; deliveries that got receipt #1: {}", receipts.len());
    assert_eq!(created, 1, "the callback created more than one receipt");
    assert!(receipts.iter().all(|r| r == &receipts[0]), "deliveries saw different receipts");
    Ok(())
}
