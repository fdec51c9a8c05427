//! The gRPC layer on a real tonic server and client over loopback: a retry replays the message,
//! status and metadata exactly; a retry in flight is ABORTED with retry-after; another message
//! under the key is FAILED_PRECONDITION; a client whose deadline passed and retries is charged
//! once; statuses that are not stored run again; streaming calls are refused; keys are apart per
//! client. Messages are prost derives written by hand (no protoc at build time).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::uri::PathAndQuery;
use idempotency::grpc::GrpcIdempotencyLayer;
use idempotency::testing::TestStore;
use idempotency::{Idempotency, MemoryStore};
use tonic::body::Body;
use tonic::metadata::MetadataValue;
use tonic::{Code, Status};
use tonic_prost::ProstCodec;

#[derive(Clone, PartialEq, prost::Message)]
struct CreateOrder {
    #[prost(string, tag = "1")]
    item: String,
    #[prost(uint32, tag = "2")]
    quantity: u32,
    /// How long the handler takes.
    #[prost(uint32, tag = "3")]
    delay_ms: u32,
    /// A status code the handler answers with instead of an order (0: an order).
    #[prost(int32, tag = "4")]
    fail_with: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Order {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(string, tag = "2")]
    item: String,
}

const CREATE: &str = "/orders.Orders/Create";
const WATCH: &str = "/orders.Orders/Watch";

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The service, as tonic's generated code would write it: `Create` (unary) and `Watch` (a
/// stream of orders, here one call of the same handler).
#[derive(Clone, Default)]
struct Orders {
    made: Arc<AtomicUsize>,
}

struct CreateCall(Orders);

impl tonic::server::UnaryService<CreateOrder> for CreateCall {
    type Response = Order;
    type Future = BoxFuture<Result<tonic::Response<Order>, Status>>;

    fn call(&mut self, request: tonic::Request<CreateOrder>) -> Self::Future {
        let made = self.0.made.clone();
        Box::pin(async move {
            let order = request.into_inner();
            let delay = Duration::from_millis(order.delay_ms.into());
            if order.fail_with != 0 {
                tokio::time::sleep(delay).await;
                let mut status = Status::new(Code::from_i32(order.fail_with), format!("no {}", order.item));
                status.metadata_mut().insert("x-reason", MetadataValue::from_static("out-of-stock"));
                return Err(status);
            }
            // The order is made (the card charged) first; the answer takes `delay`.
            let id = made.fetch_add(1, SeqCst) as u64 + 1;
            tokio::time::sleep(delay).await;
            let mut response = tonic::Response::new(Order { id, item: order.item });
            response.metadata_mut().insert("x-order-id", MetadataValue::from(id));
            Ok(response)
        })
    }
}

impl tower_service::Service<http::Request<Body>> for Orders {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let orders = self.clone();
        Box::pin(async move {
            match req.uri().path() {
                CREATE | WATCH => {
                    Ok(tonic::server::Grpc::new(ProstCodec::default()).unary(CreateCall(orders), req).await)
                }
                _ => Ok(Status::unimplemented("no such method").into_http()),
            }
        })
    }
}

impl tonic::server::NamedService for Orders {
    const NAME: &'static str = "orders.Orders";
}

struct Server {
    addr: SocketAddr,
    orders: Orders,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(layer: GrpcIdempotencyLayer) -> Server {
    let orders = Orders::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let router = tonic::transport::Server::builder().layer(layer).add_service(orders.clone());
    let task = tokio::spawn(async move { router.serve_with_incoming(incoming).await.unwrap() });
    Server { addr, orders, task }
}

struct Client(tonic::client::Grpc<tonic::transport::Channel>);

/// What a call got: the order or the status, and the response metadata (initial and trailing).
type Got = Result<(Order, tonic::metadata::MetadataMap), Status>;

impl Client {
    async fn connect(addr: SocketAddr) -> Client {
        let channel =
            tonic::transport::Channel::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
        Client(tonic::client::Grpc::new(channel))
    }

    async fn call(&mut self, path: &'static str, key: Option<&str>, order: CreateOrder, client: &str) -> Got {
        self.call_within(path, key, order, client, None).await
    }

