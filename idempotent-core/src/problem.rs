//! Error responses as RFC 9457 problem details (`application/problem+json`), one kind per way a
//! request can be refused, and the one mapping from [`Error`] to them (feature `axum`), used by
//! `Error`'s `IntoResponse` and by the HTTP layer alike.

use std::time::Duration;

use axum::body::Body;
use http::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};
use serde::Serialize;

use crate::error::Error;

/// The media type of problem details.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Where the problem types are documented: `docs/http.md` of the repository, one section per
/// type. A problem's `type` is this plus `#` and its [`ProblemKind::slug`].
pub const PROBLEM_TYPE_BASE: &str = "https://github.com/idempotent-rs/idempotent/blob/main/docs/http.md";

/// The ways the layer refuses a request, each with its status code and problem type.
///
/// ```
/// use idempotency::problem::ProblemKind;
///
/// assert_eq!(ProblemKind::InFlight.status(), 409);
/// assert!(ProblemKind::InFlight.type_uri().ends_with("#in-flight"));
/// ```
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
    /// 409: a lock the handler takes ([`Idempotency::lock`](crate::Idempotency::lock)) is held
    /// by another holder (`Error::Locked`).
    LockHeld,
    /// 409: a request with this key completed, but its response was too large to keep for
    /// replay; it is not run again.
    NotReplayable,
    /// 409: a request with this key completed and the endpoint rejects duplicates
    /// (`on_duplicate = reject`); it is not run again.
    Duplicate,
    /// 400: the request's options or inputs are out of range (a fingerprint payload over its
    /// limit, say).
    InvalidCall,
    /// 422: the work with this key failed as many times as its policy allows
    /// (`on_error = give_up_after(N)`, `Error::GaveUp`); it is not run again.
    GaveUp,
    /// 409: the work with this key was stopped mid-way without an outcome (its server died, or
    /// stalled past its lease) under `on_crash = hold`, so whether it took effect is unknown
    /// (`Error::OutcomeUnknown`); it is not run again until an operator or the application's
    /// resolver says what became of it. Retrying does not help until then: no `Retry-After`.
    OutcomeUnknown,
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
            | ProblemKind::UnreadableBody
            | ProblemKind::InvalidCall => StatusCode::BAD_REQUEST,
            ProblemKind::UnidentifiedClient => StatusCode::FORBIDDEN,
            ProblemKind::InFlight
            | ProblemKind::LockHeld
            | ProblemKind::NotReplayable
            | ProblemKind::Duplicate
            | ProblemKind::OutcomeUnknown => StatusCode::CONFLICT,
            ProblemKind::RequestTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ProblemKind::KeyReused | ProblemKind::GaveUp => StatusCode::UNPROCESSABLE_ENTITY,
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
            ProblemKind::LockHeld => "lock-held",
            ProblemKind::NotReplayable => "not-replayable",
            ProblemKind::Duplicate => "duplicate",
            ProblemKind::InvalidCall => "invalid-call",
            ProblemKind::GaveUp => "gave-up",
            ProblemKind::OutcomeUnknown => "outcome-unknown",
            ProblemKind::RequestTooLarge => "request-too-large",
            ProblemKind::KeyReused => "key-reused",
            ProblemKind::UnreadableBody => "unreadable-body",
            ProblemKind::UnreadableResponse => "unreadable-response",
            ProblemKind::StoreUnavailable => "store-unavailable",
            ProblemKind::Unconfirmed => "unconfirmed",
            ProblemKind::Internal => "internal",
        }
    }

    /// The title, as the HTTP layer words it: the same for every occurrence of the kind.
    pub fn title(self) -> &'static str {
        self.title_for(Origin::Header)
    }

    /// The title for a key of `origin`: the HTTP layer names its `Idempotency-Key` header; a
    /// call through the attribute or [`Idempotency::run`](crate::Idempotency::run) speaks of an
    /// idempotency key and a call.
    ///
    /// ```
    /// use idempotency::problem::{Origin, ProblemKind};
    ///
    /// assert_eq!(ProblemKind::KeyReused.title_for(Origin::Header), "Idempotency-Key reused for a different request");
    /// assert_eq!(ProblemKind::KeyReused.title_for(Origin::Call), "Idempotency key reused with a different payload");
    /// ```
    pub fn title_for(self, origin: Origin) -> &'static str {
        match (self, origin) {
            (ProblemKind::MissingKey, _) => "Idempotency-Key is missing",
            (ProblemKind::MalformedKey, Origin::Header) => "Idempotency-Key is malformed",
            (ProblemKind::MalformedKey, Origin::Call) => "The call's idempotency key is not valid",
            (ProblemKind::InvalidToken, _) => "Idempotency token is not valid",
            (ProblemKind::UnidentifiedClient, _) => "Client could not be identified",
            (ProblemKind::InFlight, Origin::Header) => "A request with this Idempotency-Key is being processed",
            (ProblemKind::InFlight, Origin::Call) => "A call with this idempotency key is in progress",
            (ProblemKind::LockHeld, _) => "The lock is held by another holder",
            (ProblemKind::NotReplayable, Origin::Header) => "The response to this Idempotency-Key cannot be replayed",
            (ProblemKind::NotReplayable, Origin::Call) => "The result of this call cannot be replayed",
            (ProblemKind::Duplicate, Origin::Header) => "This request was already made",
            (ProblemKind::Duplicate, Origin::Call) => "This call was already made",
            (ProblemKind::InvalidCall, Origin::Header) => "The request's options are out of range",
            (ProblemKind::InvalidCall, Origin::Call) => "The call's options are out of range",
            (ProblemKind::GaveUp, Origin::Header) => "This request failed too many times; it is not run again",
            (ProblemKind::GaveUp, Origin::Call) => "This call failed too many times; it is not run again",
            (ProblemKind::OutcomeUnknown, Origin::Header) => {
                "The outcome of the request with this Idempotency-Key is unknown; it is not run again until resolved"
            }
            (ProblemKind::OutcomeUnknown, Origin::Call) => {
                "The outcome of this call is unknown; it is not run again until resolved"
            }
            (ProblemKind::RequestTooLarge, _) => "Request body too large",
            (ProblemKind::KeyReused, Origin::Header) => "Idempotency-Key reused for a different request",
            (ProblemKind::KeyReused, Origin::Call) => "Idempotency key reused with a different payload",
            (ProblemKind::UnreadableBody, _) => "Request body could not be read",
            (ProblemKind::UnreadableResponse, _) => "Response body could not be read",
            (ProblemKind::StoreUnavailable, _) => "Idempotency store unavailable",
            (ProblemKind::Unconfirmed, Origin::Header) => {
                "The request ran; its stored response is not confirmed durable"
            }
            (ProblemKind::Unconfirmed, Origin::Call) => "The call ran; its stored result is not confirmed durable",
            (ProblemKind::Internal, _) => "Idempotency layer error",
        }
    }

    /// The problem type URI.
    pub fn type_uri(self) -> String {
        format!("{PROBLEM_TYPE_BASE}#{}", self.slug())
    }
}

