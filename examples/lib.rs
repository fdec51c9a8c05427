//! The runnable examples of `idempotency`, one program each (`cargo run --example NAME` from
//! the workspace's root):
//!
//! - `quickstart`: a first call, a replay, a conflict, a retry after an error, a token used twice;
//! - `payment_callback`: a provider re-sends a callback, some copies at once: one receipt;
//! - `order_submit`: token mode, a double click, used and unknown tokens;
//! - `cron_mutex`: a job fired on three instances runs once;
//! - `observability`: the spans and the Prometheus metrics of a few calls;
//! - `stream_consumer`: a Redis Streams consumer group, a batch of entries claimed at once;
//! - `jetstream_consumer` (feature `jetstream`): a NATS JetStream consumer whose effects commit
//!   with their records in one PostgreSQL transaction per batch;
//! - `rabbitmq_consumer` (feature `rabbitmq`): the same on RabbitMQ.
//!
//! The package exists so that the examples build with their own dependencies, not the test
//! suites'. Its library holds the consumers' loops, each shared by its example and its kill -9
//! test: the Redis Streams consumer's ([`streams`]) and, with their features, the JetStream
//! consumer's (`jetstream`) and the RabbitMQ consumer's (`rabbitmq`), on what they share
//! (`orders`).

#[cfg(feature = "jetstream")]
pub mod jetstream;
#[cfg(any(feature = "jetstream", feature = "rabbitmq"))]
pub mod orders;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;
pub mod streams;
