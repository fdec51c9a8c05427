//! Error responses as RFC 9457 problem details (`application/problem+json`), one kind per way a
//! request can be refused by the layer.

use axum::body::Body;
use http::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};
use serde::Serialize;

/// The media type of problem details.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Where the problem types are documented: `docs/http.md` of the repository, one section per
/// type. A problem's `type` is this plus `#` and its [`ProblemKind::slug`].
pub const PROBLEM_TYPE_BASE: &str = "https://github.com/idempotent-rs/idempotent/blob/main/docs/http.md";

/// The ways the layer refuses a request, each with its status code and problem type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProblemKind {
    /// 400: the route requires an `Idempotency-Key` and the request has none.
    MissingKey,
    /// 400: the header is not one structured-field string, or the key is empty or too long.
    MalformedKey,
    /// 400: token mode, and the key is not a token this client was issued (made up, tampered
    /// with, or expired).
    InvalidToken,
    /// 403: the client-scope extractor found no client in the request.
    UnidentifiedClient,
    /// 409: a request with the same key is still being processed.
    InFlight,
    /// 409: a request with this key completed, but its response was too large to keep for
    /// replay; it is not run again.
    NotReplayable,
    /// 413: the request body is larger than the layer reads to fingerprint it.
    RequestTooLarge,
    /// 422: the key was used before for a different request (method, path or body).
    KeyReused,
    /// 400: the request body could not be read.
    UnreadableBody,
    /// 502: the handler's response body failed while being read.
    UnreadableResponse,
    /// 503: the idempotency store is unreachable or timed out; nothing was run.
    StoreUnavailable,
    /// 503: the request ran and its response was stored, but the store could not confirm it
    /// durable (too few replicas acknowledged it); a retry with the same key gets the stored
    /// response unless a failover lost it.
    Unconfirmed,
    /// 500: anything else (a stored response that no longer decodes, a corrupt record).
    Internal,
}

impl ProblemKind {
    /// The status code.
    pub fn status(self) -> StatusCode {
        match self {
            ProblemKind::MissingKey
            | ProblemKind::MalformedKey
            | ProblemKind::InvalidToken
            | ProblemKind::UnreadableBody => StatusCode::BAD_REQUEST,
            ProblemKind::UnidentifiedClient => StatusCode::FORBIDDEN,
            ProblemKind::InFlight | ProblemKind::NotReplayable => StatusCode::CONFLICT,
            ProblemKind::RequestTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ProblemKind::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            ProblemKind::UnreadableResponse => StatusCode::BAD_GATEWAY,
            ProblemKind::StoreUnavailable | ProblemKind::Unconfirmed => StatusCode::SERVICE_UNAVAILABLE,
            ProblemKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The short name: the anchor of the problem type's documentation.
    pub fn slug(self) -> &'static str {
        match self {
            ProblemKind::MissingKey => "missing-key",
            ProblemKind::MalformedKey => "malformed-key",
            ProblemKind::InvalidToken => "invalid-token",
            ProblemKind::UnidentifiedClient => "unidentified-client",
            ProblemKind::InFlight => "in-flight",
            ProblemKind::NotReplayable => "not-replayable",
            ProblemKind::RequestTooLarge => "request-too-large",
            ProblemKind::KeyReused => "key-reused",
            ProblemKind::UnreadableBody => "unreadable-body",
            ProblemKind::UnreadableResponse => "unreadable-response",
            ProblemKind::StoreUnavailable => "store-unavailable",
            ProblemKind::Unconfirmed => "unconfirmed",
            ProblemKind::Internal => "internal",
        }
    }

    /// The title: the same for every occurrence of the kind.
    pub fn title(self) -> &'static str {
        match self {
            ProblemKind::MissingKey => "Idempotency-Key is missing",
            ProblemKind::MalformedKey => "Idempotency-Key is malformed",
            ProblemKind::InvalidToken => "Idempotency token is not valid",
            ProblemKind::UnidentifiedClient => "Client could not be identified",
            ProblemKind::InFlight => "A request with this Idempotency-Key is being processed",
            ProblemKind::NotReplayable => "The response to this Idempotency-Key cannot be replayed",
            ProblemKind::RequestTooLarge => "Request body too large",
            ProblemKind::KeyReused => "Idempotency-Key reused for a different request",
            ProblemKind::UnreadableBody => "Request body could not be read",
            ProblemKind::UnreadableResponse => "Response body could not be read",
            ProblemKind::StoreUnavailable => "Idempotency store unavailable",
            ProblemKind::Unconfirmed => "The request ran; its stored response is not confirmed durable",
            ProblemKind::Internal => "Idempotency layer error",
        }
    }

    /// The problem type URI.
    pub fn type_uri(self) -> String {
        format!("{PROBLEM_TYPE_BASE}#{}", self.slug())
    }
}

/// A problem details object (RFC 9457 §3): `type`, `title`, `status`, `detail`.
///
/// ```
/// use idempotent_http::problem::{Problem, ProblemKind};
///
/// let p = Problem::new(ProblemKind::KeyReused, "the key was first used for POST /orders with another body");
/// assert_eq!(p.status, 422);
/// let json = serde_json::to_value(&p).unwrap();
/// assert_eq!(json["title"], "Idempotency-Key reused for a different request");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Problem {
    /// A URI naming the problem type; it leads to its documentation.
    #[serde(rename = "type")]
    pub type_uri: String,
    /// A short summary of the problem type.
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// What happened to this request.
    pub detail: String,
    #[serde(skip)]
    kind: Option<ProblemKind>,
}

impl Problem {
    /// A problem of `kind` with a `detail` about this occurrence.
    pub fn new(kind: ProblemKind, detail: impl Into<String>) -> Self {
        Problem {
            type_uri: kind.type_uri(),
            title: kind.title().to_owned(),
            status: kind.status().as_u16(),
            detail: detail.into(),
            kind: Some(kind),
        }
    }

    /// The kind, when built by [`Problem::new`].
    pub fn kind(&self) -> Option<ProblemKind> {
        self.kind
    }

    /// The response: the status, `Content-Type: application/problem+json`, `Cache-Control:
    /// no-store`, and for a request in flight or an unconfirmed result `Retry-After: 1`.
    pub fn into_response(self) -> Response<Body> {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self).unwrap_or_else(|_| b"{}".to_vec());
        let mut response = Response::new(Body::from(body));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if matches!(self.kind, Some(ProblemKind::InFlight | ProblemKind::Unconfirmed)) {
            headers.insert(RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

impl axum::response::IntoResponse for Problem {
    fn into_response(self) -> axum::response::Response {
        Problem::into_response(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_consistent() {
        let kinds = [
            ProblemKind::MissingKey,
            ProblemKind::MalformedKey,
            ProblemKind::InvalidToken,
            ProblemKind::UnidentifiedClient,
            ProblemKind::InFlight,
            ProblemKind::NotReplayable,
            ProblemKind::RequestTooLarge,
            ProblemKind::KeyReused,
            ProblemKind::UnreadableBody,
            ProblemKind::UnreadableResponse,
            ProblemKind::StoreUnavailable,
            ProblemKind::Unconfirmed,
            ProblemKind::Internal,
        ];
        let mut slugs: Vec<_> = kinds.iter().map(|k| k.slug()).collect();
        slugs.sort_unstable();
        slugs.dedup();
        assert_eq!(slugs.len(), kinds.len());
        for k in kinds {
            let r = Problem::new(k, "d").into_response();
            assert_eq!(r.status(), k.status());
            assert_eq!(r.headers()[CONTENT_TYPE], PROBLEM_JSON);
        }
    }
}