/// Where the key of a refused call came from, for the words of its problem: a problem says
/// what the call was. The type, the status and `Retry-After` do not depend on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Origin {
    /// The client sent it in the `Idempotency-Key` header (the HTTP layer's requests): the
    /// problem names the header and speaks of a request's method, path and body.
    Header,
    /// The service built it from a call's arguments (the attribute's template) or gave it to
    /// [`Call::new`](crate::Call::new): the problem speaks of a call, its idempotency key and its
    /// payload. What `Error`'s `IntoResponse` uses.
    Call,
}

/// A problem details object (RFC 9457 §3): `type`, `title`, `status`, `detail`.
///
/// ```
/// use idempotency::problem::{Problem, ProblemKind};
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
    /// When to retry, in seconds (`Retry-After`), for the kinds that have one.
    #[serde(skip)]
    retry_after: Option<u64>,
}

impl Problem {
    /// A problem of `kind` with a `detail` about this occurrence, titled as the HTTP layer
    /// words it.
    pub fn new(kind: ProblemKind, detail: impl Into<String>) -> Self {
        Problem::worded(kind, Origin::Header, detail)
    }

    /// A problem of `kind` with a `detail` about this occurrence, titled for a key of `origin`.
    pub fn worded(kind: ProblemKind, origin: Origin, detail: impl Into<String>) -> Self {
        let retry_after =
            matches!(kind, ProblemKind::InFlight | ProblemKind::LockHeld | ProblemKind::Unconfirmed).then_some(1);
        Problem {
            type_uri: kind.type_uri(),
            title: kind.title_for(origin).to_owned(),
            status: kind.status().as_u16(),
            detail: detail.into(),
            kind: Some(kind),
            retry_after,
        }
    }

