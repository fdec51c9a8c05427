//! The layer's OpenAPI fragment: valid OpenAPI 3.1 (checked by the reference validator,
//! `openapi-spec-validator`, installed by `scripts/install-openapi-validator.sh`) for every kind
//! of policy, and true: what it says the layer answers is what a real server with that layer
//! answers.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use idempotency::{Idempotency, MemoryStore};
use idempotent_http::{client, IdempotencyLayer};
use serde_json::{json, Value};

/// The validator's executable: `$OPENAPI_VALIDATOR`, else what the install script prints.
fn validator() -> &'static PathBuf {
    static VALIDATOR: OnceLock<PathBuf> = OnceLock::new();
    VALIDATOR.get_or_init(|| {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/install-openapi-validator.sh");
        let out = Command::new("bash").arg(&script).stderr(Stdio::inherit()).output().expect("run the install script");
        assert!(out.status.success(), "install-openapi-validator.sh failed");
        let printed = String::from_utf8(out.stdout).expect("a path");
        PathBuf::from(printed.lines().last().expect("the validator's path").trim())
    })
}

/// Runs the validator on `doc`: `Ok` or its complaint (cut short: it prints the whole schema).
fn validate(doc: &Value) -> Result<(), String> {
    static N: AtomicUsize = AtomicUsize::new(0);
    let file = std::env::temp_dir().join(format!(
        "idempotency-openapi-{}-{}.json",
        std::process::id(),
        N.fetch_add(1, SeqCst)
    ));
    std::fs::write(&file, serde_json::to_vec_pretty(doc).unwrap()).unwrap();
    let out = Command::new(validator()).arg(&file).output().expect("run openapi-spec-validator");
    let _ = std::fs::remove_file(&file);
    if out.status.success() {
        return Ok(());
    }
    let mut said = String::from_utf8_lossy(&out.stdout).into_owned();
    said.push_str(&String::from_utf8_lossy(&out.stderr));
    said.truncate(said.char_indices().nth(600).map_or(said.len(), |(i, _)| i));
    Err(said)
}

fn idem(keep: Duration) -> Idempotency {
    Idempotency::builder(MemoryStore::new()).default_keep(keep).build()
}

fn by_header(req: &http::request::Parts) -> Option<String> {
    req.headers.get("x-client").and_then(|v| v.to_str().ok()).map(str::to_owned)
}

#[test]
fn the_fragment_is_valid_openapi_3_1_for_every_kind_of_policy() {
    let day = idem(Duration::from_secs(86_400));
    let layers = [
        ("per client, the defaults", IdempotencyLayer::per_client(day.clone(), client::authorization())),
        (
            "shared keys, optional, lenient, canonical JSON, told expiry, waiting, other methods",
            IdempotencyLayer::shared_keys(day.clone())
                .key_optional()
                .lenient_header()
                .json_fingerprint()
                .expiry_header()
                .wait_in_flight(Duration::from_millis(2500))
                .keep(Duration::from_secs(600))
                .methods([Method::POST, Method::PUT, Method::DELETE])
                .replay_header(http::HeaderName::from_static("x-replayed"))
                .store_if(|s| s.is_success()),
        ),
        ("token mode", IdempotencyLayer::per_client(day, by_header).require_token().token_path("/forms/token")),
    ];
    for (what, layer) in layers {
        let doc = layer.openapi(["/payments", "/orders/{id}/refunds"]);
        if let Err(complaint) = validate(&doc) {
            panic!("{what}: the fragment is not valid OpenAPI 3.1: {complaint}\n{doc:#}");
        }
    }
}

