//! `IdempotencyLayer`: the tower layer and its policies (which requests it guards, how keys are
//! scoped per client, what is stored), set with chained builder methods.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::header::{HeaderName, CONTENT_LANGUAGE, CONTENT_LOCATION, CONTENT_TYPE, ETAG, LAST_MODIFIED, LOCATION};
use http::{request, Method, StatusCode};
use idempotent_core::{Idempotency, OnConflict, OnCrash};
use tower_layer::Layer;

use crate::header::DEFAULT_MAX_KEY_BYTES;
use crate::policy::{
    stored_by_default, ClientScope, KeyMode, Policy, DEFAULT_MAX_REQUEST_BYTES, DEFAULT_REPLAY_HEADER,
    DEFAULT_TOKEN_PATH, DEFAULT_TOKEN_TTL, IDEMPOTENCY_KEY_EXPIRES,
};
use crate::service::IdempotencyService;

/// A tower layer that makes the requests it guards idempotent with the `Idempotency-Key`
/// header, on an [`Idempotency`] runtime (and so on its store: memory or Redis).
///
/// Built with a choice of key space: [`per_client`](Self::per_client) (each client's keys
/// apart, as the IETF draft asks; [`client`](crate::client) has extractors for the usual
/// cases) or [`shared_keys`](Self::shared_keys) (one key space for every client, which lets any
/// client that knows another's key and body read its stored response). The other defaults are
/// those of a payments API:
///
/// | policy | default | change with |
/// |---|---|---|
/// | guarded methods | `POST`, `PATCH` (others pass through untouched) | [`methods`](Self::methods) |
/// | key | required (400 without) | [`key_optional`](Self::key_optional), [`require_token`](Self::require_token) |
/// | key header | a Structured Field string, `"..."` (400 otherwise) | [`lenient_header`](Self::lenient_header) |
/// | key length | 255 bytes | [`max_key_bytes`](Self::max_key_bytes) |
/// | in flight | 409 at once | [`wait_in_flight`](Self::wait_in_flight) |
/// | stored responses | all but 5xx and the statuses frameworks answer before a handler runs ([`stored_by_default`]); a response with [`Ran`](crate::Ran) always | [`store_if`](Self::store_if) |
/// | stored headers | `Content-Location`, `Location`, `ETag`, `Last-Modified`, and always the [`MEANING_HEADERS`](crate::MEANING_HEADERS) (`Content-Type`, `Content-Encoding`, `Content-Language`, `Content-Disposition`, `Content-Range`, `Vary`, `Cache-Control`) | [`store_headers`](Self::store_headers) |
/// | replay marker | `Idempotent-Replayed: true` | [`replay_header`](Self::replay_header) |
/// | request body read | 1 MiB (413 over) | [`max_request_bytes`](Self::max_request_bytes) |
/// | what "the same body" means | the same bytes | [`json_fingerprint`](Self::json_fingerprint) (a JSON body's canonical form) |
/// | response size | the runtime's `max_result_bytes` (1 MiB): larger ones are not replayable (409) | `IdempotencyBuilder::max_result_bytes` |
/// | lease, retention | the runtime's (30 s renewed, 24 h) | [`ttl`](Self::ttl), [`keep`](Self::keep) |
/// | retention told to clients | not told | [`expiry_header`](Self::expiry_header) (`Idempotency-Key-Expires`) |
/// | the policy, described | on request | [`openapi`](Self::openapi): an OpenAPI 3.1 fragment for the guarded routes |
///
/// ```
/// use axum::{routing::post, Router};
/// use idempotent_core::{Idempotency, MemoryStore};
/// use idempotent_http::{client, IdempotencyLayer};
///
/// let idem = Idempotency::new(MemoryStore::new());
/// let app: Router = Router::new()
///     .route("/payments", post(|| async { "paid" }))
///     .route_layer(IdempotencyLayer::per_client(idem, client::authorization()));
/// ```
#[derive(Clone)]
#[must_use]
pub struct IdempotencyLayer {
    pub(crate) policy: Arc<Policy>,
}