    /// The `Retry-After` the response carries, in whole seconds (at least 1), for a kind that
    /// has one.
    pub fn retry_after(mut self, after: Duration) -> Self {
        if self.retry_after.is_some() {
            self.retry_after = Some(after.as_secs_f64().ceil().max(1.0) as u64);
        }
        self
    }

    /// The problem that answers `error` for a call through the runtime (the attribute,
    /// [`Idempotency::run`](crate::Idempotency::run), a lock): what `Error`'s `IntoResponse`
    /// answers. [`Problem::for_error_from`] with [`Origin::Call`]; the HTTP layer uses
    /// [`Origin::Header`].
    ///
    /// | error | status | type |
    /// |---|---|---|
    /// | `Conflict` | 409, `Retry-After: 1` | in-flight |
    /// | `Timeout` (waited, still in flight) | 409, `Retry-After: 1` | in-flight |
    /// | `Locked` (a lock held by another holder) | 409, `Retry-After: 1` | lock-held |
    /// | `Duplicate` (rejected by policy) | 409 | duplicate |
    /// | `Duplicate` (not replayable) | 409 | not-replayable |
    /// | `KeyReused` | 422 | key-reused |
    /// | `InvalidToken` | 400 | invalid-token |
    /// | `InvalidKey` | 400 | malformed-key |
    /// | `InvalidCall` | 400 | invalid-call |
    /// | `GaveUp` | 422 | gave-up |
    /// | `OutcomeUnknown` | 409 | outcome-unknown |
    /// | `Store`, `LeaseLost` | 503 | store-unavailable |
    /// | `Unconfirmed` | 503, `Retry-After: 1` | unconfirmed |
    /// | `Codec`, `Corrupt`, `NotConfigured` | 500 | internal |
    ///
    /// ```
    /// use idempotency::problem::{Problem, ProblemKind};
    /// use idempotency::Error;
    ///
    /// let p = Problem::for_error(&Error::KeyReused { key: "k".into() });
    /// assert_eq!((p.status, p.kind()), (422, Some(ProblemKind::KeyReused)));
    /// assert_eq!(p.title, "Idempotency key reused with a different payload");
    /// ```
    pub fn for_error(error: &Error) -> Problem {
        Problem::for_error_from(error, Origin::Call)
    }

