//! The inbox pattern: a claimed batch's bodies write in one transaction of the store's database,
//! each inside a savepoint of its own, and every completed record is written by one owner-checked
//! statement over arrays in that same transaction, which then commits: the batch's effects and its
//! records are durable together, or none of them (`PgStore::run_batch_in_transaction`).

use std::future::Future;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::batch::item_of;
use super::transaction::PgTransaction;
use super::{fence_param, millis, pg_error, stored, PgStore};
use crate::error::{Error, StoreError};
use crate::runtime::{Batch, Settled};
use crate::store::{within, Completed, Transition};
use crate::CallContext;

/// The savepoint each item's body writes under; `ROLLBACK TO` it undoes one body's writes and
/// keeps it, `RELEASE` then a new one opens the next item's.
const SAVEPOINT: &str = "SAVEPOINT idempotency_item";
const NEXT_ITEM: &str = "RELEASE SAVEPOINT idempotency_item; SAVEPOINT idempotency_item";
const UNDO_ITEM: &str = "ROLLBACK TO SAVEPOINT idempotency_item";

impl PgStore {
    /// Runs the bodies of the items `batch` won ([`Idempotency::claim`]) in one transaction, one
    /// after the other, and commits their writes and their completed records together: every
    /// message of a consumer's poll applied exactly once, or not at all (the inbox pattern).
    ///
    /// The batch must be claimed through an `Idempotency` on this store. Each body gets the
    /// transaction (write on `&mut *tx`) and hands it back with its value. Its writes are inside a
    /// savepoint: a body that returns `Err` has them rolled back and its key released, while the
    /// others go on. Then one owner-checked statement turns every completed item's record from in
    /// progress to completed in the transaction, which commits. If any record is not this batch's
    /// any more (its lease ran out and another caller took it), or the commit fails, nothing of
    /// the batch stays: every key is released and every item that ran is settled as
    /// [`Settled::Unavailable`], to be handed back and run again. A batch dropped or unwinding
    /// before the commit leaves nothing either: the transaction rolls back and the keys are
    /// released in the background.
    ///
    /// One transaction has one connection, so the bodies run in order; its statements are under
    /// the store's transactional timeout, and our own (the savepoints, the records' statement, the
    /// commit) under the store's timeout too. A savepoint's statement that gets no answer in time,
    /// or loses its connection, leaves unknown what the transaction holds: the items after it do
    /// not run, nothing is committed, and every item is released and settled as
    /// [`Settled::Unavailable`] (no attempt counted), its delivery to be handed back; only a body
    /// that returned `Err` itself keeps its failure, counted as any body's `Err` is.
    ///
    /// Round trips besides the claim's and the bodies' own: `BEGIN` (with the first savepoint) and one per item run (releasing its savepoint and
    /// opening the next), then the records' statement and `COMMIT`: 104 for a batch of 100,
    /// where one transactional call per message costs 5 each.
    ///
    /// [`Idempotency::claim`]: crate::Idempotency::claim
    ///
    /// ```no_run
    /// # async fn f(store: idempotent_core::PgStore) {
    /// use idempotent_core::store::postgres::sqlx;
    /// use idempotent_core::{AckPlan, Call, Error, Idempotency};
    ///
    /// let idem = Idempotency::new(store.clone());
    /// let deliveries = [("m1", 10_i64), ("m2", 20)];
    /// let batch = idem.claim::<()>(deliveries.iter().map(|(id, _)| Call::new(*id).scope("payments"))).await;
    /// let settled = store
    ///     .run_batch_in_transaction(batch, |mut tx, i, _context| async move {
    ///         let (id, amount) = deliveries[i];
    ///         let done = sqlx::query("UPDATE accounts SET balance = balance + $2 WHERE id = $1")
    ///             .bind(id)
    ///             .bind(amount)
    ///             .execute(&mut *tx)
    ///             .await
    ///             .map(|_| ())
    ///             .map_err(|e| Error::InvalidCall { key: id.into(), reason: e.to_string() });
    ///         (tx, done)
    ///     })
    ///     .await;
    /// let plan = AckPlan::of(&settled); // ack, requeue, dead-letter: indices into the deliveries
    /// # let _ = plan; }
    /// ```
    pub async fn run_batch_in_transaction<'b, T, E, F, Fut>(&self, batch: Batch<T>, mut body: F) -> Vec<Settled<T, E>>
    where
        T: Serialize + DeserializeOwned + Send + 'b,
        E: From<Error> + std::fmt::Display + Send + 'b,
        F: FnMut(PgTransaction, usize, CallContext) -> Fut,
        Fut: Future<Output = (PgTransaction, Result<T, E>)> + Send + 'b,
    {
        let begun = if batch.to_run() == 0 { Err(None) } else { self.begin_batch().await.map_err(Some) };
        let tx = match begun {
            Ok(tx) => tx,
            // Nothing to run, or no transaction: every item won is released, and says why.
            Err(cause) => {
                let failed = move |_: usize, context: CallContext| {
                    let source = cause.as_ref().map_or_else(
                        || StoreError::new(crate::StoreErrorKind::Backend, "no transaction"),
                        StoreError::copied,
                    );
                    std::future::ready(Err(E::from(Error::Store { key: context.key().to_owned(), source })))
                };
                return batch.run(1, failed).await;
            }
        };
        // Boxed: the runtime's future then holds each body's future as one type, and stays
        // `Send` for a caller that spawns it (a body's own borrows of its transaction, inside a
        // generic caller's future, otherwise defeat the compiler's proof that it is).
        let timeout = self.inner.timeout;
        let each = move |inbox: Inbox, index: usize, context: CallContext| -> ItemFuture<'b, T, E> {
            let ran = body(inbox.tx, index, context.clone());
            Box::pin(item_done(ran, context, timeout))
        };
        let spent = |inbox: &Inbox| inbox.broken.as_ref().map(StoreError::copied);
        let inbox = Inbox { tx, broken: None };
        batch.run_committing(inbox, each, spent, |inbox, completed| self.commit_batch(inbox.tx, completed)).await
    }

    /// The batch's transaction, with its first item's savepoint open: one round trip.
    async fn begin_batch(&self) -> Result<PgTransaction, StoreError> {
        self.begin_then(SAVEPOINT).await
    }

    /// Writes every completed record in `tx` (owner-checked, one statement) and commits; rolls
    /// back, answering which were not this batch's, when any was not.
    async fn commit_batch(
        &self,
        mut tx: PgTransaction,
        completed: Vec<Completed>,
    ) -> Result<Vec<Transition>, StoreError> {
        let n = completed.len();
        let keys: Vec<String> = completed.iter().map(|c| stored(&c.key).into_owned()).collect();
        let owners: Vec<&str> = completed.iter().map(|c| c.owner.as_str()).collect();
        let fences: Vec<i64> = completed.iter().map(|c| fence_param(c.fence)).collect();
        let fingerprints: Vec<Option<&str>> = completed.iter().map(|c| c.fingerprint.as_deref()).collect();
        let results: Vec<Option<&[u8]>> = completed.iter().map(|c| c.result.as_deref()).collect();
        let keeps: Vec<i64> = completed.iter().map(|c| millis(c.keep)).collect();
        within("commit", self.inner.timeout, async {
            let rows = sqlx::query(&self.inner.sql.batch.tx_commit_many)
                .bind(keys)
                .bind(owners)
                .bind(fences)
                .bind(fingerprints)
                .bind(results)
                .bind(keeps)
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| pg_error("commit", e))?;
            let mut done = vec![Transition::Lost; n];
            for row in &rows {
                let ours: bool = sqlx::Row::try_get(row, "done").map_err(|e| pg_error("commit", e))?;
                if let (Some(i), true) = (item_of("commit", row, n), ours) {
                    done[i] = Transition::Done;
                }
            }
            if done.iter().any(|t| *t != Transition::Done) {
                let lost: Vec<&str> = completed
                    .iter()
                    .zip(&done)
                    .filter(|(_, t)| **t != Transition::Done)
                    .map(|(c, _)| c.key.as_str())
                    .collect();
                tracing::warn!(
                    keys = ?lost,
                    "idempotency batch commit: keys not held by this batch any more (their leases ran out and they \
                     were taken or reaped); the batch's transaction rolled back"
                );
                let _ = tx.rollback().await;
                return Ok(done);
            }
            tx.commit().await.map_err(|e| pg_error("commit", e))?;
            Ok(done)
        })
        .await
    }
}

