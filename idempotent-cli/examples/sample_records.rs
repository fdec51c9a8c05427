//! Makes a few records to try the CLI on (the samples in docs/cli.md come from them): two
//! completed orders, a completed payment with a fingerprint, and a payment held in progress for
//! a while, which then completes.
//!
//! ```sh
//! cargo run -p idempotency-cli --example sample_records -- redis://127.0.0.1:6379 [HOLD_SECONDS]
//! ```

use std::time::Duration;

use idempotency::{Call, Error, Idempotency, RedisStore};
use serde_json::{json, Value};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let url = args.next().unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
    let hold = Duration::from_secs(args.next().and_then(|s| s.parse().ok()).unwrap_or(60));
    let store = RedisStore::connect(&url).await.map_err(|source| Error::Store { key: url.clone(), source })?;
    let idem = Idempotency::new(store);

    for id in [1001, 1002] {
        let call = Call::new(id.to_string()).scope("orders").keep(Duration::from_secs(24 * 3600));
        let _: Value =
            idem.run(call, || async move { Ok::<_, Error>(json!({ "order_id": id, "status": "paid" })) }).await?;
    }
    let paid = Call::new("stripe:txn_1").scope("my_crate::payments::pay").fingerprint(&("EUR", 4200));
    let _: Value =
        idem.run(paid, || async { Ok::<_, Error>(json!({ "receipt": "rcpt_8f2", "amount": 4200 })) }).await?;

    println!("made orders:1001, orders:1002, my_crate::payments::pay:stripe:txn_1");
    println!("holding my_crate::payments::pay:stripe:txn_2 in progress for {hold:?}");
    let held = Call::new("stripe:txn_2").scope("my_crate::payments::pay").ttl(Duration::from_secs(30));
    let _: Value = idem
        .run(held, || async move {
            tokio::time::sleep(hold).await;
            Ok::<_, Error>(json!({ "receipt": "rcpt_9a1", "amount": 1500 }))
        })
        .await?;
    println!("my_crate::payments::pay:stripe:txn_2 completed");
    Ok(())
}
