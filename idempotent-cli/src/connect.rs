//! From the connection options to a connected store: the library's own configuration from the
//! environment (`RedisStoreBuilder::from_vars`), with the command line's options in place of the
//! variables they name.

use std::time::Duration;

use idempotent_core::{Idempotency, RedisStore, RedisStoreBuilder};

use crate::args::Connection;
use crate::failure::{Failure, EXIT_CONNECT};

/// What every command works with.
pub struct Ctx {
    /// The store, for what only Redis has (record keys, the connection pool).
    pub store: RedisStore,
    /// The runtime on it, for the operator API (`inspect`, `forget`, `scan`).
    pub idem: Idempotency,
    /// The store's key prefix.
    pub namespace: String,
    /// The bound on every command.
    pub timeout: Duration,
}

/// Connects to the store the options name; every failure here is exit code 3.
pub async fn connect(conn: &Connection) -> Result<Ctx, Failure> {
    let builder = builder(conn, &|name| std::env::var(name).ok())?;
    let store = builder.connect().await.map_err(|e| Failure::new(EXIT_CONNECT, format!("cannot connect: {e}")))?;
    Ok(Ctx { idem: Idempotency::new(store.clone()), store, namespace: conn.namespace.clone(), timeout: conn.timeout })
}

/// The store's builder: the variables of `RedisStoreBuilder::from_vars`, each option given on
/// the command line (or in its own variable, which clap has read) taking its variable's place.
/// Connecting is bounded by `--timeout` too, unless `IDEMPOTENCY_CONNECT_TIMEOUT` says otherwise.
fn builder(conn: &Connection, env: &dyn Fn(&str) -> Option<String>) -> Result<RedisStoreBuilder, Failure> {
    let timeout = format!("{}ms", conn.timeout.as_millis());
    let vars = |name: &str| match name {
        "IDEMPOTENCY_REDIS_URL" => conn.url.clone(),
        "IDEMPOTENCY_PREFIX" => Some(conn.namespace.clone()),
        "IDEMPOTENCY_TIMEOUT" => Some(timeout.clone()),
        "IDEMPOTENCY_CONNECT_TIMEOUT" => env(name).or_else(|| Some(timeout.clone())),
        "IDEMPOTENCY_TLS_CA_FILE" => conn.tls_ca_file.as_ref().map(|p| p.display().to_string()),
        // Replica acknowledgements concern acquires and commits, which this tool never makes.
        "IDEMPOTENCY_REPLICA_ACKS" => None,
        other => env(other),
    };
    RedisStoreBuilder::from_vars(&vars).map_err(|e| {
        let hint = if conn.url.is_none() { " (or pass --url)" } else { "" };
        Failure::new(EXIT_CONNECT, format!("{e}{hint}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(url: Option<&str>) -> Connection {
        Connection {
            url: url.map(str::to_owned),
            namespace: "svc".into(),
            timeout: Duration::from_millis(750),
            tls_ca_file: None,
        }
    }

    #[test]
    fn options_take_their_variables_place() {
        let env = |name: &str| match name {
            "IDEMPOTENCY_POOL_SIZE" => Some("3".to_owned()),
            "IDEMPOTENCY_TIMEOUT" => Some("soon".to_owned()), // read by clap, never here
            _ => None,
        };
        let shown = format!("{:?}", builder(&conn(Some("redis://127.0.0.1:1")), &env).ok().unwrap());
        assert!(shown.contains("svc") && shown.contains("750ms") && shown.contains("pool_size: 3"), "{shown}");
        let missing = builder(&conn(None), &env).err().unwrap();
        assert_eq!(missing.code, EXIT_CONNECT);
        assert!(missing.message.unwrap().contains("--url"));
    }
}
