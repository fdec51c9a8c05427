//! An HTTP route as a subject of the core's test kit (feature `testing`): any tower service
//! taking `http::Request<Body>` (an axum `Router`, a service with the layer), sent the same
//! request with the same `Idempotency-Key` again and again, its answers told apart by status,
//! problem type and replay header.

use std::fmt::Debug;
use std::sync::Arc;

use axum::body::Body;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::{Method, Request, Response};
use http_body::Body as HttpBody;
use http_body_util::BodyExt;
use idempotent_core::problem::PROBLEM_JSON;
use idempotent_core::testing::{Answer, Answering, Ask, Subject};
use tokio::sync::OnceCell;
use tower_service::Service;

use crate::header::key_value;
use crate::policy::DEFAULT_REPLAY_HEADER;
use crate::token::IssuedToken;

/// A route under test; see [`route`].
#[derive(Debug, Clone)]
pub struct Route<S> {
    service: S,
    method: Method,
    path: String,
    key: String,
    body: Bytes,
    other_body: Option<Bytes>,
    headers: Vec<(HeaderName, HeaderValue)>,
    replay_header: HeaderName,
    /// Token mode: where to get the key from, and the token got.
    token_path: Option<String>,
    token: Arc<OnceCell<String>>,
}

/// `method path` of `service` (built on the kit's runtime, [`Kit::idempotency`]) as a subject of
/// the test kit: every call sends the same request with `Idempotency-Key: "kit-key"`.
///
/// [`Kit::idempotency`]: idempotent_core::testing::Kit::idempotency
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
/// use std::sync::Arc;
/// use axum::{routing::post, Router};
/// use http::Method;
/// use idempotent_core::testing::Kit;
/// use idempotent_http::{testing::route, IdempotencyLayer};
///
/// let kit = Kit::new();
/// let orders = Arc::new(AtomicUsize::new(0));
/// let counted = orders.clone();
/// let app: Router = Router::new()
///     .route("/orders", post(move |body: String| async move {
///         let n = counted.fetch_add(1, SeqCst) + 1;
///         (http::StatusCode::CREATED, format!("order {n}: {body}"))
///     }))
///     .route_layer(IdempotencyLayer::shared_keys(kit.idempotency()));
/// let subject = route(app, Method::POST, "/orders").body(r#"{"sku":1}"#).other_body(r#"{"sku":2}"#);
/// kit.check(subject, move || orders.load(SeqCst)).await.assert_passed();
/// # }
/// ```
pub fn route<S>(service: S, method: Method, path: impl Into<String>) -> Route<S> {
    Route {
        service,
        method,
        path: path.into(),
        key: "kit-key".into(),
        body: Bytes::new(),
        other_body: None,
        headers: Vec::new(),
        replay_header: DEFAULT_REPLAY_HEADER.clone(),
        token_path: None,
        token: Arc::default(),
    }
}

impl<S> Route<S> {
    /// The request's body (empty by default).
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    /// Another body for the same key: the kit expects it refused (422).
    pub fn other_body(mut self, body: impl Into<Bytes>) -> Self {
        self.other_body = Some(body.into());
        self
    }

    /// A header every request carries (credentials, a content type, a client id).
    ///
    /// # Panics
    /// When `name` or `value` is not a valid header name or value.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        let name = HeaderName::try_from(name).expect("a header name");
        let value = HeaderValue::try_from(value).expect("a header value");
        self.headers.push((name, value));
        self
    }

    /// The key sent (default `kit-key`).
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = key.into();
        self
    }

    /// The header marking a replay, when the layer was given another one.
    pub fn replay_header(mut self, name: HeaderName) -> Self {
        self.replay_header = name;
        self
    }

    /// Token mode: the key is a one-time token from `POST token_path` (the layer's token
    /// endpoint, on the same service), got once with the request's headers. Tokens are signed,
    /// not stored, so the one token serves every scenario: each starts on an empty store.
    pub fn token_from(mut self, token_path: impl Into<String>) -> Self {
        self.token_path = Some(token_path.into());
        self
    }

    fn request(&self, ask: Ask, key: &str) -> Request<Body> {
        let body = match ask {
            Ask::Same => self.body.clone(),
            Ask::OtherPayload => self.other_body.clone().unwrap_or_else(|| self.body.clone()),
        };
        let mut request = Request::builder().method(self.method.clone()).uri(&self.path);
        for (name, value) in &self.headers {
            request = request.header(name, value);
        }
        if let Some(key) = key_value(key) {
            request = request.header(crate::IDEMPOTENCY_KEY.clone(), key);
        }
        request.body(Body::from(body)).unwrap_or_else(|_| Request::new(Body::empty()))
    }
}

