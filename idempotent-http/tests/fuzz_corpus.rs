//! The HTTP layer's fuzz targets' corpora (`fuzz/corpus/idempotency_key_header/`,
//! `fuzz/corpus/json_canonical/`) as ordinary tests.

#[test]
fn the_header_corpus_passes() {
    corpus_passes("idempotency_key_header", idempotent_http::header::fuzz);
}

#[test]
fn the_json_canonical_corpus_passes() {
    corpus_passes("json_canonical", idempotent_http::json::fuzz);
}

fn corpus_passes(target: &str, fuzz: fn(&[u8])) {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus").join(target);
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert!(!files.is_empty(), "no corpus in {}", dir.display());
    for path in files {
        let data = std::fs::read(&path).unwrap();
        let outcome = std::panic::catch_unwind(|| fuzz(&data));
        assert!(outcome.is_ok(), "{} fails", path.display());
    }
}
