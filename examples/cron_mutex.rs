//! A scheduled job fires on three instances at once: one runs it, the other two skip. The job
//! outlives its lease three times over, and keeps it: the watchdog renews it while it runs. And a
//! job that must run once per day, however often and wherever it fires: a key per day, kept
//! longer than a day.
//!
//! Both give their scope: by default a key's scope is the function's module path and name, so
//! two binaries (or a renamed function) guarding "the same" job would not exclude each other.
//!
//! ```text
//! cargo run --example cron_mutex                               # in-memory store
//! cargo run --example cron_mutex -- --redis redis://127.0.0.1:6379
//! ```

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idempotency::{idempotent, Error, Idempotency, MemoryStore, RedisStore, Store};

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

/// One instance of the service, with its own runtime and store client.
struct Instance {
    name: &'static str,
    idem: Idempotency,
}

/// Times the job body ran, over all instances.
static RUNS: AtomicU32 = AtomicU32::new(0);

/// Daily digests sent, over all instances.
static DIGESTS: AtomicU32 = AtomicU32::new(0);

/// How long the job takes: three times its lease.
const JOB: Duration = Duration::from_millis(1800);

impl Instance {
    /// A mutex, not a cache: a key in progress elsewhere is refused at once, and nothing is kept
    /// after success (`keep = "0s"`), so tomorrow's run runs. The 600 ms lease is renewed every
    /// 200 ms while the body runs; a crashed instance would hold it 600 ms at most. `scope =
    /// "jobs"`: every binary that fires this job shares the key, whatever its module path.
    #[idempotent(scope = "jobs", key = "nightly-report", ttl = "600ms", keep = "0s", on_conflict = reject, store = self.idem)]
    async fn nightly_report(&self) -> Result<String, AppError> {
        let n = RUNS.fetch_add(1, Ordering::SeqCst) + 1;
        println!("  {}: running the report (run #{n})", self.name);
        tokio::time::sleep(JOB).await;
        Ok(format!("report #{n} by {}", self.name))
    }

    /// Once per day: the day is in the key, and the record of a day's run is kept 36 hours, so an
    /// instance firing again that day (a restart, a second schedule) finds it and skips
    /// (`on_duplicate = reject`), and one firing while it runs is refused.
    #[idempotent(scope = "jobs", key = "daily-digest:{day}", ttl = "600ms", keep = "36h", on_duplicate = reject, store = self.idem)]
    async fn daily_digest(&self, day: &str) -> Result<String, AppError> {
        let n = DIGESTS.fetch_add(1, Ordering::SeqCst) + 1;
        println!("  {}: sending the digest of {day} (digest #{n})", self.name);
        Ok(format!("digest of {day}"))
    }

    /// Fires the daily job: whether this instance sent it.
    async fn fire_digest(&self, day: &str) -> bool {
        match self.daily_digest(day).await {
            Ok(_) => true,
            Err(AppError::Idempotency(Error::Duplicate { .. } | Error::Conflict { .. })) => {
                println!("  {}: the digest of {day} is already sent, or being sent", self.name);
                false
            }
            Err(AppError::Idempotency(e)) => panic!("{}: {e}", self.name),
        }
    }

    /// What the scheduler does when the job fires: run it, or skip it if it runs elsewhere.
    async fn fire(&self) -> Option<String> {
        match self.nightly_report().await {
            Ok(report) => {
                println!("  {}: done, {report}", self.name);
                Some(report)
            }
            Err(AppError::Idempotency(Error::Conflict { .. })) => {
                println!("  {}: skipped, another instance is running it", self.name);
                None
            }
            Err(AppError::Idempotency(e)) => panic!("{}: {e}", self.name),
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Three instances: with Redis, three separate clients; in memory, one shared store (three
    // processes would need Redis).
    let url = common::redis_url("cron_mutex");
    let shared: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mut instances = Vec::new();
    for name in ["instance-a", "instance-b", "instance-c"] {
        let store: Arc<dyn Store> = match &url {
            Some(url) => Arc::new(RedisStore::connect(url).await?),
            None => shared.clone(),
        };
        instances.push(Instance { name, idem: Idempotency::builder_shared(store).build() });
    }
    match &url {
        Some(url) => println!("store: Redis at {url}, one client per instance"),
        None => println!("store: in memory, shared by the instances (pass --redis URL for Redis)"),
    }
    let [a, b, c] = &instances[..] else { unreachable!() };

    println!("night 1: the job fires on all three instances at once");
    let start = Instant::now();
    let late = async {
        // Twice the lease later: without renewal the key would have expired by now.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        println!("  ({} ms in, past two leases, instance-c fires again)", start.elapsed().as_millis());
        c.fire().await
    };
    let (ra, rb, rc, rlate) = tokio::join!(a.fire(), b.fire(), c.fire(), late);
    let ran: Vec<_> = [&ra, &rb, &rc, &rlate].into_iter().flatten().collect();
    assert_eq!(ran.len(), 1, "the job ran on more than one instance: {ran:?}");
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);

    println!("night 2: nothing was kept, so the job runs again");
    let (rb, rc) = tokio::join!(b.fire(), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        c.fire().await
    });
    assert!(rb.is_some() != rc.is_some(), "night 2: the job ran on both instances, or on none");

    let runs = RUNS.load(Ordering::SeqCst);
    println!("the job ran {runs} times in two nights on three instances");
    assert_eq!(runs, 2);

    println!("the daily digest fires on all three instances, then again later the same day, then the next day");
    let sent =
        [a.fire_digest("2026-12-01").await, b.fire_digest("2026-12-01").await, c.fire_digest("2026-12-01").await];
    assert_eq!(sent.iter().filter(|s| **s).count(), 1, "the digest went out more than once that day");
    assert!(!a.fire_digest("2026-12-01").await, "fired again the same day, and sent again");
    assert!(b.fire_digest("2026-12-02").await, "the next day's digest did not go out");
    assert_eq!(DIGESTS.load(Ordering::SeqCst), 2);
    println!("two digests in two days, whatever the firing");
    Ok(())
}
