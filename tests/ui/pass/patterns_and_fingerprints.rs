//! Arguments written as patterns (an extractor's `Wrapper(req): Wrapper<Req>`, a struct
//! pattern, a tuple) are named by their bindings in the key and the fingerprint; a fingerprint is
//! an expression of the arguments: a field, a tuple of fields, a method's value. And the future of
//! a call is `Send` whenever its result type is, `Sync` or not (it runs in `tokio::spawn`).

use std::cell::Cell;

use idempotency::{idempotent, Error, Idempotency, MemoryStore};
use serde::{Deserialize, Serialize};

struct Wrapper<T>(T);

#[derive(Serialize, Deserialize)]
struct Payment {
    provider: String,
    txn_id: u64,
    amount_cents: i64,
    currency: String,
}

impl Payment {
    fn total(&self) -> i64 {
        self.amount_cents
    }
}

struct Ctx {
    idem: Idempotency,
    tenant: u32,
}

#[idempotent(key = "pay:{ev.provider}:{ev.txn_id}", fingerprint = ev.amount_cents, store = ctx.idem.clone())]
async fn by_field(Wrapper(ctx): Wrapper<Ctx>, Wrapper(ev): Wrapper<Payment>) -> Result<u64, Error> {
    Ok(ev.txn_id + u64::from(ctx.tenant))
}

#[idempotent(key = "pay:{tenant}:{p.txn_id}", fingerprint = (p.amount_cents, p.currency), store = idem)]
async fn by_tuple(idem: &Idempotency, Ctx { tenant, .. }: &Ctx, p: Payment) -> Result<i64, Error> {
    Ok(p.amount_cents + i64::from(*tenant))
}

#[idempotent(key = "pay:{a}:{b}", fingerprint = (pair.total(), a), store = idem)]
async fn by_method(idem: &Idempotency, (a, b): (u8, u8), pair: &Payment) -> Result<u8, Error> {
    Ok(a + b)
}

/// `Send` but not `Sync`: the call's future may still go to `tokio::spawn`.
#[idempotent(key = "{n}", store = idem)]
async fn not_sync(idem: Idempotency, n: u32) -> Result<Cell<u32>, Error> {
    Ok(Cell::new(n))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let idem = Idempotency::new(MemoryStore::new());
    let payment = || Payment { provider: "acme".into(), txn_id: 7, amount_cents: 1250, currency: "EUR".into() };
    let ctx = Ctx { idem: idem.clone(), tenant: 1 };
    assert_eq!(by_field(Wrapper(ctx), Wrapper(payment())).await.unwrap(), 8);
    let ctx = Ctx { idem: idem.clone(), tenant: 1 };
    assert_eq!(by_tuple(&idem, &ctx, payment()).await.unwrap(), 1251);
    assert_eq!(by_method(&idem, (1, 2), &payment()).await.unwrap(), 3);
    let spawned = tokio::spawn(not_sync(idem.clone(), 5));
    assert_eq!(spawned.await.unwrap().unwrap().get(), 5);
}
