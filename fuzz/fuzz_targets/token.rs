//! Fuzz target: `idempotent_core::fuzz::token`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idempotent_core::fuzz::token(data));
