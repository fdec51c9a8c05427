//! The transactional mode: the body runs in a transaction of the store's database, and the
//! completed record is written by an owner-checked `UPDATE` in that same transaction, committed
//! once with the body's writes (on [`Idempotency::run_committing`]).

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{pg_error, PgStore};
use crate::error::{Error, StoreError};
use crate::store::within;
use crate::store::Completed;
use crate::store::{BoxFuture, Transition};
use crate::{Call, CallContext, Idempotency};

/// The transaction a transactional body writes in (see [`PgStore::run_in_transaction`]): run
/// queries on `&mut **tx`.
pub type PgTransaction = sqlx::Transaction<'static, sqlx::Postgres>;

impl PgStore {
    /// Runs `body` at most once for `call`'s key, like [`Idempotency::run`], with the body's writes
    /// and the completed record committed in one transaction: either both are durable, or neither.
    ///
    /// `idem` must run on this store (`Idempotency::new(store.clone())`). The key is taken by the
    /// store's own short statement first, so a duplicate arriving while the body runs finds it in
    /// progress at once; then a transaction begins on the store's pool and `body` gets it. When the
    /// body returns `Ok`, the record goes from in progress to completed by an owner-checked
    /// `UPDATE` in that transaction, which then commits:
    ///
    /// - `Err`, a panic, or the call dropped: the transaction rolls back and the key is released;
    /// - the commit fails (a serialization failure: [`StoreErrorKind::Serialization`], the
    ///   connection lost...): nothing of the body stayed; the key is released and the call fails
    ///   with [`Error::Store`];
    /// - the key is no longer this call's (its lease ran out and another call took it, or the
    ///   record is gone): the transaction rolls back and the call fails with [`Error::LeaseLost`].
    ///
    /// Effects outside the database (an HTTP call, an email) are not part of the transaction:
    /// docs/postgres.md says what holds for them.
    ///
    /// [`StoreErrorKind::Serialization`]: crate::StoreErrorKind::Serialization
    ///
    /// ```no_run
    /// # async fn f(store: idempotent_core::PgStore) -> Result<(), idempotent_core::Error> {
    /// use idempotent_core::store::postgres::sqlx;
    /// use idempotent_core::{Call, CallContext, Error, Idempotency};
    ///
    /// let idem = Idempotency::new(store.clone());
    /// let order_id: i64 = store
    ///     .run_in_transaction(&idem, Call::new("order:42").scope("checkout"), |tx| {
    ///         Box::pin(async move {
    ///             let fence = CallContext::current().expect("in a call").fence().await? as i64;
    ///             let (id,): (i64,) = sqlx::query_as("INSERT INTO orders (ref, fence) VALUES ($1, $2) RETURNING id")
    ///                 .bind("42")
    ///                 .bind(fence)
    ///                 .fetch_one(&mut **tx)
    ///                 .await
    ///                 .map_err(|e| Error::InvalidCall { key: "order:42".into(), reason: e.to_string() })?;
    ///             Ok::<_, Error>(id)
    ///         })
    ///     })
    ///     .await?;
    /// # let _ = order_id; Ok(()) }
    /// ```
    pub async fn run_in_transaction<T, E, F>(&self, idem: &Idempotency, call: Call, body: F) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: for<'t> FnOnce(&'t mut PgTransaction) -> BoxFuture<'t, Result<T, E>>,
    {
        let body = move || async move {
            let mut tx = self.begin_for_body::<E>().await?;
            let value = body(&mut tx).await?;
            Ok((value, tx))
        };
        idem.run_committing(call, body, |tx, completed| self.commit_transaction(tx, completed)).await
    }

    /// [`run_in_transaction`](Self::run_in_transaction) with the transaction handed to `body`
    /// by value and handed back with its value: `Ok((value, tx))`. What differs is only the
    /// body's type: a closure returning a future that borrows its transaction must be written
    /// for every lifetime of it (`BoxFuture<'t, _>`), and such a future cannot borrow anything
    /// else that is not `'static`; one that owns the transaction can borrow whatever the caller
    /// holds (`&self`, `&App`). The attribute's `tx = ...` expands to this.
    ///
    /// ```no_run
    /// # async fn f(store: idempotent_core::PgStore, app_name: &str) -> Result<(), idempotent_core::Error> {
    /// use idempotent_core::store::postgres::sqlx;
    /// use idempotent_core::{Call, Error, Idempotency};
    ///
    /// let idem = Idempotency::new(store.clone());
    /// let id: i64 = store
    ///     .run_in_owned_transaction(&idem, Call::new("order:42").scope("checkout"), |mut tx| async move {
    ///         let (id,): (i64,) = sqlx::query_as("INSERT INTO orders (ref, app) VALUES ('42', $1) RETURNING id")
    ///             .bind(app_name) // borrowed from the caller
    ///             .fetch_one(&mut *tx)
    ///             .await
    ///             .map_err(|e| Error::InvalidCall { key: "order:42".into(), reason: e.to_string() })?;
    ///         Ok::<_, Error>((id, tx))
    ///     })
    ///     .await?;
    /// # let _ = id; Ok(()) }
    /// ```
    pub async fn run_in_owned_transaction<T, E, F, Fut>(&self, idem: &Idempotency, call: Call, body: F) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: FnOnce(PgTransaction) -> Fut,
        Fut: std::future::Future<Output = Result<(T, PgTransaction), E>>,
    {
        let body = move || async move {
            let tx = self.begin_for_body::<E>().await?;
            body(tx).await
        };
        idem.run_committing(call, body, |tx, completed| self.commit_transaction(tx, completed)).await
    }

    /// The body's transaction, or the call's error naming its key.
    async fn begin_for_body<E: From<Error>>(&self) -> Result<PgTransaction, E> {
        self.begin().await.map_err(|source| {
            let key = CallContext::current().map(|c| c.key().to_owned()).unwrap_or_default();
            E::from(Error::Store { key, source })
        })
    }

    /// A transaction on the store's pool, its statements under the transactional timeout.
    async fn begin(&self) -> Result<PgTransaction, StoreError> {
        self.begin_then("").await
    }

    /// [`begin`](Self::begin) with `then` (statements) sent in the same message.
    pub(super) async fn begin_then(&self, then: &str) -> Result<PgTransaction, StoreError> {
        let pool = &self.inner.pool;
        let statement =
            if then.is_empty() { self.inner.begin.clone() } else { format!("{}; {then}", self.inner.begin) };
        pool.within("begin", pool.sqlx().begin_with(statement)).await
    }

    /// Writes the completed record in `tx` (owner-checked) and commits; `Lost` (rolled back) when
    /// the key is not held by this owner any more.
    async fn commit_transaction(&self, mut tx: PgTransaction, c: Completed) -> Result<Transition, StoreError> {
        let sql = &self.inner.sql;
        within("commit", self.inner.timeout, async {
            let done = if c.keep.is_zero() {
                let query = sqlx::query(&sql.tx_remove).bind(super::stored(&c.key)).bind(&c.owner);
                query.fetch_one(&mut *tx).await
            } else {
                let query = sqlx::query(&sql.tx_commit)
                    .bind(super::stored(&c.key))
                    .bind(&c.owner)
                    .bind(super::fence_param(c.fence))
                    .bind(c.fingerprint.as_deref())
                    .bind(c.result.as_deref())
                    .bind(super::millis(c.keep));
                query.fetch_one(&mut *tx).await
            };
            let done: i64 = sqlx::Row::try_get(&done.map_err(|e| pg_error("commit", e))?, "done")
                .map_err(|e| pg_error("commit", e))?;
            if done == 0 {
                tracing::warn!(
                    key = %c.key,
                    "idempotency transactional commit: the key is not held by this call any more (its lease ran out \
                     and the key was taken or reaped, or the Idempotency given does not run on this PgStore); \
                     rolled back"
                );
                let _ = tx.rollback().await;
                return Ok(Transition::Lost);
            }
            tx.commit().await.map_err(|e| pg_error("commit", e))?;
            Ok(Transition::Done)
        })
        .await
    }
}