    /// The problem that answers `error`, worded for a key of `origin`: the one mapping of the
    /// library's errors to HTTP (see [`Problem::for_error`] for its table).
    ///
    /// ```
    /// use idempotency::problem::{Origin, Problem};
    /// use idempotency::Error;
    ///
    /// let e = Error::Conflict { key: "http:key:1:a:k-1".into(), retry_after: None };
    /// assert_eq!(Problem::for_error_from(&e, Origin::Header).title, "A request with this Idempotency-Key is being processed");
    /// ```
    pub fn for_error_from(error: &Error, origin: Origin) -> Problem {
        let header = origin == Origin::Header;
        let (what, a_call, payload, result) = if header {
            ("request", "a request", "method, path or body", "response")
        } else {
            ("call", "a call", "the call's fingerprint", "result")
        };
        let p = |kind, detail: String| Problem::worded(kind, origin, detail);
        match error {
            // `Retry-After: 1`, not the holder's lease: a lease renewed while the holder runs says
            // when a crashed holder's key frees at the latest (tens of seconds by default), not when
            // a live one finishes, which is usually far sooner; and stores differ in whether they
            // report it at all.
            Error::Conflict { .. } => p(
                ProblemKind::InFlight,
                format!("{a_call} with this key is still being processed; retry later to get its {result}"),
            ),
            Error::Timeout { waited, .. } => p(
                ProblemKind::InFlight,
                format!("{a_call} with this key is still being processed after waiting {waited:?}; retry later"),
            ),
            Error::Locked { waited: None, .. } => {
                p(ProblemKind::LockHeld, "another holder has the lock this needs; retry later".to_owned())
            }
            Error::Locked { waited: Some(waited), .. } => p(
                ProblemKind::LockHeld,
                format!("another holder still had the lock this needs after waiting {waited:?}; retry later"),
            ),
            Error::KeyReused { .. } => p(
                ProblemKind::KeyReused,
                format!("this key was first used for {a_call} with a different payload ({payload} differs)"),
            ),
            Error::Duplicate { replayable: false, .. } => p(
                ProblemKind::NotReplayable,
                format!(
                    "{a_call} with this key completed, but its {result} was too large to keep for replay; it is not \
                     run again"
                ),
            ),
            Error::Duplicate { .. } => {
                p(ProblemKind::Duplicate, format!("{a_call} with this key completed; it is not run again"))
            }
            Error::InvalidToken { .. } => {
                p(ProblemKind::InvalidToken, "the token is not one issued to this client, or it expired".to_owned())
            }
            Error::InvalidKey { reason, .. } if header => {
                p(ProblemKind::MalformedKey, format!("the key is refused: {reason}"))
            }
            Error::InvalidKey { reason, .. } => {
                p(ProblemKind::MalformedKey, format!("the key built from the call's arguments is refused: {reason}"))
            }
            Error::InvalidCall { reason, .. } => p(ProblemKind::InvalidCall, reason.clone()),
            Error::GaveUp { attempts, last_error, .. } => p(
                ProblemKind::GaveUp,
                format!(
                    "{a_call} with this key failed {attempts} times, the last with: {last_error}; it is not run again"
                ),
            ),
            Error::OutcomeUnknown { lease_ended, attempt, .. } => p(
                ProblemKind::OutcomeUnknown,
                format!(
                    "{a_call} with this key (attempt {attempt}) stopped without an outcome when its lease ended at {}: \
                     whether it took effect is unknown, and it is not run again until an operator resolves it",
                    crate::utc::Iso8601(*lease_ended)
                ),
            ),
            Error::Store { source, .. } => p(
                ProblemKind::StoreUnavailable,
                format!("the idempotency store failed ({}); nothing ran, retry later", source.kind()),
            ),
            Error::LeaseLost { .. } => p(
                ProblemKind::StoreUnavailable,
                format!("the idempotency lease was lost while {a_call} ran; retry later"),
            ),
            Error::Unconfirmed { source, .. } => p(
                ProblemKind::Unconfirmed,
                format!(
                    "the {what} ran and its {result} was stored, but the store could not confirm it is durable \
                     ({source}); retry with the same key to get the stored {result}"
                ),
            ),
            _ => p(ProblemKind::Internal, "the idempotency layer failed; see the server log".to_owned()),
        }
    }

    /// The kind, when built by [`Problem::new`].
    pub fn kind(&self) -> Option<ProblemKind> {
        self.kind
    }

