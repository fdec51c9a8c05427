#!/usr/bin/env bash
# Packages every published crate of the workspace (`cargo package --workspace`, which also builds
# each one from its own tarball), then builds a crate OUTSIDE the workspace that depends on the
# packaged `idempotency` alone (through `[patch.crates-io]` pointing at the unpacked tarballs) and
# runs a guarded call on a RedisStore against a redis-server started here: the Lua scripts must be
# inside the core package for that call to work.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

echo "== cargo package --workspace"
cargo package --workspace --exclude idempotent-explore --exclude idempotent-bench --exclude idempotency-examples --allow-dirty --quiet

version=$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json,sys; print([p["version"] for p in json.load(sys.stdin)["packages"] if p["name"]=="idempotency"][0])')
pkg="$root/target/package"
for crate in idempotency idempotent-core idempotent-macros idempotent-http; do
    [ -d "$pkg/$crate-$version" ] || { echo "no unpacked $crate-$version in $pkg" >&2; exit 1; }
done
[ -f "$pkg/idempotent-core-$version/lua/acquire.lua" ] || { echo "the core package has no lua/acquire.lua" >&2; exit 1; }

work=$(mktemp -d)
redis_pid=""
cleanup() {
    [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

mkdir -p "$work/consumer/src"
cat > "$work/consumer/Cargo.toml" <<TOML
[package]
name = "consumer"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
idempotency = "$version"
tokio = { version = "1", features = ["rt", "macros"] }

[patch.crates-io]
idempotency = { path = "$pkg/idempotency-$version" }
idempotent-core = { path = "$pkg/idempotent-core-$version" }
idempotent-macros = { path = "$pkg/idempotent-macros-$version" }
idempotent-http = { path = "$pkg/idempotent-http-$version" }

[workspace]
TOML
cat > "$work/consumer/src/main.rs" <<'RS'
use idempotency::{idempotent, Error, Idempotency, RedisStore};

#[idempotent(key = "{n}", store = idem)]
async fn double(idem: &Idempotency, n: u32, runs: &std::cell::Cell<u32>) -> Result<u32, Error> {
    runs.set(runs.get() + 1);
    Ok(n * 2)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let url = std::env::args().nth(1).expect("redis url");
    let idem = Idempotency::new(RedisStore::connect(&url).await.expect("connect"));
    let runs = std::cell::Cell::new(0);
    assert_eq!(double(&idem, 21, &runs).await.unwrap(), 42);
    assert_eq!(double(&idem, 21, &runs).await.unwrap(), 42);
    assert_eq!(runs.get(), 1, "the second call must replay");
    println!("packaged idempotency: one execution, one replay, on Redis");
}
RS

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize no >/dev/null 2>&1 &
redis_pid=$!
for _ in $(seq 1 100); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && break
    sleep 0.05
done

echo "== a crate outside the workspace, on the packaged crates"
CARGO_TARGET_DIR="$root/target/package-check" cargo run --quiet --manifest-path "$work/consumer/Cargo.toml" -- "redis://127.0.0.1:$port"
