//! `PgStoreBuilder`: a store's settings (URL or sqlx options, schema and table, timeouts, the
//! pool, the reaper, the transactional timeout) and connecting: the pool and the store's own
//! connections made, the schema migrated if asked, the table checked and the shared token secret
//! read or created, all within the connect timeout.

use super::*;

/// Configures and connects a [`PgStore`].
#[must_use]
pub struct PgStoreBuilder {
    options: Result<PgConnectOptions, StoreError>,
    /// The URL, password masked, for errors.
    shown: String,
    schema: String,
    table: String,
    timeout: Duration,
    connect_timeout: Duration,
    pool_size: u32,
    reap_every: Duration,
    reap_batch: u32,
    application_name: String,
    transaction_statement_timeout: Option<Duration>,
    migrate: bool,
}

impl PgStore {
    /// Connects to the database at `url` (`postgres://user:password@host:port/db?...`, libpq's
    /// forms as sqlx reads them) with the default settings: table `public.idempotency`, a 2 s
    /// bound on every call. The table must exist (see [`PgStoreBuilder::migrate`]).
    pub async fn connect(url: &str) -> Result<PgStore, StoreError> {
        Self::builder(url).connect().await
    }

    /// A builder for a store on the database at `url`.
    pub fn builder(url: &str) -> PgStoreBuilder {
        let shown = masked(url);
        let options = url.parse::<PgConnectOptions>().map_err(|e| {
            StoreError::new(
                StoreErrorKind::Config,
                format!("{shown} is not a PostgreSQL URL: {}", scrub(&e.to_string(), url)),
            )
        });
        Self::from_options(options).shown(shown)
    }

    /// A builder for a store connecting with sqlx's options (for settings a URL cannot carry).
    pub fn from_options(options: impl Into<Result<PgConnectOptions, StoreError>>) -> PgStoreBuilder {
        PgStoreBuilder {
            options: options.into(),
            shown: "the configured database".to_owned(),
            schema: DEFAULT_SCHEMA.to_owned(),
            table: DEFAULT_TABLE.to_owned(),
            timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(5),
            pool_size: 10,
            reap_every: Duration::from_secs(10),
            reap_batch: 1000,
            application_name: "idempotency".to_owned(),
            transaction_statement_timeout: None,
            migrate: false,
        }
    }
}

/// The token secrets every runtime on the table shares (see `Store::token_secrets`): the current
/// one, created by the first store that connects (`ON CONFLICT DO NOTHING`, so that racing
/// processes agree on one), and the previous one if a rotation left it, from the table beside the
/// records (`<table>_secret`, made by `migrate`). Without that table (a schema made by hand from an
/// older `schema_sql`) or its permissions, none: runtimes then sign with keys of their own, and a
/// warning says so.
async fn shared_token_secrets(conn: &mut sqlx::PgConnection, schema: &str, table: &str) -> Vec<Vec<u8>> {
    let secrets = format!("\"{schema}\".\"{table}_secret\"");
    let insert = format!("INSERT INTO {secrets} (name, secret) VALUES ('token', $1) ON CONFLICT (name) DO NOTHING");
    let select = format!("SELECT secret FROM {secrets} WHERE name IN ('token', 'token:previous') ORDER BY name");
    let read = async {
        sqlx::query(&insert).bind(crate::token::TokenKeys::fresh_secret()).execute(&mut *conn).await?;
        sqlx::query_scalar::<_, String>(&select).fetch_all(&mut *conn).await
    };
    match read.await {
        Ok(found) => found.iter().filter_map(|s| crate::token::TokenKeys::decode_secret(s)).collect(),
        Err(e) => {
            tracing::warn!(
                table = %secrets,
                error = %pg_error("token secret", e),
                "idempotency store: cannot read or create the shared token secret; this process signs tokens \
                 with a key of its own, which other instances refuse (migrate, or give every instance the same TokenKeys)"
            );
            Vec::new()
        }
    }
}

