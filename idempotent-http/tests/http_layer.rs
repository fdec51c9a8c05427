//! The layer over real HTTP: a server on 127.0.0.1:0 and a real client, every status path, on
//! `MemoryStore` and on `RedisStore` against a `redis-server` each test starts for itself.

#[path = "../../tests/support/mod.rs"]
#[macro_use]
mod support;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use idempotent_http::{client, IdempotencyLayer, Ran};
use serde_json::Value;
use support::{Backend, Fixture};

both_stores!(
    missing_key_is_400,
    malformed_or_overlong_key_is_400,
    in_flight_duplicate_is_409,
    reused_key_with_another_request_is_422,
    replay_is_identical_and_marked,
    server_error_is_not_stored_and_the_retry_runs,
    oversized_response_is_not_replayable,
    hundred_concurrent_identical_requests_run_once,
    hundred_concurrent_waiting_requests_get_the_replay,
    two_clients_with_one_key_do_not_collide,
    unidentified_client_is_403,
    token_is_consumed_once_and_usable_after_a_failure,
    unguarded_requests_pass_through,
    clients_with_one_key_and_one_body_are_apart_by_their_credentials,
    rejections_before_the_handler_are_not_stored,
    lenient_header_takes_a_bare_uuid,
    token_guard_answers_instead_of_issuing,
    json_bodies_reserialized_for_a_retry_replay_when_asked,
    stored_responses_and_their_replays_tell_until_when_they_replay,
    a_server_that_died_mid_request_holds_its_key_under_hold,
    a_server_that_died_mid_request_frees_its_key_by_default,
);

/// The largest serialized result the runtime stores for replay in these tests.
const MAX_RESULT_BYTES: usize = 2048;

#[derive(Clone, Default)]
struct Counters {
    orders: Arc<AtomicUsize>,
    charges: Arc<AtomicUsize>,
    typed: Arc<AtomicUsize>,
    flaky: Arc<AtomicUsize>,
    big: Arc<AtomicUsize>,
    tokens: Arc<AtomicUsize>,
    open: Arc<AtomicUsize>,
}

/// `POST /orders` (and the other counted handlers): sleeps `x-delay-ms`, then answers 201 with
/// the run number and the request body, a `Location`, and a header the layer does not store.
async fn create(counter: &AtomicUsize, headers: &HeaderMap, body: Bytes) -> Response {
    let run = counter.fetch_add(1, SeqCst) + 1;
    let delay = headers.get("x-delay-ms").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()).unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(delay)).await;
    let echo = String::from_utf8_lossy(&body).into_owned();
    let json = serde_json::json!({ "run": run, "echo": echo });
    (
        StatusCode::CREATED,
        [("location", format!("/orders/{run}")), ("x-not-stored", format!("run-{run}"))],
        axum::Json(json),
    )
        .into_response()
}

