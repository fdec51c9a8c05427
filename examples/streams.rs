//! A Redis Streams consumer group's loop around a batch claim, shared by the `stream_consumer`
//! example and its kill -9 test (`tests/stream_consumer.rs`).
//!
//! Each poll takes up to `batch` entries: first the ones delivered before and never acked (by a
//! consumer that crashed, or handed back by this one) once they have been idle for
//! `redeliver_after` (`XAUTOCLAIM`), else new ones (`XREADGROUP ... >`). Their keys are claimed
//! in one round trip, the bodies of the items won run, the completed ones are committed in one
//! more; then the plan is mapped onto the stream: acked (`XACK`), left pending to be claimed
//! again later (requeue), or copied to `<stream>:dead` and acked (dead-letter: a re-used or keyless
//! entry, or, with `give_up_after`, a poison message that failed that many times).

use std::future::Future;
use std::time::Duration;

use fred::prelude::*;
use fred::types::streams::{XReadResponse, XReadValue};
use idempotency::{AckPlan, Call, Idempotency, Settled};

/// One entry of the stream: its stream id and the fields the producer wrote (`key`, the
/// message's idempotency key, and `amount`).
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The entry's id in the stream (`1700000000000-0`).
    pub entry: String,
    /// The message's own id, the same in every copy a producer published.
    pub key: String,
    /// The message's payload.
    pub amount: i64,
}

/// A consumer of one group on one stream.
pub struct Consumer {
    /// The connection the consumer reads and acks with.
    pub client: Client,
    /// The runtime whose store holds the keys.
    pub idem: Idempotency,
    /// The stream's key.
    pub stream: String,
    /// The consumer group.
    pub group: String,
    /// This consumer's name in the group.
    pub name: String,
    /// How long an entry stays pending before any consumer may take it again.
    pub redeliver_after: Duration,
    /// Entries per poll.
    pub batch: u64,
    /// Each key's lease while its body runs.
    pub lease: Duration,
    /// A message whose body failed this many times (across redeliveries and consumers) is
    /// dead-lettered instead of handed back again: a poison message (`Call::give_up_after`).
    /// `None`: handed back for as long as it fails.
    pub give_up_after: Option<u32>,
}

/// What one poll did, by entry.
#[derive(Debug, Default)]
pub struct Polled {
    /// Entries taken.
    pub taken: usize,
    /// Whether they were delivered before (taken with `XAUTOCLAIM`).
    pub redelivered: bool,
    /// Keys whose body ran and whose record was stored.
    pub executed: Vec<String>,
    /// Entries acked (their body ran now, or their key completed before).
    pub acked: usize,
    /// Entries left pending, to be taken again after `redeliver_after`.
    pub requeued: usize,
    /// Entries copied to the dead-letter stream and acked.
    pub dead: usize,
}

/// What a poll's stream commands can fail with.
pub type StreamError = fred::error::Error;

impl Consumer {
    /// Creates the group (and the stream) if it does not exist, reading from the start.
    pub async fn create_group(&self) -> Result<(), StreamError> {
        match self.client.xgroup_create::<(), _, _, _>(&self.stream, &self.group, "0", true).await {
            Err(e) if e.details().starts_with("BUSYGROUP") => Ok(()),
            other => other,
        }
    }

    /// One poll: takes a batch, runs the bodies of the keys it wins with `body` (`concurrency`
    /// at a time), and acks, hands back or dead-letters each entry as the batch's plan says.
    pub async fn poll<E, F, Fut>(&self, concurrency: usize, body: F) -> Result<Polled, StreamError>
    where
        E: std::fmt::Debug + std::fmt::Display,
        F: Fn(&Delivery) -> Fut,
        Fut: Future<Output = Result<(), E>>,
    {
        let (deliveries, redelivered) = self.take().await?;
        let mut polled = Polled { taken: deliveries.len(), redelivered, ..Polled::default() };
        if deliveries.is_empty() {
            return Ok(polled);
        }
        let calls = deliveries.iter().map(|d| {
            let call = Call::new(&d.key).scope("stream-orders").ttl(self.lease).fingerprint(&d.amount);
            match self.give_up_after {
                Some(attempts) => call.give_up_after(attempts),
                None => call,
            }
        });
        let batch = self.idem.claim::<()>(calls).await;
        let settled = batch.run(concurrency, |i, _context| body(&deliveries[i])).await;
        for (delivery, item) in deliveries.iter().zip(&settled) {
            if matches!(item, Settled::Executed { stored: true, .. }) {
                polled.executed.push(delivery.key.clone());
            }
        }
        let plan = AckPlan::of(&settled);
        let ids = |indices: &[usize]| indices.iter().map(|&i| deliveries[i].entry.clone()).collect::<Vec<_>>();
        for &i in &plan.dead_letter {
            let d = &deliveries[i];
            let reason = format!("{:?}", settled[i]);
            let fields = vec![("key", d.key.clone()), ("amount", d.amount.to_string()), ("reason", reason)];
            let _: String = self.client.xadd(format!("{}:dead", self.stream), false, None, "*", fields).await?;
        }
        let acked = ids(&plan.ack).into_iter().chain(ids(&plan.dead_letter)).collect::<Vec<_>>();
        if !acked.is_empty() {
            let _: u64 = self.client.xack(&self.stream, &self.group, acked).await?;
        }
        polled.acked = plan.ack.len();
        polled.requeued = plan.requeue.len();
        polled.dead = plan.dead_letter.len();
        Ok(polled)
    }

    /// Entries delivered before and idle for long enough, else new ones (waiting up to 200 ms).
    async fn take(&self) -> Result<(Vec<Delivery>, bool), StreamError> {
        let (_, pending): (String, Vec<XReadValue<String, String, String>>) = self
            .client
            .xautoclaim_values(
                &self.stream,
                &self.group,
                &self.name,
                self.redeliver_after.as_millis() as u64,
                "0-0",
                Some(self.batch),
                false,
            )
            .await?;
        if !pending.is_empty() {
            return Ok((pending.into_iter().map(delivery).collect(), true));
        }
        // Nothing new within the block: a nil reply, which has no map form.
        let fresh: Value = self
            .client
            .xreadgroup(&self.group, &self.name, Some(self.batch), Some(200), false, &self.stream, ">")
            .await?;
        if fresh.is_null() {
            return Ok((Vec::new(), false));
        }
        let fresh: XReadResponse<String, String, String, String> = fresh.into_xread_response()?;
        let entries = fresh.into_values().flatten().map(delivery).collect();
        Ok((entries, false))
    }

    /// How many entries of the group are delivered and not acked.
    pub async fn pending(&self) -> Result<u64, StreamError> {
        let summary: Value = self.client.xpending(&self.stream, &self.group, ()).await?;
        Ok(match summary {
            Value::Array(parts) => parts.first().and_then(Value::as_u64).unwrap_or(0),
            _ => 0,
        })
    }
}

/// An entry as the producer wrote it; fields missing or unreadable become an empty key (refused
/// as invalid, then dead-lettered) or an amount of 0.
fn delivery((entry, fields): XReadValue<String, String, String>) -> Delivery {
    let key = fields.get("key").cloned().unwrap_or_default();
    let amount = fields.get("amount").and_then(|a| a.parse().ok()).unwrap_or(0);
    Delivery { entry, key, amount }
}
