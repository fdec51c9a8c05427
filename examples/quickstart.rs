//! Quickstart: what happens to a first call, a replay, a concurrent conflict, a retry after an
//! error, and a token submitted twice. Runs on the in-memory store; no Redis needed.
//!
//! ```text
//! cargo run --example quickstart
//! ```

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idempotency::{Call, Error, Idempotency, MemoryStore};

/// The service's error type: it must take the library's errors in.
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

/// `Ok: value` or `Err: message`, for the printout.
fn show<T: std::fmt::Display>(r: &Result<T, AppError>) -> String {
    match r {
        Ok(v) => format!("Ok: {v}"),
        Err(e) => format!("Err: {e}"),
    }
}

static CHARGES: AtomicU32 = AtomicU32::new(0);

/// The guarded operation: charge an order once, however often it is asked.
async fn charge(idem: &Idempotency, order: u32, decline: bool) -> Result<String, AppError> {
    let call = Call::new(order.to_string()).scope("charge").ttl(Duration::from_secs(5));
    idem.run(call, || async move {
        tokio::time::sleep(Duration::from_millis(200)).await; // the payment provider is slow
        if decline {
            return Err(AppError::CardDeclined);
        }
        let n = CHARGES.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(format!("receipt #{n} for order {order}"))
    })
    .await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let idem = Idempotency::new(MemoryStore::new());

    println!("1. first call runs the body:       {}", show(&charge(&idem, 1, false).await));
    println!("2. the same call again is replayed: {}", show(&charge(&idem, 1, false).await));

    let (a, b) = tokio::join!(charge(&idem, 2, false), charge(&idem, 2, false));
    println!("3. two calls at once, one runs:     {}", show(&a));
    println!("   the other is turned away:        {}", show(&b));

    println!("4. a failed attempt releases:       {}", show(&charge(&idem, 3, true).await));
    println!("   so the retry runs:               {}", show(&charge(&idem, 3, false).await));

    let token = idem.issue_token(Duration::from_secs(60))?;
    let submit = || {
        idem.run(Call::token(&token), || async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok::<_, AppError>(format!("order created with token {token}"))
        })
    };
    println!("5. a token's first submit runs:     {}", show(&submit().await));
    println!("   its second submit is replayed:   {}", show(&submit().await));
    let unknown = idem.run(Call::token("never-issued"), || async { Ok::<_, AppError>(0) }).await;
    println!("   an unknown token is refused:     {}", show(&unknown));

    println!("cards charged: {} (orders 1, 2 and 3, once each)", CHARGES.load(Ordering::SeqCst));
    assert_eq!(CHARGES.load(Ordering::SeqCst), 3);
    Ok(())
}