struct TestServer {
    base: String,
    counters: Counters,
    http: reqwest::Client,
    task: tokio::task::JoinHandle<()>,
    _fixture: Fixture,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A client sending `x-client: name` with every request.
fn client_as(name: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("x-client", name.parse().unwrap());
    reqwest::Client::builder().default_headers(headers).pool_max_idle_per_host(128).build().unwrap()
}

async fn server(backend: Backend) -> TestServer {
    let fixture = Fixture::new(backend, 1).await;
    let idem = fixture.idem_with(0, |b| b.max_result_bytes(MAX_RESULT_BYTES));
    let layer = IdempotencyLayer::per_client(idem, |req| {
        req.headers.get("x-client").and_then(|v| v.to_str().ok()).map(str::to_owned)
    });
    let counters = Counters::default();
    let app = Router::new()
        .route(
            "/orders",
            post(|State(c): State<Counters>, h: HeaderMap, b: Bytes| async move { create(&c.orders, &h, b).await })
                .get(|| async { "orders" })
                .route_layer(layer.clone()),
        )
        .route(
            "/wait",
            post(|State(c): State<Counters>, h: HeaderMap, b: Bytes| async move { create(&c.orders, &h, b).await })
                .route_layer(layer.clone().wait_in_flight(Duration::from_secs(20))),
        )
        .route(
            "/flaky",
            post(|State(c): State<Counters>| async move {
                if c.flaky.fetch_add(1, SeqCst) == 0 {
                    (StatusCode::SERVICE_UNAVAILABLE, "try again").into_response()
                } else {
                    (StatusCode::CREATED, "done").into_response()
                }
            })
            .route_layer(layer.clone()),
        )
        .route(
            "/big",
            post(|State(c): State<Counters>| async move {
                c.big.fetch_add(1, SeqCst);
                "x".repeat(4 * MAX_RESULT_BYTES)
            })
            .route_layer(layer.clone()),
        )
        .route(
            "/token-orders",
            post(|State(c): State<Counters>, h: HeaderMap, b: Bytes| async move {
                if h.contains_key("x-fail") {
                    c.tokens.fetch_add(1, SeqCst);
                    return (StatusCode::INTERNAL_SERVER_ERROR, "card network down").into_response();
                }
                create(&c.tokens, &h, b).await
            })
            .route_layer(layer.clone().require_token()),
        )
        .route(
            "/open",
            post(|State(c): State<Counters>, h: HeaderMap, b: Bytes| async move { create(&c.open, &h, b).await })
                .route_layer(layer.clone().key_optional()),
        )
        .route(
            "/charges",
            post(|State(c): State<Counters>, h: HeaderMap, b: Bytes| async move { create(&c.charges, &h, b).await })
                .route_layer(IdempotencyLayer::per_client(layer.idempotency().clone(), client::authorization())),
        )
        .route(
            "/typed",
            post(|State(c): State<Counters>, axum::Json(order): axum::Json<TypedOrder>| async move {
                let run = c.typed.fetch_add(1, SeqCst) + 1;
                if order.qty == 0 {
                    // The handler's own refusal, after work that must not run twice: stored.
                    let mut declined =
                        (StatusCode::UNPROCESSABLE_ENTITY, format!("declined, run {run}")).into_response();
                    declined.extensions_mut().insert(Ran);
                    return declined;
                }
                (StatusCode::CREATED, format!("{} x{}, run {run}", order.sku, order.qty)).into_response()
            })
            .route_layer(layer.clone()),
        )
        .route(
            "/lenient",
            post(|State(c): State<Counters>, h: HeaderMap, b: Bytes| async move { create(&c.orders, &h, b).await })
                .route_layer(layer.clone().lenient_header()),
        )
        .route(
            "/json",
            post(|State(c): State<Counters>, h: HeaderMap, b: Bytes| async move { create(&c.orders, &h, b).await })
                .route_layer(layer.clone().json_fingerprint()),
        )
        .route(
            "/expiring",
            post(|State(c): State<Counters>, h: HeaderMap, b: Bytes| async move {
                if h.contains_key("x-fail") {
                    return (StatusCode::SERVICE_UNAVAILABLE, "try again").into_response();
                }
                create(&c.orders, &h, b).await
            })
            .route_layer(layer.clone().keep(Duration::from_secs(3600)).expiry_header()),
        )
        .route(
            "/expiring-token",
            post(|State(c): State<Counters>, h: HeaderMap, b: Bytes| async move { create(&c.tokens, &h, b).await })
                .route_layer(layer.clone().require_token().expiry_header()),
        )
        .merge(layer.token_router())
        .merge(
            layer
                .clone()
                .token_path("/guarded/token")
                .token_guard(|req| match req.headers.get("x-session") {
                    Some(_) => None,
                    None => Some((StatusCode::UNAUTHORIZED, "log in first").into_response()),
                })
                .token_router(),
        )
        .with_state(counters.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    TestServer { base, counters, http: client_as("alice"), task, _fixture: fixture }
}

impl TestServer {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn post(&self, path: &str, key: Option<&str>, body: &str) -> reqwest::RequestBuilder {
        let mut req = self.http.post(self.url(path)).body(body.to_owned());
        if let Some(key) = key {
            req = req.header("idempotency-key", format!("\"{key}\""));
        }
        req
    }
}

/// Checks a problem+json response of `status` and type `#slug`, and returns its body.
async fn problem(response: reqwest::Response, status: u16, slug: &str) -> Value {
    assert_eq!(response.status().as_u16(), status, "expected a {status} {slug} problem");
    assert_eq!(response.headers()["content-type"], "application/problem+json");
    assert!(response.headers().get("idempotent-replayed").is_none());
    let body: Value = response.json().await.expect("a JSON problem");
    let type_uri = body["type"].as_str().expect("type");
    assert!(type_uri.ends_with(&format!("#{slug}")), "type {type_uri} is not #{slug}");
    assert_eq!(body["status"], status);
    assert!(!body["title"].as_str().expect("title").is_empty());
    assert!(!body["detail"].as_str().expect("detail").is_empty());
    body
}

fn replayed(response: &reqwest::Response) -> bool {
    response.headers().get("idempotent-replayed").map(|v| v == "true").unwrap_or(false)
}

async fn missing_key_is_400(backend: Backend) {
    let s = server(backend).await;
    let r = s.post("/orders", None, "{}").send().await.unwrap();
    let body = problem(r, 400, "missing-key").await;
    assert!(body["detail"].as_str().unwrap().contains("/orders"), "{body}");
    let r = s.post("/token-orders", None, "{}").send().await.unwrap();
    problem(r, 400, "missing-key").await;
    assert_eq!(s.counters.orders.load(SeqCst), 0);
    assert_eq!(s.counters.tokens.load(SeqCst), 0);
}

async fn malformed_or_overlong_key_is_400(backend: Backend) {
    let s = server(backend).await;
    let long = format!("\"{}\"", "k".repeat(256));
    for raw in ["unquoted", "\"unterminated", r#""bad\escape""#, r#""""#, r#""a" trailing"#, r#""a","b""#, &long] {
        let r = s.http.post(s.url("/orders")).header("idempotency-key", raw).body("{}").send().await.unwrap();
        problem(r, 400, "malformed-key").await;
    }
    let r = s
        .http
        .post(s.url("/orders"))
        .header("idempotency-key", "\"a\"")
        .header("idempotency-key", "\"b\"")
        .body("{}")
        .send()
        .await
        .unwrap();
    problem(r, 400, "malformed-key").await;
    assert_eq!(s.counters.orders.load(SeqCst), 0);
    // 255 bytes is still accepted.
    let ok = "k".repeat(255);
    let r = s.post("/orders", Some(&ok), "{}").send().await.unwrap();
    assert_eq!(r.status(), 201);
}

async fn in_flight_duplicate_is_409(backend: Backend) {
    let s = server(backend).await;
    let first = s.post("/orders", Some("k1"), r#"{"sku":1}"#).header("x-delay-ms", "1500").send();
    let first = tokio::spawn(first);
    support::eventually(Duration::from_secs(5), "the first request reaches the handler", || async {
        (s.counters.orders.load(SeqCst) == 1).then_some(())
    })
    .await;
    let r = s.post("/orders", Some("k1"), r#"{"sku":1}"#).send().await.unwrap();
    assert_eq!(r.headers()["retry-after"], "1");
    problem(r, 409, "in-flight").await;
    let r = first.await.unwrap().unwrap();
    assert_eq!(r.status(), 201);
    assert!(!replayed(&r));
    // Once finished, the same request gets the replay.
    let r = s.post("/orders", Some("k1"), r#"{"sku":1}"#).send().await.unwrap();
    assert_eq!(r.status(), 201);
    assert!(replayed(&r));
    assert_eq!(s.counters.orders.load(SeqCst), 1);
}

async fn reused_key_with_another_request_is_422(backend: Backend) {
    let s = server(backend).await;
    // While the first is in flight...
    let first = tokio::spawn(s.post("/orders", Some("k2"), r#"{"sku":1}"#).header("x-delay-ms", "1500").send());
    support::eventually(Duration::from_secs(5), "the first request reaches the handler", || async {
        (s.counters.orders.load(SeqCst) == 1).then_some(())
    })
    .await;
    let r = s.post("/orders", Some("k2"), r#"{"sku":2}"#).send().await.unwrap();
    problem(r, 422, "key-reused").await;
    assert_eq!(first.await.unwrap().unwrap().status(), 201);
    // ...and after it completed: another body, another path (query), another method.
    let r = s.post("/orders", Some("k2"), r#"{"sku":2}"#).send().await.unwrap();
    problem(r, 422, "key-reused").await;
    let r = s.post("/orders?express=1", Some("k2"), r#"{"sku":1}"#).send().await.unwrap();
    problem(r, 422, "key-reused").await;
    let r = s.post("/wait", Some("k2"), r#"{"sku":1}"#).send().await.unwrap();
    problem(r, 422, "key-reused").await;
    assert_eq!(s.counters.orders.load(SeqCst), 1);
}

async fn replay_is_identical_and_marked(backend: Backend) {
    let s = server(backend).await;
    let body = r#"{"sku":"tea","qty":2}"#;
    let first = s.post("/orders", Some("k3"), body).send().await.unwrap();
    assert_eq!(first.status(), 201);
    assert!(!replayed(&first), "the first response is not a replay");
    let first_headers = first.headers().clone();
    assert_eq!(first_headers["x-not-stored"], "run-1", "the first response keeps all its headers");
    let first_body = first.bytes().await.unwrap();
    for _ in 0..3 {
        let again = s.post("/orders", Some("k3"), body).send().await.unwrap();
        assert_eq!(again.status(), 201);
        assert!(replayed(&again), "replays carry Idempotent-Replayed: true");
        for name in ["content-type", "location"] {
            assert_eq!(again.headers()[name], first_headers[name], "{name} is replayed");
        }
        assert!(again.headers().get("x-not-stored").is_none(), "only the configured headers are stored");
        assert_eq!(again.bytes().await.unwrap(), first_body);
    }
    assert_eq!(s.counters.orders.load(SeqCst), 1);
    let v: Value = serde_json::from_slice(&first_body).unwrap();
    assert_eq!(v["run"], 1);
    assert_eq!(v["echo"], body);
}

async fn server_error_is_not_stored_and_the_retry_runs(backend: Backend) {
    let s = server(backend).await;
    let r = s.post("/flaky", Some("k4"), "pay").send().await.unwrap();
    assert_eq!(r.status(), 503, "the 5xx is passed through");
    assert!(!replayed(&r));
    assert_eq!(r.text().await.unwrap(), "try again");
    let r = s.post("/flaky", Some("k4"), "pay").send().await.unwrap();
    assert_eq!(r.status(), 201, "the retry ran the handler again");
    assert!(!replayed(&r));
    assert_eq!(s.counters.flaky.load(SeqCst), 2);
    let r = s.post("/flaky", Some("k4"), "pay").send().await.unwrap();
    assert_eq!(r.status(), 201);
    assert!(replayed(&r), "the success is stored");
    assert_eq!(r.text().await.unwrap(), "done");
    assert_eq!(s.counters.flaky.load(SeqCst), 2);
}

async fn oversized_response_is_not_replayable(backend: Backend) {
    let s = server(backend).await;
    let r = s.post("/big", Some("k5"), "").send().await.unwrap();
    assert_eq!(r.status(), 200, "the first caller gets the response");
    assert_eq!(r.bytes().await.unwrap().len(), 4 * MAX_RESULT_BYTES);
    let r = s.post("/big", Some("k5"), "").send().await.unwrap();
    problem(r, 409, "not-replayable").await;
    assert_eq!(s.counters.big.load(SeqCst), 1, "completed: not run again");
}

async fn hundred_concurrent_identical_requests_run_once(backend: Backend) {
    let s = server(backend).await;
    let requests = (0..100).map(|_| s.post("/orders", Some("k6"), r#"{"sku":9}"#).header("x-delay-ms", "300").send());
    let responses = futures_join_all(requests).await;
    let (mut fresh, mut replays, mut conflicts) = (0, 0, 0);
    let mut first_body = None;
    for r in responses {
        let r = r.unwrap();
        match (r.status().as_u16(), replayed(&r)) {
            (201, false) => {
                fresh += 1;
                first_body = Some(r.bytes().await.unwrap());
            }
            (201, true) => {
                replays += 1;
                let v: Value = r.json().await.unwrap();
                assert_eq!(v["run"], 1);
            }
            (409, _) => {
                conflicts += 1;
                problem(r, 409, "in-flight").await;
            }
            (status, _) => panic!("unexpected status {status}"),
        }
    }
    assert_eq!(fresh, 1, "exactly one request ran ({replays} replays, {conflicts} conflicts)");
    assert_eq!(fresh + replays + conflicts, 100);
    assert_eq!(s.counters.orders.load(SeqCst), 1, "the handler ran once");
    let v: Value = serde_json::from_slice(&first_body.unwrap()).unwrap();
    assert_eq!(v["run"], 1);
}

async fn hundred_concurrent_waiting_requests_get_the_replay(backend: Backend) {
    let s = server(backend).await;
    let requests = (0..100).map(|_| s.post("/wait", Some("k7"), r#"{"sku":9}"#).header("x-delay-ms", "300").send());
    let responses = futures_join_all(requests).await;
    let mut fresh = 0;
    for r in responses {
        let r = r.unwrap();
        assert_eq!(r.status(), 201, "a waiting duplicate gets the first response");
        if !replayed(&r) {
            fresh += 1;
        }
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["run"], 1);
    }
    assert_eq!(fresh, 1);
    assert_eq!(s.counters.orders.load(SeqCst), 1, "the handler ran once");
}

async fn two_clients_with_one_key_do_not_collide(backend: Backend) {
    let s = server(backend).await;
    let bob = client_as("bob");
    let alice_first = s.post("/orders", Some("shared"), "alice's order").send().await.unwrap();
    assert_eq!(alice_first.status(), 201);
    // Bob, same key and a different body: not a key reuse, his own request.
    let bob_first =
        bob.post(s.url("/orders")).header("idempotency-key", "\"shared\"").body("bob's order").send().await.unwrap();
    assert_eq!(bob_first.status(), 201);
    assert!(!replayed(&bob_first));
    // Mallory, same key and alice's very body: not alice's replay.
    let mallory = client_as("mallory");
    let r = mallory
        .post(s.url("/orders"))
        .header("idempotency-key", "\"shared\"")
        .body("alice's order")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    assert!(!replayed(&r), "another client never reads alice's replay");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["run"], 3);
    assert_eq!(s.counters.orders.load(SeqCst), 3);
    // Each gets their own replay.
    let r = s.post("/orders", Some("shared"), "alice's order").send().await.unwrap();
    assert!(replayed(&r));
    assert_eq!(r.json::<Value>().await.unwrap()["echo"], "alice's order");
    let r =
        bob.post(s.url("/orders")).header("idempotency-key", "\"shared\"").body("bob's order").send().await.unwrap();
    assert!(replayed(&r));
    assert_eq!(r.json::<Value>().await.unwrap()["echo"], "bob's order");
    assert_eq!(s.counters.orders.load(SeqCst), 3);
}

async fn unidentified_client_is_403(backend: Backend) {
    let s = server(backend).await;
    let anonymous = reqwest::Client::new();
    let r = anonymous.post(s.url("/orders")).header("idempotency-key", "\"k8\"").body("{}").send().await.unwrap();
    problem(r, 403, "unidentified-client").await;
    let r = anonymous.post(s.url("/idempotent/token")).send().await.unwrap();
    problem(r, 403, "unidentified-client").await;
    assert_eq!(s.counters.orders.load(SeqCst), 0);
}

async fn issue_token(http: &reqwest::Client, s: &TestServer) -> String {
    let r = http.post(s.url("/idempotent/token")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["cache-control"], "no-store");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["expires_in"], 3600);
    v["token"].as_str().expect("a token").to_owned()
}

async fn token_is_consumed_once_and_usable_after_a_failure(backend: Backend) {
    let s = server(backend).await;
    let token = issue_token(&s.http, &s).await;
    assert_eq!(token.len(), 56);
    // A key the server did not issue is refused.
    let r = s.post("/token-orders", Some("made-up-token"), "order").send().await.unwrap();
    problem(r, 400, "invalid-token").await;
    // Another client cannot use alice's token.
    let r = client_as("bob")
        .post(s.url("/token-orders"))
        .header("idempotency-key", format!("\"{token}\""))
        .body("order")
        .send()
        .await
        .unwrap();
    problem(r, 400, "invalid-token").await;
    assert_eq!(s.counters.tokens.load(SeqCst), 0);
    // A failed attempt (5xx) gives the token back.
    let r = s.post("/token-orders", Some(&token), "order").header("x-fail", "1").send().await.unwrap();
    assert_eq!(r.status(), 500);
    assert_eq!(r.text().await.unwrap(), "card network down");
    let r = s.post("/token-orders", Some(&token), "order").send().await.unwrap();
    assert_eq!(r.status(), 201);
    assert!(!replayed(&r));
    assert_eq!(s.counters.tokens.load(SeqCst), 2);
    // Used: replayed, not run again; with another body: 422.
    let r = s.post("/token-orders", Some(&token), "order").send().await.unwrap();
    assert_eq!(r.status(), 201);
    assert!(replayed(&r));
    let r = s.post("/token-orders", Some(&token), "another order").send().await.unwrap();
    problem(r, 422, "key-reused").await;
    assert_eq!(s.counters.tokens.load(SeqCst), 2);
    // A fresh token is a fresh order; a client-made key is not a token.
    let second = issue_token(&s.http, &s).await;
    assert_ne!(second, token);
    let r = s.post("/token-orders", Some(&second), "order").send().await.unwrap();
    assert!(!replayed(&r));
    assert_eq!(s.counters.tokens.load(SeqCst), 3);
}

async fn unguarded_requests_pass_through(backend: Backend) {
    let s = server(backend).await;
    // GET is not guarded: no key needed, and a key is ignored.
    let r = s.http.get(s.url("/orders")).send().await.unwrap();
    assert_eq!(r.text().await.unwrap(), "orders");
    let r = s.http.get(s.url("/orders")).header("idempotency-key", "not a sf-string").send().await.unwrap();
    assert_eq!(r.status(), 200);
    // A route with an optional key runs keyless requests every time, keyed ones once.
    for _ in 0..2 {
        let r = s.post("/open", None, "x").send().await.unwrap();
        assert!(!replayed(&r));
    }
    assert_eq!(s.counters.open.load(SeqCst), 2);
    s.post("/open", Some("k9"), "x").send().await.unwrap();
    let r = s.post("/open", Some("k9"), "x").send().await.unwrap();
    assert!(replayed(&r));
    assert_eq!(s.counters.open.load(SeqCst), 3);
}

#[derive(serde::Deserialize)]
struct TypedOrder {
    sku: String,
    qty: u32,
}

/// The default the layer used to have mixed clients: bob, sending alice's key with alice's
/// very body, was replayed alice's response (a receipt with her card). Scoped by credentials,
/// he gets his own run; `shared_keys` would replay it, which is what that name says.
async fn clients_with_one_key_and_one_body_are_apart_by_their_credentials(backend: Backend) {
    let s = server(backend).await;
    let as_user = |token: &str| {
        s.http
            .post(s.url("/charges"))
            .header("authorization", format!("Bearer {token}"))
            .header("idempotency-key", "\"charge-1\"")
            .body("card 4242, 10 EUR")
    };
    let alice = as_user("alice-token").send().await.unwrap();
    assert_eq!(alice.status(), 201);
    let alice_body: Value = alice.json().await.unwrap();
    let bob = as_user("bob-token").send().await.unwrap();
    assert_eq!(bob.status(), 201);
    assert!(!replayed(&bob), "bob was replayed alice's response");
    let bob_body: Value = bob.json().await.unwrap();
    assert_ne!(bob_body["run"], alice_body["run"]);
    let again = as_user("alice-token").send().await.unwrap();
    assert!(replayed(&again));
    assert_eq!(again.json::<Value>().await.unwrap()["run"], alice_body["run"]);
    // No credentials: refused, not put in some shared space.
    let r = s.http.post(s.url("/charges")).header("idempotency-key", "\"charge-1\"").body("x").send().await.unwrap();
    problem(r, 403, "unidentified-client").await;
    assert_eq!(s.counters.charges.load(SeqCst), 2);
}

/// A body axum's extractor refuses (not JSON: 400; wrong content type: 415; wrong shape: 422)
/// is answered before the handler runs: not stored, so the client that fixes its body and
/// retries with the same key gets it run. The handler's own 422, marked `Ran`, is stored.
async fn rejections_before_the_handler_are_not_stored(backend: Backend) {
    let s = server(backend).await;
    let post = |key: &str, content_type: &str, body: &str| {
        s.http
            .post(s.url("/typed"))
            .header("idempotency-key", format!("\"{key}\""))
            .header("content-type", content_type)
            .body(body.to_owned())
    };
    for (key, content_type, body, status) in [
        ("fix-1", "application/json", "{not json", 400),
        ("fix-2", "text/plain", r#"{"sku":"tea","qty":1}"#, 415),
        ("fix-3", "application/json", r#"{"sku":"tea"}"#, 422),
    ] {
        let r = post(key, content_type, body).send().await.unwrap();
        assert_eq!(r.status(), status, "{key}");
        assert!(!replayed(&r));
        // The fixed request, same key: the handler runs (a different body is not a key reuse:
        // nothing was stored for the first one).
        let r = post(key, "application/json", r#"{"sku":"tea","qty":2}"#).send().await.unwrap();
        assert_eq!(r.status(), 201, "{key}: the corrected retry got the old rejection");
        assert!(!replayed(&r));
    }
    assert_eq!(s.counters.typed.load(SeqCst), 3);
    // The handler's own 422, marked as ran: stored and replayed.
    let r = post("declined", "application/json", r#"{"sku":"tea","qty":0}"#).send().await.unwrap();
    assert_eq!(r.status(), 422);
    let r = post("declined", "application/json", r#"{"sku":"tea","qty":0}"#).send().await.unwrap();
    assert_eq!(r.status(), 422);
    assert!(replayed(&r), "the handler's own refusal was not stored");
    assert_eq!(s.counters.typed.load(SeqCst), 4);
}

/// Strict by default (the draft's quoted form); `lenient_header` also takes a bare UUID.
async fn lenient_header_takes_a_bare_uuid(backend: Backend) {
    let s = server(backend).await;
    let uuid = "8e03978e-40d5-43e8-bc93-6894a57f9324";
    let r = s.http.post(s.url("/orders")).header("idempotency-key", uuid).body("{}").send().await.unwrap();
    problem(r, 400, "malformed-key").await;
    let first = s.http.post(s.url("/lenient")).header("idempotency-key", uuid).body("{}").send().await.unwrap();
    assert_eq!(first.status(), 201);
    // The bare and the quoted forms are one key.
    let quoted = s
        .http
        .post(s.url("/lenient"))
        .header("idempotency-key", format!("\"{uuid}\""))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert!(replayed(&quoted));
    let r = s.http.post(s.url("/lenient")).header("idempotency-key", "two words").body("{}").send().await.unwrap();
    problem(r, 400, "malformed-key").await;
}

/// With `json_fingerprint`, a JSON body sent again in another member order and layout is the same
/// request (a replay); other values, numbers written otherwise, and bodies that are not JSON by
/// their `Content-Type` are still compared as sent. Without it, the reordered body is a 422.
async fn json_bodies_reserialized_for_a_retry_replay_when_asked(backend: Backend) {
    let s = server(backend).await;
    let send = |path: &str, key: &str, content_type: &str, body: &str| {
        s.post(path, Some(key), body).header("content-type", content_type).send()
    };
    let (json, sent) = ("application/json", r#"{"amount": 1250, "to": {"iban": "DE02", "name": "caf\u00e9"}}"#);
    let retried = "{\"to\":{\"name\":\"café\",\"iban\":\"DE02\"},\n  \"amount\":1250}";
    let first = send("/json", "j1", json, sent).await.unwrap();
    assert_eq!(first.status(), 201);
    let again = send("/json", "j1", "application/json; charset=utf-8", retried).await.unwrap();
    assert!(replayed(&again), "the reordered body was not the same request: {}", again.status());
    assert_eq!(s.counters.orders.load(SeqCst), 1);
    // Another value, a number written otherwise, a member named twice: another request.
    for other in [
        r#"{"amount":1251,"to":{"iban":"DE02","name":"café"}}"#,
        r#"{"amount":1250.0,"to":{"iban":"DE02","name":"café"}}"#,
        r#"{"amount":1250,"amount":1250,"to":{"iban":"DE02","name":"café"}}"#,
    ] {
        problem(send("/json", "j1", json, other).await.unwrap(), 422, "key-reused").await;
    }
    // Not JSON by its type: the bytes are compared, whitespace and all.
    assert_eq!(send("/json", "t1", "text/plain", r#"{"a": 1}"#).await.unwrap().status(), 201);
    problem(send("/json", "t1", "text/plain", r#"{"a":1}"#).await.unwrap(), 422, "key-reused").await;
    // Off by default: a route without it compares bytes.
    assert_eq!(send("/orders", "j2", json, sent).await.unwrap().status(), 201);
    problem(send("/orders", "j2", json, retried).await.unwrap(), 422, "key-reused").await;
    assert_eq!(s.counters.orders.load(SeqCst), 3);
}

/// With `expiry_header`, the stored response and its replays say until when they replay: the
/// call's `keep` from the commit, or in token mode the token's expiry plus the skew allowed.
/// Responses not stored, and routes without it, say nothing.
async fn stored_responses_and_their_replays_tell_until_when_they_replay(backend: Backend) {
    let s = server(backend).await;
    let expiry =
        |r: &reqwest::Response| r.headers().get("idempotency-key-expires").map(|v| v.to_str().unwrap().to_owned());
    let from_now = |date: &str| {
        let at = httpdate::parse_http_date(date).unwrap();
        at.duration_since(std::time::SystemTime::now()).unwrap_or_default()
    };
    let sent = std::time::SystemTime::now();
    let first = s.post("/expiring", Some("x1"), "order").send().await.unwrap();
    assert_eq!(first.status(), 201);
    let told = expiry(&first).expect("the stored response tells its expiry");
    let left = from_now(&told);
    assert!(left <= Duration::from_secs(3600) && left >= Duration::from_secs(3590), "{told}: {left:?} left");
    assert!(httpdate::parse_http_date(&told).unwrap() >= sent + Duration::from_secs(3599));
    let again = s.post("/expiring", Some("x1"), "order").send().await.unwrap();
    assert!(replayed(&again));
    assert_eq!(expiry(&again).as_deref(), Some(told.as_str()), "a replay tells the moment the first did");
    // Not stored: nothing to tell.
    let failed = s.post("/expiring", Some("x2"), "order").header("x-fail", "1").send().await.unwrap();
    assert_eq!((failed.status().as_u16(), expiry(&failed)), (503, None));
    // Not asked for: not told.
    let plain = s.post("/orders", Some("x3"), "order").send().await.unwrap();
    assert_eq!((plain.status().as_u16(), expiry(&plain)), (201, None));
    // Token mode: kept while the token (an hour) and the skew allowed (five minutes) last.
    let token = issue_token(&s.http, &s).await;
    let used = s.post("/expiring-token", Some(&token), "order").send().await.unwrap();
    assert_eq!(used.status(), 201);
    let left = from_now(&expiry(&used).expect("a token's response tells its expiry"));
    assert!(left <= Duration::from_secs(3900) && left >= Duration::from_secs(3890), "{left:?} left");
}

/// The token endpoint behind a guard: without a session the guard's answer, with one a token.
async fn token_guard_answers_instead_of_issuing(backend: Backend) {
    let s = server(backend).await;
    let r = s.http.post(s.url("/guarded/token")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.text().await.unwrap(), "log in first");
    let r = s.http.post(s.url("/guarded/token")).header("x-session", "abc").send().await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["token"].as_str().unwrap().len(), 56);
}

/// Awaits all futures concurrently (each on its own task), in order.
/// Two servers of one service on one store, both with `policy`: the first takes a payout, starts
/// its handler and dies there (its process sends nothing more); once its lease has ended the
/// second is asked the same request. Returns the second's answer and how many times the handler
/// started.
/// What a retry found after the first server died mid-request: its answer, how many times the
/// handler started, the fixture and the second server's address.
struct Died {
    answer: reqwest::Response,
    runs: usize,
    fixture: Fixture,
    url: String,
}

/// The same payout request as `after_a_server_died` sends, to `url`.
async fn payout(url: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(url)
        .header("host", "pay.test")
        .header("idempotency-key", "\"payout-7\"")
        .body("70.00")
        .send()
        .await
        .unwrap()
}

async fn after_a_server_died(backend: Backend, policy: idempotent_core::OnCrash) -> Died {
    const LEASE: Duration = Duration::from_millis(400);
    let fixture = Fixture::new(backend, 2).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let serve = |idem: idempotency::Idempotency| {
        let runs = runs.clone();
        let app = Router::new().route(
            "/payouts",
            post(move || {
                let runs = runs.clone();
                async move {
                    if runs.fetch_add(1, SeqCst) == 0 {
                        std::future::pending::<()>().await;
                    }
                    (StatusCode::CREATED, "paid")
                }
            })
            .route_layer(IdempotencyLayer::shared_keys(idem).ttl(LEASE).on_crash(policy)),
        );
        async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let base = format!("http://{}/payouts", listener.local_addr().unwrap());
            tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
            base
        }
    };
    let (dies, dying) = support::dying::Dying::runtime(fixture.store(0));
    let (first, second) = (serve(dies).await, serve(fixture.idem(1)).await);
    let http = reqwest::Client::new();
    let pay = |url: &str| {
        // One service behind one name: the two servers see the same request.
        http.post(url).header("host", "pay.test").header("idempotency-key", "\"payout-7\"").body("70.00").send()
    };
    let lost = tokio::spawn(pay(&first));
    support::eventually(Duration::from_secs(5), "the first server starts the payout", || async {
        (runs.load(SeqCst) == 1).then_some(())
    })
    .await;
    dying.die();
    // While its lease lasts the key is in flight, whatever the policy.
    problem(pay(&second).await.unwrap(), 409, "in-flight").await;
    tokio::time::sleep(LEASE + Duration::from_millis(300)).await;
    let answer = pay(&second).await.unwrap();
    lost.abort();
    Died { answer, runs: runs.load(SeqCst), fixture, url: second }
}

/// The unknown outcome's full key, found as an operator finds it (`list --state unknown`).
async fn unknown_key(idem: &idempotency::Idempotency) -> String {
    let filter = idempotency::ScanFilter::default().state(idempotency::store::RecordState::Unknown);
    let page = idem.scan(&filter, None, 1000).await.unwrap();
    assert_eq!(page.records.len(), 1, "{page:?}");
    page.records[0].key.clone()
}

/// Under `.on_crash(OnCrash::Hold)` a request whose server died mid-handler is not run again:
/// whether the payout went out is unknown, and a retry gets 409 `outcome-unknown` that says so.
///
/// An operator resolves it as docs/http.md says: with a response in the layer's stored form, the
/// retry replays it; with a bare value, every retry fails (500) until the key is purged.
async fn a_server_that_died_mid_request_holds_its_key_under_hold(backend: Backend) {
    let Died { answer, runs, fixture, url } = after_a_server_died(backend, idempotent_core::OnCrash::Hold).await;
    assert!(answer.headers().get("retry-after").is_none(), "retrying does not help");
    let body = problem(answer, 409, "outcome-unknown").await;
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains("attempt 1"), "the detail names the attempt: {detail}");
    assert_eq!(runs, 1, "the handler ran again on a held key");
    let idem = fixture.idem(1);
    let key = unknown_key(&idem).await;
    let stored = serde_json::json!({"status": 201, "headers": [], "body": {"text": "paid by hand"}});
    let resolve = idempotency::Resolve::completed(&stored).unwrap();
    assert_eq!(idem.resolve("", &key, resolve).await.unwrap(), idempotency::store::Resolved::Done);
    let replayed = payout(&url).await;
    assert_eq!(replayed.status(), 201);
    assert_eq!(replayed.headers()["idempotent-replayed"], "true");
    assert_eq!(replayed.text().await.unwrap(), "paid by hand");

    let Died { fixture, url, .. } = after_a_server_died(backend, idempotent_core::OnCrash::Hold).await;
    let idem = fixture.idem(1);
    let key = unknown_key(&idem).await;
    let bare = idempotency::Resolve::completed(&"paid").unwrap();
    assert_eq!(idem.resolve("", &key, bare).await.unwrap(), idempotency::store::Resolved::Done);
    for _ in 0..2 {
        assert_eq!(payout(&url).await.status(), 500, "a value the layer cannot read back");
    }
    idem.forget("", &key, idempotency::Force::CompletedOnly).await.unwrap();
    assert_eq!(payout(&url).await.status(), 201, "purged, the key runs again");
}

/// By default (`OnCrash::Rerun`) the same request after the dead server's lease runs the handler
/// again: the key is free once the lease ends.
async fn a_server_that_died_mid_request_frees_its_key_by_default(backend: Backend) {
    let Died { answer, runs, .. } = after_a_server_died(backend, idempotent_core::OnCrash::Rerun).await;
    assert_eq!(answer.status(), 201);
    assert_eq!(runs, 2);
}

async fn futures_join_all<F>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("request task"));
    }
    out
}
