//! `IdempotencyService`: one guarded request, from the `Idempotency-Key` header to the runtime's
//! `run` and back to a response (the handler's, a replay, or a problem).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::Bytes;
use http::header::HeaderValue;
use http::{request, response, Request, Response};
use http_body::Body as HttpBody;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use idempotent_core::Call;
use tower_service::Service;

use crate::failure::Failure;
use crate::header::{parse_key_with, KeyError, IDEMPOTENCY_KEY};
use crate::json;
use crate::policy::{problem_for, KeyMode, Policy, Ran, IDEMPOTENCY_KEY_EXPIRES};
use crate::problem::{Problem, ProblemKind};
use crate::stored::StoredResponse;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The service [`IdempotencyLayer`](crate::IdempotencyLayer) wraps around a handler.
#[derive(Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    policy: Arc<Policy>,
}

impl<S> IdempotencyService<S> {
    pub(crate) fn new(inner: S, policy: Arc<Policy>) -> Self {
        IdempotencyService { inner, policy }
    }
}

impl<S> std::fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyService").field("scope", &self.policy.scope).finish_non_exhaustive()
    }
}

impl<S, B, ResBody> Service<Request<B>> for IdempotencyService<S>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: HttpBody + From<Bytes> + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The clone that was not polled ready goes to the next request; this one is ready.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let policy = self.policy.clone();
        Box::pin(guard(policy, inner, req))
    }
}

/// The request's target as the client sent it: axum's `OriginalUri` inside a nested router
/// (whose own URI has lost the prefix), the URI itself elsewhere.
fn original_uri(parts: &request::Parts) -> &http::Uri {
    parts.extensions.get::<axum::extract::OriginalUri>().map_or(&parts.uri, |o| &o.0)
}

/// Runs one request through the layer. A guarded request runs in a task of its own: once its
/// handler has started, it runs to its end and its response is stored even if the client goes
/// away (hyper drops the request's future then); a retry meanwhile is answered 409 with
/// `Retry-After`, and after it the stored response.
async fn guard<S, B, ResBody>(policy: Arc<Policy>, mut inner: S, req: Request<B>) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: HttpBody + From<Bytes> + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let (parts, body) = req.into_parts();
    // The token endpoint's path as the client sent it: inside a nested router the request's own
    // path has lost its prefix, and another route could look like the token endpoint.
    let token_path = original_uri(&parts).path() == policy.token_path;
    let req = Request::from_parts(parts, body);
    let unguarded = !policy.methods.contains(req.method()) || token_path;
    if unguarded {
        return inner.call(req).await.map(|r| r.map(Body::new));
    }
    let (parts, body) = req.into_parts();
    let call = match prepare(&policy, &parts) {
        Ok(Some(call)) => call,
        Ok(None) => return inner.call(Request::from_parts(parts, body)).await.map(|r| r.map(Body::new)),
        Err(problem) => return Ok(problem.into_response()),
    };
    // Under the request's span (the current one); the call's own span nests under this one.
    let span = tracing::info_span!(
        "idempotent.http",
        method = %parts.method,
        replayed = tracing::field::Empty,
        status = tracing::field::Empty,
    );
    let run = {
        let policy = policy.clone();
        async move { respond(&policy, inner, parts, body, call).await }
    };
    let answered = match tokio::spawn(tracing::Instrument::instrument(run, span.clone())).await {
        Ok(answered) => answered,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => {
            let detail = "the request's task was cancelled (the server is shutting down); a retry with the same key \
                          replays it or runs it";
            Ok((Problem::new(ProblemKind::Internal, detail).into_response(), false))
        }
    };
    if let Ok((response, replayed)) = &answered {
        span.record("replayed", *replayed);
        span.record("status", response.status().as_u16());
    }
    answered.map(|(response, _)| response)
}

/// Runs a guarded request: its body read, its call run. Says whether the response is a replay.
async fn respond<S, B, ResBody>(
    policy: &Policy,
    mut inner: S,
    parts: request::Parts,
    body: B,
    call: Call,
) -> Result<(Response<Body>, bool), S::Error>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    B: HttpBody + From<Bytes>,
    B::Error: Into<BoxError>,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let problem = |p: Problem| Ok((p.into_response(), false));
    let body = match Limited::new(body, policy.max_request_bytes).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<LengthLimitError>() => {
            let detail = format!("the body is over {} bytes, the most this endpoint reads", policy.max_request_bytes);
            return problem(Problem::new(ProblemKind::RequestTooLarge, detail));
        }
        Err(e) => return problem(Problem::new(ProblemKind::UnreadableBody, e.to_string())),
    };
    // The fingerprint covers the request as the client sent it: the method, the authority (one
    // layer may serve several hosts), the whole target (a nested router's own URI has lost its
    // prefix: `/v1/orders` and `/v2/orders` would be one request) and the body.
    let uri = original_uri(&parts);
    let target = uri.path_and_query().map_or_else(|| uri.path(), |pq| pq.as_str());
    let authority = match uri.authority() {
        Some(authority) => authority.as_str().as_bytes(),
        None => parts.headers.get(http::header::HOST).map_or(&b""[..], |h| h.as_bytes()),
    };
    // A JSON body by its canonical form when the layer says so: a canonical form is itself JSON
    // with a canonical form, and a body without one is not JSON, so the two never meet.
    let canonical =
        (policy.json_fingerprint && json::is_json(&parts.headers)).then(|| json::canonical(&body)).flatten();
    let body_hashed = canonical.as_deref().unwrap_or(&body[..]);
    let parts_hashed: [&[u8]; 4] = [parts.method.as_str().as_bytes(), authority, target.as_bytes(), body_hashed];
    let call = call.fingerprint_parts(parts_hashed);
    let req = Request::from_parts(parts, B::from(body));

    // The first run leaves the handler's own response head here (all its headers, not only the
    // stored ones); a replay leaves nothing.
    let first: Mutex<Option<(response::Parts, Bytes)>> = Mutex::new(None);
    let outcome = policy
        .idem
        .run(call, || async {
            let response = inner.call(req).await.map_err(Failure::Inner)?;
            let (mut head, body) = response.into_parts();
            let bytes = match body.collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(e) => return Err(Failure::Unreadable(e.into().to_string())),
            };
            if head.extensions.get::<Ran>().is_none() && !(policy.store_if)(head.status) {
                return Err(Failure::NotStored(Response::from_parts(head, Body::from(bytes))));
            }
            if policy.expiry_header {
                tell_expiry(&mut head);
            }
            let stored = StoredResponse::capture(&head, &bytes, &policy.stored_headers);
            *first.lock().unwrap_or_else(|p| p.into_inner()) = Some((head, bytes));
            Ok::<_, Failure<S::Error, Response<Body>>>(stored)
        })
        .await;
    let first = first.into_inner().unwrap_or_else(|p| p.into_inner());
    match outcome {
        Ok(stored) => Ok(match first {
            Some((head, bytes)) => (Response::from_parts(head, Body::from(bytes)), false),
            None => match stored.replay(&policy.replay_header) {
                Ok(response) => (response, true),
                Err(why) => {
                    let detail = format!("the stored response does not decode: {why}");
                    (Problem::new(ProblemKind::Internal, detail).into_response(), false)
                }
            },
        }),
        Err(Failure::Idem(e)) => problem(problem_for(policy, &e)),
        Err(Failure::NotStored(response)) => Ok((response, false)),
        Err(Failure::Unreadable(why)) => problem(Problem::new(
            ProblemKind::UnreadableResponse,
            format!("the handler's response body failed ({why}); nothing was stored, a retry runs it again"),
        )),
        Err(Failure::Inner(e)) => Err(e),
    }
}

