//! The service the gRPC layer wraps around a tonic server: a call's key read from its metadata,
//! its message read and fingerprinted, the call run once through the runtime in a task of its
//! own, its response stored whole (metadata, message, status, trailers) and played back.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{request, response, Request, Response};
use http_body::Body as HttpBody;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use idempotent_core::Call;
use tonic::body::Body;
use tonic::{Code, Status};
use tower_service::Service;

use super::status::{answer, for_error};
use super::stored::{Frames, StoredCall};
use super::{GrpcPolicy, IDEMPOTENCY_KEY_METADATA, REPLAYED_METADATA};
use crate::failure::Failure;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The service of a [`GrpcIdempotencyLayer`](super::GrpcIdempotencyLayer).
#[derive(Clone)]
pub struct GrpcIdempotencyService<S> {
    inner: S,
    policy: Arc<GrpcPolicy>,
}

impl<S> GrpcIdempotencyService<S> {
    pub(crate) fn new(inner: S, policy: Arc<GrpcPolicy>) -> Self {
        GrpcIdempotencyService { inner, policy }
    }
}

impl<S> std::fmt::Debug for GrpcIdempotencyService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcIdempotencyService").field("scope", &self.policy.scope).finish_non_exhaustive()
    }
}

impl<S, ResBody> Service<Request<Body>> for GrpcIdempotencyService<S>
where
    S: Service<Request<Body>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(guard(self.policy.clone(), inner, req))
    }
}

/// One call through the layer.
async fn guard<S, ResBody>(
    policy: Arc<GrpcPolicy>,
    mut inner: S,
    req: Request<Body>,
) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<Body>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let (parts, body) = req.into_parts();
    let (call, key) = match prepare(&policy, &parts) {
        Ok(Some(prepared)) => prepared,
        Ok(None) => return inner.call(Request::from_parts(parts, body)).await.map(|r| r.map(Body::new)),
        Err(status) => return Ok(answer(status)),
    };
    let span = tracing::info_span!("idempotent.grpc", method = %parts.uri.path(), replayed = tracing::field::Empty);
    let run = {
        let policy = policy.clone();
        async move { respond(&policy, inner, parts, body, call, &key).await }
    };
    // In a task of its own: a client whose deadline passed, or that went away, does not cancel
    // a call that started; its retry gets ABORTED meanwhile, and the stored response after.
    match tokio::spawn(tracing::Instrument::instrument(run, span.clone())).await {
        Ok(Ok((response, replayed))) => {
            span.record("replayed", replayed);
            Ok(response)
        }
        Ok(Err(e)) => Err(e),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Ok(answer(Status::new(
            Code::Unavailable,
            "the call's task was cancelled (the server is shutting down); a retry with the same key replays it or runs it",
        ))),
    }
}

/// The number of gRPC messages in `body` (each a 5-byte prefix and its bytes), or `None` when it
/// is not whole messages.
fn messages(mut body: &[u8]) -> Option<usize> {
    let mut n = 0;
    while !body.is_empty() {
        let len = u32::from_be_bytes(body.get(1..5)?.try_into().ok()?) as usize;
        body = body.get(5 + len..)?;
        n += 1;
    }
    Some(n)
}

