//! `RedisStoreBuilder`: a store's settings (a URL or a fred configuration, the prefix, the pool,
//! timeouts, TLS, replica acknowledgement), from code or from the environment, and connecting:
//! every connection up, the scripts loaded, the server's version read, the shared token secret
//! read or created, all within the connect timeout.

use super::*;

/// Configures and connects a [`RedisStore`].
#[must_use]
pub struct RedisStoreBuilder {
    config: Result<Config, StoreError>,
    /// The URL asks for TLS (or the fred configuration has it).
    tls: bool,
    #[cfg(feature = "tls")]
    tls_settings: Result<tls::TlsSettings, StoreError>,
    /// What errors call the servers: the URL, password masked.
    shown: String,
    /// The URL as given, to scrub its passwords from fred's messages (never shown).
    url: Option<String>,
    prefix: String,
    pool_size: usize,
    timeout: Duration,
    connect_timeout: Duration,
    reconnect: ReconnectPolicy,
    acks: Option<ReplicaAcks>,
}

impl RedisStore {
    /// Connects to the Redis at `url` with the default settings (prefix `idem`, 2 s timeout).
    ///
    /// The URL is fred's: `redis://[user:password@]host:port/db`, `rediss://` for TLS,
    /// `redis-cluster://host:port?node=host2:port2` (`rediss-cluster://`),
    /// `redis-sentinel://host:port?sentinelServiceName=mymaster` (`rediss-sentinel://`), and the
    /// same with `valkey` for `redis`. Any other scheme is an error naming the URL (its password
    /// masked). A TLS URL connects over TLS (feature `tls`, on by default; without it, the URL
    /// is an error), trusting the system's root certificates unless the builder is given a CA
    /// ([`tls_ca_file`](RedisStoreBuilder::tls_ca_file)).
    pub async fn connect(url: &str) -> Result<RedisStore, StoreError> {
        Self::builder(url).connect().await
    }

    /// A builder for a store on the Redis at `url` (see [`connect`](Self::connect)).
    pub fn builder(url: &str) -> RedisStoreBuilder {
        let mut builder = match url::parse(url) {
            Ok(parsed) => {
                let mut builder = Self::from_config(Ok::<_, Error>(parsed.config));
                builder.tls = parsed.tls;
                builder.shown = parsed.shown;
                builder
            }
            Err(e) => {
                let mut builder = Self::from_config(Err(Error::new(ErrorKind::Config, "")));
                builder.shown = url::masked(url);
                builder.config = Err(e);
                builder
            }
        };
        builder.url = Some(url.to_owned());
        builder
    }

    /// Connects with the settings of the environment (see
    /// [`RedisStoreBuilder::from_env`]).
    pub async fn from_env() -> Result<RedisStore, StoreError> {
        RedisStoreBuilder::from_env()?.connect().await
    }

    /// A builder for a store on a fred [`Config`] (for settings a URL cannot carry). Its TLS
    /// setting is used as it is, unless the builder is given a CA or a client certificate.
    pub fn from_config(config: impl Into<Result<Config, Error>>) -> RedisStoreBuilder {
        let config = config.into().map_err(|e| store_error("configure", e));
        #[cfg(feature = "tls")]
        let tls = config.as_ref().is_ok_and(|c| c.tls.is_some());
        #[cfg(not(feature = "tls"))]
        let tls = false;
        let shown = match &config {
            Ok(c) => describe(c),
            Err(_) => "the configured servers".to_owned(),
        };
        RedisStoreBuilder {
            config,
            tls,
            #[cfg(feature = "tls")]
            tls_settings: Ok(tls::TlsSettings::default()),
            shown,
            url: None,
            prefix: DEFAULT_PREFIX.to_owned(),
            pool_size: 1,
            timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(5),
            reconnect: ReconnectPolicy::new_exponential(0, 50, 2_000, 2),
            acks: None,
        }
    }
}