/// `url` with its password replaced by `***`, for errors and `Debug`.
pub(super) fn masked(url: &str) -> String {
    crate::store::credentials::masked(url, &["password"])
}

/// `message` with any password of `url` replaced by `***`.
pub(super) fn scrub(message: &str, url: &str) -> String {
    crate::store::credentials::scrub(message, crate::store::credentials::secrets(url, &["password"]))
}

pub(super) fn check_names(schema: &str, table: &str) -> Result<(), StoreError> {
    let config = |m: String| StoreError::new(StoreErrorKind::Config, m);
    sql::check_identifier("schema", schema).map_err(config)?;
    sql::check_identifier("table", table).map_err(config)?;
    if schema.len() + table.len() > sql::MAX_NAME_BYTES {
        return Err(config(format!(
            "schema {schema:?} and table {table:?} have more than {} bytes together",
            sql::MAX_NAME_BYTES
        )));
    }
    Ok(())
}

impl PgStoreBuilder {
    fn shown(mut self, shown: String) -> Self {
        self.shown = shown;
        self
    }

    /// The schema of the records table (default `public`): a plain identifier.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// The records table's name (default `idempotency`): a plain identifier (lower-case ASCII
    /// letters, digits, underscores); with the schema's, at most 52 bytes.
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// The bound on every store call (default 2 s): each statement runs under this
    /// `statement_timeout`, and the client waits for its answer a grace longer, counted from when
    /// it is sent (a tenth of the timeout, at least 100 ms, at most a second: so that the
    /// server's cancel, which says the statement took nothing, comes first); past that the call
    /// fails with a store error of kind `Timeout`. Before sending, a call waits at most this
    /// long for a pooled connection (past it: `Unavailable`, nothing sent).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The bound on connecting, checking the table and migrating (default 5 s); and on opening
    /// each connection later (after a restart, say), which goes on in the background when the
    /// call that needed it gives up first (see docs/postgres.md, "Bounds").
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The most connections the store's pool opens (default 10, at least 1); a transactional body
    /// holds one for its transaction. Besides the pool, the store keeps connections of its own
    /// that bodies never take: two for renewals and releases, one for `LISTEN` (waiters and
    /// replay caches), so that a pool full of running bodies never starves a lease's renewal, a
    /// release, or the commit of a caller whose waiters are woken by notification.
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size.max(1);
        self
    }

    /// How often expired records are deleted, and how many at most at a time (defaults: every
    /// 10 s, 1000; again at once while a batch comes back full). Expired records are treated as
    /// absent by every statement whether reaped or not. A zero interval turns the reaper off
    /// (another process, or a job of yours, reaps).
    pub fn reap(mut self, every: Duration, batch: u32) -> Self {
        self.reap_every = every;
        self.reap_batch = batch.max(1);
        self
    }

    /// The `application_name` of the store's sessions (default `idempotency`), as
    /// `pg_stat_activity` shows them.
    pub fn application_name(mut self, name: impl Into<String>) -> Self {
        self.application_name = name.into();
        self
    }

    /// The `statement_timeout` of a transactional body's own statements (default: none; the
    /// store's own timeout bounds the store's statements only).
    pub fn transaction_statement_timeout(mut self, timeout: Duration) -> Self {
        self.transaction_statement_timeout = Some(timeout);
        self
    }

    /// Creates the records table (with its sequence and index) at connect where it is missing,
    /// instead of failing. Safe with several processes starting at once.
    pub fn migrate(mut self) -> Self {
        self.migrate = true;
        self
    }

    /// Connects: opens a first connection, migrates if asked, and checks the records table is
    /// there; all of it within the connect timeout. An unreachable database, refused
    /// credentials or a missing table are errors now, not at the first call.
    pub async fn connect(self) -> Result<PgStore, StoreError> {
        check_names(&self.schema, &self.table)?;
        let shown = self.shown.clone();
        let named = |e: StoreError| e.prefixed(&shown);
        let options = self
            .options
            .map_err(named)?
            .application_name(&self.application_name)
            .options([("statement_timeout", millis(self.timeout).to_string())]);
        // Opening a connection is bounded by the connect timeout, not by a call's: see pools.rs.
        let side = |connections: u32| pools::options(connections, self.connect_timeout);
        let pool = Pool::lazy(side(self.pool_size), options.clone(), self.timeout);
        let control = Pool::lazy(side(CONTROL_CONNECTIONS), options.clone(), self.timeout);
        let listen_pool: PgPool = side(1).max_lifetime(None).idle_timeout(None).connect_lazy_with(options);
        let mut sql = Statements::new(&self.schema, &self.table);
        let table = format!("\"{}\".\"{}\"", self.schema, self.table);
        let ready = async {
            let mut conn = pool.sqlx().acquire().await.map_err(|e| pg_error("connect", e))?;
            if self.migrate {
                sqlx::raw_sql(&sql.migrate_quietly).execute(&mut *conn).await.map_err(|e| pg_error("migrate", e))?;
            }
            // The columns of the table's latest version: a table of an earlier one (not migrated)
            // is named at connect, not at the first call that needs them.
            let check = format!("SELECT key, attempt, lease_end, hold, last_error FROM {table} LIMIT 0");
            sqlx::query(&check).execute(&mut *conn).await.map_err(|e| {
                let e = pg_error("check the records table", e);
                let message = format!(
                    "{} (a table of schema version 1 lacks the columns of attempts: run PgStore::migrate, or the \
                     builder's migration, or apply PgStore::schema_sql)",
                    e.message()
                );
                StoreError::new(e.kind(), message)
            })?;
            // The acquire function of schema version 3, where the user may execute it; without it
            // (a table migrated by an earlier version, or by hand from it), the same statement.
            let call = "SELECT coalesce(has_function_privilege(to_regprocedure($1), 'EXECUTE'), false)";
            let callable: bool = sqlx::query_scalar(call)
                .bind(&sql.acquire_function)
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| pg_error("check the acquire function", e))?;
            if !callable {
                tracing::warn!(
                    function = %sql.acquire_function,
                    "idempotency: no acquire function this user may execute; first executions send the longer \
                     statement (run PgStore::migrate, or the builder's migration, or apply PgStore::schema_sql)"
                );
            }
            Ok((shared_token_secrets(&mut conn, &self.schema, &self.table).await, callable))
        };
        // The connect timeout bounds everything, including the pool's own wait for a connection.
        let connected = tokio::time::timeout(self.connect_timeout, ready).await;
        let token_secrets = match connected {
            Ok(Ok((secrets, callable))) => {
                if callable {
                    sql.acquire = sql.acquire_call.clone();
                }
                secrets
            }
            Ok(Err(e)) => return Err(named(e)),
            Err(_) => return Err(named(StoreError::timeout("connect", self.connect_timeout))),
        };
        let begin = match self.transaction_statement_timeout {
            Some(t) => format!("BEGIN; SET LOCAL statement_timeout = {}", millis(t)),
            None => "BEGIN; SET LOCAL statement_timeout = 0".to_owned(),
        };
        let inner = Arc::new_cyclic(|weak| Inner {
            pool,
            control,
            listen_pool,
            sql,
            table,
            timeout: self.timeout,
            connect_timeout: self.connect_timeout,
            begin,
            flights: Flights::default(),
            listener: OnceCell::new(),
            token_secrets,
            reaper: (!self.reap_every.is_zero()).then(|| start_reaper(weak.clone(), self.reap_every, self.reap_batch)),
        });
        Ok(PgStore { inner })
    }
}

impl std::fmt::Debug for PgStoreBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStoreBuilder")
            .field("database", &self.shown)
            .field("schema", &self.schema)
            .field("table", &self.table)
            .field("timeout", &self.timeout)
            .field("pool_size", &self.pool_size)
            .finish_non_exhaustive()
    }
}