/// Sets `Idempotency-Key-Expires` on a response about to be stored: until when the call's result
/// is kept, rounded down to the second (the record lives at least that long).
fn tell_expiry(head: &mut response::Parts) {
    let Some(until) = idempotent_core::CallContext::current().and_then(|c| c.kept_until()) else { return };
    // An HTTP-date has four digits of year (and `httpdate` panics past 9999).
    const YEAR_10000: u64 = 253_402_300_800;
    let Ok(since) = until.duration_since(std::time::UNIX_EPOCH) else { return };
    if since.as_secs() >= YEAR_10000 {
        return;
    }
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(since.as_secs());
    if let Ok(value) = HeaderValue::from_str(&httpdate::fmt_http_date(at)) {
        head.headers.insert(IDEMPOTENCY_KEY_EXPIRES.clone(), value);
    }
}

/// The call for a request's key, `None` when it runs unguarded, or the problem refusing it.
fn prepare(policy: &Policy, parts: &request::Parts) -> Result<Option<Call>, Problem> {
    let key = match parse_key_with(parts.headers.get_all(&IDEMPOTENCY_KEY), policy.max_key_bytes, policy.lenient_header)
    {
        Ok(key) => key,
        Err(KeyError::Missing) => {
            return match policy.mode {
                KeyMode::Optional => Ok(None),
                KeyMode::Required => Err(Problem::new(
                    ProblemKind::MissingKey,
                    format!("{} {} requires an Idempotency-Key header", parts.method, parts.uri.path()),
                )),
                KeyMode::Token => Err(Problem::new(
                    ProblemKind::MissingKey,
                    format!(
                        "{} {} requires an Idempotency-Key header holding a token from POST {}",
                        parts.method,
                        parts.uri.path(),
                        policy.token_path
                    ),
                )),
            };
        }
        Err(e) => return Err(Problem::new(ProblemKind::MalformedKey, e.to_string())),
    };
    let (call, kind) = match policy.mode {
        KeyMode::Token => (Call::token(key), "token"),
        KeyMode::Required | KeyMode::Optional => (Call::new(key), "key"),
    };
    let mut call =
        call.scope(policy.client_scope(kind, parts)?).on_conflict(policy.on_conflict).on_crash(policy.on_crash);
    if let Some(ttl) = policy.ttl {
        call = call.ttl(ttl);
    }
    if let Some(keep) = policy.keep {
        call = call.keep(keep);
    }
    Ok(Some(call))
}

#[cfg(test)]
mod tests {
    use super::*;
    use idempotent_core::{Error, Idempotency, MemoryStore, StoreError, StoreErrorKind};

    /// A commit the replicas did not acknowledge came after the handler ran: not "nothing ran,
    /// retry later" (503 store-unavailable) but its own problem, saying a retry replays it.
    #[test]
    fn an_unconfirmed_commit_is_not_a_store_outage() {
        let layer = crate::IdempotencyLayer::shared_keys(Idempotency::new(MemoryStore::new()));
        let source = StoreError::new(StoreErrorKind::Replication, "commit: 0 of 1 replicas acknowledged within 100ms");
        let p = problem_for(&layer.policy, &Error::Unconfirmed { key: "k".into(), source });
        assert_eq!(p.kind(), Some(ProblemKind::Unconfirmed));
        assert_eq!(p.status, 503);
        assert!(p.detail.contains("the request ran") && p.detail.contains("retry with the same key"), "{}", p.detail);
        assert!(!p.detail.contains("nothing ran"));
        let store = StoreError::new(StoreErrorKind::Unavailable, "connection refused");
        let p = problem_for(&layer.policy, &Error::Store { key: "k".into(), source: store });
        assert_eq!(p.kind(), Some(ProblemKind::StoreUnavailable));
        assert!(p.detail.contains("nothing ran"));
    }
}
