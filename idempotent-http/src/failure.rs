//! Why a guarded call left nothing to store, shared by the HTTP and the gRPC services: every one
//! releases the key, and each service answers it in its own protocol.

use idempotent_core::Error;

/// Why the guarded body did not produce a response to store.
pub(crate) enum Failure<E, R> {
    /// The runtime refused (conflict, key reused, store down...).
    Idem(Error),
    /// The handler answered with a response not to store (a 5xx, a status not stored, a
    /// stream): passed through.
    NotStored(R),
    /// The handler's response body failed.
    Unreadable(String),
    /// The inner service failed.
    Inner(E),
}

impl<E, R> From<Error> for Failure<E, R> {
    fn from(e: Error) -> Self {
        Failure::Idem(e)
    }
}
