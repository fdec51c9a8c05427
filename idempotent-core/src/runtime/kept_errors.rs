//! `on_error = store`: a body's `Err` kept and replayed like an `Ok`, for operations whose
//! failure is their answer (a declined card, a rejected transfer): the same request gets the
//! same error, and the body does not run again. The stored value is the body's `Result` itself,
//! so the record format is the one of every result.

use std::future::Future;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::call::Call;
use crate::error::Error;

use super::Idempotency;

impl Idempotency {
    /// Runs `body` like [`run`](Self::run), and keeps its `Err` too: an `Err` is stored for
    /// `keep` and returned, and a duplicate gets the same `Err` back without running the body.
    /// The library's own refusals of this call (a key in progress, a reused key, a store
    /// failure) are not stored: they come before the body runs. The attribute's
    /// `on_error = store`.
    ///
    /// The value stored is the `Result` (`{"Ok": ...}` or `{"Err": ...}`): a key is run under
    /// one policy; a call reading it under the other is told its record does not decode
    /// ([`Error::Codec`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use idempotency::{Call, Error, Idempotency, MemoryStore};
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Debug, PartialEq, Serialize, Deserialize)]
    /// enum PayError { Declined(String), Idem(String) }
    /// impl From<Error> for PayError {
    ///     fn from(e: Error) -> Self { PayError::Idem(e.to_string()) }
    /// }
    ///
    /// let idem = Idempotency::new(MemoryStore::new());
    /// let pay = |n: u32| idem.run_keeping_errors(Call::new("pay:1"), move || async move {
    ///     Err::<String, _>(PayError::Declined(format!("card declined (attempt {n})")))
    /// });
    /// let first = pay(1).await;
    /// assert_eq!(first, Err(PayError::Declined("card declined (attempt 1)".into())));
    /// assert_eq!(pay(2).await, first, "the same error, and the body did not run again");
    /// # }
    /// ```
    pub async fn run_keeping_errors<T, E, F, Fut>(&self, call: Call, body: F) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: Serialize + DeserializeOwned + From<Error>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.run(call, || async { Ok::<_, E>(body().await) }).await.and_then(|kept| kept)
    }
}
