//! Every file of the fuzz targets' corpus (`fuzz/corpus/<target>/`) through its target, as an
//! ordinary test on the stable toolchain: what the fuzzer found stays checked.
#![cfg(feature = "fuzzing")]

use std::path::PathBuf;

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus").join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no corpus in {}", dir.display());
    files.into_iter().map(|p| (p.clone(), std::fs::read(&p).unwrap())).collect()
}

fn run(target: &str, f: fn(&[u8])) {
    for (path, data) in corpus(target) {
        let outcome = std::panic::catch_unwind(|| f(&data));
        assert!(outcome.is_ok(), "{target}: {} fails", path.display());
    }
}

#[test]
fn the_corpus_of_every_target_passes() {
    run("record", idempotent_core::fuzz::record);
    run("token", idempotent_core::fuzz::token);
    run("duration", idempotent_core::fuzz::duration);
    run("store_url", idempotent_core::fuzz::store_url);
    run("key_values", idempotent_core::fuzz::key_values);
    run("pg_key", idempotent_core::fuzz::pg_key);
}