/// The control: the validator refuses what is not OpenAPI 3.1, so the test above can fail.
#[test]
fn the_validator_refuses_a_broken_fragment() {
    let layer = IdempotencyLayer::per_client(idem(Duration::from_secs(60)), client::authorization());
    let mut doc = layer.openapi(["/payments"]);
    assert!(validate(&doc).is_ok());
    doc["components"]["parameters"]["IdempotencyKey"]["in"] = json!("body");
    assert!(validate(&doc).is_err(), "a header parameter `in: body` passed");
    let mut doc = layer.openapi(["/payments"]);
    doc["paths"]["/payments"]["post"]["responses"]["4x9"] = json!({ "description": "not a status" });
    assert!(validate(&doc).is_err(), "a response keyed `4x9` passed");
}

#[test]
fn the_fragment_follows_the_layers_settings() {
    let layer = IdempotencyLayer::shared_keys(idem(Duration::from_secs(3600)))
        .key_optional()
        .methods([Method::PUT])
        .wait_in_flight(Duration::from_secs(2));
    let doc = layer.openapi(["/a"]);
    let put = &doc["paths"]["/a"]["put"];
    assert!(doc["paths"]["/a"].get("post").is_none(), "POST is not guarded: {doc:#}");
    assert_eq!(put["x-idempotency"]["key"], "optional");
    assert_eq!(put["x-idempotency"]["keyScope"], "shared");
    assert_eq!(put["x-idempotency"]["retentionSeconds"], 3600);
    assert_eq!(put["x-idempotency"]["inFlight"], json!({ "answer": "wait", "waitSeconds": 2.0 }));
    assert_eq!(put["x-idempotency"]["expiryHeader"], Value::Null);
    let key = &doc["components"]["parameters"]["IdempotencyKey"];
    assert_eq!(key["required"], false);
    assert!(put["responses"].get("403").is_none(), "shared keys never answer 403");
    let types = problem_types(&doc, 400);
    assert!(!types.iter().any(|t| t.ends_with("#missing-key")), "an optional key is never missing: {types:?}");
    assert!(doc["paths"].get("/idempotent/token").is_none());

    let tokens = IdempotencyLayer::per_client(idem(Duration::from_secs(60)), by_header).require_token();
    let doc = tokens.openapi(["/a"]);
    assert!(doc["paths"]["/idempotent/token"]["post"]["responses"]["200"].is_object(), "{doc:#}");
    assert!(problem_types(&doc, 400).iter().any(|t| t.ends_with("#invalid-token")));
}

