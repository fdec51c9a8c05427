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
