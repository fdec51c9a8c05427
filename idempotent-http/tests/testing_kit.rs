//! The test kit on HTTP routes (`idempotent_http::testing::route`): a route with the layer
//! passes every scenario, the same route without it fails the ones it should, and the
//! `orders_web` example (token mode, waiting duplicates) passes.

#[path = "../examples/orders_web.rs"]
#[allow(dead_code)]
mod orders_web;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use axum::http::{Method, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use idempotency::testing::{route, Kit, Scenario, Verdict};
use idempotent_http::IdempotencyLayer;

#[derive(Clone, Default)]
struct Orders {
    made: Arc<AtomicUsize>,
    fail_next: Arc<AtomicBool>,
}

impl Orders {
    fn app(&self, layer: Option<IdempotencyLayer>) -> Router {
        let orders = self.clone();
        let handler = post(move |body: String| {
            let orders = orders.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                if orders.fail_next.swap(false, SeqCst) {
                    return (StatusCode::SERVICE_UNAVAILABLE, "try again").into_response();
                }
                let n = orders.made.fetch_add(1, SeqCst) + 1;
                tokio::time::sleep(Duration::from_millis(30)).await;
                (StatusCode::CREATED, format!("order {n} of {body}")).into_response()
            }
        });
        let handler = match layer {
            Some(layer) => handler.route_layer(layer),
            None => handler,
        };
        Router::new().route("/orders", handler)
    }

    fn made(&self) -> impl Fn() -> usize {
        let made = self.made.clone();
        move || made.load(SeqCst)
    }

    fn fail_next(&self) -> Option<impl Fn()> {
        let fail = self.fail_next.clone();
        Some(move || fail.store(true, SeqCst))
    }
}

fn by_header(req: &http::request::Parts) -> Option<String> {
    req.headers.get("x-client").and_then(|v| v.to_str().ok()).map(str::to_owned)
}

#[tokio::test]
async fn a_route_with_the_layer_passes_every_scenario() {
    let kit = Kit::new();
    let orders = Orders::default();
    let app = orders.app(Some(IdempotencyLayer::per_client(kit.idempotency(), by_header)));
    let subject = route(app, Method::POST, "/orders").header("x-client", "c1").body("tea").other_body("coffee");
    let report = kit.check_failing(subject, orders.made(), orders.fail_next()).await;
    println!("{report}");
    report.assert_passed();
    assert!(report.outcomes.iter().all(|o| o.verdict == Verdict::Passed), "{report}");
    let after = report.outcome(Scenario::AfterCompletion).unwrap();
    assert!(after.answers.iter().any(|a| a.starts_with("replay 201")), "{report}");
}

#[tokio::test]
async fn a_route_without_the_layer_fails_what_it_should() {
    let kit = Kit::new().duplicates(10);
    let orders = Orders::default();
    let subject = route(orders.app(None), Method::POST, "/orders").body("tea").other_body("coffee");
    let report = kit.check_failing(subject, orders.made(), orders.fail_next()).await;
    println!("{report}");
    assert_eq!(report.outcome(Scenario::ConcurrentDuplicates).unwrap().effects, 10, "{report}");
    for scenario in Scenario::ALL {
        let outcome = report.outcome(scenario).unwrap();
        assert!(matches!(outcome.verdict, Verdict::Failed(_)), "{scenario:?} passed without the layer:\n{report}");
    }
}

/// A layer whose handler answers are not stored (`store_if` refusing 201): every duplicate
/// after completion runs again.
#[tokio::test]
async fn a_layer_that_stores_nothing_fails_the_duplicate_after_completion() {
    // Its key, released while the store is away, stays held for the lease: no need to wait it out.
    let kit = Kit::new().patience(Duration::from_secs(1));
    let orders = Orders::default();
    let layer = IdempotencyLayer::shared_keys(kit.idempotency()).store_if(|_| false);
    let subject = route(orders.app(Some(layer)), Method::POST, "/orders").body("tea");
    let report = kit.check(subject, orders.made()).await;
    println!("{report}");
    let Verdict::Failed(why) = &report.outcome(Scenario::AfterCompletion).unwrap().verdict else { panic!("{report}") };
    assert!(why.contains("order"), "{why}");
}

/// The example app: token mode, duplicates waiting for the first request.
#[tokio::test]
async fn the_orders_web_example_passes_every_scenario_it_can_run() {
    let kit = Kit::new().duplicates(5);
    let shop = orders_web::Shop::default();
    let app = orders_web::app(kit.idempotency(), shop.clone());
    let subject = route(app, Method::POST, "/orders")
        .token_from("/idempotent/token")
        .header("content-type", "application/json")
        .body(r#"{"item":"tea","quantity":2}"#)
        .other_body(r#"{"item":"tea","quantity":3}"#);
    let orders = move || shop.list().orders.len();
    let report = kit.check(subject, orders).await;
    println!("{report}");
    report.assert_passed();
    let concurrent = report.outcome(Scenario::ConcurrentDuplicates).unwrap();
    assert_eq!(concurrent.effects, 1);
    assert!(concurrent.answers.iter().all(|a| !a.contains("in flight")), "waiting duplicates get the replay: {report}");
}