impl IdempotencyLayer {
    /// A layer on `idem` whose keys are scoped per client: `client` names the client a request
    /// comes from (a hash of its credentials, an authenticated user id from the request's
    /// extensions: see [`client`](crate::client)). Two clients sending the same key never collide
    /// and never see each other's replays. When it returns `None` the request is refused with
    /// 403; run authentication before this layer.
    ///
    /// ```
    /// # use idempotent_core::{Idempotency, MemoryStore};
    /// # use idempotent_http::{client, IdempotencyLayer};
    /// # let idem = Idempotency::new(MemoryStore::new());
    /// // Scoped by API key (hashed: the key itself never reaches the store).
    /// let layer = IdempotencyLayer::per_client(idem.clone(), client::header("x-api-key"));
    /// // Or by anything the request carries.
    /// let layer = IdempotencyLayer::per_client(idem, |req| {
    ///     req.headers.get("x-tenant").and_then(|v| v.to_str().ok()).map(str::to_owned)
    /// });
    /// ```
    pub fn per_client(
        idem: Idempotency,
        client: impl Fn(&request::Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        Self::with_client(idem, Arc::new(client), true)
    }

    /// A layer on `idem` with one key space for every request, whoever sends it. A client that
    /// learns another's key (and sends the same method, target and body) is replayed that
    /// client's stored response: use it when one trusted client calls the endpoint (a payment
    /// provider's callbacks, an internal service), or when keys are unguessable and responses
    /// hold nothing private.
    pub fn shared_keys(idem: Idempotency) -> Self {
        Self::with_client(idem, Arc::new(|_: &request::Parts| Some(String::new())), false)
    }

    fn with_client(idem: Idempotency, client: ClientScope, per_client: bool) -> Self {
        IdempotencyLayer {
            policy: Arc::new(Policy {
                idem,
                scope: "http".into(),
                mode: KeyMode::Required,
                methods: vec![Method::POST, Method::PATCH],
                max_key_bytes: DEFAULT_MAX_KEY_BYTES,
                max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
                stored_headers: vec![CONTENT_TYPE, CONTENT_LANGUAGE, CONTENT_LOCATION, LOCATION, ETAG, LAST_MODIFIED],
                replay_header: DEFAULT_REPLAY_HEADER.clone(),
                store_if: Arc::new(stored_by_default),
                client,
                per_client,
                lenient_header: false,
                json_fingerprint: false,
                expiry_header: false,
                on_conflict: OnConflict::Reject,
                on_crash: OnCrash::Rerun,
                ttl: None,
                keep: None,
                token_ttl: DEFAULT_TOKEN_TTL,
                token_path: DEFAULT_TOKEN_PATH.into(),
                token_guard: None,
            }),
        }
    }

    pub(crate) fn with(mut self, f: impl FnOnce(&mut Policy)) -> Self {
        f(Arc::make_mut(&mut self.policy));
        self
    }

    /// The runtime the layer runs on.
    pub fn idempotency(&self) -> &Idempotency {
        &self.policy.idem
    }

    /// The runtime scope all keys of this layer live in (default `http`): two layers on one
    /// store with different scopes never share keys.
    pub fn scope(self, scope: impl Into<String>) -> Self {
        let scope = scope.into();
        self.with(|p| p.scope = scope)
    }

    /// What a guarded request must carry; see [`KeyMode`].
    pub fn mode(self, mode: KeyMode) -> Self {
        self.with(|p| p.mode = mode)
    }

    /// Requests without a key run unguarded ([`KeyMode::Optional`]).
    pub fn key_optional(self) -> Self {
        self.mode(KeyMode::Optional)
    }

    /// The key must be a one-time token issued by [`token_router`](Self::token_router)
    /// ([`KeyMode::Token`]). Issue and consume tokens with layers derived from one
    /// (`layer.clone().require_token()`), so that they share the scope and client extractor.
    pub fn require_token(self) -> Self {
        self.mode(KeyMode::Token)
    }

    /// The methods guarded (default `POST` and `PATCH`, the methods the IETF draft names);
    /// requests with other methods pass through untouched, with or without a key.
    pub fn methods(self, methods: impl IntoIterator<Item = Method>) -> Self {
        let methods = methods.into_iter().collect();
        self.with(|p| p.methods = methods)
    }

    /// The longest key accepted, in bytes (default 255); a longer one is refused with 400. At
    /// most [`MAX_HEADER_KEY_BYTES`](crate::MAX_HEADER_KEY_BYTES): a larger value is that
    /// limit (the rest of the runtime's key limit holds the layer's scope and client).
    pub fn max_key_bytes(self, max: usize) -> Self {
        self.with(|p| p.max_key_bytes = max.min(crate::MAX_HEADER_KEY_BYTES))
    }

    /// The largest request body read to fingerprint a guarded request (default 1 MiB); a
    /// larger one is refused with 413 before anything runs.
    pub fn max_request_bytes(self, max: usize) -> Self {
        self.with(|p| p.max_request_bytes = max)
    }

    /// The response headers stored and replayed (replacing the default set); the
    /// [`MEANING_HEADERS`](crate::MEANING_HEADERS), which give the body its meaning, are stored
    /// with them whatever the set.
    pub fn store_headers(self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        let names = names.into_iter().collect();
        self.with(|p| {
            p.stored_headers = names;
            if p.expiry_header {
                p.stored_headers.push(IDEMPOTENCY_KEY_EXPIRES.clone());
            }
        })
    }

    /// The header set to `true` on replayed responses (default `Idempotent-Replayed`).
    pub fn replay_header(self, name: HeaderName) -> Self {
        self.with(|p| p.replay_header = name)
    }

    /// Which responses are stored, by status (default: [`stored_by_default`], all but 5xx and
    /// the statuses frameworks answer before a handler runs). A response not stored is passed to
    /// the client as it is and releases the key, so that a retry runs the handler again (in
    /// token mode the token becomes usable again). A response carrying [`Ran`](crate::Ran) is stored
    /// whatever this says.
    ///
    /// ```
    /// # use idempotent_core::{Idempotency, MemoryStore};
    /// # use idempotent_http::IdempotencyLayer;
    /// # let idem = Idempotency::new(MemoryStore::new());
    /// // Store only successes: a 4xx (say, a declined card) may be retried with the same key.
    /// let layer = IdempotencyLayer::shared_keys(idem).store_if(|status| status.is_success());
    /// ```
    pub fn store_if(self, predicate: impl Fn(StatusCode) -> bool + Send + Sync + 'static) -> Self {
        self.with(|p| p.store_if = Arc::new(predicate))
    }

    /// Also accepts a key sent as a bare token (`Idempotency-Key: 8e03978e-40d5-...`), as many
    /// clients send a UUID, besides the draft's quoted Structured Field string (`"..."`). Off by
    /// default: the strict form is what the draft specifies.
    pub fn lenient_header(self) -> Self {
        self.with(|p| p.lenient_header = true)
    }

    /// Compares JSON request bodies by their canonical form ([`json::canonical`](crate::json::canonical):
    /// object members in one order, no whitespace, escapes decoded), so that a client that
    /// serializes its body again for a retry, in another key order or layout, gets its replay
    /// rather than a 422. Off by default: the body's bytes are compared. Applies to requests
    /// whose `Content-Type` is JSON (`application/json`, `application/*+json`); other bodies,
    /// and JSON bodies without a canonical form (not strict JSON, a member named twice), are
    /// compared by their bytes. Numbers are compared as written: `1.0` and `1` differ. Turning
    /// it on changes the fingerprint of JSON requests: a retry of a response stored before, with
    /// the same key, is a 422 unless its body was canonical already (a new
    /// [`scope`](Self::scope) avoids that).
    ///
    /// ```
    /// # use idempotent_core::{Idempotency, MemoryStore};
    /// # use idempotent_http::IdempotencyLayer;
    /// # let idem = Idempotency::new(MemoryStore::new());
    /// // `{"amount": 5, "to": "x"}` retried as `{"to":"x","amount":5}` replays.
    /// let layer = IdempotencyLayer::shared_keys(idem).json_fingerprint();
    /// ```
    pub fn json_fingerprint(self) -> Self {
        self.with(|p| p.json_fingerprint = true)
    }

    /// A request finding its key in flight waits up to `patience` for the first one to finish,
    /// then gets its replay (or runs, if the first failed), instead of an immediate 409. Still
    /// in flight after `patience`: 409.
    pub fn wait_in_flight(self, patience: Duration) -> Self {
        self.with(|p| p.on_conflict = OnConflict::Wait(patience))
    }

    /// What a request whose server stops mid-handler (killed, or stalled past its lease) leaves
    /// its key as: free again once the lease ends ([`OnCrash::Rerun`], the default: a retry runs
    /// the handler again), or held ([`OnCrash::Hold`]): whether the handler took effect is
    /// unknown, and a retry gets 409 `outcome-unknown` until an operator resolves the key
    /// (`idempotency resolve`) or the runtime's resolver does. For endpoints that must never run
    /// twice on a guess: a payout, a withdrawal. A handler's own error answer is not a crash: it is
    /// released (or stored) as the layer's `store_if` says.
    pub fn on_crash(self, policy: OnCrash) -> Self {
        self.with(|p| p.on_crash = policy)
    }

    /// The lease while the handler runs (default: the runtime's, 30 s, renewed while the
    /// handler runs): how long a key stays in flight after its server crashed.
    pub fn ttl(self, ttl: Duration) -> Self {
        self.with(|p| p.ttl = Some(ttl))
    }

    /// How long a stored response is replayed (default: the runtime's, 24 h).
    pub fn keep(self, keep: Duration) -> Self {
        self.with(|p| p.keep = Some(keep))
    }

    /// Tells clients until when a stored response is replayed: the response that is stored, and
    /// every replay of it, carry [`Idempotency-Key-Expires`](crate::IDEMPOTENCY_KEY_EXPIRES), an
    /// HTTP-date (as `Expires` is) by the server's clock, rounded down to the second. A retry
    /// sent before it gets the replay (unless an operator forgets the key or the store loses
    /// it); after it the key is free and a retry runs again. A replay carries the date the
    /// first response did: the moment is fixed when the response is stored. Responses that are
    /// not stored (5xx, say) and the layer's own refusals carry none. Off by default.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idempotent_core::{Idempotency, MemoryStore};
    /// # use idempotent_http::IdempotencyLayer;
    /// # let idem = Idempotency::new(MemoryStore::new());
    /// let layer = IdempotencyLayer::shared_keys(idem).keep(Duration::from_secs(24 * 3600)).expiry_header();
    /// ```
    pub fn expiry_header(self) -> Self {
        self.with(|p| {
            if !p.expiry_header {
                p.expiry_header = true;
                // Stored with the response, so that every replay tells the moment the first did.
                p.stored_headers.push(IDEMPOTENCY_KEY_EXPIRES.clone());
            }
        })
    }

    /// How long an issued token stays valid (default one hour).
    pub fn token_ttl(self, ttl: Duration) -> Self {
        self.with(|p| p.token_ttl = ttl)
    }

    /// The path of the token endpoint (default `/idempotent/token`), as the client sends it
    /// (with the prefixes of any routers it is nested in). The layer lets requests to it
    /// through unguarded, so it can wrap a router that serves it.
    pub fn token_path(self, path: impl Into<String>) -> Self {
        let path = path.into();
        self.with(|p| p.token_path = path)
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService::new(inner, self.policy.clone())
    }
}

impl fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.policy;
        f.debug_struct("IdempotencyLayer")
            .field("scope", &p.scope)
            .field("mode", &p.mode)
            .field("methods", &p.methods)
            .field("max_key_bytes", &p.max_key_bytes)
            .field("max_request_bytes", &p.max_request_bytes)
            .field("stored_headers", &p.stored_headers)
            .field("replay_header", &p.replay_header)
            .field("lenient_header", &p.lenient_header)
            .field("json_fingerprint", &p.json_fingerprint)
            .field("expiry_header", &p.expiry_header)
            .field("on_conflict", &p.on_conflict)
            .field("token_path", &p.token_path)
            .finish_non_exhaustive()
    }
}
