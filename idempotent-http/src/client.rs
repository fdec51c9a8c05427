//! Naming the client a request comes from, for [`IdempotencyLayer::per_client`]: ready-made
//! extractors for the usual cases. A credential is hashed before it becomes part of a key, so no
//! secret reaches the store.
//!
//! [`IdempotencyLayer::per_client`]: crate::IdempotencyLayer::per_client

use std::fmt::Display;

use http::header::{HeaderName, AUTHORIZATION};
use http::request;
use idempotent_core::client_key::client_of_credential as credential;

/// The client is whoever sends this value of header `name` (an API key, a session id): its
/// hash. A request without the header is refused with 403.
///
/// ```
/// # use idempotent_core::{Idempotency, MemoryStore};
/// use idempotent_http::{client, IdempotencyLayer};
/// # let idem = Idempotency::new(MemoryStore::new());
/// let layer = IdempotencyLayer::per_client(idem, client::header("x-api-key"));
/// ```
pub fn header(name: &'static str) -> impl Fn(&request::Parts) -> Option<String> + Clone + Send + Sync + 'static {
    let name = HeaderName::from_static(name);
    move |req: &request::Parts| {
        let mut values = req.headers.get_all(&name).iter();
        let value = values.next()?;
        // Two values would make the client ambiguous.
        values.next().is_none().then(|| credential(value.as_bytes())).flatten()
    }
}

/// The client is whoever presents these credentials (`Authorization: Bearer ...`, `Basic ...`):
/// their hash. A request without an `Authorization` header is refused with 403.
pub fn authorization() -> impl Fn(&request::Parts) -> Option<String> + Clone + Send + Sync + 'static {
    let name = AUTHORIZATION;
    move |req: &request::Parts| {
        let mut values = req.headers.get_all(&name).iter();
        let value = values.next()?;
        values.next().is_none().then(|| credential(value.as_bytes())).flatten()
    }
}

/// The client is the value of type `T` an authentication layer put in the request's extensions
/// (a user or account id), written with `Display`. A request without one is refused with 403.
///
/// ```
/// # use idempotent_core::{Idempotency, MemoryStore};
/// use idempotent_http::{client, IdempotencyLayer};
///
/// #[derive(Clone)]
/// struct UserId(u64);
/// impl std::fmt::Display for UserId {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { self.0.fmt(f) }
/// }
/// # let idem = Idempotency::new(MemoryStore::new());
/// let layer = IdempotencyLayer::per_client(idem, client::extension::<UserId>());
/// ```
pub fn extension<T: Display + Send + Sync + 'static>(
) -> impl Fn(&request::Parts) -> Option<String> + Clone + Send + Sync + 'static {
    |req: &request::Parts| req.extensions.get::<T>().map(ToString::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(headers: &[(&str, &str)]) -> request::Parts {
        let mut b = http::Request::builder();
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn credentials_are_hashed_and_told_apart() {
        let auth = authorization();
        let a = auth(&parts(&[("authorization", "Bearer alice-secret")])).unwrap();
        let b = auth(&parts(&[("authorization", "Bearer bob-secret")])).unwrap();
        assert_ne!(a, b);
        assert!(!a.contains("alice"), "{a}");
        assert_eq!(a.len(), 32);
        assert_eq!(auth(&parts(&[])), None);
        assert_eq!(auth(&parts(&[("authorization", "x"), ("authorization", "y")])), None);
        assert_eq!(header("x-api-key")(&parts(&[("x-api-key", "k1")])), credential(b"k1"));
        for blank in ["", " ", "\t "] {
            assert_eq!(header("x-api-key")(&parts(&[("x-api-key", blank)])), None, "{blank:?}");
            assert_eq!(authorization()(&parts(&[("authorization", blank)])), None, "{blank:?}");
        }
    }
}
