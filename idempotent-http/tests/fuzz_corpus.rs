//! The `Idempotency-Key` header fuzz target's corpus (`fuzz/corpus/idempotency_key_header/`) as
//! an ordinary test.

#[test]
fn the_header_corpus_passes() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/idempotency_key_header");
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert!(!files.is_empty(), "no corpus in {}", dir.display());
    for path in files {
        let data = std::fs::read(&path).unwrap();
        let outcome = std::panic::catch_unwind(|| idempotent_http::header::fuzz(&data));
        assert!(outcome.is_ok(), "{} fails", path.display());
    }
}
