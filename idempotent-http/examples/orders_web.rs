//! orders_web: an order form that a double click cannot order twice.
//!
//! The page fetches a one-time token (`POST /idempotent/token`), then submits the order with it
//! as its `Idempotency-Key`. Creating an order takes ~1.5 s while the page shows a spinner; a
//! second (or third) click in that time sends the same request again, and the layer answers it
//! with the first request's order instead of creating another. The page deliberately does not
//! disable its button: the server is what makes the extra clicks harmless.
//!
//! ```text
//! cargo run -p idempotent-http --example orders_web                       # MemoryStore
//! cargo run -p idempotent-http --example orders_web -- --redis redis://127.0.0.1:6379 --addr 127.0.0.1:3000
//! ```
//!
//! It prints `listening on http://ADDR` and serves `GET /` (the page), `POST /orders`,
//! `GET /orders` (`{"orders": [...], "submissions": N}`, N counting every POST that reached the
//! server) and `POST /idempotent/token`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use idempotency::{Idempotency, MemoryStore, RedisStore};
use idempotent_http::IdempotencyLayer;
use serde::{Deserialize, Serialize};

/// The page, served at `/`.
const PAGE: &str = include_str!("orders_web/page.html");

/// How long creating an order takes.
pub const CREATE_DELAY: Duration = Duration::from_millis(1500);

/// An order as the form submits it.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct NewOrder {
    /// What is ordered.
    pub item: String,
    /// How many.
    pub quantity: u32,
}

/// A created order.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct Order {
    /// Its number, from 1.
    pub id: u64,
    /// What is ordered.
    pub item: String,
    /// How many.
    pub quantity: u32,
}

/// `GET /orders`: every order created, and how many order submissions reached the server.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct OrderList {
    /// The orders, oldest first.
    pub orders: Vec<Order>,
    /// `POST /orders` requests received, duplicates included.
    pub submissions: usize,
}

/// The app's state: the orders created so far.
#[derive(Clone, Default)]
pub struct Shop {
    orders: Arc<Mutex<Vec<Order>>>,
    next_id: Arc<AtomicU64>,
    submissions: Arc<AtomicUsize>,
}

impl Shop {
    /// The orders and the submission count.
    pub fn list(&self) -> OrderList {
        OrderList {
            orders: self.orders.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            submissions: self.submissions.load(Ordering::SeqCst),
        }
    }
}

/// The app on `idem`: the page, the token endpoint, and the orders.
pub fn app(idem: Idempotency, shop: Shop) -> Router {
    // One key space for every browser: the page has no login to tell clients apart, and the
    // keys are one-time tokens the server hands out, which nobody can guess.
    let layer = IdempotencyLayer::shared_keys(idem);
    // Extra clicks wait for the first request and get its order, rather than a 409.
    let orders_guard = layer.clone().require_token().wait_in_flight(Duration::from_secs(10));
    Router::new()
        .route("/", get(|| async { Html(PAGE) }))
        .route(
            "/orders",
            post(create_order)
                .route_layer(orders_guard)
                .layer(middleware::from_fn_with_state(shop.clone(), count_submission))
                .get(list_orders),
        )
        .merge(layer.token_router())
        .with_state(shop)
}

/// Counts every order submission that reaches the server, before the idempotency layer.
async fn count_submission(State(shop): State<Shop>, request: Request, next: Next) -> Response {
    shop.submissions.fetch_add(1, Ordering::SeqCst);
    next.run(request).await
}

async fn create_order(State(shop): State<Shop>, Json(new): Json<NewOrder>) -> Response {
    if new.item.trim().is_empty() || new.item.len() > 100 || !(1..=99).contains(&new.quantity) {
        let problem = serde_json::json!({
            "type": "about:blank", "title": "Invalid order", "status": 422,
            "detail": "choose an item and a quantity from 1 to 99",
        });
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            [(header::CONTENT_TYPE, "application/problem+json")],
            problem.to_string(),
        )
            .into_response();
    }
    tokio::time::sleep(CREATE_DELAY).await; // "creating" the order
    let order = Order { id: shop.next_id.fetch_add(1, Ordering::SeqCst) + 1, item: new.item, quantity: new.quantity };
    shop.orders.lock().unwrap_or_else(|p| p.into_inner()).push(order.clone());
    let location = format!("/orders/{}", order.id);
    (StatusCode::CREATED, [(header::LOCATION, location)], Json(order)).into_response()
}

async fn list_orders(State(shop): State<Shop>) -> Json<OrderList> {
    Json(shop.list())
}

/// A running app: its address and its state. Dropping it does not stop the server; abort
/// `task` for that.
pub struct Running {
    /// The bound address.
    pub addr: SocketAddr,
    /// The orders.
    pub shop: Shop,
    /// The server task.
    pub task: tokio::task::JoinHandle<()>,
}

/// Binds `addr` and serves the app on `idem` from a spawned task.
pub async fn start(addr: SocketAddr, idem: Idempotency) -> std::io::Result<Running> {
    let shop = Shop::default();
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let router = app(idem, shop.clone());
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            eprintln!("orders_web: server error: {e}");
        }
    });
    Ok(Running { addr, shop, task })
}

/// Command-line options.
struct Options {
    addr: SocketAddr,
    redis: Option<String>,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
    let mut options = Options { addr: SocketAddr::from(([127, 0, 0, 1], 3000)), redis: None };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--addr" => {
                let value = args.next().ok_or("--addr needs an address, like 127.0.0.1:3000")?;
                options.addr = value.parse().map_err(|e| format!("--addr {value}: {e}"))?;
            }
            "--redis" => options.redis = Some(args.next().ok_or("--redis needs a URL, like redis://127.0.0.1:6379")?),
            "-h" | "--help" => return Err("usage: orders_web [--addr HOST:PORT] [--redis URL]".into()),
            other => {
                return Err(format!("unknown argument {other:?}; usage: orders_web [--addr HOST:PORT] [--redis URL]"))
            }
        }
    }
    Ok(options)
}

#[tokio::main]
async fn main() {
    let options = match parse_args(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    let idem = match &options.redis {
        None => Idempotency::new(MemoryStore::new()),
        Some(url) => match RedisStore::connect(url).await {
            Ok(store) => Idempotency::new(store),
            Err(e) => {
                eprintln!("cannot connect to Redis at {url}: {e}");
                std::process::exit(1);
            }
        },
    };
    let running = match start(options.addr, idem).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot listen on {}: {e}", options.addr);
            std::process::exit(1);
        }
    };
    let store = if options.redis.is_some() { "Redis" } else { "memory" };
    println!("listening on http://{} (store: {store})", running.addr);
    let _ = running.task.await;
}
