//! `#[idempotent]` on axum handlers (feature `axum`): extractor patterns named in the key and the
//! fingerprint, `web::Json` stored and replayed, the library's errors answering as problems (409
//! with `Retry-After` while in flight, 422 for a reused key), through a real `Router`.
#![cfg(feature = "axum")]

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use axum::Router;
use http_body_util::BodyExt;
use idempotency::web::Json;
use idempotency::{idempotent, Error, Idempotency, MemoryStore};
use serde::{Deserialize, Serialize};
use tower::ServiceExt;

#[derive(Clone)]
struct App {
    idem: Idempotency,
    charges: Arc<AtomicUsize>,
}

#[derive(Serialize, Deserialize)]
struct NewOrder {
    id: u64,
    sku: String,
    qty: u32,
    slow: bool,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Order {
    id: u64,
    sku: String,
    qty: u32,
    charge: usize,
}

/// The handler as axum users write it: extractor patterns, the body's fields in the key and the
/// fingerprint, `Json` in and out, the library's `Error` as the error type.
#[idempotent(key = "order:{req.id}", fingerprint = (req.sku, req.qty), ttl = "10s", store = app.idem.clone())]
async fn create_order(State(app): State<App>, Json(req): Json<NewOrder>) -> Result<Json<Order>, Error> {
    if req.slow {
        tokio::time::sleep(Duration::from_millis(800)).await;
    }
    let charge = app.charges.fetch_add(1, SeqCst) + 1;
    Ok(Json(Order { id: req.id, sku: req.sku, qty: req.qty, charge }))
}

fn app() -> (Router, Arc<AtomicUsize>) {
    let charges = Arc::new(AtomicUsize::new(0));
    let state = App { idem: Idempotency::new(MemoryStore::new()), charges: charges.clone() };
    (Router::new().route("/orders", post(create_order)).with_state(state), charges)
}

async fn post_order(app: &Router, body: &str) -> (StatusCode, Option<String>, serde_json::Value) {
    let request = Request::post("/orders").header("content-type", "application/json").body(Body::from(body.to_owned()));
    let response = app.clone().oneshot(request.unwrap()).await.unwrap();
    let status = response.status();
    let retry = response.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, retry, serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_axum_handler_runs_once_and_answers_errors_as_problems() {
    let (app, charges) = app();
    let order = r#"{"id": 7, "sku": "tea", "qty": 2, "slow": false}"#;
    let (status, _, first) = post_order(&app, order).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(first["charge"], 1);
    let (status, _, again) = post_order(&app, order).await;
    assert_eq!((status, &again), (StatusCode::OK, &first), "the duplicate was not replayed");
    assert_eq!(charges.load(SeqCst), 1);

    // The same id with another sku: the key reused for another payload, a 422 problem.
    let (status, _, problem) = post_order(&app, r#"{"id": 7, "sku": "coffee", "qty": 2, "slow": false}"#).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(problem["type"].as_str().unwrap().ends_with("#key-reused"), "{problem}");

    // In flight: a 409 whose Retry-After comes from the holder's lease (10 s).
    let slow = r#"{"id": 8, "sku": "tea", "qty": 1, "slow": true}"#;
    let first = tokio::spawn({
        let app = app.clone();
        async move { post_order(&app, slow).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, retry, problem) = post_order(&app, slow).await;
    assert_eq!(status, StatusCode::CONFLICT, "{problem}");
    assert!(problem["type"].as_str().unwrap().ends_with("#in-flight"), "{problem}");
    let retry: u64 = retry.expect("Retry-After").parse().unwrap();
    assert!((1..=10).contains(&retry), "Retry-After {retry}");
    assert_eq!(first.await.unwrap().0, StatusCode::OK);
    assert_eq!(charges.load(SeqCst), 2);
}

static CHARGED: AtomicUsize = AtomicUsize::new(0);
static IDEM: std::sync::OnceLock<Idempotency> = std::sync::OnceLock::new();

#[derive(Serialize, Deserialize)]
struct Payment {
    id: u64,
}

/// An axum handler that charges, with `on_cancel = finish`: a client that goes away does not
/// cancel it.
#[idempotent(key = "pay:{req.id}", ttl = "10s", on_cancel = finish, store = IDEM.get().unwrap())]
async fn charge(Json(req): Json<Payment>) -> Result<Json<usize>, Error> {
    let _ = req.id;
    let run = CHARGED.fetch_add(1, SeqCst) + 1;
    tokio::time::sleep(Duration::from_millis(400)).await;
    Ok(Json(run))
}

/// A real server on loopback; the client sends a payment, closes the connection after 100 ms (the
/// handler takes 400), then retries with the same id: 409 while the first runs, then its result.
/// One charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_handler_runs_to_its_end_with_finish() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    IDEM.get_or_init(|| Idempotency::new(MemoryStore::new()));
    let app = Router::new().route("/pay", post(charge));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let request = "POST /pay HTTP/1.1\r\nhost: shop.test\r\ncontent-type: application/json\r\ncontent-length: 8\r\n\
                   connection: close\r\n\r\n{\"id\":1}";
    let send = || async {
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        conn.read_to_string(&mut answer).await.unwrap();
        answer
    };
    let mut gives_up = tokio::net::TcpStream::connect(addr).await.unwrap();
    gives_up.write_all(request.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(gives_up);
    let during = send().await;
    assert!(during.starts_with("HTTP/1.1 409"), "{during}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = send().await;
    assert!(after.starts_with("HTTP/1.1 200") && after.ends_with("\r\n\r\n1"), "{after}");
    assert_eq!(CHARGED.load(SeqCst), 1, "the client was charged twice");
}

#[derive(Serialize, Deserialize)]
struct Booking {
    seat: String,
}

/// A key from the body's field: an empty seat is an empty template value.
#[idempotent(key = "seat:{req.seat}", ttl = "10s", store = app.idem.clone())]
async fn book(State(app): State<App>, Json(req): Json<Booking>) -> Result<Json<String>, Error> {
    Ok(Json(req.seat))
}

/// A handler that needs a lock someone else may hold.
async fn report(State(app): State<App>) -> Result<Json<u64>, Error> {
    let guard = app.idem.lock("nightly-report").acquire().await?;
    let fence = guard.fence();
    guard.release().await?;
    Ok(Json(fence))
}

/// Through a `Router`: a handler with a key from its arguments, and one that takes a lock, answer
/// problems that speak of what the call was. No `Idempotency-Key` header is involved, so none is
/// named: 422 for another payload, 400 for an empty template value, 409 `in-flight` for a call
/// in progress, 409 `lock-held` for a lock held elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handlers_problems_speak_of_the_call_not_the_header() {
    let idem = Idempotency::new(MemoryStore::new());
    let state = App { idem: idem.clone(), charges: Arc::new(AtomicUsize::new(0)) };
    let app = Router::new()
        .route("/orders", post(create_order))
        .route("/book", post(book))
        .route("/report", post(report))
        .with_state(state);
    let send = |path: &'static str, body: &'static str| {
        let app = app.clone();
        async move {
            let request = Request::post(path).header("content-type", "application/json").body(Body::from(body));
            let response = app.oneshot(request.unwrap()).await.unwrap();
            let status = response.status();
            let bytes = response.into_body().collect().await.unwrap().to_bytes();
            (status, serde_json::from_slice::<serde_json::Value>(&bytes).unwrap_or(serde_json::Value::Null))
        }
    };
    let header_words = |p: &serde_json::Value| {
        let words = format!("{} {}", p["title"], p["detail"]);
        words.contains("Idempotency-Key") || words.contains("request") || words.contains("method, path")
    };

    assert_eq!(send("/orders", r#"{"id": 1, "sku": "tea", "qty": 1, "slow": false}"#).await.0, StatusCode::OK);
    let (status, reused) = send("/orders", r#"{"id": 1, "sku": "coffee", "qty": 1, "slow": false}"#).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(reused["title"], "Idempotency key reused with a different payload");
    assert!(!header_words(&reused), "{reused}");

    let (status, empty) = send("/book", r#"{"seat": ""}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{empty}");
    assert!(empty["type"].as_str().unwrap().ends_with("#malformed-key"), "{empty}");
    assert_eq!(empty["title"], "The call's idempotency key is not valid");
    assert!(empty["detail"].as_str().unwrap().contains("built from the call's arguments"), "{empty}");
    assert!(!header_words(&empty), "{empty}");

    let slow = tokio::spawn(send("/orders", r#"{"id": 2, "sku": "tea", "qty": 1, "slow": true}"#));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, in_flight) = send("/orders", r#"{"id": 2, "sku": "tea", "qty": 1, "slow": true}"#).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(in_flight["title"], "A call with this idempotency key is in progress");
    assert!(!header_words(&in_flight), "{in_flight}");
    assert_eq!(slow.await.unwrap().0, StatusCode::OK);

    let held = idem.lock("nightly-report").acquire().await.unwrap();
    let (status, locked) = send("/report", "{}").await;
    assert_eq!(status, StatusCode::CONFLICT, "{locked}");
    assert!(locked["type"].as_str().unwrap().ends_with("#lock-held"), "{locked}");
    assert_eq!(locked["title"], "The lock is held by another holder");
    assert!(!header_words(&locked), "{locked}");
    held.release().await.unwrap();
    assert_eq!(send("/report", "{}").await.0, StatusCode::OK);
}
