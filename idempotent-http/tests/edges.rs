//! Edges of the HTTP layer over real HTTP on loopback: a client that gives up mid-handler and
//! retries, and nested routers whose requests look alike once their prefix is stripped.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Path;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use idempotency::{Idempotency, MemoryStore};
use idempotent_http::IdempotencyLayer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Serves `app` on a free port of 127.0.0.1; its address.
async fn serve(app: Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// One POST over a raw connection, answered: its status and body.
async fn post_raw(addr: std::net::SocketAddr, path: &str, key: &str, body: &str) -> (u16, String) {
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(request(path, key, body).as_bytes()).await.unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).await.unwrap();
    let status = answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    (status, body)
}

fn request(path: &str, key: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: shop.test\r\nidempotency-key: \"{key}\"\r\ncontent-type: text/plain\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// The client sends a charge, gives up after 100 ms (the handler takes 400 ms) and closes the
/// connection, then retries with the same key: while the first still runs the retry gets 409,
/// after it the first's response, replayed. One charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_times_out_and_retries_is_charged_once() {
    let charges = Arc::new(AtomicUsize::new(0));
    let counted = charges.clone();
    let app = Router::new()
        .route(
            "/charge",
            post(move || {
                let charges = counted.clone();
                async move {
                    let run = charges.fetch_add(1, SeqCst) + 1;
                    tokio::time::sleep(Duration::from_millis(400)).await;
                    (StatusCode::CREATED, format!("charged, run {run}"))
                }
            }),
        )
        .layer(IdempotencyLayer::shared_keys(Idempotency::new(MemoryStore::new())));
    let addr = serve(app).await;

    let mut gives_up = tokio::net::TcpStream::connect(addr).await.unwrap();
    gives_up.write_all(request("/charge", "pay-1", "9.99").as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(gives_up);

    let (status, _) = post_raw(addr, "/charge", "pay-1", "9.99").await;
    assert_eq!(status, 409, "a retry while the first request runs");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, body) = post_raw(addr, "/charge", "pay-1", "9.99").await;
    assert_eq!((status, body.as_str()), (201, "charged, run 1"), "the retry after the first ended");
    assert_eq!(charges.load(SeqCst), 1, "the client was charged twice");
}

/// `/v1/orders` and `/v2/orders` (two nested routers), and `/tenants/1/orders` and
/// `/tenants/2/orders` (one router nested under a path parameter) are different requests: the
/// same key on the other one is 422, never the first one's response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_routers_never_share_a_key_space() {
    // The layer on each nested router, as a service that guards only some of its routers has it.
    let layer = IdempotencyLayer::shared_keys(Idempotency::new(MemoryStore::new()));
    let orders = |version: &'static str| {
        Router::new()
            .route("/orders", post(move || async move { (StatusCode::CREATED, format!("{version} receipt")) }))
            .layer(layer.clone())
    };
    let tenant = Router::new()
        .route(
            "/orders",
            post(|Path(t): Path<String>| async move { (StatusCode::CREATED, format!("tenant {t} order")) }),
        )
        .layer(layer.clone());
    let app = Router::new().nest("/v1", orders("v1")).nest("/v2", orders("v2")).nest("/tenants/{t}", tenant);
    let addr = serve(app).await;
    assert_eq!(post_raw(addr, "/v1/orders", "k-1", "{}").await, (201, "v1 receipt".into()));
    assert_eq!(post_raw(addr, "/v2/orders", "k-1", "{}").await.0, 422, "/v2 was answered with /v1's receipt");
    assert_eq!(post_raw(addr, "/tenants/1/orders", "k-2", "{}").await, (201, "tenant 1 order".into()));
    assert_eq!(post_raw(addr, "/tenants/2/orders", "k-2", "{}").await.0, 422, "tenant 2 got tenant 1's order");
    // The same request again is still the replay.
    assert_eq!(post_raw(addr, "/v1/orders", "k-1", "{}").await, (201, "v1 receipt".into()));
}

/// A gzip response replays as gzip with its `Content-Encoding`, and so do the other headers that
/// give a body its meaning; a per-request header does not replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_keeps_the_headers_that_give_its_body_meaning() {
    use axum::http::header::{CACHE_CONTROL, CONTENT_DISPOSITION, CONTENT_ENCODING, SET_COOKIE, VARY};
    let app = Router::new()
        .route(
            "/export",
            post(|| async {
                let gzip: &'static [u8] = &[0x1f, 0x8b, 0x08, 0x00, 0, 0, 0, 0];
                (
                    StatusCode::CREATED,
                    [
                        (CONTENT_ENCODING, "gzip"),
                        (CONTENT_DISPOSITION, "attachment; filename=\"export.csv\""),
                        (VARY, "Accept-Encoding"),
                        (CACHE_CONTROL, "no-store"),
                        (SET_COOKIE, "session=abc"),
                    ],
                    gzip,
                )
            }),
        )
        .layer(IdempotencyLayer::shared_keys(Idempotency::new(MemoryStore::new())));
    let addr = serve(app).await;
    let heads = |answer: &str| -> Vec<String> {
        let head = answer.split("\r\n\r\n").next().unwrap_or("").to_ascii_lowercase();
        head.lines()
            .skip(1)
            .filter(|l| !l.starts_with("date:") && !l.starts_with("content-length:") && !l.starts_with("connection:"))
            .map(str::to_owned)
            .collect()
    };
    let raw = |addr| async move {
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(request("/export", "exp-1", "").as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        conn.read_to_end(&mut answer).await.unwrap();
        answer
    };
    let first = raw(addr).await;
    let again = raw(addr).await;
    let (first_text, again_text) =
        (String::from_utf8_lossy(&first).into_owned(), String::from_utf8_lossy(&again).into_owned());
    let replayed = heads(&again_text);
    for wanted in [
        "content-encoding: gzip",
        "content-disposition: attachment; filename=\"export.csv\"",
        "vary: accept-encoding",
        "cache-control: no-store",
    ] {
        assert!(heads(&first_text).iter().any(|h| h == wanted), "first: {first_text}");
        assert!(replayed.iter().any(|h| h == wanted), "{wanted} missing from the replay: {again_text}");
    }
    assert!(!replayed.iter().any(|h| h.starts_with("set-cookie")), "a per-request header replayed");
    assert!(again.ends_with(&[0x1f, 0x8b, 0x08, 0x00, 0, 0, 0, 0]), "the body is not the same bytes");
}

/// `max_key_bytes(usize::MAX)` neither overflows nor goes past the runtime's key limit: a key
/// over the effective limit is a 400, and the connection stays up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enormous_key_limit_is_capped_not_overflowed() {
    let layer = IdempotencyLayer::shared_keys(Idempotency::new(MemoryStore::new())).max_key_bytes(usize::MAX);
    let app = Router::new().route("/orders", post(|| async { StatusCode::CREATED })).layer(layer);
    let addr = serve(app).await;
    let long = "k".repeat(idempotent_http::MAX_HEADER_KEY_BYTES + 1);
    assert_eq!(post_raw(addr, "/orders", &long, "{}").await.0, 400);
    let longest = "k".repeat(idempotent_http::MAX_HEADER_KEY_BYTES);
    assert_eq!(post_raw(addr, "/orders", &longest, "{}").await.0, 201);
}
