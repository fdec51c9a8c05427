#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs Redis, Valkey, PostgreSQL, nats-server,
# RabbitMQ (started where none answers), headless Chromium and openapi-spec-validator where missing, then format, lints,
# docs, and every test (the tests start and stop their own redis-server, valkey-server,
# nats-server, PostgreSQL clusters and chromedriver processes on free ports, make and drop a
# database of their own on a PostgreSQL already running at 127.0.0.1:5432 and a vhost of their
# own on RabbitMQ; the suites whose behaviour depends on the server run on Redis 7.0 and again on
# Valkey 8.1), and the benchmark's exact round-trip check on both servers.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-redis.sh
# Valkey 8.1 (SET ... IFEQ): built once from Debian's source package and cached (about 5 minutes
# the first time on a machine).
VALKEY_SERVER="$(bash scripts/install-valkey.sh | tail -1)"
export VALKEY_SERVER
bash scripts/install-postgres.sh
bash scripts/install-nats.sh
bash scripts/install-rabbitmq.sh
bash scripts/install-browser.sh
# The reference OpenAPI validator (PyPI, in a virtual environment of its own), for the HTTP
# layer's OpenAPI fragment.
bash scripts/install-openapi-validator.sh >/dev/null

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets --all-features -- -D warnings

echo "== cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --all-features --no-deps --quiet

echo "== cargo test"
cargo test --workspace --all-features

echo "== the suites whose behaviour depends on the server, again on Valkey $VALKEY_SERVER"
# The same tests, every server they start a valkey-server: the commit path is SET IFEQ there.
# (tests/commit_paths.rs runs on both servers in the run above; TLS is not built into our Valkey.)
REDIS_SERVER="$VALKEY_SERVER" cargo test -p idempotency --all-features \
    --test semantics --test guarantees --test proxy_faults --test redis_faults --test lock \
    --test security --test cluster --test sentinel --test operations --test held_outcomes --test attempts

echo "== without the tls feature, a rediss:// URL is an error (never plaintext)"
cargo test -p idempotent-core --no-default-features --features redis --lib

echo "== packaging: every crate packages and builds from its tarball; a crate outside the workspace runs on them"
bash scripts/package-check.sh

echo "== the explorer, deterministic layer: fixed seeds, then a random one (printed), bounded (its layer on real servers ran with the suite: tests/explore_servers.rs)"
bash scripts/explore.sh --seed 1 --schedules 20000
bash scripts/explore.sh --minutes 1

echo "== fuzzing: every target for a few seconds from its corpus (the corpus itself ran as tests above)"
# cargo fuzz needs a nightly toolchain, which a machine may not have and rustup cannot fetch
# here; cargo-fuzz itself installs from crates.io.
if rustup run nightly rustc --version >/dev/null 2>&1; then
    command -v cargo-fuzz >/dev/null 2>&1 || cargo install --quiet --locked cargo-fuzz
    (
        cd fuzz
        for target in $(cargo +nightly fuzz list); do
            cargo +nightly fuzz run "$target" "corpus/$target" -- -max_total_time=10 -rss_limit_mb=2048 2>&1 | tail -2
        done
    )
else
    echo "skipped: no nightly toolchain on this machine"
fi

echo "== benchmark round-trip check (exact counts from Redis, not timings)"
cargo run --quiet --release -p idempotent-bench -- --check
echo "== all green"