/// The batch's transaction as it goes from item to item: `broken` once a savepoint's statement
/// failed in a way that leaves unknown what the transaction holds (it timed out, or the
/// connection went), after which nothing may run in it or be committed from it.
struct Inbox {
    tx: PgTransaction,
    broken: Option<StoreError>,
}

/// An item's body and its savepoint's statement, as the batch holds it.
type ItemFuture<'b, T, E> = crate::store::BoxFuture<'b, (Inbox, Result<T, E>)>;

/// One item's body, then its savepoint: released and the next opened after `Ok`, rolled back to
/// after `Err` (its writes undone, the others kept). Each statement is bounded by `timeout`, as
/// every other statement of the store is.
async fn item_done<T, E: From<Error>>(
    ran: impl Future<Output = (PgTransaction, Result<T, E>)>,
    context: CallContext,
    timeout: std::time::Duration,
) -> (Inbox, Result<T, E>) {
    let (mut tx, out) = ran.await;
    let sql = if out.is_ok() { NEXT_ITEM } else { UNDO_ITEM };
    let failed = match savepoint(&mut tx, sql, timeout).await {
        Ok(()) => return (Inbox { tx, broken: None }, out),
        Err(failed) => failed,
    };
    match (failed, out) {
        // The server refused the statement: the body left the transaction failed (an error it
        // swallowed). Its writes cannot be kept apart from the others' but can be undone.
        (Failed::Refused(e), Ok(value)) => match savepoint(&mut tx, UNDO_ITEM, timeout).await {
            Ok(()) => {
                (Inbox { tx, broken: None }, Err(E::from(Error::Store { key: context.key().to_owned(), source: e })))
            }
            // Not undone either: the server ended the session (its last word an error, then the
            // connection closed), or the transaction cannot go on. Nothing will be committed, so
            // this body's value stands and goes back with the batch, its attempt not counted.
            Err(undo) => (Inbox { tx, broken: Some(undo.into_error()) }, Ok(value)),
        },
        // No answer in time, or no connection: whether the statement ran (keeping this item's
        // writes) is unknown. The transaction is broken: no item runs after this one and nothing
        // is committed, so this item's value stands as it ran and goes back with the batch.
        (failed, out) => (Inbox { tx, broken: Some(failed.into_error()) }, out),
    }
}

