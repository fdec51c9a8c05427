//! The order page in a real browser: headless Chromium, driven through WebDriver (chromedriver,
//! which this test starts on a free port), double-clicks and then triple-clicks "submit" on the
//! `orders_web` example served in-process, and exactly one order is created each time.
//!
//! Needs Debian's `chromium` and `chromium-driver` packages (`scripts/install-browser.sh`);
//! `CHROMIUM` and `CHROMEDRIVER` override the binaries' paths. Without them the test fails.

#[path = "../examples/orders_web.rs"]
#[allow(dead_code)]
mod orders_web;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::actions::{InputSource, MouseActions, PointerAction, MOUSE_BUTTON_LEFT};
use fantoccini::{Client, ClientBuilder, Locator};
use idempotency::{Idempotency, MemoryStore};
use serde_json::{json, Value};

const INSTALL_HINT: &str = "run `bash scripts/install-browser.sh` (installs Debian's chromium and chromium-driver)";

/// Where the screenshots go: `target/test-output/` at the workspace root.
fn output_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("target").join("test-output")
}

/// A binary from an environment variable, else the first candidate that exists.
fn find_binary(var: &str, candidates: &[&str]) -> PathBuf {
    if let Some(path) = std::env::var_os(var) {
        let path = PathBuf::from(path);
        assert!(path.is_file(), "{var}={} does not exist; {INSTALL_HINT}", path.display());
        return path;
    }
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .flat_map(|dir| candidates.iter().map(move |c| dir.join(c)));
    candidates
        .iter()
        .filter(|c| c.starts_with('/'))
        .map(PathBuf::from)
        .chain(on_path)
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{} not found; {INSTALL_HINT}", candidates[0]))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("no free port").port()
}

/// A chromedriver of the test's own on a free port, killed when dropped, with a fresh Chromium
/// profile directory removed then too.
struct Driver {
    child: Child,
    port: u16,
    profile: PathBuf,
    log: PathBuf,
}

impl Driver {
    fn start() -> Driver {
        let binary = find_binary("CHROMEDRIVER", &["/usr/bin/chromedriver", "chromedriver"]);
        let port = free_port();
        let scratch = std::env::temp_dir().join(format!("orders-web-browser-{}-{port}", std::process::id()));
        let profile = scratch.join("profile");
        std::fs::create_dir_all(&profile).expect("profile dir");
        let log = scratch.join("chromedriver.log");
        let child = Command::new(&binary)
            .arg(format!("--port={port}"))
            .arg(format!("--log-path={}", log.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}; {INSTALL_HINT}", binary.display()));
        let mut driver = Driver { child, port, profile, log };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = driver.child.try_wait() {
                panic!("chromedriver exited with {status} before listening; its log: {}", driver.log_text());
            }
            assert!(Instant::now() < deadline, "chromedriver did not listen on {port}; log: {}", driver.log_text());
            std::thread::sleep(Duration::from_millis(50));
        }
        driver
    }

