//! The global runtime: set once at start-up with [`init`], used through [`global`].

use std::future::Future;
use std::time::Duration;

use once_cell::sync::OnceCell;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::call::Call;
use crate::error::Error;
use crate::runtime::Idempotency;

static GLOBAL: OnceCell<Idempotency> = OnceCell::new();

/// Sets the global runtime, used by [`global`] and by the attribute. Only the first call takes
/// effect; a later one gets its runtime back as `Err`.
///
/// ```
/// use idempotent_core::{init, Idempotency, MemoryStore};
///
/// init(Idempotency::new(MemoryStore::new())).expect("set once, at start-up");
/// assert!(init(Idempotency::new(MemoryStore::new())).is_err());
/// ```
pub fn init(idempotency: Idempotency) -> Result<(), Idempotency> {
    GLOBAL.set(idempotency)
}

/// Sets the global runtime from the environment ([`Idempotency::from_env`]): connects to the
/// store first, so a store that cannot be reached fails the start-up, not the first request.
///
/// ```no_run
/// # async fn start() -> Result<(), idempotency::Error> {
/// // IDEMPOTENCY_REDIS_URL=rediss://... IDEMPOTENCY_TOKEN_KEY=... ./service
/// idempotency::init_from_env().await?;
/// # Ok(()) }
/// ```
#[cfg(feature = "redis")]
pub async fn init_from_env() -> Result<(), Error> {
    let idem = Idempotency::from_env().await?;
    init(idem)
        .map_err(|_| Error::InvalidCall { key: "init".into(), reason: "the global runtime is already set".into() })
}

/// The global runtime's handle. Calls through it before [`init`] fail with
/// [`Error::NotConfigured`]; none panics.
pub fn global() -> Global {
    Global { _private: () }
}

/// A handle on the global runtime; see [`global`].
#[derive(Debug, Clone, Copy)]
pub struct Global {
    _private: (),
}

impl Global {
    /// The runtime, if [`init`] was called.
    pub fn get(self) -> Option<&'static Idempotency> {
        GLOBAL.get()
    }

    /// [`Idempotency::run`] on the global runtime.
    pub async fn run<T, E, F, Fut>(self, call: Call, body: F) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        match GLOBAL.get() {
            Some(idempotency) => idempotency.run(call, body).await,
            None => Err(Error::NotConfigured { key: call.full_key() }.into()),
        }
    }

    /// [`Idempotency::run_giving_up`] on the global runtime.
    pub async fn run_giving_up<T, E, F, Fut>(self, call: Call, attempts: u32, body: F) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error> + std::fmt::Display,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        match GLOBAL.get() {
            Some(idempotency) => idempotency.run_giving_up(call, attempts, body).await,
            None => Err(Error::NotConfigured { key: call.full_key() }.into()),
        }
    }

    /// [`Idempotency::run_to_completion`] on the global runtime.
    pub async fn run_to_completion<T, E, F, Fut>(self, call: Call, body: F) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
        E: From<Error> + Send + 'static,
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        match GLOBAL.get() {
            Some(idempotency) => idempotency.run_to_completion(call, body).await,
            None => Err(Error::NotConfigured { key: call.full_key() }.into()),
        }
    }

    /// [`Idempotency::issue_token`] on the global runtime.
    pub fn issue_token(self, ttl: Duration) -> Result<String, Error> {
        match GLOBAL.get() {
            Some(idempotency) => idempotency.issue_token(ttl),
            None => Err(Error::NotConfigured { key: "token".into() }),
        }
    }
}
