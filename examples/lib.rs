//! The runnable examples of `idempotency`, one program each (`cargo run --example NAME` from
//! the workspace's root):
//!
//! - `quickstart`: a first call, a replay, a conflict, a retry after an error, a token used twice;
//! - `payment_callback`: a provider re-sends a callback, some copies at once: one receipt;
//! - `order_submit`: token mode, a double click, used and unknown tokens;
//! - `cron_mutex`: a job fired on three instances runs once;
//! - `observability`: the spans and the Prometheus metrics of a few calls;
//! - `stream_consumer`: a Redis Streams consumer group, a batch of entries claimed at once.
//!
//! The package exists so that the examples build with their own dependencies, not the test
//! suites'. Its library holds one thing: the stream consumer's loop ([`streams`]), which the
//! example and its kill -9 test share.

pub mod streams;
