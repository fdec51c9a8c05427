#!/usr/bin/env bash
# What each of the library's features adds to a plain axum service: a small service built cold
# in release mode (a target directory of its own each time), once with axum alone and once per
# feature set, each using what it enables (so that the linker keeps it). Prints one row per
# variant: cold build seconds, crates compiled, binary bytes (as built, and stripped), and the
# difference from plain axum. The README's weight table comes from this script.
#   bash scripts/weight.sh [VARIANT...]     variants: axum redis default axum-layer metrics postgres tonic
# redis is the default features without tls (rediss:// with rustls). With WEIGHT_CRATES=1, each
# variant also lists the crates its code comes from, largest first (the sizes of the symbols
# `nm` finds, by the crate that leads their demangled path: what `cargo bloat --crates` shows).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
variants=("$@")
[ ${#variants[@]} -eq 0 ] && variants=(axum redis default axum-layer metrics postgres)

mkdir -p "$work/svc/src"
cat >"$work/svc/src/main.rs" <<'RS'
use axum::{routing::post, Router};

async fn pay() -> &'static str {
    "paid"
}

#[tokio::main]
async fn main() {
    #[allow(unused_mut)]
    let mut app = Router::new().route("/pay", post(pay));
    #[cfg(feature = "idem")]
    {
        let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
        let store = idempotency::RedisStore::connect(&url).await.expect("redis");
        let idem = idempotency::Idempotency::new(store);
        let done: Result<u32, idempotency::Error> =
            idem.run(idempotency::Call::new("start").scope("svc"), || async { Ok(1) }).await;
        println!("{done:?}");
        #[cfg(feature = "grpc")]
        {
            // The gRPC layer around a service, as tonic's Server::layer puts it.
            let layer = idempotency::grpc::GrpcIdempotencyLayer::shared_keys(idem.clone());
            let svc = tower_layer::Layer::layer(&layer, tower::service_fn(|_: http::Request<tonic::body::Body>| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(tonic::body::Body::empty()))
            }));
            println!("{svc:?}");
        }
        #[cfg(feature = "layer")]
        {
            app = app.route_layer(idempotency::http::IdempotencyLayer::shared_keys(idem));
        }
    }
    #[cfg(feature = "pg")]
    {
        let store = idempotency::PgStore::connect("postgres://127.0.0.1/app").await.expect("pg");
        drop(idempotency::Idempotency::new(store));
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    if std::env::var_os("SERVE").is_some() {
        axum::serve(listener, app).await.unwrap();
    }
}
RS

printf '%-12s %10s %8s %12s %12s %10s %10s\n' variant build_s crates binary stripped +build_s +stripped
base_s="" base_size=""
for v in "${variants[@]}"; do
    case "$v" in
        axum) dep="" feats="" ;;
        redis) dep='idempotency = { path = "ROOT", default-features = false, features = ["redis"], optional = true }' feats='idem = ["dep:idempotency"]' ;;
        default) dep='idempotency = { path = "ROOT", optional = true }' feats='idem = ["dep:idempotency"]' ;;
        axum-layer) dep='idempotency = { path = "ROOT", features = ["axum"], optional = true }' feats='idem = ["dep:idempotency"]
layer = ["idem"]' ;;
        metrics) dep='idempotency = { path = "ROOT", features = ["axum", "metrics"], optional = true }' feats='idem = ["dep:idempotency"]
layer = ["idem"]' ;;
        postgres) dep='idempotency = { path = "ROOT", features = ["axum", "metrics", "postgres"], optional = true }' feats='idem = ["dep:idempotency"]
layer = ["idem"]
pg = ["idem"]' ;;
        tonic) dep='idempotency = { path = "ROOT", features = ["axum", "tonic"], optional = true }
tonic = { version = "0.14", default-features = false }
tower = { version = "0.5", features = ["util"] }
tower-layer = "0.3"
http = "1"' feats='idem = ["dep:idempotency"]
layer = ["idem"]
grpc = ["idem"]' ;;
        *) echo "weight: unknown variant $v" >&2; exit 2 ;;
    esac
    on=$(echo "$feats" | sed -n 's/^\([a-z]*\) =.*/\1/p' | paste -sd, -)
    cat >"$work/svc/Cargo.toml" <<TOML
[package]
name = "svc"
version = "0.1.0"
edition = "2021"
publish = false

[workspace]

[features]
default = [$(echo "$on" | sed 's/\([a-z]\+\)/"\1"/g')]
${feats}

[dependencies]
axum = "0.8"
tokio = { version = "1", features = ["rt-multi-thread", "macros", "net"] }
${dep//ROOT/$root}
TOML
    # The lock file of the checkout: the same versions the workspace builds with.
    cp "$root/Cargo.lock" "$work/svc/Cargo.lock"
    rm -rf "$work/target"
    start=$(date +%s.%N)
    log=$(cd "$work/svc" && CARGO_TARGET_DIR="$work/target" cargo build --release --color never 2>&1) || { echo "$log" >&2; exit 1; }
    end=$(date +%s.%N)
    secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.0f", b - a }')
    crates=$(echo "$log" | grep -c '^ *Compiling ' || true)
    bin="$work/target/release/svc"
    size=$(stat -c %s "$bin")
    strip -o "$work/svc.stripped" "$bin"
    stripped=$(stat -c %s "$work/svc.stripped")
    [ -z "$base_s" ] && { base_s=$secs; base_size=$stripped; }
    printf '%-12s %10s %8s %12s %12s %10s %10s\n' "$v" "$secs" "$crates" "$size" "$stripped" \
        "$((secs - base_s))" "$((stripped - base_size))"
    if [ "${WEIGHT_CRATES:-}" = 1 ]; then
        nm -C -S --size-sort "$bin" 2>/dev/null | awk '
            NF >= 4 && ($3 == "t" || $3 == "T") {
                name = $4; sub(/^</, "", name); sub(/^_</, "", name)
                split(name, parts, "::"); crate = parts[1]
                sub(/<.*/, "", crate); if (crate == "") crate = "?"
                size[crate] += strtonum("0x" $2)
            }
            END { for (c in size) printf "%10d  %s\n", size[c], c }' | sort -rn | head -12 | sed 's/^/    /'
    fi
done