    fn log_text(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(40).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// A WebDriver session on headless Chromium.
    async fn session(&self) -> Client {
        let chromium = find_binary("CHROMIUM", &["/usr/bin/chromium", "chromium"]);
        let args = [
            "--headless".to_owned(),
            "--no-sandbox".to_owned(),
            "--disable-gpu".to_owned(),
            "--disable-quic".to_owned(),
            "--no-first-run".to_owned(),
            "--disable-background-networking".to_owned(),
            "--disable-component-update".to_owned(),
            "--disable-sync".to_owned(),
            "--disable-dev-shm-usage".to_owned(),
            "--window-size=900,760".to_owned(),
            format!("--user-data-dir={}", self.profile.display()),
        ];
        let capabilities = json!({
            "browserName": "chrome",
            "goog:chromeOptions": { "binary": chromium, "args": args },
        });
        let Value::Object(capabilities) = capabilities else { unreachable!() };
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let url = format!("http://127.0.0.1:{}", self.port);
        match ClientBuilder::new(connector).capabilities(capabilities).connect(&url).await {
            Ok(client) => client,
            Err(e) => panic!("no WebDriver session: {e}; chromedriver log:\n{}", self.log_text()),
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(scratch) = self.profile.parent() {
            let _ = std::fs::remove_dir_all(scratch);
        }
    }
}

/// Evaluates `expression` in the page until it is `true`, for at most `limit`.
async fn wait_until(c: &Client, expression: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    let script = format!("return Boolean({expression});");
    loop {
        match c.execute(&script, vec![]).await {
            Ok(Value::Bool(true)) => return,
            Ok(_) => {}
            Err(e) => panic!("evaluating {expression}: {e}"),
        }
        if Instant::now() >= deadline {
            let state = c.execute("return document.body.innerText;", vec![]).await.unwrap_or_default();
            panic!("not within {limit:?}: {expression}; the page says: {state}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn text_of(c: &Client, id: &str) -> String {
    c.find(Locator::Id(id)).await.unwrap_or_else(|e| panic!("#{id}: {e}")).text().await.unwrap()
}

/// Presses the left button on `#submit` `times` times in a row, as fast as a person's multi-click.
async fn multi_click(c: &Client, times: usize) {
    let button = c.find(Locator::Id("submit")).await.expect("the submit button");
    let mut mouse = MouseActions::new("mouse".into()).then(PointerAction::MoveToElement {
        element: button,
        duration: None,
        x: 0.0,
        y: 0.0,
    });
    for i in 0..times {
        if i > 0 {
            mouse = mouse.pause(Duration::from_millis(60));
        }
        mouse = mouse
            .then(PointerAction::Down { button: MOUSE_BUTTON_LEFT })
            .then(PointerAction::Up { button: MOUSE_BUTTON_LEFT });
    }
    c.perform_actions(mouse).await.expect("clicking submit");
    c.release_actions().await.expect("releasing the mouse");
}

async fn orders(addr: SocketAddr) -> orders_web::OrderList {
    let url = format!("http://{addr}/orders");
    reqwest::get(&url).await.expect("GET /orders").json().await.expect("an order list")
}

/// Submits with `clicks` clicks and checks that one order, and only one, was created.
async fn submit_and_check(c: &Client, addr: SocketAddr, clicks: usize, expected_id: u64, before: usize) {
    let started = Instant::now();
    multi_click(c, clicks).await;
    let clicked_in = started.elapsed();
    assert!(
        clicked_in < orders_web::CREATE_DELAY,
        "the clicks took {clicked_in:?}, so they did not all land while the first order was being created"
    );
    // The spinner showed while the order was created (the page keeps a note of it).
    wait_until(c, "document.getElementById('spinner').dataset.shown === 'true'", Duration::from_secs(5)).await;
    // Every click's response has arrived and the order is shown.
    let all_answered = format!(
        "document.getElementById('log').dataset.sent === '{clicks}' && document.getElementById('log').dataset.pending === '0'"
    );
    wait_until(c, &all_answered, Duration::from_secs(20)).await;
    wait_until(c, "document.getElementById('order').classList.contains('on')", Duration::from_secs(5)).await;
    assert!(!c.find(Locator::Id("spinner")).await.unwrap().is_displayed().await.unwrap(), "the spinner is gone");

    let list = orders(addr).await;
    assert_eq!(
        list.submissions - before,
        clicks,
        "each click sent its own POST /orders (server saw {} submissions in all)",
        list.submissions
    );
    let created: Vec<_> = list.orders.iter().filter(|o| o.id == expected_id).collect();
    assert_eq!(list.orders.len() as u64, expected_id, "exactly one new order: {:?}", list.orders);
    assert_eq!(created.len(), 1);
    let title = text_of(c, "order-title").await;
    assert_eq!(title, format!("Order #{expected_id} created"), "the page shows the order");
    let log = text_of(c, "log").await;
    assert!(
        log.contains(&format!("Submitted {clicks} times; {} answered with the first request's order", clicks - 1)),
        "every extra click got the first order back: {log}"
    );
    assert_eq!(text_of(c, "error").await, "", "no error shown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn double_and_triple_click_create_one_order_each() {
    let running = orders_web::start("127.0.0.1:0".parse().unwrap(), Idempotency::new(MemoryStore::new()))
        .await
        .expect("the example app starts");
    let addr = running.addr;
    let driver = Driver::start();
    let c = driver.session().await;
    let session = c.clone();
    let checks = async move {
        let c = session;
        c.goto(&format!("http://{addr}/")).await.expect("opening the page");
        wait_until(&c, "document.getElementById('order-form').dataset.ready === 'true'", Duration::from_secs(15)).await;

        // A double click: two submissions, one order.
        submit_and_check(&c, addr, 2, 1, 0).await;
        let dir = output_dir();
        std::fs::create_dir_all(&dir).expect("target/test-output");
        let png = c.screenshot().await.expect("a screenshot");
        assert!(png.starts_with(b"\x89PNG"), "the screenshot is a PNG");
        std::fs::write(dir.join("orders_web_double_click.png"), &png).expect("writing the screenshot");

        // A fresh form (a new token), three of them, and a triple click: one more order.
        c.find(Locator::Id("new-order")).await.expect("the new-order button").click().await.expect("new order");
        wait_until(
            &c,
            "document.getElementById('order-form').dataset.ready === 'true' && !document.getElementById('order').classList.contains('on')",
            Duration::from_secs(15),
        )
        .await;
        let quantity = c.find(Locator::Id("quantity")).await.expect("the quantity field");
        quantity.clear().await.expect("clearing the quantity");
        quantity.send_keys("3").await.expect("typing the quantity");
        submit_and_check(&c, addr, 3, 2, 2).await;
        assert_eq!(text_of(&c, "order-detail").await, "3 × Coffee beans");
        let png = c.screenshot().await.expect("a screenshot");
        std::fs::write(dir.join("orders_web_triple_click.png"), &png).expect("writing the screenshot");

        let list = orders(addr).await;
        assert_eq!(list.orders.len(), 2, "{:?}", list.orders);
        assert_eq!(list.submissions, 5);
    };
    // Close the browser whether or not the checks passed, then report.
    let result = tokio::spawn(checks).await;
    let _ = c.close().await;
    running.task.abort();
    drop(driver);
    match result.map_err(|e| e.try_into_panic()) {
        Ok(()) => {}
        Err(Ok(panic)) => std::panic::resume_unwind(panic),
        Err(Err(e)) => panic!("the browser checks did not finish: {e}"),
    }
}
