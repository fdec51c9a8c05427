//! The runtime of [`idempotency`](https://docs.rs/idempotency): a per-key state machine that lets
//! an async function run once per key, however many times it is called.
//!
//! ```text
//!   absent ──acquire──▶ IN_PROGRESS ──commit──▶ COMPLETED (result kept for `keep`)
//!     ▲                   │   ▲ renew (watchdog)
//!     └──release on Err / panic / cancel, or lease expiry──┘
//! ```
//!
//! - [`Idempotency`] runs a body for a [`Call`] (key and policies) on a [`Store`]:
//!   [`MemoryStore`] for one process, [`RedisStore`] for many.
//! - A completed key replays its stored result ([`OnDuplicate`]); a key in progress elsewhere
//!   rejects or waits ([`OnConflict`]); token mode runs each issued token once.
//! - While the body runs, a watchdog renews the lease and tells the body if it is lost
//!   ([`CallContext`]), with a fencing token for writes downstream.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use idempotent_core::{Call, Error, Idempotency, MemoryStore};
//!
//! let idem = Idempotency::new(MemoryStore::new());
//! for _ in 0..3 {
//!     let order: Result<u64, Error> = idem
//!         .run(Call::new("order:17").scope("checkout"), || async {
//!             println!("creating order 17"); // printed once
//!             Ok(17)
//!         })
//!         .await;
//!     assert_eq!(order.unwrap(), 17);
//! }
//! # }
//! ```

#![deny(missing_docs)]

mod cache;
mod call;
pub mod client_key;
mod codec;
mod context;
mod duration;
mod error;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzz;
mod global;
mod hash;
mod ids;
mod key;
mod lock;
#[cfg(feature = "axum")]
pub mod problem;
mod runtime;
pub mod store;
pub mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;
mod token;
pub mod utc;
mod watchdog;
#[cfg(feature = "axum")]
pub mod web;

pub use call::{Call, Mode, OnConflict, OnCrash, OnDuplicate, MAX_ATTEMPTS, MAX_DURATION, MAX_KEY_BYTES, MIN_LEASE};
pub use codec::MAX_FINGERPRINT_BYTES;
pub use context::CallContext;
pub use duration::parse_duration;
pub use error::{Error, StoreError, StoreErrorKind};
#[cfg(feature = "redis")]
pub use global::init_from_env;
pub use global::{global, init, Global};
pub use key::KeyBuilder;
pub use lock::{LockGuard, LockRequest, LOCK_SCOPE};
pub use runtime::{
    Ack, AckPlan, Batch, Completed, Force, Idempotency, IdempotencyBuilder, Outcome, Resolve, ScanFilter, Settled,
    Unresolved, DEFAULT_KEEP, DEFAULT_MAX_RESULT_BYTES, DEFAULT_MAX_WAITERS_PER_KEY, DEFAULT_RESOLVER_TIMEOUT,
    DEFAULT_TOKEN_SKEW, DEFAULT_TTL, RUNTIME_ENV_VARS,
};
pub use store::memory::MemoryStore;
#[cfg(feature = "postgres")]
pub use store::postgres::{PgStore, PgStoreBuilder};
#[cfg(feature = "redis")]
pub use store::redis::{RedisStore, RedisStoreBuilder};
pub use store::Store;
pub use token::{TokenKeys, MIN_SECRET_BYTES, TOKEN_CHARS};