    async fn call_within(
        &mut self,
        path: &'static str,
        key: Option<&str>,
        order: CreateOrder,
        client: &str,
        deadline: Option<Duration>,
    ) -> Got {
        let mut request = tonic::Request::new(order);
        if let Some(key) = key {
            request.metadata_mut().insert("idempotency-key", key.parse().unwrap());
        }
        request.metadata_mut().insert("x-client", client.parse().unwrap());
        if let Some(deadline) = deadline {
            request.set_timeout(deadline);
        }
        self.0.ready().await.unwrap();
        let response = self.0.unary(request, PathAndQuery::from_static(path), ProstCodec::default()).await?;
        let (metadata, order, _) = response.into_parts();
        Ok((order, metadata))
    }
}

fn tea(delay_ms: u32) -> CreateOrder {
    CreateOrder { item: "tea".into(), quantity: 1, delay_ms, fail_with: 0 }
}

fn by_client(req: &http::request::Parts) -> Option<String> {
    req.headers.get("x-client").and_then(|v| v.to_str().ok()).map(str::to_owned)
}

fn layer() -> GrpcIdempotencyLayer {
    GrpcIdempotencyLayer::per_client(Idempotency::new(MemoryStore::new()), by_client).streaming_methods([WATCH])
}

#[tokio::test]
async fn a_retry_replays_the_message_status_and_metadata() {
    let s = serve(layer()).await;
    let mut c = Client::connect(s.addr).await;
    let (first, head) = c.call(CREATE, Some("k1"), tea(0), "c1").await.unwrap();
    assert_eq!(first, Order { id: 1, item: "tea".into() });
    assert!(head.get("idempotent-replayed").is_none());
    let (again, replayed) = c.call(CREATE, Some("k1"), tea(0), "c1").await.unwrap();
    assert_eq!(again, first, "the replay is the first message");
    assert_eq!(replayed.get("x-order-id").unwrap(), "1", "its metadata too");
    assert_eq!(replayed.get("idempotent-replayed").unwrap(), "true");
    assert_eq!(s.orders.made.load(SeqCst), 1);

    // A stored failure (NOT_FOUND is what a retry would get again) replays as the same status.
    let missing = CreateOrder { fail_with: Code::NotFound as i32, ..tea(0) };
    let first = c.call(CREATE, Some("k2"), missing.clone(), "c1").await.unwrap_err();
    let again = c.call(CREATE, Some("k2"), missing, "c1").await.unwrap_err();
    assert_eq!((again.code(), again.message()), (Code::NotFound, "no tea"));
    assert_eq!((first.code(), first.message()), (again.code(), again.message()));
    assert_eq!(again.metadata().get("x-reason").unwrap(), "out-of-stock");
    assert_eq!(again.metadata().get("idempotent-replayed").unwrap(), "true");

    // Without a key, nothing is guarded.
    c.call(CREATE, None, tea(0), "c1").await.unwrap();
    c.call(CREATE, None, tea(0), "c1").await.unwrap();
    assert_eq!(s.orders.made.load(SeqCst), 3);
}

#[tokio::test]
async fn a_retry_in_flight_is_aborted_with_retry_after_and_another_message_is_refused() {
    let s = serve(layer()).await;
    let mut c = Client::connect(s.addr).await;
    let mut other = Client::connect(s.addr).await;
    let first = tokio::spawn(async move { c.call(CREATE, Some("k"), tea(500), "c1").await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let busy = other.call(CREATE, Some("k"), tea(500), "c1").await.unwrap_err();
    assert_eq!(busy.code(), Code::Aborted, "{busy:?}");
    assert_eq!(busy.metadata().get("retry-after").unwrap(), "1");
    assert!(busy.message().contains("in progress"), "{}", busy.message());
    first.await.unwrap().unwrap();
    let reused = other.call(CREATE, Some("k"), CreateOrder { quantity: 2, ..tea(0) }, "c1").await.unwrap_err();
    assert_eq!(reused.code(), Code::FailedPrecondition, "{reused:?}");
    assert_eq!(s.orders.made.load(SeqCst), 1);
}

/// A client whose deadline passes after the order is made and before its answer, and that
/// retries with its key:
/// the first call runs to its end (the layer runs it in a task of its own, which tonic's
/// deadline does not cancel), the retry while it runs is ABORTED, and the one after gets the
/// order. One order, where a server without the layer makes two.
#[tokio::test]
async fn a_client_that_times_out_and_retries_is_charged_once() {
    for guarded in [true, false] {
        let layer = if guarded { layer() } else { layer().methods(["/none/None"]) };
        let s = serve(layer).await;
        let mut c = Client::connect(s.addr).await;
        let timed_out = c.call_within(CREATE, Some("k"), tea(400), "c1", Some(Duration::from_millis(100))).await;
        let code = timed_out.unwrap_err().code();
        assert!(matches!(code, Code::DeadlineExceeded | Code::Cancelled), "the deadline passed: {code:?}");
        let mut got = None;
        for _ in 0..100 {
            match c.call(CREATE, Some("k"), tea(400), "c1").await {
                Ok((order, _)) => {
                    got = Some(order);
                    break;
                }
                Err(status) if status.code() == Code::Aborted => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(other) => panic!("{other:?}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let made = s.orders.made.load(SeqCst);
        if guarded {
            assert_eq!(got.unwrap().id, 1, "the retry got the first call's order");
            assert_eq!(made, 1, "charged once");
        } else {
            assert_eq!(made, 2, "without the layer the retry charges again");
        }
    }
}

#[tokio::test]
async fn statuses_that_are_not_stored_run_again() {
    let s = serve(layer()).await;
    let mut c = Client::connect(s.addr).await;
    let busy = CreateOrder { fail_with: Code::Unavailable as i32, ..tea(0) };
    for _ in 0..2 {
        let e = c.call(CREATE, Some("k"), busy.clone(), "c1").await.unwrap_err();
        assert_eq!(e.code(), Code::Unavailable);
        assert!(e.metadata().get("idempotent-replayed").is_none());
    }
    // The key was released: the same key now runs and is stored.
    let (order, _) = c.call(CREATE, Some("k"), tea(0), "c1").await.unwrap();
    let (again, _) = c.call(CREATE, Some("k"), tea(0), "c1").await.unwrap();
    assert_eq!((order.id, again.id), (1, 1));
}

#[tokio::test]
async fn streaming_calls_and_bad_keys_are_refused_before_they_run() {
    let s = serve(layer().require_key()).await;
    let mut c = Client::connect(s.addr).await;
    let e = c.call(WATCH, Some("k"), tea(0), "c1").await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("streaming"), "{}", e.message());
    // A client-streaming call: two messages under one key.
    let two = tokio_stream::iter(vec![tea(0), tea(0)]);
    let mut request = tonic::Request::new(two);
    request.metadata_mut().insert("idempotency-key", "k2".parse().unwrap());
    request.metadata_mut().insert("x-client", "c1".parse().unwrap());
    c.0.ready().await.unwrap();
    let e = c
        .0
        .client_streaming::<_, CreateOrder, Order, _>(request, PathAndQuery::from_static(CREATE), ProstCodec::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("2 messages"), "{}", e.message());
    let long = "k".repeat(256);
    let e = c.call(CREATE, Some(&long), tea(0), "c1").await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = c.call(CREATE, None, tea(0), "c1").await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "require_key");
    assert_eq!(s.orders.made.load(SeqCst), 0);
}

#[tokio::test]
async fn keys_are_apart_per_client_and_an_unknown_client_is_refused() {
    let s = serve(layer()).await;
    let mut c = Client::connect(s.addr).await;
    let (a, _) = c.call(CREATE, Some("k"), tea(0), "alice").await.unwrap();
    let (b, _) = c.call(CREATE, Some("k"), tea(0), "bob").await.unwrap();
    assert_ne!(a.id, b.id, "two clients' keys never meet");
    let mut request = tonic::Request::new(tea(0));
    request.metadata_mut().insert("idempotency-key", "k".parse().unwrap());
    c.0.ready().await.unwrap();
    let e =
        c.0.unary::<_, Order, _>(request, PathAndQuery::from_static(CREATE), ProstCodec::default()).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
}

#[tokio::test]
async fn a_store_that_is_away_answers_unavailable_and_runs_nothing() {
    let store = Arc::new(TestStore::new());
    let idem = Idempotency::builder_shared(store.clone()).build();
    let s = serve(GrpcIdempotencyLayer::shared_keys(idem)).await;
    let mut c = Client::connect(s.addr).await;
    store.go_away();
    let e = c.call(CREATE, Some("k"), tea(0), "c1").await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable);
    assert!(e.message().contains("nothing ran"), "{}", e.message());
    assert_eq!(s.orders.made.load(SeqCst), 0);
    store.come_back();
    c.call(CREATE, Some("k"), tea(0), "c1").await.unwrap();
    assert_eq!(s.orders.made.load(SeqCst), 1);
}
