//! Fuzz target: the `Idempotency-Key` header's parser, strict and lenient.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idempotent_http::header::fuzz(data));
