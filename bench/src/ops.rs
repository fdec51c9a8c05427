//! The operations the cases time: our calls (first execution, replay, conflict) on a runtime,
//! the in-process floor, and what prepares them (completed keys, held keys).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idempotency::{Call, Error, Idempotency};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    pub id: u64,
    pub amount_cents: i64,
    pub currency: String,
}

pub fn receipt(id: u64) -> Receipt {
    Receipt { id, amount_cents: 1999, currency: "EUR".into() }
}

pub type R<T> = Result<T, Error>;

/// Replays of the 1,000 keys `replay:{i}` completed beforehand: true when the stored value came
/// back.
pub fn replay_op(idem: Idempotency) -> impl Fn(usize, u64) -> std::pin::Pin<Box<dyn Future<Output = bool> + Send>> {
    move |_, i| {
        let idem = idem.clone();
        Box::pin(async move {
            let r: R<Receipt> = idem.run(Call::new(format!("replay:{}", i % 1000)), || async { Ok(receipt(0)) }).await;
            r.is_ok_and(|v| v.id == i % 1000)
        })
    }
}

/// First executions of fresh keys `{prefix}:{task}:{i}`: true when the body's value came back.
pub fn first_op(
    idem: Idempotency,
    prefix: String,
) -> impl Fn(usize, u64) -> std::pin::Pin<Box<dyn Future<Output = bool> + Send>> {
    move |t, i| {
        let (idem, key) = (idem.clone(), format!("{prefix}:{t}:{i}"));
        Box::pin(async move {
            let r: R<Receipt> = idem.run(Call::new(key), || async move { Ok(receipt(i)) }).await;
            r.is_ok()
        })
    }
}

/// Calls of the 64 keys `held:{i}` held in progress elsewhere: true on `Conflict`.
pub fn conflict_op(idem: Idempotency) -> impl Fn(usize, u64) -> std::pin::Pin<Box<dyn Future<Output = bool> + Send>> {
    move |_, i| {
        let idem = idem.clone();
        Box::pin(async move {
            let r: R<()> = idem.run(Call::new(format!("held:{}", i % 64)), || async { Ok(()) }).await;
            matches!(r, Err(Error::Conflict { .. }))
        })
    }
}

/// Completes `n` keys named `{prefix}{i}` so replays have something to find.
pub async fn complete_keys(idem: &Idempotency, prefix: &str, n: u64) {
    for i in 0..n {
        let _: R<Receipt> = idem.run(Call::new(format!("{prefix}{i}")), || async move { Ok(receipt(i)) }).await;
    }
}

/// The least an in-process first execution costs: the same key and encoded result as ours,
/// inserted in a plain map under a lock, its expiry queued, due records reaped. No owner, lease,
/// fence, watchdog or context: the baseline of the memory store's first execution.
pub fn floor_op(keep: Duration) -> impl Fn(usize, u64) -> std::future::Ready<bool> {
    type Floor = (HashMap<String, (Vec<u8>, Instant)>, VecDeque<(Instant, String)>);
    let floor: Arc<std::sync::Mutex<Floor>> = Arc::default();
    move |_, i| {
        let key = format!("first:{i}");
        let Ok(result) = serde_json::to_vec(&receipt(i)) else { return std::future::ready(false) };
        let now = Instant::now();
        let mut guard = floor.lock().unwrap_or_else(|p| p.into_inner());
        let (map, queue) = &mut *guard;
        let fresh = map.insert(key.clone(), (result, now + keep)).is_none();
        queue.push_back((now + keep, key));
        while queue.front().is_some_and(|(at, _)| *at <= now) {
            if let Some((_, due)) = queue.pop_front() {
                if map.get(&due).is_some_and(|(_, at)| *at <= now) {
                    map.remove(&due);
                }
            }
        }
        std::future::ready(fresh)
    }
}

/// Holds `n` keys named `{prefix}{i}` in progress until `release` is set.
pub fn hold_keys(
    idem: &Idempotency,
    prefix: &str,
    n: u64,
    release: Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|i| {
            let (idem, key, release) = (idem.clone(), format!("{prefix}{i}"), release.clone());
            tokio::spawn(async move {
                let _: R<()> = idem
                    .run(Call::new(key), || async move {
                        while !release.load(Ordering::Relaxed) {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Ok(())
                    })
                    .await;
            })
        })
        .collect()
}
