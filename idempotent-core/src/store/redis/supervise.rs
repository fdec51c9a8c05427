//! Keeps each connection's routing task alive. fred's reconnect policy covers dropped
//! connections, but some errors end the task for good (fred 10.1 ends it on an `ASK`
//! redirection during a slot migration), after which every command of that client times out.
//! A supervisor per client starts the task again when it ends unasked.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use tokio::task::JoinHandle;

/// Starts `client`'s connection task and restarts it whenever it ends while `closing` is unset.
/// Aborting the supervisor aborts the connection task too (and so closes its connections): a
/// store that failed to connect leaves nothing reconnecting in the background.
pub(crate) fn supervise(client: Client, closing: Arc<AtomicBool>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut task = AbortOnDrop(client.connect());
        loop {
            let ended = (&mut task.0).await;
            if closing.load(Ordering::Acquire) {
                return;
            }
            tracing::warn!(client = %client.id(), outcome = ?ended, "redis connection task ended unasked; restarting it");
            tokio::time::sleep(Duration::from_millis(50)).await;
            if closing.load(Ordering::Acquire) {
                return;
            }
            task = AbortOnDrop(client.connect());
        }
    })
}

/// A task aborted when its handle is dropped.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
