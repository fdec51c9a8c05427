//! The runtime's refusals as gRPC statuses: which code each error is, and the metadata a client
//! needs to act on it (`retry-after` for a call in flight).
//!
//! A call in flight is `ABORTED`, not `ALREADY_EXISTS`: `ALREADY_EXISTS` tells a client that what
//! it tried to create exists, which it may take as done, while the first call may still fail;
//! `ABORTED` is gRPC's "a concurrency conflict, retry the sequence", the code client retry
//! policies list with `UNAVAILABLE`. A completed call whose response cannot be replayed is
//! `ALREADY_EXISTS`: it did run, and will not run again.

use http::Response;
use idempotent_core::telemetry::logged_error;
use idempotent_core::Error;
use tonic::metadata::MetadataValue;
use tonic::{Code, Status};

/// A status answer: the status in the headers (a trailers-only response).
pub(crate) fn answer(status: Status) -> Response<tonic::body::Body> {
    status.into_http()
}

/// The status answering a runtime error for the call of `key` (as the client sent it).
pub(crate) fn for_error(e: &Error, key: &str) -> Status {
    match e {
        Error::Conflict { .. } | Error::Locked { .. } => {
            let mut status = Status::new(
                Code::Aborted,
                format!("a call with idempotency-key {key:?} is in progress; retry it with the same key"),
            );
            status.metadata_mut().insert("retry-after", MetadataValue::from_static("1"));
            status
        }
        Error::KeyReused { .. } => Status::new(
            Code::FailedPrecondition,
            format!("idempotency-key {key:?} was used for a different call (method or message)"),
        ),
        Error::Duplicate { .. } => Status::new(
            Code::AlreadyExists,
            format!("the call with idempotency-key {key:?} completed; its response cannot be replayed"),
        ),
        Error::GaveUp { attempts, .. } => Status::new(
            Code::FailedPrecondition,
            format!("the call with idempotency-key {key:?} failed {attempts} times; it is not run again ({e})"),
        ),
        // Not ABORTED: a client's retry policy would retry it, and nothing changes until someone
        // resolves the key.
        Error::OutcomeUnknown { .. } => Status::new(
            Code::FailedPrecondition,
            format!("the call with idempotency-key {key:?} stopped without an outcome; it is not run again until resolved ({e})"),
        ),
        Error::InvalidKey { .. } | Error::InvalidCall { .. } | Error::InvalidToken { .. } => {
            Status::new(Code::InvalidArgument, e.to_string())
        }
        Error::Store { .. } => {
            tracing::warn!(error = %logged_error(e), "idempotency store failed; call answered UNAVAILABLE");
            Status::new(Code::Unavailable, format!("the idempotency store is unavailable; nothing ran ({e})"))
        }
        Error::Unconfirmed { .. } => Status::new(
            Code::Unavailable,
            format!("the call ran and its response was stored, but not confirmed durable; a retry with the same key replays it ({e})"),
        ),
        other => {
            tracing::error!(error = %logged_error(other), "idempotency layer failed");
            Status::new(Code::Internal, other.to_string())
        }
    }
}