/// The environment variables [`RedisStoreBuilder::from_env`] reads, with what each sets.
pub const ENV_VARS: &[(&str, &str)] = &[
    (
        "IDEMPOTENCY_REDIS_URL",
        "the store's URL (required): redis://, rediss://, redis-cluster://, redis-sentinel://...",
    ),
    ("IDEMPOTENCY_PREFIX", "the key prefix (default idem)"),
    ("IDEMPOTENCY_TIMEOUT", "the bound on every store call, a duration like 2s (default 2s)"),
    ("IDEMPOTENCY_CONNECT_TIMEOUT", "the bound on connecting (default 5s)"),
    ("IDEMPOTENCY_POOL_SIZE", "connections to spread commands over (default 1)"),
    (
        "IDEMPOTENCY_REPLICA_ACKS",
        "replicas that must acknowledge acquires and commits, as N or N/timeout (500ms by default)",
    ),
    ("IDEMPOTENCY_TLS_CA_FILE", "a PEM file of CAs to trust for rediss:// instead of the system's"),
    ("IDEMPOTENCY_TLS_CLIENT_CERT_FILE", "a PEM client certificate chain for TLS (with the key below)"),
    ("IDEMPOTENCY_TLS_CLIENT_KEY_FILE", "its PEM private key"),
];

