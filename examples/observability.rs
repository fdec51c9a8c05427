//! Observability: a few calls (a first execution, a replay, a conflict, a failed body, a call
//! that waits for another) with `tracing-subscriber` printing each call's span as it closes, and
//! the Prometheus exporter serving the metrics on `/metrics`, which the example then reads and
//! prints. Runs on the in-memory store; set `REDIS_URL` to run on Redis instead.
//!
//! ```text
//! cargo run --example observability                 # prints the spans, then /metrics, and exits
//! cargo run --example observability -- --serve      # keeps serving http://127.0.0.1:9464/metrics
//! RUST_LOG=idempotency=debug,idempotent_core=debug cargo run --example observability   # every transition
//! ```
//!
//! The metrics need the `metrics` feature (`idempotency = { features = ["metrics"] }`); the
//! spans need nothing but a subscriber.

use std::time::Duration;

use idempotency::{Call, Error, Idempotency, MemoryStore, OnConflict, RedisStore};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::EnvFilter;

#[derive(Debug)]
enum AppError {
    Idempotency(Error),
    CardDeclined,
}

impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        AppError::Idempotency(e)
    }
}

#[tokio::main]
async fn main() {
    // One line per call, when its span closes: scope, redacted key, mode, outcome, fence,
    // attempts, wait, and how long it took.
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .with_span_events(FmtSpan::CLOSE)
        .with_target(false)
        .init();
    let serve = std::env::args().any(|a| a == "--serve");
    let addr: std::net::SocketAddr =
        std::env::var("METRICS_ADDR").ok().and_then(|a| a.parse().ok()).unwrap_or(([127, 0, 0, 1], 9464).into());
    // Histograms with buckets (aggregatable across instances), not the exporter's default
    // summaries.
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(
            Matcher::Suffix("_seconds".into()),
            &[0.0001, 0.0005, 0.001, 0.005, 0.025, 0.1, 0.5, 2.5, 10.0],
        )
        .expect("buckets")
        .install()
        .expect("the Prometheus exporter");

    let idem = match std::env::var("REDIS_URL") {
        Ok(url) => Idempotency::new(RedisStore::connect(&url).await.expect("connect to Redis")),
        Err(_) => Idempotency::new(MemoryStore::new()),
    };
    let charge = |id: &str| Call::new(id.to_owned()).scope("payments::charge");

    // Executed, then replayed.
    for _ in 0..2 {
        let _: Result<u32, AppError> = idem.run(charge("ch_1001"), || async { Ok(1200) }).await;
    }
    // A failed body: the key is released, a retry runs it.
    let _: Result<u32, AppError> = idem.run(charge("ch_1002"), || async { Err(AppError::CardDeclined) }).await;
    // A conflict, and a call that waits for the holder and replays its result.
    let holder = tokio::spawn({
        let idem = idem.clone();
        async move {
            let _: Result<u32, AppError> = idem
                .run(charge("ch_1003"), || async {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    Ok(800)
                })
                .await;
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    if let Err(AppError::Idempotency(e)) = idem.run(charge("ch_1003"), || async { Ok::<u32, AppError>(0) }).await {
        println!("a second caller: {e}");
    }
    let (value, outcome) = idem
        .run_with_outcome(charge("ch_1003").on_conflict(OnConflict::Wait(Duration::from_secs(5))), || async {
            Ok::<u32, AppError>(0)
        })
        .await
        .expect("replayed after waiting");
    holder.await.unwrap();
    println!(
        "\nrun_with_outcome: value {value}, {} (replayed: {}, waited {:?}, {} attempts)\n",
        outcome.kind, outcome.replayed, outcome.waited, outcome.attempts
    );

    let metrics = scrape(addr).await;
    println!("GET http://{addr}/metrics (the idempotency lines):");
    for line in metrics.lines().filter(|l| l.contains("idempotency_")) {
        println!("{line}");
    }
    if serve {
        println!("\nserving http://{addr}/metrics; Ctrl-C to stop");
        tokio::signal::ctrl_c().await.unwrap();
    }
}

/// The exporter's page, read as Prometheus would.
async fn scrape(addr: std::net::SocketAddr) -> String {
    for _ in 0..50 {
        if let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await {
            let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
            stream.write_all(request.as_bytes()).await.unwrap();
            let mut response = String::new();
            stream.read_to_string(&mut response).await.unwrap();
            return response.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or(response);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the exporter did not listen on {addr}");
}