    /// The response: the status, `Content-Type: application/problem+json`, `Cache-Control:
    /// no-store`, and for a request in flight or an unconfirmed result `Retry-After` (1 s unless
    /// the holder's lease says more).
    pub fn into_response(self) -> Response<Body> {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self).unwrap_or_else(|_| b"{}".to_vec());
        let mut response = Response::new(Body::from(body));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if let Some(secs) = self.retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

impl axum::response::IntoResponse for Problem {
    fn into_response(self) -> axum::response::Response {
        Problem::into_response(self)
    }
}

/// The library's errors as responses (feature `axum`): a handler returning
/// `Result<T, idempotency::Error>`, or an error type wrapping it, answers with the problem of
/// [`Problem::for_error`].
impl axum::response::IntoResponse for Error {
    fn into_response(self) -> axum::response::Response {
        Problem::for_error(&self).into_response()
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
            ProblemKind::LockHeld,
            ProblemKind::NotReplayable,
            ProblemKind::Duplicate,
            ProblemKind::InvalidCall,
            ProblemKind::GaveUp,
            ProblemKind::OutcomeUnknown,
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

    /// A call's problems speak of a call, never of the header or of a request's method, path or
    /// body; the HTTP layer's keep the header's words. The type and status are the same.
    #[test]
    fn a_calls_problem_speaks_of_a_call_and_a_requests_of_the_header() {
        let k = || "orders:7".to_owned();
        let errors = vec![
            Error::Conflict { key: k(), retry_after: None },
            Error::Timeout { key: k(), waited: Duration::from_secs(5) },
            Error::Duplicate { key: k(), replayable: true },
            Error::Duplicate { key: k(), replayable: false },
            Error::KeyReused { key: k() },
            Error::InvalidKey { key: k(), reason: "the template value {req.id} is empty".into() },
            Error::LeaseLost { key: k(), reason: "expired".into() },
            Error::GaveUp { key: k(), attempts: 3, last_error: "card declined".into() },
        ];
        for e in &errors {
            let call = Problem::for_error(e);
            let request = Problem::for_error_from(e, Origin::Header);
            let words = format!("{} {}", call.title, call.detail);
            assert!(!words.contains("Idempotency-Key") && !words.contains("request"), "{e}: {words}");
            assert!(!words.contains("method, path"), "{e}: {words}");
            assert_eq!((call.type_uri, call.status), (request.type_uri.clone(), request.status), "{e}");
            let words = format!("{} {}", request.title, request.detail);
            assert!(words.contains("Idempotency-Key") || words.contains("request"), "{e}: {words}");
        }
        let reused = Problem::for_error_from(&Error::KeyReused { key: k() }, Origin::Header);
        assert!(reused.detail.contains("method, path or body"), "{}", reused.detail);
        let locked = Problem::for_error(&Error::Locked { key: k(), waited: Some(Duration::from_secs(5)) });
        assert_eq!((locked.status, locked.title.as_str()), (409, "The lock is held by another holder"));
        assert!(!locked.detail.contains("Idempotency-Key"), "{}", locked.detail);
    }

    /// Every error's response: status, content type, body, `Retry-After`.
    #[tokio::test]
    async fn every_error_answers_with_its_problem() {
        use crate::error::{StoreError, StoreErrorKind};
        use axum::response::IntoResponse;
        use http_body_util::BodyExt;

        let store = || StoreError::new(StoreErrorKind::Unavailable, "connection refused");
        let k = || "orders:7".to_owned();
        let cases: Vec<(Error, u16, &str)> = vec![
            (Error::Conflict { key: k(), retry_after: Some(Duration::from_millis(2500)) }, 409, "in-flight"),
            (Error::Timeout { key: k(), waited: Duration::from_secs(5) }, 409, "in-flight"),
            (Error::Locked { key: k(), waited: None }, 409, "lock-held"),
            (Error::Locked { key: k(), waited: Some(Duration::from_secs(5)) }, 409, "lock-held"),
            (Error::Duplicate { key: k(), replayable: true }, 409, "duplicate"),
            (Error::Duplicate { key: k(), replayable: false }, 409, "not-replayable"),
            (Error::KeyReused { key: k() }, 422, "key-reused"),
            (Error::InvalidToken { key: k() }, 400, "invalid-token"),
            (Error::InvalidKey { key: k(), reason: "empty".into() }, 400, "malformed-key"),
            (Error::InvalidCall { key: k(), reason: "too large".into() }, 400, "invalid-call"),
            (Error::GaveUp { key: k(), attempts: 3, last_error: "card declined".into() }, 422, "gave-up"),
            (
                Error::OutcomeUnknown {
                    key: k(),
                    owner: "AAAAAAgR7uBddltXePwIaA".into(),
                    lease_ended: std::time::UNIX_EPOCH,
                    attempt: 1,
                },
                409,
                "outcome-unknown",
            ),
            (Error::Store { key: k(), source: store() }, 503, "store-unavailable"),
            (Error::LeaseLost { key: k(), reason: "expired".into() }, 503, "store-unavailable"),
            (Error::Unconfirmed { key: k(), source: store() }, 503, "unconfirmed"),
            (Error::Codec { key: k(), message: "bad".into() }, 500, "internal"),
            (Error::Corrupt { key: k(), reason: "foreign".into() }, 500, "internal"),
            (Error::NotConfigured { key: k() }, 500, "internal"),
        ];
        for (error, status, slug) in cases {
            let shown = error.to_string();
            let response = error.into_response();
            assert_eq!(response.status().as_u16(), status, "{shown}");
            assert_eq!(response.headers()[CONTENT_TYPE], PROBLEM_JSON, "{shown}");
            let retry = response.headers().get(RETRY_AFTER).map(|v| v.to_str().unwrap().to_owned());
            let body = response.into_body().collect().await.unwrap().to_bytes();
            let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert!(json["type"].as_str().unwrap().ends_with(&format!("#{slug}")), "{shown}: {json}");
            assert_eq!(json["status"], status);
            assert!(!json["title"].as_str().unwrap().is_empty() && !json["detail"].as_str().unwrap().is_empty());
            assert!(!json.to_string().contains("orders:7"), "the key is in the body: {json}");
            match slug {
                // A holder's lease says when a crashed holder's key frees, not when to retry.
                "in-flight" | "lock-held" | "unconfirmed" => assert_eq!(retry.as_deref(), Some("1"), "{shown}"),
                _ => assert_eq!(retry, None, "{shown}"),
            }
        }
    }
}
