//! The store's connection pools, and how a statement takes a connection from one: within the
//! call's own deadline, while opening a new connection is bounded by the connect timeout alone.
//!
//! A call that gives up waiting for a connection drops the connection it was opening with it.
//! When opening one takes longer than a call may wait (a server slow to take connections after a
//! restart under load, a short store timeout), every call would give up and the pool, emptied by
//! the restart, would stay empty. So a call that gives up starts a refill: one background task
//! per pool that checks the idle connections, replaces the dead ones and opens one more, within
//! the connect timeout, and leaves them idle in the pool for the next calls.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sqlx::pool::{PoolConnection, PoolOptions};
use sqlx::postgres::{PgConnectOptions, PgPool};
use sqlx::Postgres;
use tokio::time::Instant;

use super::errors::pg_error;
use crate::error::{StoreError, StoreErrorKind};
use crate::store::{within, Within};

/// A pool of connections, how long a call waits for one of them, and whether a refill is under
/// way.
pub(crate) struct Pool {
    pool: PgPool,
    timeout: Duration,
    refilling: Arc<AtomicBool>,
}

/// How much longer than the store's timeout the client waits for a statement's answer. The
/// server's `statement_timeout` starts when the statement arrives, later than the client's clock
/// did, and its cancel has to come back: a client that gave up at the same bound would give up
/// first, on a statement that may still land (an acquire that then holds its key past the error
/// its caller got). Waiting this much longer, the server's answer comes first unless the server
/// or the network is that slow: a tenth of the timeout, at least 100 ms, at most a second.
pub(crate) fn answer_grace(timeout: Duration) -> Duration {
    (timeout / 10).clamp(Duration::from_millis(100), Duration::from_secs(1))
}

/// The options of each of the store's pools: at most `connections`, opened lazily, each acquire
/// (opening a connection included) bounded by `connect_timeout`. A call waits less (its own
/// deadline: [`Pool::connection`]); what it leaves unopened, the refill opens.
pub(crate) fn options(connections: u32, connect_timeout: Duration) -> PoolOptions<Postgres> {
    PoolOptions::<Postgres>::new().max_connections(connections).min_connections(0).acquire_timeout(connect_timeout)
}

impl Pool {
    /// A pool with `options`, its connections opened (lazily) from `connect`, that callers wait
    /// for at most `timeout` (the store's).
    pub(crate) fn lazy(options: PoolOptions<Postgres>, connect: PgConnectOptions, timeout: Duration) -> Pool {
        Pool { pool: options.connect_lazy_with(connect), timeout, refilling: Arc::new(AtomicBool::new(false)) }
    }

    /// The sqlx pool.
    pub(crate) fn sqlx(&self) -> &PgPool {
        &self.pool
    }

    /// Awaits the answer of `statement`, sent now: within the store's timeout and its grace
    /// ([`answer_grace`]), so that the server's own cancel comes first; `Timeout` past that. The
    /// statement's own error is left to the caller (whether it may have landed depends on it).
    pub(crate) async fn answer<T>(
        &self,
        op: &str,
        statement: impl std::future::Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<Result<T, sqlx::Error>, StoreError> {
        within(op, self.timeout + answer_grace(self.timeout), async { Ok(statement.await) }).await
    }

    /// A connection by `deadline` (at most the store's timeout from now). Unavailable if there
    /// is none by then: nothing was sent.
    pub(crate) async fn connection(&self, op: &str, deadline: Instant) -> Result<PoolConnection<Postgres>, StoreError> {
        match tokio::time::timeout_at(deadline, self.pool.acquire()).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => {
                self.refill();
                Err(pg_error(op, e))
            }
            Err(_) => {
                self.refill();
                let message = format!("{op}: no connection to the database within {:?} (is it up?)", self.timeout);
                Err(StoreError::new(StoreErrorKind::Unavailable, message))
            }
        }
    }

    /// Runs `fut` (which takes a connection of this pool itself, like `pool.begin()`) within the
    /// store's timeout, refilling the pool if it times out.
    pub(crate) async fn within<T>(
        &self,
        op: &str,
        fut: impl std::future::Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, StoreError> {
        let done = Within::reading(op, self.timeout, fut, pg_error).await;
        if matches!(&done, Err(e) if e.kind() == StoreErrorKind::Timeout) {
            self.refill();
        }
        done
    }

    /// In the background, takes every idle connection and one more (as many as the pool may
    /// hand out now), each at once given back: each idle connection taken is checked, and one
    /// found dead (after a restart) is replaced by a new one; each is opened within the pool's
    /// acquire bound, the connect timeout. So after a restart the pool is whole again in about
    /// one connect's time, rather than one call failing for each dead connection. Skipped while a
    /// refill is under way, while callers hold every connection, and outside a runtime.
    fn refill(&self) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        // Every connection in use by callers: nothing to check or open.
        let (idle, size) = (self.pool.num_idle() as u32, self.pool.size());
        let free = self.pool.options().get_max_connections().saturating_sub(size.saturating_sub(idle));
        let count = (idle + 1).min(free);
        if count == 0 || self.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        let (pool, refilling) = (self.pool.clone(), Done(self.refilling.clone()));
        rt.spawn(async move {
            let _refilling = refilling;
            let mut taking = tokio::task::JoinSet::new();
            for _ in 0..count {
                let pool = pool.clone();
                // Given back (idle) as soon as it is taken.
                taking.spawn(async move { pool.acquire().await.map(drop) });
            }
            while let Some(took) = taking.join_next().await {
                if let Ok(Err(e)) = took {
                    tracing::debug!(error = %e, "idempotency store: no connection opened in the background");
                }
            }
        });
    }
}

/// Marks a refill done when its task ends, or is dropped with its runtime.
struct Done(Arc<AtomicBool>);

impl Drop for Done {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}
