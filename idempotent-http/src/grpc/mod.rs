//! gRPC: a tower layer for tonic servers (feature `grpc`; `idempotency::grpc` with the facade's
//! feature `tonic`), keyed by the `idempotency-key` request metadata. A unary call with a key runs
//! once; a retry with the key gets the first call's response message, status and trailers back,
//! exactly; a retry while the first still runs gets `ABORTED` with `retry-after`; the key with
//! another message gets `FAILED_PRECONDITION`. The first call runs in a task of its own, so that a
//! client that gives up (its deadline passed, it went away) does not cancel it.
//!
//! ```
//! use idempotent_core::{Idempotency, MemoryStore};
//! use idempotent_http::grpc::GrpcIdempotencyLayer;
//!
//! let idem = Idempotency::new(MemoryStore::new());
//! // Keys apart per client, here by the `x-client-id` metadata an authentication layer set.
//! let layer = GrpcIdempotencyLayer::per_client(idem, |req| {
//!     req.headers.get("x-client-id").and_then(|v| v.to_str().ok()).map(str::to_owned)
//! })
//! .methods(["/orders.Orders/Create"]);
//! // tonic::transport::Server::builder().layer(layer).add_service(...)
//! # let _ = layer;
//! ```
//!
//! | the call | answer |
//! |---|---|
//! | first with key `k` | the handler's response; stored when its status is one of [`STORED_CODES`] (`OK` and the answers a retry would get again) |
//! | `k` again, same method and message | the stored response: initial metadata (plus `idempotent-replayed: true`), message, status and trailers |
//! | `k` again while the first runs | `ABORTED`, `retry-after: 1` (or it waits: [`GrpcIdempotencyLayer::wait_in_flight`]) |
//! | `k` with another method or message | `FAILED_PRECONDITION` |
//! | the store unreachable | `UNAVAILABLE`: nothing ran |
//! | a malformed key, a client-streaming call, a method listed as streaming | `INVALID_ARGUMENT`, nothing ran |
//! | no key, on a method that requires one ([`GrpcIdempotencyLayer::require_key`]) | `INVALID_ARGUMENT` |

mod service;
mod status;
mod stored;
/// The gRPC layer's methods as subjects of the test kit (feature `testing`).
#[cfg(feature = "testing")]
pub mod testing;

use std::sync::Arc;
use std::time::Duration;

use http::request;
use idempotent_core::{Idempotency, OnConflict, OnCrash};
use tower_layer::Layer;

pub use service::GrpcIdempotencyService;
pub use stored::StoredCall;

use crate::policy::ClientScope;

/// The request metadata holding the key: `idempotency-key`.
pub const IDEMPOTENCY_KEY_METADATA: &str = "idempotency-key";

/// The response metadata marking a replay: `idempotent-replayed: true`.
pub const REPLAYED_METADATA: &str = "idempotent-replayed";

/// The status codes whose responses are stored by default: `OK`, and the answers a retry of the
/// same call would get again (`INVALID_ARGUMENT`, `NOT_FOUND`, `ALREADY_EXISTS`,
/// `PERMISSION_DENIED`, `FAILED_PRECONDITION`, `OUT_OF_RANGE`). The others (`UNAVAILABLE`,
/// `DEADLINE_EXCEEDED`, `ABORTED`, `INTERNAL`, `RESOURCE_EXHAUSTED`, `UNKNOWN`...) say the
/// server failed or was busy: not stored, a retry runs.
pub const STORED_CODES: [i32; 7] = [0, 3, 5, 6, 7, 9, 11];

/// The longest message read to fingerprint it by default: 4 MiB, gRPC's usual limit.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 << 20;

/// The longest key by default, in bytes.
pub const DEFAULT_MAX_KEY_BYTES: usize = 255;

/// The settings of a gRPC layer, shared by its services.
#[derive(Clone)]
pub(crate) struct GrpcPolicy {
    pub(crate) idem: Idempotency,
    pub(crate) scope: String,
    pub(crate) client: ClientScope,
    pub(crate) require_key: bool,
    /// The guarded methods' paths (`/package.Service/Method`); `None`: every method.
    pub(crate) methods: Option<Vec<String>>,
    /// Methods whose calls stream: a key on one is refused.
    pub(crate) streaming: Vec<String>,
    pub(crate) max_key_bytes: usize,
    pub(crate) max_message_bytes: usize,
    pub(crate) store_if: Arc<dyn Fn(i32) -> bool + Send + Sync>,
    pub(crate) on_conflict: OnConflict,
    pub(crate) on_crash: OnCrash,
    pub(crate) ttl: Option<Duration>,
    pub(crate) keep: Option<Duration>,
}

impl GrpcPolicy {
    /// Whether calls of `path` are guarded.
    pub(crate) fn guards(&self, path: &str) -> bool {
        self.methods.as_ref().is_none_or(|methods| methods.iter().any(|m| m == path))
    }
}

/// A tower layer making the unary calls of a tonic server idempotent by their `idempotency-key`
/// metadata; see the [module](self). Built with a choice of key space:
/// [`per_client`](Self::per_client) or [`shared_keys`](Self::shared_keys).
#[derive(Clone)]
#[must_use]
pub struct GrpcIdempotencyLayer {
    pub(crate) policy: Arc<GrpcPolicy>,
}

