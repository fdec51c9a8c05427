//! Make async service functions safe against duplicate calls: a double-clicked submit button, a
//! payment provider re-sending its callback, a queue redelivering a message, an RPC retry, a
//! scheduled job firing on every instance.
//!
//! This facade re-exports the runtime ([`idempotent_core`]). See the README for the whole
//! picture.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use idempotency::{Call, Error, Idempotency, MemoryStore};
//!
//! let idem = Idempotency::new(MemoryStore::new());
//! let first: Result<String, Error> = idem.run(Call::new("k"), || async { Ok("ran".into()) }).await;
//! let again: Result<String, Error> = idem.run(Call::new("k"), || async { Ok("ran twice".into()) }).await;
//! assert_eq!(first.unwrap(), "ran");
//! assert_eq!(again.unwrap(), "ran"); // replayed
//! # }
//! ```

pub use idempotent_core::*;

pub use idempotent_macros::idempotent;

/// What the `#[idempotent]` attribute's expansion names, re-exported here so that the macro and
/// the runtime it calls always come from the same version of this crate. Not public API.
#[doc(hidden)]
pub mod __private {
    pub use idempotent_core::{global, Call, Error, KeyBuilder, OnConflict, OnDuplicate};

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
}

/// The HTTP layer (feature `axum`): the `Idempotency-Key` header and one-time form tokens as a
/// tower layer for axum. See [`idempotent_http`].
#[cfg(feature = "axum")]
pub use idempotent_http as http;