/// How a savepoint's statement failed.
enum Failed {
    /// The server answered with an error: the transaction is in a state the client knows.
    Refused(StoreError),
    /// No answer in time, or the connection went: what the transaction holds is unknown.
    Unknown(StoreError),
}

impl Failed {
    fn into_error(self) -> StoreError {
        match self {
            Failed::Refused(e) | Failed::Unknown(e) => e,
        }
    }
}

/// Runs a savepoint's statement `sql` in `tx`, within `timeout`.
async fn savepoint(tx: &mut PgTransaction, sql: &'static str, timeout: std::time::Duration) -> Result<(), Failed> {
    let mut refused = false;
    let done = within("savepoint", timeout, async {
        simple(tx, sql).await.map_err(|e| {
            refused = matches!(e, sqlx::Error::Database(_));
            pg_error("savepoint", e)
        })
    })
    .await;
    done.map_err(|e| if refused { Failed::Refused(e) } else { Failed::Unknown(e) })
}

/// Runs `sql` (statements without parameters, sent in one message) in `tx`.
async fn simple(tx: &mut PgTransaction, sql: &'static str) -> Result<(), sqlx::Error> {
    // A `&str` with no arguments goes by the simple query protocol, several statements at once.
    sqlx::Executor::execute(&mut **tx, sql).await.map(|_| ())
}