/// The value of variable `name`, parsed by `parse`; a bad value is a `Config` error naming it.
fn env_parsed<T>(
    vars: &dyn Fn(&str) -> Option<String>,
    name: &str,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Result<Option<T>, StoreError> {
    match vars(name) {
        None => Ok(None),
        Some(text) => parse(text.trim())
            .map(Some)
            .map_err(|why| StoreError::new(StoreErrorKind::Config, format!("{name}: {why}"))),
    }
}

impl RedisStoreBuilder {
    /// A builder with the settings of the process's environment: `IDEMPOTENCY_REDIS_URL` (required)
    /// and the optional variables of [`ENV_VARS`]. A missing URL or a value that does not parse
    /// is a `Config` error naming the variable.
    pub fn from_env() -> Result<RedisStoreBuilder, StoreError> {
        Self::from_vars(&|name| std::env::var(name).ok())
    }

    /// Like [`from_env`](Self::from_env), with the variables looked up by `vars` (a
    /// configuration system, a test).
    ///
    /// ```
    /// use idempotency::RedisStoreBuilder;
    ///
    /// let vars = |name: &str| match name {
    ///     "IDEMPOTENCY_REDIS_URL" => Some("redis://127.0.0.1:6379".to_owned()),
    ///     "IDEMPOTENCY_TIMEOUT" => Some("500ms".to_owned()),
    ///     _ => None,
    /// };
    /// let builder = RedisStoreBuilder::from_vars(&vars).unwrap();
    /// assert!(RedisStoreBuilder::from_vars(&|_: &str| None).is_err()); // no URL
    /// ```
    pub fn from_vars(vars: &dyn Fn(&str) -> Option<String>) -> Result<RedisStoreBuilder, StoreError> {
        let url = vars("IDEMPOTENCY_REDIS_URL").ok_or_else(|| {
            StoreError::new(StoreErrorKind::Config, "IDEMPOTENCY_REDIS_URL is not set: it names the Redis to use")
        })?;
        let duration = |t: &str| crate::parse_duration(t);
        let mut builder = RedisStore::builder(url.trim());
        if let Some(prefix) = vars("IDEMPOTENCY_PREFIX") {
            builder = builder.prefix(prefix.trim());
        }
        if let Some(t) = env_parsed(vars, "IDEMPOTENCY_TIMEOUT", duration)? {
            builder = builder.timeout(t);
        }
        if let Some(t) = env_parsed(vars, "IDEMPOTENCY_CONNECT_TIMEOUT", duration)? {
            builder = builder.connect_timeout(t);
        }
        if let Some(n) = env_parsed(vars, "IDEMPOTENCY_POOL_SIZE", |t| t.parse::<usize>().map_err(|e| e.to_string()))? {
            builder = builder.pool_size(n);
        }
        let acks = env_parsed(vars, "IDEMPOTENCY_REPLICA_ACKS", |t| {
            let (n, timeout) = t.split_once('/').unwrap_or((t, "500ms"));
            Ok((n.trim().parse::<u32>().map_err(|e| e.to_string())?, duration(timeout.trim())?))
        })?;
        if let Some((n, timeout)) = acks {
            builder = builder.replica_acks(n, timeout);
        }
        let file = |name: &str| vars(name).map(|p| (name.to_owned(), p));
        let tls_files = [
            file("IDEMPOTENCY_TLS_CA_FILE"),
            file("IDEMPOTENCY_TLS_CLIENT_CERT_FILE"),
            file("IDEMPOTENCY_TLS_CLIENT_KEY_FILE"),
        ];
        #[cfg(feature = "tls")]
        {
            let read = |(name, path): &(String, String)| {
                std::fs::read(path.trim())
                    .map_err(|e| StoreError::new(StoreErrorKind::Config, format!("{name}: cannot read {path}: {e}")))
            };
            let [ca, cert, key] = tls_files;
            if let Some(ca) = &ca {
                builder = builder.tls_ca_pem(read(ca)?);
            }
            match (&cert, &key) {
                (Some(cert), Some(key)) => builder = builder.tls_client_cert_pem(read(cert)?, read(key)?),
                (None, None) => {}
                _ => {
                    return Err(StoreError::new(
                        StoreErrorKind::Config,
                        "IDEMPOTENCY_TLS_CLIENT_CERT_FILE and IDEMPOTENCY_TLS_CLIENT_KEY_FILE go together",
                    ))
                }
            }
        }
        #[cfg(not(feature = "tls"))]
        if let Some((name, _)) = tls_files.into_iter().flatten().next() {
            return Err(StoreError::new(
                StoreErrorKind::Config,
                format!("{name} is set, and this build has no TLS (feature `tls`)"),
            ));
        }
        Ok(builder)
    }

    /// The prefix of every key the store writes (default `idem`); it may not contain braces.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How many connections to spread commands over (default 1: fred pipelines concurrent
    /// commands on one connection).
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size.max(1);
        self
    }

    /// The bound on every store call (default 2 s): past it the call fails with a store error of
    /// kind `Timeout` instead of waiting for Redis to come back.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The bound on connecting (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How the connections come back after they drop (default: forever, exponential backoff
    /// from 50 ms to 2 s).
    pub fn reconnect_policy(mut self, policy: ReconnectPolicy) -> Self {
        self.reconnect = policy;
        self
    }

    /// After each acquire and commit, wait (Redis `WAIT`) until `replicas` replicas have the
    /// write, for at most `timeout`. With fewer, an acquire gives the key back and fails, and a
    /// commit fails (its record stays on the primary: a retry replays it unless a failover lost
    /// it), both with a store error of kind [`StoreErrorKind::Replication`].
    ///
    /// This narrows, and does not close, the window in which a failover loses a record: `WAIT`
    /// is not a consensus protocol (a replica that acknowledged may still not be the one
    /// promoted, and the write stays on the primary even when too few acknowledge). See
    /// `docs/guarantees.md`.
    pub fn replica_acks(mut self, replicas: u32, timeout: Duration) -> Self {
        self.acks = (replicas > 0).then_some(ReplicaAcks { replicas, timeout });
        self
    }

    /// Trusts the CA certificates in the PEM file at `path` for TLS, instead of the system's
    /// root certificates (feature `tls`). The URL must be a TLS one (`rediss://`).
    #[cfg(feature = "tls")]
    pub fn tls_ca_file(mut self, path: impl AsRef<std::path::Path>) -> Self {
        let path = path.as_ref();
        match std::fs::read(path) {
            Ok(pem) => self.tls_ca_pem(pem),
            Err(e) => {
                self.tls_settings = Err(StoreError::new(
                    StoreErrorKind::Config,
                    format!("cannot read the TLS CA file {}: {e}", path.display()),
                ));
                self
            }
        }
    }

    /// Trusts the CA certificates in `pem` for TLS, instead of the system's root certificates
    /// (feature `tls`). The URL must be a TLS one (`rediss://`).
    #[cfg(feature = "tls")]
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        if let Ok(settings) = &mut self.tls_settings {
            settings.ca_pem = Some(pem.into());
        }
        self
    }

    /// Presents a client certificate over TLS (feature `tls`): the chain and its private key,
    /// both PEM, for servers with `tls-auth-clients yes`.
    #[cfg(feature = "tls")]
    pub fn tls_client_cert_pem(mut self, chain: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> Self {
        if let Ok(settings) = &mut self.tls_settings {
            settings.client_pem = Some((chain.into(), key.into()));
        }
        self
    }

    /// The configuration to connect with, TLS set up as asked: a TLS URL without the `tls`
    /// feature, or TLS settings for a URL that is not TLS, are errors, never plaintext.
    fn resolved_config(&mut self) -> Result<Config, StoreError> {
        let config = std::mem::replace(&mut self.config, Err(StoreError::new(StoreErrorKind::Config, "")));
        #[allow(unused_mut)]
        let mut config = config?;
        #[cfg(feature = "tls")]
        {
            let settings = std::mem::replace(&mut self.tls_settings, Ok(tls::TlsSettings::default()))?;
            if settings.is_set() && !self.tls {
                return Err(StoreError::new(
                    StoreErrorKind::Config,
                    format!("TLS settings were given, but {} is not a TLS URL (rediss://)", self.shown),
                ));
            }
            if self.tls && (settings.is_set() || self.url.is_some()) {
                config.tls = Some(tls::connector(&settings)?.into());
            }
        }
        #[cfg(not(feature = "tls"))]
        if self.tls {
            return Err(StoreError::new(
                StoreErrorKind::Config,
                format!(
                    "{} asks for TLS, and this build has none: enable the `tls` feature of idempotency \
                     (refusing to connect in plaintext)",
                    self.shown
                ),
            ));
        }
        Ok(config)
    }

    /// Connects the pool. Everything it does (connecting every connection, loading the scripts,
    /// reading the server's version) is bounded by the connect timeout as a whole: an
    /// unreachable server, a refused port or a listener that never answers is an error within
    /// it.
    pub async fn connect(mut self) -> Result<RedisStore, StoreError> {
        keys::check_prefix(&self.prefix).map_err(|m| StoreError::new(StoreErrorKind::Config, m))?;
        let config = self.resolved_config()?;
        let (shown, url) = (self.shown.clone(), self.url.clone());
        // Errors name the servers (password masked) and never carry a password fred put in.
        let named = move |e: StoreError| {
            let e = e.prefixed(&shown);
            match &url {
                Some(url) => StoreError::new(e.kind(), url::scrub(e.message(), url)),
                None => e,
            }
        };
        let clustered = config.server.is_clustered();
        let mut builder = Builder::from_config(config);
        builder
            .set_policy(self.reconnect)
            // Commands are bounded by the store's own timeout (see `bounded`), not fred's: fred's
            // does not cover EVAL/EVALSHA queued while Redis is down, and a second timer per
            // command costs throughput.
            .with_connection_config(|c| {
                c.connection_timeout = self.connect_timeout;
                c.internal_command_timeout = self.timeout;
            });
        let pool = builder.build_pool(self.pool_size).map_err(|e| store_error("configure", e))?;
        let closing = Arc::new(AtomicBool::new(false));
        let tasks: Vec<_> = pool.clients().iter().map(|c| supervise::supervise(c.clone(), closing.clone())).collect();
        let ready = async {
            for client in pool.clients() {
                connected(client).await.map_err(|e| store_error("connect", e))?;
            }
            // Load the scripts now (on every primary of a cluster), so that the first call of
            // each does not pay a NOSCRIPT round trip: on a slow link that doubles the first
            // renewal's time. A failure here is harmless: EVALSHA falls back to EVAL.
            for script in scripts::all() {
                let _ = script.load(pool.next()).await;
            }
            let server = server_info(pool.next()).await?;
            let secrets = shared_token_secrets(pool.next(), &self.prefix, server.has_set_nx_get()).await;
            Ok::<_, StoreError>((server, secrets))
        };
        let (server, token_secrets) = match within("connect", self.connect_timeout, ready).await.map_err(named) {
            Ok(found) => found,
            Err(e) => {
                // Not awaited: closing a client that never connected can itself wait.
                closing.store(true, Ordering::Release);
                tasks.iter().for_each(|t| t.abort());
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    rt.spawn(async move {
                        let _ = tokio::time::timeout(Duration::from_secs(5), pool.quit()).await;
                    });
                }
                return Err(e);
            }
        };
        let store = RedisStore {
            inner: Arc::new(Inner {
                pool,
                builder,
                shown: self.shown,
                prefix: self.prefix,
                timeout: self.timeout,
                acks: self.acks,
                closing,
                tasks,
                clustered,
                plain_acquire: server.has_set_nx_get(),
                compare_and_set: AtomicBool::new(server.has_set_ifeq()),
                server,
                subscriptions: OnceCell::new(),
                token_secrets,
            }),
        };
        // fred names its own log lines (a lost connection, a reconnect) by a client id it makes
        // up (`fred-J0TYP7Cnok`) and cannot be given one: this line says which ids are this
        // store's, and which servers it talks to.
        let clients: Vec<String> = store.inner.pool.clients().iter().map(|c| c.id().to_string()).collect();
        tracing::info!(
            store = %store.inner.shown,
            clients = %clients.join(","),
            server = %store.inner.server,
            acquire = if store.inner.plain_acquire { "SET NX GET" } else { "script" },
            commit = %store.commit_path(),
            release = "script",
            "idempotency store connected"
        );
        Ok(store)
    }
}

