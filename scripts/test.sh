#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs Redis, PostgreSQL and headless Chromium where
# missing, then format, lints, docs, and every test (the tests start and stop their own
# redis-server, PostgreSQL clusters and chromedriver processes on free ports, and make and drop a
# database of their own on a PostgreSQL already running at 127.0.0.1:5432), and the benchmark's
# exact round-trip check.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-redis.sh
bash scripts/install-postgres.sh
bash scripts/install-browser.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets --all-features -- -D warnings

echo "== cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --all-features --no-deps --quiet

echo "== cargo test"
cargo test --workspace --all-features

echo "== without the tls feature, a rediss:// URL is an error (never plaintext)"
cargo test -p idempotent-core --no-default-features --features redis --lib

echo "== packaging: every crate packages and builds from its tarball; a crate outside the workspace runs on them"
bash scripts/package-check.sh

echo "== benchmark round-trip check (exact counts from Redis, not timings)"
cargo run --quiet --release --example bench -- --check
echo "== all green"
