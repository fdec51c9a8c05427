//! The one-time token endpoint: `POST /idempotent/token` issues a token (the runtime's
//! `issue_token_scoped`, in the client's scope) for a route in token mode. Tokens are signed,
//! not stored: issuing one costs no store command, so the endpoint cannot be used to fill the
//! store; a guard (authentication, a rate limit) can still run before it.

use std::convert::Infallible;

use axum::body::Body;
use axum::extract::Request;
use axum::routing::{post, MethodRouter};
use axum::Router;
use http::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use http::{request, Response, StatusCode};
use serde::{Deserialize, Serialize};

use crate::layer::IdempotencyLayer;
use crate::policy::problem_for;

/// The token endpoint's answer: `{"token": "...", "expires_in": 3600}`. The client sends the
/// token back as its `Idempotency-Key` (`Idempotency-Key: "<token>"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IssuedToken {
    /// The token: 56 URL-safe characters.
    pub token: String,
    /// Seconds until it expires unless used.
    pub expires_in: u64,
}

impl IdempotencyLayer {
    /// Issues a token to the client of `request` (as the layer's client extractor names it):
    /// `200` with an [`IssuedToken`] and `Cache-Control: no-store`, or what the
    /// [`token_guard`](Self::token_guard) answered, or a problem (403 for an unidentified
    /// client).
    pub fn issue_token(&self, request: &request::Parts) -> Response<Body> {
        let policy = &self.policy;
        if let Some(refused) = policy.token_guard.as_ref().and_then(|guard| guard(request)) {
            return refused;
        }
        let scope = match policy.client_scope("token", request) {
            Ok(scope) => scope,
            Err(problem) => return problem.into_response(),
        };
        match policy.idem.issue_token_scoped(&scope, policy.token_ttl) {
            Ok(token) => {
                let body = IssuedToken { token, expires_in: policy.token_ttl.as_secs() };
                let json = serde_json::to_vec(&body).unwrap_or_default();
                let mut response = Response::new(Body::from(json));
                *response.status_mut() = StatusCode::OK;
                response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                response.headers_mut().insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
                response
            }
            Err(e) => problem_for(policy, &e).into_response(),
        }
    }

    /// The token handler, for mounting at a path of your choice (then tell the layer with
    /// [`token_path`](Self::token_path)).
    pub fn token_handler<S: Clone + Send + Sync + 'static>(&self) -> MethodRouter<S, Infallible> {
        let layer = self.clone();
        post(move |request: Request| {
            let layer = layer.clone();
            async move {
                let (parts, _body) = request.into_parts();
                layer.issue_token(&parts)
            }
        })
    }

    /// Runs `guard` on every request to the token endpoint before a token is issued: a response
    /// it returns answers the request instead (a 401 without a session, a 429 past a rate limit);
    /// `None` lets the token be issued. A tower layer does the same job:
    /// `token_router().route_layer(auth)`.
    ///
    /// ```
    /// use axum::response::IntoResponse;
    /// use http::StatusCode;
    /// use idempotent_core::{Idempotency, MemoryStore};
    /// use idempotent_http::IdempotencyLayer;
    ///
    /// let layer = IdempotencyLayer::shared_keys(Idempotency::new(MemoryStore::new())).token_guard(|req| {
    ///     match req.headers.get("cookie") {
    ///         Some(_) => None,
    ///         None => Some((StatusCode::UNAUTHORIZED, "log in first").into_response()),
    ///     }
    /// });
    /// ```
    pub fn token_guard(
        self,
        guard: impl Fn(&request::Parts) -> Option<Response<Body>> + Send + Sync + 'static,
    ) -> Self {
        self.with(|p| p.token_guard = Some(std::sync::Arc::new(guard)))
    }

    /// A router serving the token endpoint at the layer's token path (default
    /// `POST /idempotent/token`); merge it into the app.
    ///
    /// ```
    /// use axum::{routing::post, Router};
    /// use idempotent_core::{Idempotency, MemoryStore};
    /// use idempotent_http::IdempotencyLayer;
    ///
    /// let layer = IdempotencyLayer::shared_keys(Idempotency::new(MemoryStore::new()));
    /// let app: Router = Router::new()
    ///     .route("/orders", post(|| async { "created" }).route_layer(layer.clone().require_token()))
    ///     .merge(layer.token_router());
    /// ```
    pub fn token_router<S: Clone + Send + Sync + 'static>(&self) -> Router<S> {
        Router::new().route(&self.policy.token_path, self.token_handler())
    }
}