/// Waits for `client`'s first connection. fred's `wait_for_connect` reads the client's state and
/// only then subscribes to the connect notification: a connection that completes between the two
/// is never announced to it, and it waits forever (2 to 3 of 1,600 connects to a server on
/// loopback did, on a 2-core machine: `connect_never_misses_its_connection`). The state is set
/// before the notification is sent, so a look at the state now and then ends the wait that missed
/// it; errors still come from `wait_for_connect`.
async fn connected(client: &Client) -> Result<(), Error> {
    let missed = async {
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if client.is_connected() {
                return Ok(());
            }
        }
    };
    tokio::select! {
        connected = client.wait_for_connect() => connected,
        connected = missed => connected,
    }
}

/// The token secrets every runtime on the store shares (see `Store::token_secrets`): the current
/// one, created by the first process that connects (`SET NX`, so that racing processes agree on
/// one), and the previous one if a rotation left it. A store that cannot read or write them (a
/// user without the permission, a read-only replica) has none: its runtimes then sign with keys
/// of their own, and a warning says so.
async fn shared_token_secrets(client: &Client, prefix: &str, nx_get: bool) -> Vec<Vec<u8>> {
    let key = keys::token_secret(prefix);
    let ours = crate::token::TokenKeys::fresh_secret();
    let read = async {
        let existing: Option<String> = if nx_get {
            Box::pin(client.set(key.as_str(), ours.as_str(), None, Some(SetOptions::NX), true)).await?
        } else {
            let _: Value = Box::pin(client.set(key.as_str(), ours.as_str(), None, Some(SetOptions::NX), false)).await?;
            Box::pin(client.get(key.as_str())).await?
        };
        let previous: Option<String> = Box::pin(client.get(format!("{key}:previous"))).await?;
        Ok::<_, Error>([Some(existing.unwrap_or(ours)), previous])
    };
    match read.await {
        Ok(found) => found.into_iter().flatten().filter_map(|s| crate::token::TokenKeys::decode_secret(&s)).collect(),
        Err(e) => {
            tracing::warn!(
                key = %key,
                error = %store_error("token secret", e),
                "idempotency store: cannot read or create the shared token secret; this process signs tokens \
                 with a key of its own, which other instances refuse (give every instance the same TokenKeys)"
            );
            Vec::new()
        }
    }
}

