//! `RedisStore`: the production store, on the `fred` client. Each transition is one command:
//! a Lua script (see `lua/`), or a plain command where one keeps the same guarantees (a script
//! costs Redis several times a plain command): for a parameter-mode acquire, `SET NX GET`, whose
//! reply is read here, with a `TIME` right behind it on the same connection for the fencing
//! token; for a commit on a server with compare-and-set, `SET IFEQ` (see `server.rs`). Each call is bounded by the
//! store's own timeout, and the client reconnects by itself. Time always comes from the server:
//! the store keeps no estimate of Redis's clock.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::clients::Pool;
use fred::prelude::*;
use fred::types::{CustomCommand, Expiration, SetOptions};
use tokio::sync::OnceCell;

use super::{
    within, AcquireOutcome, AcquireRequest, CommitRequest, Forgotten, Inspected, Lease, PurgeHandler, ScanPage, Store,
    StoreFuture, Transition, Watcher,
};
use crate::error::{StoreError, StoreErrorKind};
use crate::telemetry::logged_key;

mod keys;
pub(crate) mod record;
mod replies;
mod scripts;
mod server;
mod supervise;
#[cfg(feature = "tls")]
mod tls;
pub(crate) mod url;
mod watch;

pub use fred;
pub use server::CommitPath;

/// The default prefix of every key the store writes.
pub const DEFAULT_PREFIX: &str = "idem";

/// The production store: records in Redis (standalone, Sentinel or Cluster, by URL), shared by
/// every process that connects to it.
///
/// ```no_run
/// # async fn f() -> Result<(), idempotent_core::StoreError> {
/// use std::time::Duration;
/// use idempotent_core::{Idempotency, RedisStore};
///
/// let store = RedisStore::builder("redis://127.0.0.1:6379")
///     .prefix("orders-svc")
///     .timeout(Duration::from_secs(1))
///     .connect()
///     .await?;
/// let idem = Idempotency::new(store);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    builder: Builder,
    prefix: String,
    timeout: Duration,
    acks: Option<ReplicaAcks>,
    /// Set when the store closes: the supervisors then let the connection tasks end.
    closing: Arc<AtomicBool>,
    /// The connection supervisors, aborted when the store drops.
    tasks: Vec<tokio::task::JoinHandle<()>>,
    clustered: bool,
    /// What the server is (read at connect), for `server()`.
    server: server::Server,
    /// The server takes `SET ... NX GET` (Redis 7.0 and later): parameter-mode acquires need no
    /// script.
    plain_acquire: bool,
    /// The server takes `SET ... IFEQ` (Valkey 8.1, Redis 8.4): a commit that finds the record
    /// as its acquire wrote it needs no script. Turned off for good if the server refuses it
    /// after all (a node of an older version in a cluster being upgraded).
    compare_and_set: AtomicBool,
    subscriptions: OnceCell<watch::Subscriptions>,
    /// The secrets runtimes on this store sign tokens with, read at connect.
    token_secrets: Vec<Vec<u8>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.closing.store(true, Ordering::Release);
        for task in &self.tasks {
            task.abort();
        }
        let pool = self.pool.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = pool.quit().await;
            });
        }
    }
}

