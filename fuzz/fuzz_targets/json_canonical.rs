//! Fuzz target: the canonical form of JSON bodies, which the HTTP layer fingerprints.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idempotent_http::json::fuzz(data));
