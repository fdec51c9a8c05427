//! HTTP support for [`idempotency`](https://docs.rs/idempotency): a tower layer speaking the
//! `Idempotency-Key` header (IETF draft "The Idempotency-Key HTTP Header Field"), and one-time
//! tokens for forms, on the runtime's per-key state machine ([`idempotent_core::Idempotency`]).
//!
//! One line makes an axum route safe against a double-clicked submit or a client's retry:
//!
//! ```
//! use axum::{routing::post, Router};
//! use idempotent_core::{Idempotency, MemoryStore};
//! use idempotent_http::{client, IdempotencyLayer};
//!
//! let idem = Idempotency::new(MemoryStore::new()); // or a RedisStore, for many instances
//! let app: Router = Router::new()
//!     .route("/payments", post(|| async { "charged once" }))
//!     // Each client's keys apart: here, clients are told apart by their credentials.
//!     .route_layer(IdempotencyLayer::per_client(idem, client::authorization()));
//! ```
//!
//! What a client sees, for a guarded request (`POST`, `PATCH`) with `Idempotency-Key: "k"`:
//!
//! | situation | response |
//! |---|---|
//! | first request with `k` | the handler's response, stored (status, body, selected headers) |
//! | `k` again, same method, path and body | the stored response replayed, with `Idempotent-Replayed: true` |
//! | `k` again while the first is still running | 409 (or wait for it: [`IdempotencyLayer::wait_in_flight`]) |
//! | `k` again with another method, path or body | 422 |
//! | the handler answered 5xx, or a status frameworks answer before a handler runs (400, 422, 413, 415...) | passed through, not stored: a retry with `k` runs again |
//! | the response was over the size limit | the first caller gets it; later ones 409 (not replayable) |
//! | no key, on a route that requires one | 400 |
//! | a malformed or over-long key | 400 |
//!
//! Errors are `application/problem+json` bodies (RFC 9457, [`problem`]). Keys are scoped per
//! client ([`IdempotencyLayer::per_client`], [`client`]), or shared by every client on purpose
//! ([`IdempotencyLayer::shared_keys`]): the layer has no default that mixes clients. Token mode
//! ([`IdempotencyLayer::require_token`], [`IdempotencyLayer::token_router`]) has the server
//! hand out one-time keys, for pages that cannot make up good keys of their own.
//!
//! The policy is told to clients on request: [`IdempotencyLayer::expiry_header`] says on each
//! stored response until when it is replayed, and [`IdempotencyLayer::openapi`] describes the
//! guarded routes as an OpenAPI 3.1 fragment ([`openapi`]), generated from the layer itself.

#![deny(missing_docs)]

pub mod client;
mod failure;
#[cfg(feature = "grpc")]
pub mod grpc;
pub mod header;
pub mod json;
mod layer;
pub mod openapi;
/// Problem details: the runtime's own (`idempotency::problem`), shared with `Error`'s
/// `IntoResponse`.
pub use idempotent_core::problem;
mod policy;
mod service;
mod stored;
#[cfg(feature = "testing")]
pub mod testing;
mod token;

pub use header::IDEMPOTENCY_KEY;

/// The longest key [`IdempotencyLayer::max_key_bytes`] can allow: half the runtime's key limit
/// ([`MAX_KEY_BYTES`](idempotent_core::MAX_KEY_BYTES)), the other half for the layer's scope and
/// client.
pub const MAX_HEADER_KEY_BYTES: usize = idempotent_core::MAX_KEY_BYTES / 2;
pub use layer::IdempotencyLayer;
pub use policy::{
    stored_by_default, ClientScope, KeyMode, Ran, StorePredicate, TokenGuard, DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_REPLAY_HEADER, DEFAULT_TOKEN_PATH, DEFAULT_TOKEN_TTL, IDEMPOTENCY_KEY_EXPIRES, REJECTED_BEFORE_THE_HANDLER,
};
pub use service::IdempotencyService;
pub use stored::{StoredResponse, MEANING_HEADERS};
pub use token::IssuedToken;
