//! What a guarded route does, shared by the layer that sets it and the service that follows it:
//! the key mode, the client scope, what is stored and replayed, and how a runtime error answers.

use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderName;
use http::{request, Method, StatusCode};
use idempotent_core::telemetry::logged_error;
use idempotent_core::{Error, Idempotency, OnConflict, OnCrash};

use crate::problem::{Origin, Problem, ProblemKind};

/// The header marking a replayed response by default: `Idempotent-Replayed: true`.
pub static DEFAULT_REPLAY_HEADER: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The response header saying until when a stored response is replayed, when the layer tells
/// it ([`IdempotencyLayer::expiry_header`](crate::IdempotencyLayer::expiry_header)):
/// `Idempotency-Key-Expires: Thu, 04 Dec 2026 10:00:00 GMT`.
pub static IDEMPOTENCY_KEY_EXPIRES: HeaderName = HeaderName::from_static("idempotency-key-expires");

/// The largest request body read (to fingerprint it) by default: 1 MiB.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1 << 20;

/// How long an issued token stays valid by default: one hour.
pub const DEFAULT_TOKEN_TTL: Duration = Duration::from_secs(3600);

/// Where [`IdempotencyLayer::token_router`](crate::IdempotencyLayer::token_router) serves tokens by default.
pub const DEFAULT_TOKEN_PATH: &str = "/idempotent/token";

/// What a guarded request must carry in its `Idempotency-Key` header.
///
/// ```
/// use idempotent_core::{Idempotency, MemoryStore};
/// use idempotent_http::{IdempotencyLayer, KeyMode};
///
/// let layer = IdempotencyLayer::shared_keys(Idempotency::new(MemoryStore::new())).mode(KeyMode::Optional);
/// # let _ = layer;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyMode {
    /// A key of the client's choosing is required: a request without one is refused with 400.
    /// The default.
    #[default]
    Required,
    /// A request with a key is guarded; one without runs unguarded.
    Optional,
    /// The key must be a one-time token from the token endpoint (token mode of the runtime):
    /// consumed atomically by the first request, replayed to later ones, and usable again after
    /// a failed (not stored) attempt. 400 when missing, unknown or expired.
    Token,
}

/// Picks the client a request comes from; see [`IdempotencyLayer::per_client`](crate::IdempotencyLayer::per_client).
pub type ClientScope = Arc<dyn Fn(&request::Parts) -> Option<String> + Send + Sync>;

/// Decides from the status whether a response is stored; see [`IdempotencyLayer::store_if`](crate::IdempotencyLayer::store_if).
pub type StorePredicate = Arc<dyn Fn(StatusCode) -> bool + Send + Sync>;

/// The settings of a layer, shared by its services.
#[derive(Clone)]
pub(crate) struct Policy {
    pub(crate) idem: Idempotency,
    pub(crate) scope: String,
    pub(crate) mode: KeyMode,
    pub(crate) methods: Vec<Method>,
    pub(crate) max_key_bytes: usize,
    pub(crate) max_request_bytes: usize,
    pub(crate) stored_headers: Vec<HeaderName>,
    pub(crate) replay_header: HeaderName,
    pub(crate) store_if: StorePredicate,
    pub(crate) client: ClientScope,
    /// Keys are scoped per client (`per_client`), not shared (`shared_keys`).
    pub(crate) per_client: bool,
    pub(crate) lenient_header: bool,
    /// JSON bodies compared by their canonical form (`json.rs`).
    pub(crate) json_fingerprint: bool,
    /// Stored responses and their replays carry `Idempotency-Key-Expires`.
    pub(crate) expiry_header: bool,
    pub(crate) on_conflict: OnConflict,
    /// What a request whose server stopped mid-handler leaves: free again, or held unknown.
    pub(crate) on_crash: OnCrash,
    pub(crate) ttl: Option<Duration>,
    pub(crate) keep: Option<Duration>,
    pub(crate) token_ttl: Duration,
    pub(crate) token_path: String,
    pub(crate) token_guard: Option<TokenGuard>,
}

