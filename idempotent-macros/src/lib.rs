//! The `#[idempotent(...)]` attribute of the `idempotent` crate.
//!
//! This crate is a placeholder until the attribute lands; the runtime in
//! `idempotent-core` is usable by hand through `Idempotency::run`.