/// Replica acknowledgement: after an acquire and a commit, `WAIT` for this many replicas.
#[derive(Debug, Clone, Copy)]
struct ReplicaAcks {
    replicas: u32,
    timeout: Duration,
}

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

    /// The Redis key holding the record of `key` (scope included), for operators and tests:
    /// `redis-cli GET <it>` shows the record (see `lua/lib.lua` for its fields).
    pub fn record_key(&self, key: &str) -> String {
        keys::record_key(&self.inner.prefix, key)
    }

    /// The server the store connected to and its version, as `INFO server` reports them:
    /// `redis 7.0.15`, `valkey 8.1.1`.
    pub fn server(&self) -> String {
        self.inner.server.to_string()
    }

    /// How commits run on this server: a plain `SET ... IFEQ` where the server has it (Valkey
    /// 8.1+, Redis 8.4+), the commit script elsewhere. Releases, and commits that keep nothing
    /// (a lock), always run their script: `DELIFEQ` (Valkey 9) and `DELEX` (Redis 8.4) are not
    /// used yet.
    pub fn commit_path(&self) -> CommitPath {
        if self.inner.compare_and_set.load(Ordering::Relaxed) {
            CommitPath::CompareAndSet
        } else {
            CommitPath::Script
        }
    }

    /// The connection pool, for commands of your own next to the store's.
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// Closes the store's connections.
    pub async fn quit(&self) {
        self.inner.closing.store(true, Ordering::Release);
        let _ = self.inner.pool.quit().await;
        if let Some(subs) = self.inner.subscriptions.get() {
            let _ = subs.quit().await;
        }
    }

    /// Replaces the token secret every runtime on this store shares (see
    /// [`Store::token_secrets`]) with a new random one, keeping the current one as the previous,
    /// still accepted: for an operator (`idempotency rotate-token-secret`). Processes pick the new
    /// one up when they next connect; until then they sign with the old one, which every process
    /// still accepts. Tokens signed with the secret before the previous one are refused.
    pub async fn rotate_token_secret(&self) -> Result<(), StoreError> {
        let key = keys::token_secret(&self.inner.prefix);
        let previous = format!("{key}:previous");
        let client = self.inner.pool.next();
        let current: Option<String> = self.bounded("rotate", Box::pin(client.get(key.as_str()))).await?;
        if let Some(current) = current {
            let _: Value =
                self.bounded("rotate", Box::pin(client.set(previous.as_str(), current, None, None, false))).await?;
        }
        let fresh = crate::token::TokenKeys::fresh_secret();
        let _: Value = self.bounded("rotate", Box::pin(client.set(key.as_str(), fresh, None, None, false))).await?;
        Ok(())
    }

    /// The client a key's commands go through: always the same one for one key, so that they
    /// reach Redis in the order they were sent (a release after a timed-out acquire, say).
    fn client_for(&self, key: &str) -> &Client {
        let clients = self.inner.pool.clients();
        match clients.len() {
            1 => &clients[0],
            n => &clients[crate::hash::fnv1a(key.as_bytes()) as usize % n],
        }
    }

    /// Runs the fred command `op`, bounded by the store's timeout.
    async fn bounded<T>(&self, op: &str, fut: impl Future<Output = Result<T, Error>>) -> Result<T, StoreError> {
        bounded(op, self.inner.timeout, fut).await
    }

    async fn script(
        &self,
        op: &str,
        script: &fred::types::scripts::Script,
        key: &str,
        args: impl Fn() -> Vec<Value>,
    ) -> Result<Value, StoreError> {
        let client = self.client_for(key);
        let record_key = self.record_key(key);
        self.bounded(op, scripts::run(client, script, || (vec![record_key.as_str().into()], args()))).await
    }

    async fn acquire_inner(&self, req: AcquireRequest<'_>) -> Result<AcquireOutcome, StoreError> {
        // A caller that needs the record's lifetime (a replay cache, a waiter) takes the script,
        // which reads it with the record: a `PTTL` sent behind a plain `SET NX GET` could read the
        // record of the next holder if this one ended in between (a stall splitting the pipeline).
        let found = if !req.will_wait && !req.report_ttl && self.inner.plain_acquire {
            self.acquire_plain(&req).await
        } else {
            self.acquire_script(&req).await
        };
        match found {
            Ok(outcome) => {
                if matches!(outcome, AcquireOutcome::Acquired { .. }) {
                    if let Err(e) = self.replicated("acquire", req.key).await {
                        // Not durable enough to act on: give the key back and say so.
                        let _ = self.release_inner(req.key, req.owner).await;
                        return Err(e);
                    }
                }
                Ok(outcome)
            }
            // The acquire may still reach Redis later (fred re-sends queued commands after a
            // reconnect): the runtime has the store release it (`abandon`).
            Err(e) => Err(e),
        }
    }

    /// Parameter mode, nobody waiting, no lifetime asked for: `SET key <IN_PROGRESS> NX PX lease
    /// GET` takes an absent key, and otherwise changes nothing and returns what the key holds
    /// (read here as the acquire script would report it). A re-sent command finds this owner's
    /// own record.
    ///
    /// Right behind it, on the same connection, goes `TIME` (the fencing token: the server's
    /// clock, read after the `SET` ran, so after any earlier holder's record was gone). Both are
    /// sent at once: one round trip.
    async fn acquire_plain(&self, req: &AcquireRequest<'_>) -> Result<AcquireOutcome, StoreError> {
        let pending = record::pending(req.owner, req.fingerprint);
        let client = self.client_for(req.key);
        let record_key = self.record_key(req.key);
        // Boxed at once: fred's command futures are about 5 KB, and every layer holding one
        // inline would copy it. A fred command is sent when its future is first polled: `join!`
        // polls them in this order, SET, TIME, both before waiting for any reply.
        let set = Box::pin(client.set::<Value, _, _>(
            record_key.as_str(),
            pending,
            Some(Expiration::PX(millis(req.lease))),
            Some(SetOptions::NX),
            true,
        ));
        let time = Box::pin(server_time(client, &record_key));
        let replies = within("acquire", self.inner.timeout, async {
            let (set, time) = tokio::join!(set, time);
            let set = match set {
                // Not a string: the script names what it is.
                Err(e) if e.details().starts_with("WRONGTYPE") => None,
                other => Some(other.map_err(|e| store_error("acquire", e))?),
            };
            Ok((set, time.map_err(|e| store_error("acquire", e))?))
        })
        .await?;
        let (set, now_us) = replies;
        Ok(match set {
            None => return self.acquire_script(req).await,
            Some(Value::Null) => AcquireOutcome::Acquired { fence: now_us },
            Some(Value::String(s)) => record::found(s.as_bytes(), req.owner, now_us, None),
            Some(Value::Bytes(b)) => record::found(&b, req.owner, now_us, None),
            Some(other) => return Err(StoreError::reply("acquire", format_args!("unexpected reply {other:?}"))),
        })
    }

    async fn acquire_script(&self, req: &AcquireRequest<'_>) -> Result<AcquireOutcome, StoreError> {
        let args = || {
            vec![
                req.owner.into(),
                millis(req.lease).into(),
                req.fingerprint.unwrap_or("").into(),
                if req.will_wait { "1" } else { "0" }.into(),
                if req.report_ttl { "1" } else { "0" }.into(),
            ]
        };
        replies::acquire(self.script("acquire", &scripts::ACQUIRE, req.key, args).await?)
    }

    async fn renew_inner(&self, leases: &[Lease<'_>]) -> Result<Vec<bool>, StoreError> {
        // One script call per hash slot (a single one on a standalone server), all sent at once.
        let keys: Vec<String> = leases.iter().map(|l| self.record_key(l.key)).collect();
        let mut groups: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (i, key) in keys.iter().enumerate() {
            let slot = if self.inner.clustered { fred::util::redis_keyslot(key.as_bytes()) } else { 0 };
            groups.entry(slot).or_default().push(i);
        }
        let calls = groups.values().map(|members| async {
            let args = || {
                let group_keys: Vec<Key> = members.iter().map(|&i| keys[i].as_str().into()).collect();
                let values: Vec<Value> =
                    members.iter().flat_map(|&i| [leases[i].owner.into(), millis(leases[i].lease).into()]).collect();
                (group_keys, values)
            };
            let client = self.client_for(leases[members[0]].key);
            let reply = self.bounded("renew", scripts::run(client, &scripts::RENEW, args)).await?;
            Ok::<_, StoreError>(members.iter().zip(replies::renewed(reply, members.len())?))
        });
        let mut renewed = vec![false; leases.len()];
        for group in join_all(calls).await {
            for (&i, flag) in group? {
                renewed[i] = flag;
            }
        }
        Ok(renewed)
    }

    async fn commit_inner(&self, req: CommitRequest<'_>) -> Result<Transition, StoreError> {
        // What an acquire by this owner wrote: the compare-and-set and the script's fast path
        // compare it whole instead of decoding the record.
        let pending = record::pending(req.owner, req.fingerprint);
        let completed = bytes::Bytes::from(record::completed(req.fence, req.fingerprint, unix_ms_now(), req.result));
        let compare_and_set = !req.keep.is_zero() && self.inner.compare_and_set.load(Ordering::Relaxed);
        if compare_and_set && self.commit_compare_and_set(&req, &pending, &completed).await? {
            self.replicated("commit", req.key).await?;
            return Ok(Transition::Done);
        }
        let args = || {
            vec![
                req.owner.into(),
                millis(req.keep).into(),
                itoa::Buffer::new().format(req.fence).into(),
                pending.as_str().into(),
                Value::Bytes(completed.clone()),
            ]
        };
        let reply = self.script("commit", &scripts::COMMIT, req.key, args).await?;
        let outcome = replies::transition("commit", reply)?;
        if outcome == Transition::Done {
            self.replicated("commit", req.key).await?;
        }
        Ok(outcome)
    }

    /// `SET key <completed> IFEQ <pending> PX keep`: true when it set the record (the key held
    /// exactly this owner's pending record), false when the script must decide (anything else
    /// at the key, or a server that turned out not to take `IFEQ`).
    async fn commit_compare_and_set(
        &self,
        req: &CommitRequest<'_>,
        pending: &str,
        completed: &bytes::Bytes,
    ) -> Result<bool, StoreError> {
        let set = CustomCommand::new_static("SET", fred::types::ClusterHash::FirstKey, false);
        let args: Vec<Value> = vec![
            self.record_key(req.key).into(),
            Value::Bytes(completed.clone()),
            "IFEQ".into(),
            pending.into(),
            "PX".into(),
            millis(req.keep).into(),
        ];
        let reply = Box::pin(self.client_for(req.key).custom::<Value, Value>(set, args));
        match within("commit", self.inner.timeout, async { Ok(reply.await) }).await? {
            Ok(Value::Null) => Ok(false),
            Ok(Value::String(ok)) if &*ok == "OK" => Ok(true),
            Ok(other) => Err(StoreError::reply("commit", format_args!("SET IFEQ replied {other:?}"))),
            // Not a string (something else overwrote the key): the script names what it is.
            Err(e) if e.details().starts_with("WRONGTYPE") => Ok(false),
            Err(e) if e.details().to_ascii_lowercase().contains("syntax error") => {
                self.inner.compare_and_set.store(false, Ordering::Relaxed);
                tracing::warn!(
                    server = %self.inner.server,
                    "idempotency store: the server refused SET ... IFEQ; commits run the script from now on"
                );
                Ok(false)
            }
            Err(e) => Err(store_error("commit", e)),
        }
    }

    /// With replica acknowledgement on: `WAIT`s, on the connection that wrote `key`, for the
    /// configured number of replicas to have this client's writes, and fails with a
    /// `Replication` error when fewer do in time.
    async fn replicated(&self, op: &str, key: &str) -> Result<(), StoreError> {
        let Some(acks) = self.inner.acks else { return Ok(()) };
        let slot = fred::util::redis_keyslot(self.record_key(key).as_bytes());
        let wait = CustomCommand::new_static("WAIT", fred::types::ClusterHash::Custom(slot), false);
        let args = vec![acks.replicas.to_string(), millis(acks.timeout).to_string()];
        let wait = Box::pin(self.client_for(key).custom(wait, args));
        let got: i64 = bounded(op, acks.timeout + self.inner.timeout, wait).await?;
        if got < i64::from(acks.replicas) {
            return Err(StoreError::new(
                StoreErrorKind::Replication,
                format!("{op}: {got} of {} replicas acknowledged within {:?}", acks.replicas, acks.timeout),
            ));
        }
        Ok(())
    }

    async fn release_inner(&self, key: &str, owner: &str) -> Result<Transition, StoreError> {
        let reply = self.script("release", &scripts::RELEASE, key, || vec![owner.into()]).await?;
        replies::transition("release", reply)
    }

    /// Releases `owner`'s hold on `key` in the background, for a caller that gave up. The release
    /// goes through the key's own connection, so it reaches Redis after anything this owner sent
    /// before (an acquire queued while Redis was away lands first, then this); it is sent as
    /// `EVAL` with the script's text, so a server whose script cache is empty (restarted, failed
    /// over) runs it as it is; and it is not bounded by the caller's timeout: fred keeps it
    /// queued while disconnected and sends it on reconnecting. Tried again on a failure until a
    /// lease and two store timeouts have passed, after which whatever the owner took has
    /// expired by itself.
    fn release_in_background(&self, key: &str, owner: &str, lease: Duration) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(key = %logged_key(key), "idempotency release outside a runtime; the key is held until its lease ends");
            return;
        };
        let Some(slot) = super::background::slot("release") else { return };
        let (store, key, owner) = (self.clone(), key.to_owned(), owner.to_owned());
        rt.spawn(async move {
            let _slot = slot;
            let until = tokio::time::Instant::now() + lease + 2 * store.inner.timeout;
            let mut backoff = Duration::from_millis(50);
            loop {
                let client = store.client_for(&key);
                let lua = scripts::RELEASE.lua().cloned().unwrap_or_default();
                let eval = Box::pin(client.eval::<Value, _, _, _>(lua, vec![store.record_key(&key)], vec![owner.as_str()]));
                let outcome = match eval.await {
                    Ok(reply) => replies::transition("release", reply),
                    Err(e) => Err(store_error("release", e)),
                };
                match outcome {
                    Ok(Transition::Done) => return,
                    Ok(other) => {
                        tracing::debug!(key = %logged_key(&key), outcome = ?other, "idempotency background release found the key not ours");
                        return;
                    }
                    Err(e) if tokio::time::Instant::now() + backoff >= until => {
                        tracing::warn!(key = %logged_key(&key), error = %e, "idempotency background release failed until the lease ran out");
                        return;
                    }
                    Err(e) => tracing::debug!(key = %logged_key(&key), error = %e, "idempotency background release failed; retrying"),
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        });
    }

    /// The store's pub/sub connection, started on first use.
    async fn subscriptions(&self) -> Result<&watch::Subscriptions, StoreError> {
        self.inner
            .subscriptions
            .get_or_try_init(|| async {
                let client = self.inner.builder.build_subscriber_client().map_err(|e| store_error("subscribe", e))?;
                let channel = keys::purge_channel(&self.inner.prefix);
                let publisher = self.inner.pool.next().clone();
                let started = watch::Subscriptions::start(client, channel, publisher, self.inner.timeout);
                self.bounded("subscribe", started).await
            })
            .await
    }

    async fn watch_inner(&self, key: &str) -> Result<Watcher, StoreError> {
        let subs = self.subscriptions().await?;
        within("subscribe", self.inner.timeout, subs.watch(&self.record_key(key))).await
    }

    async fn follow_purges_inner(&self, handler: PurgeHandler) -> Result<bool, StoreError> {
        let subs = self.subscriptions().await?;
        // Subscribing, then a message published and waited for (each bounded by the timeout).
        within("subscribe", self.inner.timeout * 3, subs.follow_purges(handler)).await?;
        Ok(true)
    }

    /// A record key's value and `PTTL`, read in one step (`inspect.lua`); `Err` naming the type
    /// for a value that is not a string.
    async fn read(&self, client: &Client, record_key: &str) -> Result<replies::Read, StoreError> {
        let reply = scripts::run(client, &scripts::INSPECT, || (vec![record_key.into()], Vec::new()))
            .await
            .map_err(|e| store_error("inspect", e))?;
        replies::inspected(reply)
    }

    async fn inspect_inner(&self, key: &str) -> Result<Inspected, StoreError> {
        let record_key = self.record_key(key);
        let (got, ttl) = within("inspect", self.inner.timeout, self.read(self.client_for(key), &record_key)).await?;
        Ok(match got {
            Ok(None) => Inspected::Absent,
            Ok(Some(bytes)) => match record::view(key, &bytes, Some(ttl)) {
                Ok(view) => Inspected::Record(view),
                Err(reason) => Inspected::Foreign { reason: reason.to_owned() },
            },
            Err(reason) => Inspected::Foreign { reason },
        })
    }

    async fn forget_inner(&self, key: &str, force: bool) -> Result<Forgotten, StoreError> {
        let channel = keys::purge_channel(&self.inner.prefix);
        let args = || vec![if force { "1" } else { "0" }.into(), channel.as_str().into(), key.into()];
        replies::forgotten(self.script("forget", &scripts::FORGET, key, args).await?)
    }

    /// A page of `SCAN` on one node (every primary of a cluster in turn: the cursor is the
    /// node's place in the list and its own cursor), with each key's record read.
    async fn scan_inner(&self, prefix: &str, cursor: Option<&str>, count: usize) -> Result<ScanPage, StoreError> {
        let client = self.inner.pool.next();
        let nodes: Vec<Option<fred::types::config::Server>> = if self.inner.clustered {
            let mut primaries =
                client.cached_cluster_state().map(|state| state.unique_primary_nodes()).ok_or_else(|| {
                    StoreError::new(StoreErrorKind::Unavailable, "scan: the cluster's slot map is not known yet")
                })?;
            primaries.sort_by(|a, b| (&a.host, a.port).cmp(&(&b.host, b.port)));
            primaries.into_iter().map(Some).collect()
        } else {
            vec![None]
        };
        let (node, node_cursor) = match cursor {
            None => (0, "0".to_owned()),
            Some(c) => {
                let (node, rest) =
                    c.split_once(':').and_then(|(n, rest)| Some((n.parse::<usize>().ok()?, rest))).ok_or_else(
                        || StoreError::new(StoreErrorKind::Config, format!("scan: {c:?} is not a scan cursor")),
                    )?;
                (node, rest.to_owned())
            }
        };
        let Some(server) = nodes.get(node) else { return Ok(ScanPage::default()) };
        let pattern = keys::scan_pattern(&self.inner.prefix, prefix);
        let count = u32::try_from(count).unwrap_or(u32::MAX);
        let reply: Value = match server {
            Some(server) => {
                let on_node = client.with_cluster_node(server.clone());
                self.bounded(
                    "scan",
                    Box::pin(on_node.scan_page::<Value, _, _>(node_cursor, pattern, Some(count), None)),
                )
                .await?
            }
            None => {
                self.bounded("scan", Box::pin(client.scan_page::<Value, _, _>(node_cursor, pattern, Some(count), None)))
                    .await?
            }
        };
        let (next_cursor, record_keys) = replies::scan_page(reply)?;
        let mut page = ScanPage { examined: record_keys.len(), ..ScanPage::default() };
        let reads = record_keys.iter().map(|rk| async move {
            let got = within("scan", self.inner.timeout, self.read(client, rk)).await;
            (rk, got)
        });
        for (record_key, got) in join_all(reads).await {
            let Some(key) = keys::full_key_of(&self.inner.prefix, record_key) else { continue };
            match got? {
                // Gone between the SCAN and the GET.
                (Ok(None), _) => {}
                (Ok(Some(bytes)), ttl) => match record::view(key, &bytes, Some(ttl)) {
                    Ok(view) => page.records.push(view),
                    Err(reason) => page.foreign.push((key.to_owned(), reason.to_owned())),
                },
                (Err(reason), _) => page.foreign.push((key.to_owned(), reason)),
            }
        }
        page.next = if next_cursor != "0" {
            Some(format!("{node}:{next_cursor}"))
        } else if node + 1 < nodes.len() {
            Some(format!("{}:0", node + 1))
        } else {
            None
        };
        Ok(page)
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
                client.wait_for_connect().await.map_err(|e| store_error("connect", e))?;
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
        tracing::debug!(
            server = %store.inner.server,
            acquire = if store.inner.plain_acquire { "SET NX GET" } else { "script" },
            commit = %store.commit_path(),
            release = "script",
            "idempotency store connected"
        );
        Ok(store)
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

/// The fred command `fut` as a store call: its error mapped, and bounded by `bound`.
async fn bounded<T>(op: &str, bound: Duration, fut: impl Future<Output = Result<T, Error>>) -> Result<T, StoreError> {
    within(op, bound, async { fut.await.map_err(|e| store_error(op, e)) }).await
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

/// The server's clock in microseconds (`TIME`), from the node that holds `record_key`.
async fn server_time(client: &Client, record_key: &str) -> Result<u64, Error> {
    let slot = fred::util::redis_keyslot(record_key.as_bytes());
    let time = CustomCommand::new_static("TIME", fred::types::ClusterHash::Custom(slot), false);
    let reply: Vec<u64> = client.custom(time, Vec::<String>::new()).await?;
    match reply[..] {
        [secs, micros] => Ok(secs.saturating_mul(1_000_000).saturating_add(micros)),
        _ => Err(Error::new(ErrorKind::Parse, format!("TIME replied {reply:?}"))),
    }
}

/// Runs `futs` concurrently; their outputs in order.
async fn join_all<F: Future>(futs: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    use std::task::Poll;
    let mut futs: Vec<_> = futs.into_iter().map(|f| (Box::pin(f), None)).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (fut, out) in futs.iter_mut().filter(|(_, out)| out.is_none()) {
            match fut.as_mut().poll(cx) {
                Poll::Ready(v) => *out = Some(v),
                Poll::Pending => pending = true,
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    futs.into_iter().filter_map(|(_, out)| out).collect()
}

/// A fred error as a store error, with the kind a caller can act on.
pub(crate) fn store_error(op: &str, e: Error) -> StoreError {
    // The server refused a command to this user: a configuration matter (docs/security.md
    // lists the permissions the store needs); Redis's message names the command.
    if e.details().starts_with("NOPERM") {
        let message = format!("{op}: {} (docs/security.md lists the permissions the store needs)", e.details());
        return StoreError::new(StoreErrorKind::Config, message).with_source(e);
    }
    // rustls reports a refused certificate as an I/O error of the handshake.
    if e.details().contains("InvalidCertificate") {
        let message = format!("{op}: the server's TLS certificate is not trusted ({}); is the CA right?", e.details());
        return StoreError::new(StoreErrorKind::Config, message).with_source(e);
    }
    let kind = match e.kind() {
        ErrorKind::IO
        | ErrorKind::Canceled
        | ErrorKind::Routing
        | ErrorKind::Cluster
        | ErrorKind::Backpressure
        | ErrorKind::Sentinel => StoreErrorKind::Unavailable,
        ErrorKind::Timeout => StoreErrorKind::Timeout,
        ErrorKind::Protocol | ErrorKind::Parse => StoreErrorKind::Reply,
        ErrorKind::Config | ErrorKind::Url | ErrorKind::Auth => StoreErrorKind::Config,
        #[cfg(feature = "tls")]
        ErrorKind::Tls => StoreErrorKind::Config,
        // A command whose reply channel was dropped unanswered: the connection's routing task
        // ended (the supervisor starts it again). Its fate is unknown, as with a dropped
        // connection.
        ErrorKind::Unknown if e.details() == "channel closed" => StoreErrorKind::Unavailable,
        // `ERR ...`: an argument or script error (Redis's other prefixes, OOM, BUSY, LOADING,
        // READONLY, TRYAGAIN, pass).
        _ if e.details().starts_with("ERR") => StoreErrorKind::Refused,
        _ => StoreErrorKind::Backend,
    };
    StoreError::new(kind, format!("{op}: {}", e.details())).with_source(e)
}

/// This machine's clock, unix ms: only for the informational `t` field of completed records.
fn unix_ms_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Store for RedisStore {
    fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> StoreFuture<'a, Result<AcquireOutcome, StoreError>> {
        StoreFuture::new(self.acquire_inner(request))
    }

    fn renew<'a>(&'a self, leases: &'a [Lease<'a>]) -> StoreFuture<'a, Result<Vec<bool>, StoreError>> {
        StoreFuture::new(self.renew_inner(leases))
    }

    fn commit<'a>(&'a self, request: CommitRequest<'a>) -> StoreFuture<'a, Result<Transition, StoreError>> {
        StoreFuture::new(self.commit_inner(request))
    }

    fn release<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, Result<Transition, StoreError>> {
        StoreFuture::new(self.release_inner(key, owner))
    }

    fn watch<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<Watcher, StoreError>> {
        StoreFuture::new(self.watch_inner(key))
    }

    fn abandon(self: Arc<Self>, key: &str, owner: &str, lease: Duration) {
        self.release_in_background(key, owner, lease);
    }

    fn inspect<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<Inspected, StoreError>> {
        StoreFuture::new(self.inspect_inner(key))
    }

    fn forget<'a>(&'a self, key: &'a str, force: bool) -> StoreFuture<'a, Result<Forgotten, StoreError>> {
        StoreFuture::new(self.forget_inner(key, force))
    }

    fn scan<'a>(
        &'a self,
        prefix: &'a str,
        cursor: Option<&'a str>,
        count: usize,
    ) -> StoreFuture<'a, Result<ScanPage, StoreError>> {
        StoreFuture::new(self.scan_inner(prefix, cursor, count))
    }

    fn follow_purges(&self, handler: PurgeHandler) -> StoreFuture<'_, Result<bool, StoreError>> {
        StoreFuture::new(self.follow_purges_inner(handler))
    }

    fn call_timeout(&self) -> Option<Duration> {
        Some(self.inner.timeout)
    }

    fn token_secrets(&self) -> Vec<Vec<u8>> {
        self.inner.token_secrets.clone()
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

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.inner.prefix)
            .field("timeout", &self.inner.timeout)
            .field("clustered", &self.inner.clustered)
            .field("server", &self.inner.server.to_string())
            .field("commit_path", &self.commit_path())
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(feature = "tls")))]
mod without_tls {
    use super::*;

    /// Without the `tls` feature a TLS URL is an error at connect, never a plaintext connection
    /// (`scripts/test.sh` runs this with `--no-default-features --features redis`).
    #[tokio::test]
    async fn a_tls_url_is_an_error() {
        for url in ["rediss://127.0.0.1:6379", "rediss-cluster://127.0.0.1:7000", "valkeys://u:pw@127.0.0.1:1"] {
            let e = RedisStore::connect(url).await.err().expect("a TLS URL connected without TLS");
            assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
            assert!(e.to_string().contains("enable the `tls` feature"), "{e}");
            assert!(!e.to_string().contains("pw@"), "{e}");
        }
    }
}