async fn respond<S, ResBody>(
    policy: &GrpcPolicy,
    mut inner: S,
    parts: request::Parts,
    body: Body,
    call: Call,
    key: &str,
) -> Result<(Response<Body>, bool), S::Error>
where
    S: Service<Request<Body>, Response = Response<ResBody>>,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let refuse = |code: Code, message: String| Ok((answer(Status::new(code, message)), false));
    let bytes = match Limited::new(body, policy.max_message_bytes).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<LengthLimitError>() => {
            let why = format!(
                "the request is over {} bytes, the most this server reads for an idempotency key",
                policy.max_message_bytes
            );
            return refuse(Code::ResourceExhausted, why);
        }
        Err(e) => return refuse(Code::Internal, format!("the request could not be read: {e}")),
    };
    match messages(&bytes) {
        Some(1) | Some(0) => {}
        Some(n) => {
            let why = format!("{} sent {n} messages: idempotency keys are for unary calls", parts.uri.path());
            return refuse(Code::InvalidArgument, why);
        }
        None => return refuse(Code::InvalidArgument, "the request is not whole gRPC messages".into()),
    }
    let call = call.fingerprint_parts([parts.uri.path().as_bytes(), &bytes[..]]);
    let req = Request::from_parts(parts, Body::new(Full::new(bytes)));

    let first: Mutex<Option<(response::Parts, Bytes, Option<http::HeaderMap>)>> = Mutex::new(None);
    let outcome = policy
        .idem
        .run(call, || async {
            let response = inner.call(req).await.map_err(Failure::Inner)?;
            let (head, body) = response.into_parts();
            let collected = body.collect().await.map_err(|e| Failure::Unreadable(e.into().to_string()))?;
            let trailers = collected.trailers().cloned();
            let bytes = collected.to_bytes();
            let code = grpc_status(&head.headers, trailers.as_ref());
            let streamed = messages(&bytes).is_some_and(|n| n > 1);
            if streamed {
                tracing::warn!(
                    "a call with an idempotency key answered with more than one message: not stored (list its method in \
                     streaming_methods)"
                );
            }
            if streamed || !(policy.store_if)(code) {
                return Err(Failure::NotStored(Response::from_parts(head, Frames::new(bytes, trailers))));
            }
            let stored = StoredCall::capture(&head, &bytes, trailers.as_ref());
            *first.lock().unwrap_or_else(|p| p.into_inner()) = Some((head, bytes, trailers));
            Ok::<_, Failure<S::Error, Response<Frames>>>(stored)
        })
        .await;
    let first = first.into_inner().unwrap_or_else(|p| p.into_inner());
    match outcome {
        Ok(stored) => Ok(match first {
            Some((head, bytes, trailers)) => {
                (Response::from_parts(head, Body::new(Frames::new(bytes, trailers))), false)
            }
            None => match stored.replay(REPLAYED_METADATA) {
                Ok(response) => (response.map(Body::new), true),
                Err(why) => {
                    (answer(Status::new(Code::Internal, format!("the stored response does not decode: {why}"))), false)
                }
            },
        }),
        Err(Failure::Idem(e)) => Ok((answer(for_error(&e, key)), false)),
        Err(Failure::NotStored(response)) => Ok((response.map(Body::new), false)),
        Err(Failure::Unreadable(why)) => refuse(
            Code::Internal,
            format!("the handler's response failed ({why}); nothing was stored, a retry runs it again"),
        ),
        Err(Failure::Inner(e)) => Err(e),
    }
}

/// The call's status code: in the trailers, or in the headers of a trailers-only response;
/// `UNKNOWN` (2) without one.
fn grpc_status(headers: &http::HeaderMap, trailers: Option<&http::HeaderMap>) -> i32 {
    trailers
        .and_then(|t| t.get("grpc-status"))
        .or_else(|| headers.get("grpc-status"))
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(2)
}

/// The call for a request's key and the key itself; `None` when it runs unguarded; or the
/// status refusing it.
fn prepare(policy: &GrpcPolicy, parts: &request::Parts) -> Result<Option<(Call, String)>, Status> {
    let path = parts.uri.path();
    if !policy.guards(path) {
        return Ok(None);
    }
    let mut values = parts.headers.get_all(IDEMPOTENCY_KEY_METADATA).iter();
    let key = match (values.next(), values.next()) {
        (None, _) if policy.require_key => {
            return Err(Status::new(
                Code::InvalidArgument,
                format!("{path} requires {IDEMPOTENCY_KEY_METADATA} metadata"),
            ))
        }
        (None, _) => return Ok(None),
        (Some(_), Some(_)) => {
            return Err(Status::new(Code::InvalidArgument, format!("more than one {IDEMPOTENCY_KEY_METADATA}")))
        }
        (Some(value), None) => value,
    };
    let key = match key.to_str() {
        Ok(k) if !k.is_empty() && k.len() <= policy.max_key_bytes && k.bytes().all(|c| c.is_ascii_graphic()) => k,
        _ => {
            return Err(Status::new(
                Code::InvalidArgument,
                format!("{IDEMPOTENCY_KEY_METADATA} must be 1 to {} visible ASCII characters", policy.max_key_bytes),
            ))
        }
    };
    if policy.streaming.iter().any(|m| m == path) {
        return Err(Status::new(
            Code::InvalidArgument,
            format!("{path} is a streaming method: idempotency keys are for unary calls"),
        ));
    }
    let Some(client) = (policy.client)(parts) else {
        return Err(Status::new(
            Code::PermissionDenied,
            "the call does not say which client it comes from, so its key cannot be scoped",
        ));
    };
    let scope = idempotent_core::client_key::client_scope(&policy.scope, "key", &client);
    let mut call = Call::new(key).scope(scope).on_conflict(policy.on_conflict).on_crash(policy.on_crash);
    if let Some(ttl) = policy.ttl {
        call = call.ttl(ttl);
    }
    if let Some(keep) = policy.keep {
        call = call.keep(keep);
    }
    Ok(Some((call, key.to_owned())))
}

#[cfg(test)]
mod tests {
    use super::messages;

    #[test]
    fn messages_are_counted_by_their_prefixes() {
        assert_eq!(messages(b""), Some(0));
        assert_eq!(messages(&[0, 0, 0, 0, 2, 8, 7]), Some(1));
        assert_eq!(messages(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 9]), Some(2));
        assert_eq!(messages(&[0, 0, 0, 0, 5, 1]), None, "cut short");
        assert_eq!(messages(&[0, 0, 0]), None);
    }
}
