//! A gRPC method as a subject of the core's test kit (features `grpc` and `testing`): the
//! layered service called directly with one framed request message and the key in its
//! metadata, its answers told apart by `grpc-status` and the replay metadata.

use bytes::{BufMut, Bytes, BytesMut};
use http::{Request, Response};
use http_body::Body as HttpBody;
use http_body_util::{BodyExt, Full};
use idempotent_core::testing::{Answer, Answering, Ask, Subject};
use tonic::body::Body;
use tower_service::Service;

use super::{IDEMPOTENCY_KEY_METADATA, REPLAYED_METADATA};

/// A unary method under test; see [`method`].
#[derive(Debug, Clone)]
pub struct Method<S> {
    service: S,
    path: String,
    message: Bytes,
    other: Option<Bytes>,
    metadata: Vec<(http::HeaderName, http::HeaderValue)>,
}

/// The unary method at `path` (`/package.Service/Method`) of `service`, a tonic service with the
/// layer around it (`GrpcIdempotencyLayer::layer(svc)`, on the kit's runtime), as a subject of
/// the test kit: every call sends `message` (the request message encoded, as prost's
/// `encode_to_vec` gives it) with `idempotency-key: kit-key`.
pub fn method<S>(service: S, path: impl Into<String>, message: impl Into<Bytes>) -> Method<S> {
    Method { service, path: path.into(), message: message.into(), other: None, metadata: Vec::new() }
}

impl<S> Method<S> {
    /// Another message for the same key: the kit expects `FAILED_PRECONDITION`.
    pub fn other_message(mut self, message: impl Into<Bytes>) -> Self {
        self.other = Some(message.into());
        self
    }

    /// Metadata every call carries (the client's id, credentials).
    ///
    /// # Panics
    /// When `name` or `value` is not valid metadata.
    pub fn metadata(mut self, name: &str, value: &str) -> Self {
        let name = http::HeaderName::try_from(name).expect("a metadata name");
        let value = http::HeaderValue::try_from(value).expect("a metadata value");
        self.metadata.push((name, value));
        self
    }

    fn request(&self, ask: Ask) -> Request<Body> {
        let message = match ask {
            Ask::Same => &self.message,
            Ask::OtherPayload => self.other.as_ref().unwrap_or(&self.message),
        };
        let mut framed = BytesMut::with_capacity(5 + message.len());
        framed.put_u8(0);
        framed.put_u32(message.len() as u32);
        framed.put_slice(message);
        let mut request = Request::builder()
            .method(http::Method::POST)
            .uri(&self.path)
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header("te", "trailers")
            .header(IDEMPOTENCY_KEY_METADATA, "kit-key");
        for (name, value) in &self.metadata {
            request = request.header(name, value);
        }
        request.body(Body::new(Full::new(framed.freeze()))).unwrap_or_else(|_| Request::new(Body::empty()))
    }
}

/// `grpc-message` as it was written: the gRPC spec percent-encodes it on the wire.
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex =
            (bytes[i] == b'%').then(|| text.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok())).flatten();
        match hex {
            Some(b) => {
                out.push(b);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What a response says, as the kit tells answers apart.
async fn answer<B: HttpBody>(response: Response<B>) -> Answer
where
    B::Error: std::fmt::Debug,
{
    let (parts, body) = response.into_parts();
    let collected = match body.collect().await {
        Ok(collected) => collected,
        Err(e) => return Answer::Failed(format!("the response body failed: {e:?}")),
    };
    let trailers = collected.trailers().cloned().unwrap_or_default();
    let bytes = collected.to_bytes();
    let get = |name: &str| {
        trailers.get(name).or_else(|| parts.headers.get(name)).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned()
    };
    let code: i32 = get("grpc-status").parse().unwrap_or(2);
    let message = percent_decoded(&get("grpc-message"));
    match code {
        10 => Answer::InFlight,
        9 => Answer::KeyReused,
        14 if message.contains("idempotency store is unavailable") => Answer::StoreUnavailable,
        // The message and the statuses a retry would get again are the answer; the rest fails.
        code if super::STORED_CODES.contains(&code) => Answer::Value {
            shown: format!("status {code} {message} message {:02x?}", &bytes[..]),
            replayed: Some(parts.headers.get(REPLAYED_METADATA).is_some_and(|v| v == "true")),
        },
        _ => Answer::Failed(format!("status {code} {message}")),
    }
}

impl<S, B> Subject for Method<S>
where
    S: Service<Request<Body>, Response = Response<B>> + Clone + 'static,
    S::Error: std::fmt::Debug,
    B: HttpBody,
    B::Error: std::fmt::Debug,
{
    fn call(&self, ask: Ask) -> Answering<'_> {
        let request = self.request(ask);
        let service = self.service.clone();
        Box::pin(async move {
            match crate::testing::send(service, request).await {
                Ok(response) => answer(response).await,
                Err(e) => Answer::Failed(e),
            }
        })
    }

    fn has_other_payload(&self) -> bool {
        self.other.is_some()
    }

    fn describe(&self) -> String {
        format!("gRPC {}", self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::percent_decoded;

    #[test]
    fn grpc_messages_are_percent_decoded() {
        assert_eq!(percent_decoded("try%20again"), "try again");
        assert_eq!(percent_decoded("100%25 %2"), "100% %2", "a cut escape is kept as it is");
        assert_eq!(percent_decoded("caf%C3%A9"), "café");
    }
}