impl<S, B> Route<S>
where
    S: Service<Request<Body>, Response = Response<B>> + Clone,
    S::Error: Debug,
    B: HttpBody,
    B::Error: Debug,
{
    /// The key: the one given, or in token mode the token got from the endpoint.
    async fn key_to_send(&self) -> Result<String, String> {
        let Some(path) = &self.token_path else { return Ok(self.key.clone()) };
        let got = self.token.get_or_try_init(|| async {
            let mut request = Request::builder().method(Method::POST).uri(path);
            for (name, value) in &self.headers {
                request = request.header(name, value);
            }
            let request = request.body(Body::empty()).map_err(|e| e.to_string())?;
            let response = send(self.service.clone(), request).await?;
            let status = response.status();
            let bytes = response.into_body().collect().await.map_err(|e| format!("{e:?}"))?.to_bytes();
            let issued: Result<IssuedToken, _> = serde_json::from_slice(&bytes);
            match issued {
                Ok(issued) if status.is_success() => Ok(issued.token),
                _ => Err(format!("POST {path} answered {status}: {}", String::from_utf8_lossy(&bytes))),
            }
        });
        got.await.cloned()
    }
}

/// Sends `request` to `service` once it is ready (a route's, or a gRPC method's).
pub(crate) async fn send<S, Q, B>(mut service: S, request: Request<Q>) -> Result<Response<B>, String>
where
    S: Service<Request<Q>, Response = Response<B>>,
    S::Error: Debug,
{
    std::future::poll_fn(|cx| service.poll_ready(cx)).await.map_err(|e| format!("the service is not ready: {e:?}"))?;
    service.call(request).await.map_err(|e| format!("the service failed: {e:?}"))
}

/// What a response says, as the kit tells answers apart.
async fn answer<B>(response: Response<B>, replay_header: &HeaderName) -> Answer
where
    B: HttpBody,
    B::Error: Debug,
{
    let (parts, body) = response.into_parts();
    let bytes = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => return Answer::Failed(format!("{} with a body that failed: {e:?}", parts.status)),
    };
    let text = String::from_utf8_lossy(&bytes);
    let problem = parts.headers.get(CONTENT_TYPE).is_some_and(|t| t.as_bytes() == PROBLEM_JSON.as_bytes());
    if problem {
        let slug = serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|p| p["type"].as_str().and_then(|t| t.rsplit_once('#')).map(|(_, slug)| slug.to_owned()))
            .unwrap_or_default();
        return match slug.as_str() {
            "in-flight" => Answer::InFlight,
            "key-reused" => Answer::KeyReused,
            "store-unavailable" => Answer::StoreUnavailable,
            _ => Answer::Failed(format!("{} {slug}", parts.status.as_u16())),
        };
    }
    if parts.status.is_server_error() {
        return Answer::Failed(format!("{} {text}", parts.status.as_u16()));
    }
    let replayed = parts.headers.get(replay_header).is_some_and(|v| v == "true");
    Answer::Value { shown: format!("{} {text}", parts.status.as_u16()), replayed: Some(replayed) }
}

impl<S, B> Subject for Route<S>
where
    S: Service<Request<Body>, Response = Response<B>> + Clone + 'static,
    S::Error: Debug,
    B: HttpBody,
    B::Error: Debug,
{
    fn call(&self, ask: Ask) -> Answering<'_> {
        Box::pin(async move {
            let key = match self.key_to_send().await {
                Ok(key) => key,
                Err(why) => return Answer::Failed(why),
            };
            match send(self.service.clone(), self.request(ask, &key)).await {
                Ok(response) => answer(response, &self.replay_header).await,
                Err(why) => Answer::Failed(why),
            }
        })
    }

    fn has_other_payload(&self) -> bool {
        self.other_body.is_some()
    }

    fn describe(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}
