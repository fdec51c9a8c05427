//! Telemetry as a service would install it, switched on only for the "+ telemetry" cases.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A subscriber and a recorder as a service would install them (`fmt` at `INFO`, a line per
/// closed span, written to a sink; the Prometheus recorder, its upkeep run every 5 s), switched
/// on for the "+ telemetry" cases only. Off, the subscriber's level filter is `OFF` (every
/// callsite disabled, as with no subscriber) and the recorder hands out no-op handles (as with
/// no recorder).
pub struct Telemetry {
    pub level:
        tracing_subscriber::reload::Handle<tracing_subscriber::filter::LevelFilter, tracing_subscriber::Registry>,
    pub metrics: Arc<AtomicBool>,
}

/// The Prometheus recorder, or no-op handles while off.
pub struct Toggled {
    pub on: Arc<AtomicBool>,
    pub inner: metrics_exporter_prometheus::PrometheusRecorder,
}

impl metrics::Recorder for Toggled {
    fn describe_counter(&self, key: metrics::KeyName, unit: Option<metrics::Unit>, text: metrics::SharedString) {
        self.inner.describe_counter(key, unit, text)
    }
    fn describe_gauge(&self, key: metrics::KeyName, unit: Option<metrics::Unit>, text: metrics::SharedString) {
        self.inner.describe_gauge(key, unit, text)
    }
    fn describe_histogram(&self, key: metrics::KeyName, unit: Option<metrics::Unit>, text: metrics::SharedString) {
        self.inner.describe_histogram(key, unit, text)
    }
    fn register_counter(&self, key: &metrics::Key, meta: &metrics::Metadata<'_>) -> metrics::Counter {
        if self.on.load(Ordering::Relaxed) {
            self.inner.register_counter(key, meta)
        } else {
            metrics::Counter::noop()
        }
    }
    fn register_gauge(&self, key: &metrics::Key, meta: &metrics::Metadata<'_>) -> metrics::Gauge {
        if self.on.load(Ordering::Relaxed) {
            self.inner.register_gauge(key, meta)
        } else {
            metrics::Gauge::noop()
        }
    }
    fn register_histogram(&self, key: &metrics::Key, meta: &metrics::Metadata<'_>) -> metrics::Histogram {
        if self.on.load(Ordering::Relaxed) {
            self.inner.register_histogram(key, meta)
        } else {
            metrics::Histogram::noop()
        }
    }
}

impl Telemetry {
    pub fn install() -> Telemetry {
        use tracing_subscriber::layer::SubscriberExt;
        let (level, handle) = tracing_subscriber::reload::Layer::new(tracing_subscriber::filter::LevelFilter::OFF);
        let fmt = tracing_subscriber::fmt::layer()
            .with_writer(std::io::sink)
            .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE);
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(level).with(fmt))
            .expect("the only subscriber");
        let on = Arc::new(AtomicBool::new(false));
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let upkeep = recorder.handle();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                upkeep.run_upkeep();
            }
        });
        metrics::set_global_recorder(Toggled { on: on.clone(), inner: recorder }).expect("the only recorder");
        idempotency::telemetry::describe_metrics();
        Telemetry { level: handle, metrics: on }
    }

    pub fn set(&self, on: bool) {
        let level = if on {
            tracing_subscriber::filter::LevelFilter::INFO
        } else {
            tracing_subscriber::filter::LevelFilter::OFF
        };
        self.level.reload(level).expect("the subscriber is alive");
        self.metrics.store(on, Ordering::Relaxed);
    }
}
