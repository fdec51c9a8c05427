//! The `#[idempotent(...)]` attribute of the [`idempotency`](https://docs.rs/idempotency) crate:
//! it turns an `async fn` into one that runs at most once per key. Use it through the facade
//! (`use idempotency::idempotent;`), not from this crate directly.
//!
//! The attribute is thin: it builds a `Call` from the function's arguments and hands the
//! original body to the runtime's public `run` method, exactly as a user could by hand.
//!
//! ```
//! use idempotency::{idempotent, Error, Idempotency, MemoryStore};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Debug)]
//! enum AppError { Idem(Error) }
//! impl From<Error> for AppError {
//!     fn from(e: Error) -> Self { AppError::Idem(e) }
//! }
//!
//! #[derive(Serialize, Deserialize)]
//! struct Callback { provider: String, txn_id: u64 }
//!
//! #[derive(Debug, PartialEq, Serialize, Deserialize)]
//! struct Receipt(String);
//!
//! /// Runs once per provider and transaction; a re-sent callback gets the same receipt.
//! #[idempotent(key = "pay:{cb.provider}:{cb.txn_id}", ttl = "30s", keep = "24h", store = idem)]
//! async fn on_payment_callback(idem: &Idempotency, cb: Callback) -> Result<Receipt, AppError> {
//!     Ok(Receipt(format!("receipt for {}", cb.txn_id)))
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let idem = Idempotency::new(MemoryStore::new());
//! let cb = || Callback { provider: "stripe".into(), txn_id: 7 };
//! let first = on_payment_callback(&idem, cb()).await.unwrap();
//! let again = on_payment_callback(&idem, cb()).await.unwrap(); // replayed, body not run
//! assert_eq!(first, again);
//! # }
//! ```
//!
//! The body above becomes, in essence:
//!
//! ```text
//! let __idem_key = ::std::format!("pay:{}:{}", cb.provider, cb.txn_id);
//! let __idem_call = ::idempotency::__private::Call::new(__idem_key)
//!     .scope(concat!(module_path!(), "::on_payment_callback"))
//!     .ttl(Duration::from_millis(30000)).keep(Duration::from_millis(86400000));
//! (idem).run(__idem_call, move || async move { /* the original body */ }).await
//! ```
//!
//! Arguments (`docs/attribute.md` in the repository has the full reference):
//!
//! | argument | meaning | default |
//! |---|---|---|
//! | `key = "tmpl"` | key template: `{arg}`, `{arg.field}`, `{self.field}` (`Display` values); `{{`/`}}` escape | required |
//! | `mode = Param \| Token` | key from the arguments, or a one-time token issued beforehand | `Param` |
//! | `ttl = "30s"` | the lease, renewed while the body runs | the runtime's (30 s) |
//! | `keep = "24h"` | how long a completed result is kept and replayed | the runtime's (24 h) |
//! | `on_duplicate = replay \| reject` | a completed key replays its result, or fails with `Error::Duplicate` | `replay` |
//! | `on_conflict = reject \| wait("5s")` | a key in progress elsewhere fails with `Error::Conflict`, or is waited for | `reject` |
//! | `fingerprint = arg` or `(a, b)` | arguments hashed with the key: the same key with another payload is `Error::KeyReused` | none |
//! | `scope = "..."` | the key space; the same scope on two functions shares keys | param mode: module path + function name; token mode: none |
//! | `abort_on_lease_lost` | drop the body and fail with `Error::LeaseLost` when the lease is lost | off |
//! | `store = expr` | what runs the call: an `Idempotency`, a `&Idempotency`, `idempotency::global()` | `idempotency::global()` |
//! | `crate = path` | the path of the `idempotency` crate, when renamed | `::idempotency` |
//!
//! Durations are `"500ms"`, `"30s"`, `"5m"`, `"24h"`, `"7d"` or an integer of seconds, checked
//! at compile time. Every malformed attribute is a compile error on the offending token, and the
//! function is still emitted beside it.

// A symlink to the runtime's parser (idempotent-core/src/duration.rs): one parser, packaged
// with each crate.
mod duration;

mod args;
mod expand;
mod template;

use proc_macro::TokenStream;

/// Makes an `async fn` run at most once per key; see the [crate docs](crate) for the arguments.
///
/// The function must return `Result<T, E>` where `T: Serialize + DeserializeOwned` (the value
/// stored and replayed) and `E: From<idempotency::Error>` (the library's errors: conflict,
/// duplicate, store failure...). Its `Err` releases the key, so a retry runs the body again.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::expand(args.into(), item.into()).into()
}