/// The problem types the fragment lists for `status`.
fn problem_types(doc: &Value, status: u16) -> Vec<String> {
    let response = &doc["components"]["responses"][format!("IdempotencyStatus{status}")];
    response["content"]["application/problem+json"]["schema"]["properties"]["type"]["enum"]
        .as_array()
        .map(|types| types.iter().map(|t| t.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

/// Whether `status` is in the fragment's `storedStatuses` ranges.
fn listed_as_stored(doc: &Value, status: u16) -> bool {
    doc["paths"]["/orders"]["post"]["x-idempotency"]["storedStatuses"].as_array().unwrap().iter().any(|range| {
        let range = range.as_str().unwrap();
        let (low, high) = range.split_once('-').unwrap_or((range, range));
        (low.parse::<u16>().unwrap()..=high.parse::<u16>().unwrap()).contains(&status)
    })
}

struct Server {
    base: String,
    http: reqwest::Client,
    runs: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    async fn start(layer: IdempotencyLayer) -> Server {
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = runs.clone();
        let app = Router::new().route(
            "/orders",
            post(move |headers: HeaderMap| {
                let runs = counted.clone();
                async move {
                    runs.fetch_add(1, SeqCst);
                    let delay = headers.get("x-delay-ms").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(0);
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                    let status = headers.get("x-status").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(201);
                    (StatusCode::from_u16(status).unwrap(), "done").into_response()
                }
            })
            .route_layer(layer),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Server { base, http: reqwest::Client::new(), runs, task }
    }

    fn post(&self, key: Option<&str>) -> reqwest::RequestBuilder {
        let request = self.http.post(format!("{}/orders", self.base)).header("x-client", "c1").body("{}");
        match key {
            Some(key) => request.header("idempotency-key", format!("\"{key}\"")),
            None => request,
        }
    }
}

/// Checks that `response` is a problem whose type the fragment lists for its status, and
/// returns its body.
async fn listed_problem(doc: &Value, response: reqwest::Response, slug: &str) -> Value {
    let status = response.status().as_u16();
    assert_eq!(response.headers()["content-type"], "application/problem+json");
    let body: Value = response.json().await.unwrap();
    let type_uri = body["type"].as_str().unwrap().to_owned();
    assert!(type_uri.ends_with(&format!("#{slug}")), "{body}");
    let listed = problem_types(doc, status);
    assert!(listed.contains(&type_uri), "{status} {type_uri} answered, the fragment lists {listed:?}");
    let operation = &doc["paths"]["/orders"]["post"];
    assert!(operation["responses"][status.to_string()]["$ref"].is_string(), "{status} is not on the operation");
    body
}

#[tokio::test]
async fn what_the_fragment_says_is_what_the_layer_answers() {
    let layer = IdempotencyLayer::per_client(idem(Duration::from_secs(86_400)), by_header)
        .keep(Duration::from_secs(600))
        .expiry_header();
    let doc = layer.openapi(["/orders"]);
    let policy = &doc["paths"]["/orders"]["post"]["x-idempotency"];
    assert_eq!(policy["retentionSeconds"], 600);
    assert_eq!(policy["retention"], "PT600S");
    let s = Server::start(layer).await;

    // 400: no key.
    let r = s.post(None).send().await.unwrap();
    listed_problem(&doc, r, "missing-key").await;
    // 403: no client.
    let r = s.http.post(format!("{}/orders", s.base)).header("idempotency-key", "\"k0\"").send().await.unwrap();
    listed_problem(&doc, r, "unidentified-client").await;

    // 409 while the first is in flight, with the Retry-After the fragment names.
    let first = tokio::spawn(s.post(Some("k1")).header("x-delay-ms", "800").send());
    for _ in 0..1000 {
        if s.runs.load(SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(s.runs.load(SeqCst), 1, "the first request reached the handler");
    let r = s.post(Some("k1")).send().await.unwrap();
    assert!(r.headers().contains_key("retry-after"));
    assert!(doc["components"]["responses"]["IdempotencyStatus409"]["headers"]["Retry-After"].is_object());
    listed_problem(&doc, r, "in-flight").await;
    let stored = first.await.unwrap().unwrap();
    assert_eq!(stored.status(), 201);

    // The replay carries the header the fragment names, and the expiry it tells is the retention.
    let replay = s.post(Some("k1")).send().await.unwrap();
    let replay_header = policy["replayHeader"].as_str().unwrap();
    assert_eq!(replay.headers()[replay_header], "true");
    let expires = replay.headers()[policy["expiryHeader"].as_str().unwrap()].to_str().unwrap();
    let expires = httpdate::parse_http_date(expires).unwrap();
    let ahead = expires.duration_since(SystemTime::now()).unwrap().as_secs();
    assert!((590..=601).contains(&ahead), "replayed until {ahead} s from now, the fragment says 600");

    // 422: the key again with another body.
    let r = s.post(Some("k1")).body("{\"other\":1}").send().await.unwrap();
    listed_problem(&doc, r, "key-reused").await;

    // The statuses it lists as stored are the ones replayed.
    for (i, status) in [200u16, 201, 202, 204, 302, 400, 402, 404, 409, 415, 422, 429, 500, 503].into_iter().enumerate()
    {
        let key = format!("status-{i}");
        let before = s.runs.load(SeqCst);
        for _ in 0..2 {
            let r = s.post(Some(&key)).header("x-status", status.to_string()).send().await.unwrap();
            assert_eq!(r.status().as_u16(), status);
        }
        let ran = s.runs.load(SeqCst) - before;
        let stored = ran == 1;
        assert_eq!(stored, listed_as_stored(&doc, status), "status {status}: ran {ran} times");
    }
}
