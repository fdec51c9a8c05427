//! Make async service functions safe against duplicate calls: a double-clicked submit button, a
//! payment provider re-sending its callback, a queue redelivering a message, an RPC retry, a
//! scheduled job firing on every instance. One attribute, a per-key state machine behind it
//! (in Redis, PostgreSQL, or this process's memory).
//!
//! # Quickstart
//!
//! ```sh
//! cargo add idempotency                     # the runtime, the attribute, RedisStore (TLS included)
//! cargo add idempotency --features axum     # plus the HTTP layer (idempotency::http) and web::Json
//! ```
//!
//! Set a runtime once at start-up, put the attribute on the function:
//!
//! ```
//! use idempotency::{idempotent, Error, Idempotency, MemoryStore};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Callback { provider: String, txn_id: String, amount_cents: i64 }
//!
//! #[derive(Debug, PartialEq, Serialize, Deserialize)]
//! struct Receipt { charged_cents: i64 }
//!
//! /// Runs once per provider and transaction; a re-sent callback gets the same receipt, and the
//! /// same transaction id with another amount is refused (`Error::KeyReused`).
//! #[idempotent(key = "pay:{cb.provider}:{cb.txn_id}", fingerprint = cb.amount_cents, ttl = "30s", keep = "24h")]
//! async fn on_payment_callback(cb: Callback) -> Result<Receipt, Error> {
//!     Ok(Receipt { charged_cents: cb.amount_cents }) // charge the card, once
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! // Once, at start-up. In production: RedisStore::connect("rediss://...").await?, or
//! // idempotency::init_from_env().await? with IDEMPOTENCY_REDIS_URL set.
//! idempotency::init(Idempotency::new(MemoryStore::new())).expect("set once");
//!
//! let cb = || Callback { provider: "stripe".into(), txn_id: "txn_1".into(), amount_cents: 1250 };
//! let first = on_payment_callback(cb()).await.unwrap();
//! let again = on_payment_callback(cb()).await.unwrap(); // replayed: the card is not charged twice
//! assert_eq!(first, again);
//! # }
//! ```
//!
//! - [`idempotent`](macro@idempotent): the attribute and every argument (key templates, `ttl`,
//!   `keep`, `on_duplicate`, `on_conflict`, `fingerprint`, `scope`, token mode).
//! - [`Idempotency`]: the runtime; everything the attribute does is [`Idempotency::run`] with a
//!   [`Call`]. Also [`Idempotency::lock`] (a lock guard for a critical section),
//!   [`Idempotency::inspect`] / [`forget`](Idempotency::forget) / [`scan`](Idempotency::scan)
//!   for operators, and [`Idempotency::issue_token`] for forms.
//! - Stores: [`MemoryStore`] (one process), [`RedisStore`] (standalone, Sentinel, Cluster; TLS),
//!   and custom ones through [`Store`].
//! - [`Error`]: what a call can fail with, each naming its key; with the `axum` feature it answers
//!   as an RFC 9457 problem, and [`web::Json`] serves `#[idempotent]` axum handlers.
//!
//! The repository's README and `docs/` (guarantees, attribute, HTTP, security, records) have the
//! whole picture, each claim with the test that shows it.

#![deny(missing_docs)]

pub use idempotent_core::*;

pub use idempotent_macros::idempotent;

/// What the `#[idempotent]` attribute's expansion names, re-exported here so that the macro and
/// the runtime it calls always come from the same version of this crate. Not public API.
#[doc(hidden)]
pub mod __private {
    pub use idempotent_core::{global, Call, Error, KeyBuilder, Mode, OnConflict, OnCrash, OnDuplicate};

    use serde::de::DeserializeOwned;
    use serde::Serialize;