/// What runs before a token is issued; see [`IdempotencyLayer::token_guard`](crate::IdempotencyLayer::token_guard).
pub type TokenGuard = Arc<dyn Fn(&request::Parts) -> Option<http::Response<axum::body::Body>> + Send + Sync>;

impl Policy {
    /// The runtime scope of client `client`'s keys (`kind` is `key` or `token`). The client id
    /// is length-prefixed, so that no client id and key can be cut differently into another's.
    fn scope_for(&self, kind: &str, client: &str) -> String {
        idempotent_core::client_key::client_scope(&self.scope, kind, client)
    }

    /// The scope of the `kind` keys of the client that sent `request`, or the 403 problem when
    /// the client extractor cannot tell who that is.
    pub(crate) fn client_scope(&self, kind: &str, request: &request::Parts) -> Result<String, Problem> {
        match (self.client)(request) {
            Some(client) => Ok(self.scope_for(kind, &client)),
            None => Err(Problem::new(
                ProblemKind::UnidentifiedClient,
                "the request does not say which client it comes from, so its keys cannot be scoped",
            )),
        }
    }
}

/// The statuses a framework answers before a handler runs: a body that does not parse (400,
/// 422), is too large (413) or of the wrong type (415), a missing or refused credential (401,
/// 403), a method or representation the route does not serve (405, 406), a request that took
/// too long or was too large in its parts (408, 411, 414, 431), a rate limit (429). Not stored by
/// default: a client that fixes its request and retries with the same key gets it run.
pub const REJECTED_BEFORE_THE_HANDLER: [StatusCode; 13] = [
    StatusCode::BAD_REQUEST,
    StatusCode::UNAUTHORIZED,
    StatusCode::FORBIDDEN,
    StatusCode::METHOD_NOT_ALLOWED,
    StatusCode::NOT_ACCEPTABLE,
    StatusCode::REQUEST_TIMEOUT,
    StatusCode::LENGTH_REQUIRED,
    StatusCode::PAYLOAD_TOO_LARGE,
    StatusCode::URI_TOO_LONG,
    StatusCode::UNSUPPORTED_MEDIA_TYPE,
    StatusCode::UNPROCESSABLE_ENTITY,
    StatusCode::TOO_MANY_REQUESTS,
    StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
];

/// Whether a response is stored by default: not a 5xx (a retry should run), and not a status
/// frameworks answer before the handler runs ([`REJECTED_BEFORE_THE_HANDLER`]). A handler can
/// have any response stored by putting [`Ran`] in its extensions.
pub fn stored_by_default(status: StatusCode) -> bool {
    !status.is_server_error() && !REJECTED_BEFORE_THE_HANDLER.contains(&status)
}

/// A marker a handler puts in a response's extensions to have it stored and replayed whatever
/// its status: "this 422 is my answer, after work that must not run twice".
///
/// ```
/// use axum::response::IntoResponse;
/// use http::StatusCode;
/// use idempotent_http::Ran;
///
/// let mut response = (StatusCode::UNPROCESSABLE_ENTITY, "card declined").into_response();
/// response.extensions_mut().insert(Ran);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ran;

/// The problem answering a runtime error: the runtime's mapping
/// worded for the `Idempotency-Key` header ([`Problem::for_error_from`] with
/// [`Origin::Header`]), with the token endpoint named for an invalid token.
pub(crate) fn problem_for(policy: &Policy, e: &Error) -> Problem {
    match e {
        Error::InvalidToken { .. } => Problem::new(
            ProblemKind::InvalidToken,
            format!(
                "the key is not a token issued to this client, or it expired; get a new one with POST {}",
                policy.token_path
            ),
        ),
        Error::Store { .. } | Error::Unconfirmed { .. } => {
            tracing::warn!(error = %logged_error(e), "idempotency store failed; request answered with 503");
            Problem::for_error_from(e, Origin::Header)
        }
        Error::Codec { .. } | Error::Corrupt { .. } | Error::NotConfigured { .. } => {
            tracing::error!(error = %logged_error(e), "idempotency layer failed");
            Problem::for_error_from(e, Origin::Header)
        }
        other => Problem::for_error_from(other, Origin::Header),
    }
}
