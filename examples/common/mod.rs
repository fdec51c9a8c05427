//! What the examples share: the store chosen on the command line (in memory by default, Redis
//! with `--redis URL`).
#![allow(dead_code)]

use idempotency::{Idempotency, MemoryStore, RedisStore, StoreError};

/// `Some(url)` with `--redis URL` (or `--redis=URL`), `None` without arguments; anything else
/// prints the usage of `example` and exits.
pub fn redis_url(example: &str) -> Option<String> {
    let mut args = std::env::args().skip(1);
    let url = match args.next().as_deref() {
        None => return None,
        Some("--redis") => args.next(),
        Some(other) => other.strip_prefix("--redis=").map(str::to_owned),
    };
    match (url, args.next()) {
        (Some(url), None) => Some(url),
        _ => {
            eprintln!("usage: {example} [--redis redis://HOST:PORT]");
            std::process::exit(2)
        }
    }
}

/// A runtime on the store the command line asks for, saying which.
pub async fn runtime(example: &str) -> Result<Idempotency, StoreError> {
    Ok(match redis_url(example) {
        Some(url) => {
            println!("store: Redis at {url}");
            Idempotency::new(RedisStore::connect(&url).await?)
        }
        None => {
            println!("store: in memory (pass --redis URL for Redis)");
            Idempotency::new(MemoryStore::new())
        }
    })
}
