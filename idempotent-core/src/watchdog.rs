//! The watchdog: renews a held lease every `lease / 3` beside the body, in the body's own task,
//! and tells when the lease is lost, by the store's word or by a local monotonic deadline.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::context::CallContext;
use crate::error::StoreError;
use crate::store::{BoxFuture, Lease, Store};

/// How a guarded body ended.
pub(crate) enum Driven<T> {
    /// The body finished.
    Finished(T),
    /// The lease was lost and the call aborts: the body was dropped.
    Lost(String),
}

/// Keeps one lease alive while a body runs.
pub(crate) struct Watchdog<'a> {
    pub(crate) store: &'a dyn Store,
    pub(crate) key: &'a str,
    pub(crate) owner: &'a str,
    pub(crate) lease: Duration,
    /// Renew at all (a call may opt out, and then the lease bounds the body).
    pub(crate) renew: bool,
    /// Drop the body once the lease is lost.
    pub(crate) abort: bool,
    pub(crate) context: &'a CallContext,
}

/// The part of a lease kept back from the local deadline: a renewal must be confirmed this
/// long before the lease would end on the server.
fn safety_margin(lease: Duration) -> Duration {
    lease / 10
}

type Renewal<'a> = (Instant, BoxFuture<'a, Result<Vec<bool>, StoreError>>);

/// The reply of the renewal in flight, if one is; pending otherwise.
async fn reply(inflight: &mut Option<Renewal<'_>>) -> (Instant, Result<Vec<bool>, StoreError>) {
    match inflight {
        Some((sent, fut)) => (*sent, fut.await),
        None => std::future::pending().await,
    }
}

impl Watchdog<'_> {
    /// Runs `body` to its end (or until the lease is lost, when aborting), renewing the lease
    /// acquired by a request sent at `sent`. The lease counts from when a request was *sent*,
    /// so a slow reply can only make the local deadline early, never late.
    pub(crate) async fn drive<F: Future>(&self, sent: Instant, body: F) -> Driven<F::Output> {
        let interval = self.lease / 3;
        let keep_back = self.lease - safety_margin(self.lease);
        let leases = [Lease { key: self.key, owner: self.owner, lease: self.lease }];
        let mut inflight: Option<Renewal<'_>> = None;
        let mut lost = false;
        let expiry = tokio::time::sleep_until(sent + keep_back);
        let tick = tokio::time::sleep_until(sent + interval);
        tokio::pin!(body, expiry, tick);
        loop {
            tokio::select! {
                biased;
                out = &mut body => return Driven::Finished(out),
                (sent, result) = reply(&mut inflight) => {
                    inflight = None;
                    match result {
                        Ok(renewed) if renewed.first() == Some(&true) => {
                            expiry.as_mut().reset(sent + keep_back);
                            tick.as_mut().reset(sent + interval);
                        }
                        Ok(_) => {
                            lost = true;
                            if let Some(reason) = self.lost("the record expired or another owner holds it") {
                                return Driven::Lost(reason);
                            }
                        }
                        Err(e) => {
                            tracing::warn!(key = self.key, error = %e, "idempotency lease renewal failed; retrying");
                            tick.as_mut().reset(Instant::now() + (interval / 2).max(Duration::from_millis(1)));
                        }
                    }
                }
                () = &mut tick, if self.renew && inflight.is_none() && !lost => {
                    inflight = Some((Instant::now(), self.store.renew(&leases)));
                }
                () = &mut expiry, if !lost => {
                    lost = true;
                    if let Some(reason) = self.lost("no renewal was confirmed before the lease ran out") {
                        return Driven::Lost(reason);
                    }
                }
            }
        }
    }

    /// Records a lost lease; returns the reason when the call aborts.
    fn lost(&self, reason: &str) -> Option<String> {
        self.context.mark_lost();
        tracing::warn!(key = self.key, reason, abort = self.abort, "idempotency lease lost while the body runs");
        self.abort.then(|| reason.to_owned())
    }
}
