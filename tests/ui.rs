//! The attribute's compile-time contract, checked with `trybuild`: what compiles (and runs), and
//! each diagnostic, with its message and span, in `tests/ui/fail/*.stderr`.
//!
//! Regenerate the snapshots after a deliberate change of a message:
//! `TRYBUILD=overwrite cargo test -p idempotency --test ui`, then read every changed `.stderr`.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
