//! Redis's clock as this process estimates it, so that the paths without a script can stamp
//! fencing tokens and record expiries in the same time base as the scripts (which read `TIME`):
//! the offset between this process's monotonic clock and Redis's `TIME`, measured when the
//! store connects and again every few seconds.
//!
//! The estimate is off by at most half a round trip (plus drift between two measurements),
//! far less than the shortest lease (10 ms), so a fencing token stamped after a lease ran out
//! is still larger than the token of the holder whose lease it was. Within one process tokens
//! strictly increase regardless.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand};
use once_cell::sync::Lazy;

/// How often the offset is measured again.
const RESYNC: Duration = Duration::from_secs(10);

/// The process's monotonic time base.
static EPOCH: Lazy<Instant> = Lazy::new(Instant::now);

/// The last fencing token handed out by any store of this process.
static LAST_FENCE: AtomicU64 = AtomicU64::new(0);

fn local_us() -> i64 {
    i64::try_from(EPOCH.elapsed().as_micros()).unwrap_or(i64::MAX)
}

/// Redis's time as this process estimates it.
#[derive(Debug)]
pub(crate) struct RedisClock {
    /// Redis µs minus local µs; until the first measurement, the system clock's.
    offset_us: AtomicI64,
}

impl RedisClock {
    pub(crate) fn new() -> Arc<RedisClock> {
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_micros();
        let offset = i64::try_from(wall).unwrap_or(0) - local_us();
        Arc::new(RedisClock { offset_us: AtomicI64::new(offset) })
    }

    /// Redis's time now, in unix microseconds.
    pub(crate) fn now_us(&self) -> u64 {
        u64::try_from(local_us() + self.offset_us.load(Ordering::Relaxed)).unwrap_or(0)
    }

    pub(crate) fn now_ms(&self) -> u64 {
        self.now_us() / 1000
    }

    /// A fencing token: Redis's time in µs, and larger than any this process handed out before.
    pub(crate) fn fence(&self) -> u64 {
        let now = self.now_us();
        let previous = LAST_FENCE
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| Some(now.max(last + 1)))
            .unwrap_or_else(|last| last);
        now.max(previous + 1)
    }

    /// Measures the offset with one `TIME`, taking Redis's reading as made halfway through the
    /// round trip.
    pub(crate) async fn sync(&self, client: &Client) -> Result<(), Error> {
        let time = CustomCommand::new_static("TIME", ClusterHash::Random, false);
        let sent = local_us();
        let reply: Vec<i64> = client.custom(time, Vec::<String>::new()).await?;
        let received = local_us();
        let [secs, micros] = reply[..] else {
            return Err(Error::new(ErrorKind::Parse, format!("TIME replied {reply:?}")));
        };
        let redis_us = secs.saturating_mul(1_000_000).saturating_add(micros);
        self.offset_us.store(redis_us - (sent + received) / 2, Ordering::Relaxed);
        Ok(())
    }

    /// Measures the offset again every few seconds, for as long as the task runs.
    pub(crate) fn keep_in_sync(self: Arc<Self>, client: Client) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(RESYNC).await;
                if let Err(e) = tokio::time::timeout(RESYNC, self.sync(&client)).await.unwrap_or(Ok(())) {
                    tracing::debug!(error = %e, "could not read Redis's clock; keeping the last offset");
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_strictly_increase_and_follow_the_clock() {
        let clock = RedisClock::new();
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as u64;
        let mut last = 0;
        for _ in 0..10_000 {
            let f = clock.fence();
            assert!(f > last);
            last = f;
        }
        assert!(last.abs_diff(wall) < 5_000_000, "{last} vs {wall}");
    }
}
