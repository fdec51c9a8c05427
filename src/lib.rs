//! Make async service functions safe against duplicate calls: a double-clicked submit button, a
//! payment provider re-sending its callback, a queue redelivering a message, an RPC retry, a
//! scheduled job firing on every instance.
//!
//! This facade re-exports the runtime ([`idempotent_core`]). See the README for the whole
//! picture.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use idempotent::{Call, Error, Idempotency, MemoryStore};
//!
//! let idem = Idempotency::new(MemoryStore::new());
//! let first: Result<String, Error> = idem.run(Call::new("k"), || async { Ok("ran".into()) }).await;
//! let again: Result<String, Error> = idem.run(Call::new("k"), || async { Ok("ran twice".into()) }).await;
//! assert_eq!(first.unwrap(), "ran");
//! assert_eq!(again.unwrap(), "ran"); // replayed
//! # }
//! ```

pub use idempotent_core::*;
