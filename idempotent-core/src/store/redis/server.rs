//! What the server the store connected to is, and so which commands a transition can use:
//! read once at connect from `INFO server`. Valkey reports itself in `server_name` and
//! `valkey_version` (its `redis_version` stays at 7.2.4 for clients that test it); Redis only
//! in `redis_version`.

use std::fmt;

use crate::error::StoreError;

/// How a [`RedisStore`](super::RedisStore) commits a completed result (a `keep` above zero).
///
/// ```no_run
/// # async fn f() -> Result<(), idempotent_core::StoreError> {
/// use idempotent_core::store::redis::CommitPath;
/// use idempotent_core::RedisStore;
///
/// let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
/// if store.commit_path() == CommitPath::Script {
///     println!("{}: commits run a Lua script", store.server());
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CommitPath {
    /// `SET key <completed> IFEQ <pending> PX keep`: a plain compare-and-set command, on servers
    /// that have it (Valkey 8.1 and later, Redis 8.4 and later). It sets the record only when the
    /// key still holds exactly what this owner's acquire wrote: held by this owner, nobody
    /// waiting. Otherwise (a waiter marked the record, the lease was lost, the key is gone or
    /// was committed already) the commit runs the script, which decides as it always does.
    CompareAndSet,
    /// The `commit.lua` script, on every commit: servers without `SET ... IFEQ`.
    Script,
}

impl CommitPath {
    /// A short name for logs and the benchmark: `SET IFEQ` or `script`.
    pub fn as_str(self) -> &'static str {
        match self {
            CommitPath::CompareAndSet => "SET IFEQ",
            CommitPath::Script => "script",
        }
    }
}

impl fmt::Display for CommitPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The server's product and version, from `INFO server`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Server {
    /// `redis` or `valkey`.
    pub name: &'static str,
    /// As the server reports it, e.g. `8.1.1`.
    pub version: String,
    /// Major and minor, for the feature tests.
    pub release: (u32, u32),
}

impl Server {
    /// Reads `INFO server`'s text.
    pub fn from_info(info: &str) -> Result<Server, StoreError> {
        let field = |name: &str| {
            info.lines().find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(':'))).map(str::trim)
        };
        let (name, version) = match field("valkey_version") {
            Some(v) => ("valkey", v),
            None => ("redis", field("redis_version").unwrap_or_default()),
        };
        let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
        let release = match (parts.next().flatten(), parts.next().flatten()) {
            (Some(major), minor) => (major, minor.unwrap_or(0)),
            _ => {
                return Err(StoreError::reply(
                    "read the server's version",
                    format_args!("no {name}_version in INFO server: {version:?}"),
                ))
            }
        };
        Ok(Server { name, version: version.to_owned(), release })
    }

    /// `SET ... NX GET` (Redis 7.0; every Valkey): a parameter-mode acquire needs no script.
    pub fn has_set_nx_get(&self) -> bool {
        self.name == "valkey" || self.release >= (7, 0)
    }

    /// `SET ... IFEQ` (Valkey 8.1, Redis 8.4).
    pub fn has_set_ifeq(&self) -> bool {
        match self.name {
            "valkey" => self.release >= (8, 1),
            _ => self.release >= (8, 4),
        }
    }
}

impl fmt::Display for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.name, self.version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_are_told_apart_by_info() {
        let valkey = Server::from_info(
            "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.1\r\nredis_mode:standalone\r\n",
        )
        .unwrap();
        assert_eq!((valkey.name, valkey.release, valkey.to_string().as_str()), ("valkey", (8, 1), "valkey 8.1.1"));
        assert!(valkey.has_set_ifeq() && valkey.has_set_nx_get());
        let valkey80 = Server::from_info("redis_version:7.2.4\r\nvalkey_version:8.0.1\r\n").unwrap();
        assert!(!valkey80.has_set_ifeq() && valkey80.has_set_nx_get());
        let redis7 = Server::from_info("# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:0\r\n").unwrap();
        assert_eq!(redis7.to_string(), "redis 7.0.15");
        assert!(!redis7.has_set_ifeq() && redis7.has_set_nx_get());
        assert!(Server::from_info("redis_version:8.4.0\r\n").unwrap().has_set_ifeq());
        assert!(!Server::from_info("redis_version:8.2.3\r\n").unwrap().has_set_ifeq());
        let redis6 = Server::from_info("redis_version:6.2.14\r\n").unwrap();
        assert!(!redis6.has_set_nx_get() && !redis6.has_set_ifeq());
        // A prefix of another field's name is not that field.
        assert!(Server::from_info("redis_version_x:9\r\n").is_err());
        assert!(Server::from_info("").unwrap_err().to_string().contains("no redis_version"));
    }
}