    /// The return types an `#[idempotent]` function may have.
    #[diagnostic::on_unimplemented(
        message = "an `#[idempotent]` function must return `Result<T, E>`, not `{Self}`",
        label = "expected `Result<T, E>` with `T: Serialize + DeserializeOwned` and `E: From<idempotency::Error>`",
        note = "the `Ok` value is stored and replayed (serde); the error type takes the library's errors (conflict, duplicate, store failure...)"
    )]
    pub trait IdempotentReturn {}

    impl<T: Serialize + DeserializeOwned, E: From<idempotent_core::Error>> IdempotentReturn for Result<T, E> {}

    /// Called by the expansion, spanned on the return type, so that a wrong one is reported there.
    #[inline(always)]
    pub fn check_return<R: IdempotentReturn>() {}

    /// The return types of an `#[idempotent(on_error = store)]` function: its error is stored too.
    #[diagnostic::on_unimplemented(
        message = "with `on_error = store`, an `#[idempotent]` function's error is stored and replayed: `{Self}` does not serialize",
        label = "expected `Result<T, E>` with `T` and `E: Serialize + DeserializeOwned`, and `E: From<idempotency::Error>`",
        note = "the error is stored like the `Ok` value (serde); derive `Serialize` and `Deserialize` for it, or use `on_error = release`"
    )]
    pub trait IdempotentReturnKeepingErrors {}

    impl<T, E> IdempotentReturnKeepingErrors for Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: Serialize + DeserializeOwned + From<idempotent_core::Error>,
    {
    }

    /// [`check_return`] for `on_error = store`.
    #[inline(always)]
    pub fn check_return_keeping_errors<R: IdempotentReturnKeepingErrors>() {}

    /// The return types of an `#[idempotent(on_error = give_up_after(N))]` function: its
    /// error's text is kept with the count of failures.
    #[diagnostic::on_unimplemented(
        message = "with `on_error = give_up_after(N)`, an `#[idempotent]` function's error is counted and its text kept: `{Self}` does not show it",
        label = "expected `Result<T, E>` with `T: Serialize + DeserializeOwned`, and `E: Display + From<idempotency::Error>`",
        note = "the last failure's text (`Display`) is what later calls get in `Error::GaveUp`; implement `Display` for the error type"
    )]
    pub trait IdempotentReturnGivingUp {}

    impl<T, E> IdempotentReturnGivingUp for Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: std::fmt::Display + From<idempotent_core::Error>,
    {
    }

    /// [`check_return`] for `on_error = give_up_after(N)`.
    #[inline(always)]
    pub fn check_return_giving_up<R: IdempotentReturnGivingUp>() {}

    /// The runtime an expansion runs on: the global one, or the `store = ...` expression's.
    pub trait Runtime {
        /// The runtime, `None` for a global one not initialised.
        fn runtime(&self) -> Option<&idempotent_core::Idempotency>;
    }

    impl Runtime for idempotent_core::Idempotency {
        fn runtime(&self) -> Option<&idempotent_core::Idempotency> {
            Some(self)
        }
    }

    impl Runtime for idempotent_core::Global {
        fn runtime(&self) -> Option<&idempotent_core::Idempotency> {
            self.get()
        }
    }

    impl<R: Runtime + ?Sized> Runtime for &R {
        fn runtime(&self) -> Option<&idempotent_core::Idempotency> {
            (**self).runtime()
        }
    }

    #[cfg(feature = "postgres")]
    pub use idempotent_core::store::postgres::PgTransaction;

    /// `tx = store`: the body in a transaction of `store`, committed with the completed record
    /// ([`PgStore::run_in_owned_transaction`](idempotent_core::PgStore::run_in_owned_transaction)).
    #[cfg(feature = "postgres")]
    pub async fn run_in_transaction<T, E, F, Fut>(
        store: &idempotent_core::PgStore,
        runtime: Option<&idempotent_core::Idempotency>,
        call: Call,
        body: F,
    ) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<idempotent_core::Error>,
        F: FnOnce(PgTransaction) -> Fut,
        Fut: std::future::Future<Output = Result<(T, PgTransaction), E>>,
    {
        match runtime {
            Some(idem) => store.run_in_owned_transaction(idem, call, body).await,
            None => Err(idempotent_core::Error::NotConfigured { key: call.full_key() }.into()),
        }
    }
}

/// The HTTP layer (feature `axum`): the `Idempotency-Key` header and one-time form tokens as a
/// tower layer for axum. See [`idempotent_http`].
#[cfg(feature = "axum")]
pub use idempotent_http as http;
/// The gRPC layer for tonic servers (feature `tonic`): `idempotency::grpc::GrpcIdempotencyLayer`.
#[cfg(feature = "tonic")]
pub use idempotent_http::grpc;

/// The test kit: the standard scenarios pointed at your own function ([`testing::function`])
/// or, with the `axum` feature, your own route ([`testing::route`]), and a pass-through runtime
/// for unit tests. See `docs/testing.md`.
#[cfg(feature = "testing")]
pub mod testing {
    pub use idempotent_core::testing::*;
    #[cfg(feature = "axum")]
    pub use idempotent_http::testing::{route, Route};
}