/// What the server is, from `INFO server`.
async fn server_info(client: &Client) -> Result<server::Server, StoreError> {
    let info: String = client
        .info(Some(fred::types::InfoKind::Server))
        .await
        .map_err(|e| store_error("read the server's version", e))?;
    server::Server::from_info(&info)
}

/// The servers a fred configuration names, for error messages.
fn describe(config: &Config) -> String {
    use fred::types::config::ServerConfig;
    let hosts = |servers: &[fred::types::config::Server]| {
        servers.iter().map(|s| format!("{}:{}", s.host, s.port)).collect::<Vec<_>>().join(",")
    };
    match &config.server {
        ServerConfig::Centralized { server } => format!("redis server {}:{}", server.host, server.port),
        ServerConfig::Clustered { hosts: servers, .. } => format!("redis cluster {}", hosts(servers)),
        ServerConfig::Sentinel { hosts: servers, service_name, .. } => {
            format!("redis sentinels {} (service {service_name})", hosts(servers))
        }
        #[allow(unreachable_patterns)]
        _ => "the configured servers".to_owned(),
    }
}

impl std::fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The servers as errors show them: never a password.
        f.debug_struct("RedisStoreBuilder")
            .field("servers", &self.shown)
            .field("tls", &self.tls)
            .field("prefix", &self.prefix)
            .field("pool_size", &self.pool_size)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish_non_exhaustive()
    }
}
