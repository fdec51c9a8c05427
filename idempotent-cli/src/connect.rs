//! From the connection options to a connected store: Redis (the library's own configuration
//! from the environment, `RedisStoreBuilder::from_vars`, with the command line's options in place
//! of the variables they name) or PostgreSQL (a `postgres://` URL: `PgStore` on `--schema` and
//! `--table`, its reaper off and nothing migrated: the CLI reads and deletes rows, never makes
//! tables).

use std::time::Duration;

use idempotent_core::{Idempotency, PgStore, RedisStore, RedisStoreBuilder};

use crate::args::Connection;
use crate::failure::{Failure, EXIT_CONNECT, EXIT_REDIS_ONLY};

/// The store the records are in.
pub enum Backend {
    Redis(RedisStore),
    Postgres(PgStore),
}

/// What every command works with.
pub struct Ctx {
    /// The store, for what only it has (Redis record keys, a PostgreSQL table).
    pub backend: Backend,
    /// The runtime on it, for the operator API (`inspect`, `forget`, `scan`).
    pub idem: Idempotency,
    /// Where the records are, for messages: the key prefix of Redis, the table of PostgreSQL.
    pub namespace: String,
    /// The bound on every command.
    pub timeout: Duration,
}

impl Ctx {
    /// The Redis store, for a command that only Redis can serve; on PostgreSQL, exit code 7 with
    /// `why` (what the command needs that PostgreSQL has not).
    pub fn redis(&self, command: &str, why: &str) -> Result<&RedisStore, Failure> {
        match &self.backend {
            Backend::Redis(store) => Ok(store),
            Backend::Postgres(_) => Err(Failure::new(
                EXIT_REDIS_ONLY,
                format!("{command} works on Redis only: {why} (the records of {} are in PostgreSQL)", self.namespace),
            )),
        }
    }

    /// Where `key`'s record is, as (what, where): its Redis key, or its row of the table.
    pub fn location(&self, key: &str) -> (&'static str, String) {
        match &self.backend {
            Backend::Redis(store) => ("redis key", store.record_key(key)),
            Backend::Postgres(store) => {
                let stored = PgStore::stored_key(key).replace('\'', "''");
                ("postgres row", format!("{} WHERE key = '{stored}'", store.table()))
            }
        }
    }

    /// Closes the store's connections.
    pub async fn close(&self) {
        match &self.backend {
            Backend::Redis(store) => store.quit().await,
            Backend::Postgres(store) => store.close().await,
        }
    }
}

/// Whether `url` names a PostgreSQL server.
fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// Connects to the store the options name; every failure here is exit code 3.
pub async fn connect(conn: &Connection) -> Result<Ctx, Failure> {
    let cannot = |e: idempotent_core::StoreError| Failure::new(EXIT_CONNECT, format!("cannot connect: {e}"));
    if let Some(url) = conn.url.as_deref().filter(|u| is_postgres(u)) {
        let store = PgStore::builder(url)
            .schema(conn.schema.clone())
            .table(conn.table.clone())
            .timeout(conn.timeout)
            .connect_timeout(conn.timeout)
            .pool_size(2)
            // Reaping is the services' job; an operator's tool only looks and deletes.
            .reap(Duration::ZERO, 1)
            .application_name("idempotency-cli")
            .connect()
            .await
            .map_err(cannot)?;
        let namespace = store.table().to_owned();
        return Ok(Ctx {
            idem: Idempotency::new(store.clone()),
            backend: Backend::Postgres(store),
            namespace,
            timeout: conn.timeout,
        });
    }
    let builder = builder(conn, &|name| std::env::var(name).ok())?;
    let store = builder.connect().await.map_err(cannot)?;
    Ok(Ctx {
        idem: Idempotency::new(store.clone()),
        backend: Backend::Redis(store),
        namespace: conn.namespace.clone(),
        timeout: conn.timeout,
    })
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
            schema: "public".into(),
            table: "idempotency".into(),
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