impl GrpcIdempotencyLayer {
    /// A layer whose keys are scoped per client: `client` names the client a call comes from (an
    /// authenticated id an earlier layer put in the request's extensions or metadata). A call
    /// whose client it cannot name is refused with `PERMISSION_DENIED`.
    pub fn per_client(
        idem: Idempotency,
        client: impl Fn(&request::Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        Self::with_client(idem, Arc::new(client))
    }

    /// A layer with one key space for every caller: for a server one trusted client calls, or
    /// keys nobody can guess.
    pub fn shared_keys(idem: Idempotency) -> Self {
        Self::with_client(idem, Arc::new(|_: &request::Parts| Some(String::new())))
    }

    fn with_client(idem: Idempotency, client: ClientScope) -> Self {
        GrpcIdempotencyLayer {
            policy: Arc::new(GrpcPolicy {
                idem,
                scope: "grpc".into(),
                client,
                require_key: false,
                methods: None,
                streaming: Vec::new(),
                max_key_bytes: DEFAULT_MAX_KEY_BYTES,
                max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
                store_if: Arc::new(|code| STORED_CODES.contains(&code)),
                on_conflict: OnConflict::Reject,
                on_crash: OnCrash::Rerun,
                ttl: None,
                keep: None,
            }),
        }
    }

    fn with(mut self, f: impl FnOnce(&mut GrpcPolicy)) -> Self {
        f(Arc::make_mut(&mut self.policy));
        self
    }

    /// Guards only these methods (paths as gRPC sends them, `/package.Service/Method`); calls of
    /// the others pass through untouched. By default every call with a key is guarded.
    pub fn methods<'a>(self, paths: impl IntoIterator<Item = &'a str>) -> Self {
        let paths = paths.into_iter().map(str::to_owned).collect();
        self.with(|p| p.methods = Some(paths))
    }

    /// These methods stream: a call of one with a key is refused with `INVALID_ARGUMENT` before it
    /// runs (a stream cannot be replayed as it was). A client-streaming call is refused anyway
    /// (its request holds more than one message); a server-streaming one is only seen once it
    /// answered, so list those here.
    pub fn streaming_methods<'a>(self, paths: impl IntoIterator<Item = &'a str>) -> Self {
        let paths = paths.into_iter().map(str::to_owned).collect();
        self.with(|p| p.streaming = paths)
    }

    /// A call of a guarded method without a key is refused with `INVALID_ARGUMENT` (by default it
    /// runs unguarded). With [`methods`](Self::methods), only those require it.
    pub fn require_key(self) -> Self {
        self.with(|p| p.require_key = true)
    }

    /// Which status codes' responses are stored and replayed (default [`STORED_CODES`]).
    pub fn store_codes(self, stored: impl Fn(i32) -> bool + Send + Sync + 'static) -> Self {
        self.with(|p| p.store_if = Arc::new(stored))
    }

    /// A call finding its key in flight waits up to `patience` for the first one, then gets its
    /// response, instead of `ABORTED` at once.
    pub fn wait_in_flight(self, patience: Duration) -> Self {
        self.with(|p| p.on_conflict = OnConflict::Wait(patience))
    }

    /// What a call whose server stops mid-method (killed, or stalled past its lease) leaves its
    /// key as: free again once the lease ends ([`OnCrash::Rerun`], the default: a retry runs the
    /// method again), or held ([`OnCrash::Hold`]): whether the method took effect is unknown, and
    /// a retry gets `FAILED_PRECONDITION` until an operator resolves the key (`idempotency
    /// resolve`) or the runtime's resolver does. For methods that must never run twice on a
    /// guess: a payout, a withdrawal.
    pub fn on_crash(self, policy: OnCrash) -> Self {
        self.with(|p| p.on_crash = policy)
    }

    /// The lease while a call runs (default: the runtime's).
    pub fn ttl(self, ttl: Duration) -> Self {
        self.with(|p| p.ttl = Some(ttl))
    }

    /// How long a response is replayed (default: the runtime's).
    pub fn keep(self, keep: Duration) -> Self {
        self.with(|p| p.keep = Some(keep))
    }

    /// The runtime scope of this layer's keys (default `grpc`).
    pub fn scope(self, scope: impl Into<String>) -> Self {
        let scope = scope.into();
        self.with(|p| p.scope = scope)
    }

    /// The longest request message read to fingerprint it (default 4 MiB); a longer one is
    /// refused with `RESOURCE_EXHAUSTED`.
    pub fn max_message_bytes(self, max: usize) -> Self {
        self.with(|p| p.max_message_bytes = max)
    }

    /// The longest key, in bytes (default 255, at most [`MAX_HEADER_KEY_BYTES`](crate::MAX_HEADER_KEY_BYTES)).
    pub fn max_key_bytes(self, max: usize) -> Self {
        self.with(|p| p.max_key_bytes = max.min(crate::MAX_HEADER_KEY_BYTES))
    }
}

impl<S> Layer<S> for GrpcIdempotencyLayer {
    type Service = GrpcIdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcIdempotencyService::new(inner, self.policy.clone())
    }
}

impl std::fmt::Debug for GrpcIdempotencyLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcIdempotencyLayer").field("scope", &self.policy.scope).finish_non_exhaustive()
    }
}
