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
    boxed_in_place, join_all, within, AcquireOutcome, AcquireRequest, CommitRequest, FailRequest, Forgotten, Inspected,
    Lapse, Lease, PurgeHandler, Resolution, Resolved, ScanPage, Store, StoreFuture, Transition, Watcher, Within,
};
use crate::error::{StoreError, StoreErrorKind};
use crate::telemetry::logged_key;

mod args;
mod batch;
mod builder;
mod keys;
mod operations;
pub(crate) mod record;
mod replies;
mod scripts;
mod server;
mod supervise;
#[cfg(feature = "tls")]
mod tls;
pub(crate) mod url;
mod watch;

pub use builder::{RedisStoreBuilder, ENV_VARS};
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
    /// The servers, as errors and logs name them (passwords masked).
    shown: String,
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

impl RedisStore {
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
    fn bounded<'a, T, F>(&self, op: &'a str, fut: F) -> Within<'a, F, Error>
    where
        F: Future<Output = Result<T, Error>>,
    {
        bounded(op, self.inner.timeout, fut)
    }

    async fn script(
        &self,
        op: &str,
        script: &fred::types::scripts::Script,
        key: &str,
        args: impl Fn() -> Vec<Value>,
    ) -> Result<Value, StoreError> {
        let record_key = Key::from(self.record_key(key));
        self.script_at(op, script, self.client_for(key), &record_key, args).await
    }

    /// [`script`](Self::script) on `client`, for the record at `record_key`.
    async fn script_at(
        &self,
        op: &str,
        script: &fred::types::scripts::Script,
        client: &Client,
        record_key: &Key,
        args: impl Fn() -> Vec<Value>,
    ) -> Result<Value, StoreError> {
        self.bounded(op, scripts::run(client, script, || (vec![record_key.clone()], args()))).await
    }

    async fn acquire_inner(&self, req: AcquireRequest<'_>) -> Result<AcquireOutcome, StoreError> {
        // A caller that needs the record's lifetime (a replay cache, a waiter) takes the script,
        // which reads it with the record: a `PTTL` sent behind a plain `SET NX GET` could read the
        // record of the next holder if this one ended in between (a stall splitting the pipeline).
        // A record that keeps its lease's end is written by the script, which stamps the end by
        // the server's clock.
        let found = if !req.will_wait && !req.report_ttl && self.inner.plain_acquire && req.lapse == Lapse::Free {
            self.acquire_plain(&req).await
        } else {
            self.acquire_script(&req).await
        };
        match found {
            Ok(outcome) => {
                if matches!(outcome, AcquireOutcome::Acquired { .. }) {
                    if let Err(e) = self.replicated("acquire", req.key).await {
                        // Not durable enough to act on: give the key back and say so.
                        let _ = Box::pin(self.release_inner(req.key, req.owner)).await;
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
    /// The fencing token is left unread (`fence: 0`: `fence.lua` reads it if the body asks)
    /// unless the caller wants it now (`fence_now`, a lock guard) or the store is a cluster:
    /// then `TIME` goes right behind the `SET`, on the same connection (the server's clock, read
    /// after the `SET` ran, so after any earlier holder's record was gone), both sent at once:
    /// one round trip.
    async fn acquire_plain(&self, req: &AcquireRequest<'_>) -> Result<AcquireOutcome, StoreError> {
        let mut buf = Vec::with_capacity(self.inner.prefix.len() + req.key.len() + req.owner.len() + 80);
        keys::push_record_key(&mut buf, &self.inner.prefix, req.key);
        let key_end = buf.len();
        record::push_pending(&mut buf, req.owner, req.fingerprint);
        let end = buf.len();
        let [record_key, pending] = args::split(buf, [key_end, end]);
        let client = self.client_for(req.key);
        // Boxed at once, and built in the box: fred's command futures are about 7 KB, and every
        // layer holding one inline, or a move into the box, would copy it (the move into the box
        // was 650 of the 31,300 instructions of a replay, as callgrind counted them). A fred
        // command is sent when its future is first polled: `join!` polls them in this order,
        // SET, TIME, both before waiting for any reply.
        let set = boxed_in_place(|| {
            client.set::<Value, _, _>(
                Key::from(record_key.clone()),
                Value::Bytes(pending),
                Some(Expiration::PX(millis(req.lease))),
                Some(SetOptions::NX),
                true,
            )
        });
        // On a cluster the `TIME` goes behind every plain acquire: fred 10.1 can leave a lone
        // `SET` unanswered after following an `ASK` during a slot migration (the acquire times
        // out again and again until the migration ends; the cluster suite's
        // `slot_migrated_mid_run_follows_ask_and_moved` failed 3 runs of 8 without it, none of 5
        // with it). Standalone, Sentinel and Valkey servers send no `ASK`.
        let stamp = req.fence_now || self.inner.clustered;
        let time = stamp.then(|| boxed_in_place(|| server_time(client, &record_key)));
        let replies = within("acquire", self.inner.timeout, async {
            let (set, time) = match time {
                Some(time) => {
                    let (set, time) = tokio::join!(set, time);
                    (set, Some(time))
                }
                None => (set.await, None),
            };
            let set = match set {
                // Not a string: the script names what it is.
                Err(e) if e.details().starts_with("WRONGTYPE") => None,
                other => Some(other.map_err(|e| store_error("acquire", e))?),
            };
            let now_us = match time {
                Some(time) => time.map_err(|e| store_error("acquire", e))?,
                None => 0,
            };
            Ok((set, now_us))
        })
        .await?;
        let (set, now_us) = replies;
        match set.map(|reply| plain_acquire_reply(reply, req.owner, now_us)).transpose()? {
            // Rare (something other than a string at the key, or a record only the script can
            // decide on): boxed, so that the plain path's future does not carry the script's.
            None | Some(None) => Box::pin(self.acquire_script(req)).await,
            Some(Some(found)) => Ok(found),
        }
    }

    async fn acquire_script(&self, req: &AcquireRequest<'_>) -> Result<AcquireOutcome, StoreError> {
        replies::acquire(self.script("acquire", &scripts::ACQUIRE, req.key, || acquire_args(req).into()).await?)
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
        // What an acquire by this owner wrote: the compare-and-set compares it whole (and the
        // script's fast path, which builds it from the completed record) instead of decoding
        // the record.
        let compare_and_set =
            !req.keep.is_zero() && !req.lease_in_record && self.inner.compare_and_set.load(Ordering::Relaxed);
        let parts = CommitArgs::new(&self.inner.prefix, &req, unix_ms_now(), compare_and_set);
        if compare_and_set && self.commit_compare_and_set(&req, &parts).await? {
            self.replicated("commit", req.key).await?;
            return Ok(Transition::Done);
        }
        let args = || commit_script_args(req.keep, parts.completed.clone()).into();
        let client = self.client_for(req.key);
        let reply = self.script_at("commit", &scripts::COMMIT, client, &Key::from(parts.key.clone()), args).await?;
        let outcome = replies::transition("commit", reply)?;
        if outcome == Transition::Done {
            self.replicated("commit", req.key).await?;
        }
        Ok(outcome)
    }

    /// `SET key <completed> IFEQ <pending> PX keep`: true when it set the record (the key held
    /// exactly this owner's pending record), false when the script must decide (anything else
    /// at the key, or a server that turned out not to take `IFEQ`).
    async fn commit_compare_and_set(&self, req: &CommitRequest<'_>, parts: &CommitArgs) -> Result<bool, StoreError> {
        let set = CustomCommand::new_static("SET", fred::types::ClusterHash::FirstKey, false);
        let args: Vec<Value> = vec![
            Value::Bytes(parts.key.clone()),
            Value::Bytes(parts.completed.clone()),
            Value::from_static_str("IFEQ"),
            Value::Bytes(parts.pending.clone()),
            Value::from_static_str("PX"),
            millis(req.keep).into(),
        ];
        let reply = boxed_in_place(|| self.client_for(req.key).custom::<Value, Value>(set, args));
        self.compare_and_set_reply(within("commit", self.inner.timeout, async { Ok(reply.await) }).await?)
    }

    /// Reads a `SET ... IFEQ` reply: true when it set the record, false when the commit script
    /// must decide (the key held anything else; a server that refuses `IFEQ`, after which every
    /// commit takes the script).
    fn compare_and_set_reply(&self, reply: Result<Value, Error>) -> Result<bool, StoreError> {
        match reply {
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
        let wait = boxed_in_place(|| self.client_for(key).custom(wait, args));
        let got: i64 = bounded(op, acks.timeout + self.inner.timeout, wait).await?;
        if got < i64::from(acks.replicas) {
            return Err(StoreError::new(
                StoreErrorKind::Replication,
                format!("{op}: {got} of {} replicas acknowledged within {:?}", acks.replicas, acks.timeout),
            ));
        }
        Ok(())
    }

    /// The fencing token of `owner`'s hold, read on first use (`fence.lua`: owner-checked, the
    /// server's clock).
    async fn fence_inner(&self, key: &str, owner: &str) -> Result<Option<u64>, StoreError> {
        replies::fence(self.script("fence", &scripts::FENCE, key, || vec![owner.into()]).await?)
    }

    async fn release_inner(&self, key: &str, owner: &str) -> Result<Transition, StoreError> {
        let reply = self.script("release", &scripts::RELEASE, key, || vec![owner.into()]).await?;
        replies::transition("release", reply)
    }

    async fn fail_inner(&self, req: FailRequest<'_>) -> Result<Transition, StoreError> {
        let reply = self.script("fail", &scripts::FAIL, req.key, || fail_args(&req).into()).await?;
        replies::transition("fail", reply)
    }

    async fn resolve_inner(
        &self,
        key: &str,
        holder: Option<&str>,
        resolution: Resolution<'_>,
    ) -> Result<Resolved, StoreError> {
        let (how, replayable, result) = match resolution {
            Resolution::Completed(Some(result)) => ("completed", "1", result),
            Resolution::Completed(None) => ("completed", "0", &b""[..]),
            Resolution::Release => ("release", "0", &b""[..]),
        };
        let args = || {
            vec![
                holder.unwrap_or("").into(),
                how.into(),
                replayable.into(),
                Value::Bytes(bytes::Bytes::copy_from_slice(result)),
                crate::store::RESOLVED_RELEASED.into(),
            ]
        };
        replies::resolved(self.script("resolve", &scripts::RESOLVE, key, args).await?)
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
                let eval = boxed_in_place(|| client.eval::<Value, _, _, _>(lua, vec![store.record_key(&key)], vec![owner.as_str()]));
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
                // fred names its log lines by a client id of its own making: say which is ours.
                tracing::info!(
                    store = %self.inner.shown,
                    client = %client.id(),
                    "idempotency store: pub/sub connection started (fred logs it under this client id)"
                );
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
}

/// The fred command `fut` as a store call: its error mapped, and bounded by `bound`.
fn bounded<T, F>(op: &str, bound: Duration, fut: F) -> Within<'_, F, Error>
where
    F: Future<Output = Result<T, Error>>,
{
    Within::reading(op, bound, fut, store_error)
}

/// The server's clock in microseconds (`TIME`), from the node that holds `record_key`.
async fn server_time(client: &Client, record_key: &[u8]) -> Result<u64, Error> {
    let slot = fred::util::redis_keyslot(record_key);
    let time = CustomCommand::new_static("TIME", fred::types::ClusterHash::Custom(slot), false);
    let reply: Vec<u64> = client.custom(time, Vec::<String>::new()).await?;
    match reply[..] {
        [secs, micros] => Ok(secs.saturating_mul(1_000_000).saturating_add(micros)),
        _ => Err(Error::new(ErrorKind::Parse, format!("TIME replied {reply:?}"))),
    }
}

/// A fred error as a store error, with the kind a caller can act on.
/// fred's message when a command's write attempts are used up (fred 10.1, `decr_check_attempted`).
const WRITE_ATTEMPTS_EXHAUSTED: &str = "Too many failed write attempts.";

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
        // fred gave up re-sending a command after its write attempts failed (connections
        // dropped or redirected while a slot moves): the server is out of reach for the moment
        // and the command may or may not have run, as with a dropped connection.
        ErrorKind::Unknown if e.details() == WRITE_ATTEMPTS_EXHAUSTED => StoreErrorKind::Unavailable,
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

/// What a plain acquire's `SET ... NX GET` answered, as the acquire script would report it:
/// nothing there (acquired, the fence `now_us`: 0 when left unread), or the record the key holds;
/// `None` when only the script can decide on that record (see `record::found`).
fn plain_acquire_reply(set: Value, owner: &str, now_us: u64) -> Result<Option<AcquireOutcome>, StoreError> {
    match set {
        Value::Null => Ok(Some(AcquireOutcome::Acquired { fence: now_us, attempt: 1 })),
        Value::String(s) => Ok(record::found(s.as_bytes(), owner, now_us, None)),
        Value::Bytes(b) => Ok(record::found(&b, owner, now_us, None)),
        other => Err(StoreError::reply("acquire", format_args!("unexpected reply {other:?}"))),
    }
}

/// How many arguments the commit script takes per key.
const COMMIT_ARGS: usize = 2;

/// The commit script's arguments (`lua/commit.lua`): keep, and the completed record to write, in
/// which the script reads this acquisition's owner, fence and fingerprint.
fn commit_script_args(keep: Duration, completed: bytes::Bytes) -> [Value; COMMIT_ARGS] {
    [millis(keep).into(), Value::Bytes(completed)]
}

/// A commit's arguments, slices of one buffer (see `args.rs`): the record's key, the completed
/// record, and the pending record this owner's acquire wrote, which `SET ... IFEQ` compares
/// (empty unless asked for: the commit script builds it from the completed record).
struct CommitArgs {
    key: bytes::Bytes,
    completed: bytes::Bytes,
    pending: bytes::Bytes,
}

impl CommitArgs {
    fn new(prefix: &str, req: &CommitRequest<'_>, stored_ms: u64, with_pending: bool) -> CommitArgs {
        let result = req.result.map_or(0, <[u8]>::len);
        let mut buf = Vec::with_capacity(prefix.len() + req.key.len() + 2 * req.owner.len() + result + 120);
        keys::push_record_key(&mut buf, prefix, req.key);
        let key = buf.len();
        record::push_completed(&mut buf, req.fence, req.owner, req.fingerprint, stored_ms, req.result);
        let completed = buf.len();
        if with_pending {
            record::push_pending(&mut buf, req.owner, req.fingerprint);
        }
        let pending = buf.len();
        let [key, completed, pending] = args::split(buf, [key, completed, pending]);
        CommitArgs { key, completed, pending }
    }
}

/// `"1"` or `"0"`, as the scripts take a flag (a static string: no copy per argument).
fn flag(on: bool) -> Value {
    Value::from_static_str(if on { "1" } else { "0" })
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Store for RedisStore {
    fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> StoreFuture<'a, Result<AcquireOutcome, StoreError>> {
        StoreFuture::built(|| self.acquire_inner(request))
    }

    fn fence<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, Result<Option<u64>, StoreError>> {
        StoreFuture::built(|| self.fence_inner(key, owner))
    }

    fn renew<'a>(&'a self, leases: &'a [Lease<'a>]) -> StoreFuture<'a, Result<Vec<bool>, StoreError>> {
        StoreFuture::built(|| self.renew_inner(leases))
    }

    fn commit<'a>(&'a self, request: CommitRequest<'a>) -> StoreFuture<'a, Result<Transition, StoreError>> {
        StoreFuture::built(|| self.commit_inner(request))
    }

    fn release<'a>(&'a self, key: &'a str, owner: &'a str) -> StoreFuture<'a, Result<Transition, StoreError>> {
        StoreFuture::built(|| self.release_inner(key, owner))
    }

    fn watch<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<Watcher, StoreError>> {
        StoreFuture::built(|| self.watch_inner(key))
    }

    fn acquire_many<'a>(
        &'a self,
        requests: &'a [AcquireRequest<'a>],
    ) -> StoreFuture<'a, Vec<Result<AcquireOutcome, StoreError>>> {
        StoreFuture::built(|| self.acquire_many_inner(requests))
    }

    fn keeps_attempts(&self) -> bool {
        true
    }

    fn fail<'a>(&'a self, request: FailRequest<'a>) -> StoreFuture<'a, Result<Transition, StoreError>> {
        StoreFuture::built(|| self.fail_inner(request))
    }

    fn fail_many<'a>(
        &'a self,
        requests: &'a [FailRequest<'a>],
    ) -> StoreFuture<'a, Vec<Result<Transition, StoreError>>> {
        StoreFuture::built(|| self.fail_many_inner(requests))
    }

    fn resolve<'a>(
        &'a self,
        key: &'a str,
        holder: Option<&'a str>,
        resolution: Resolution<'a>,
    ) -> StoreFuture<'a, Result<Resolved, StoreError>> {
        StoreFuture::built(|| self.resolve_inner(key, holder, resolution))
    }

    fn commit_many<'a>(
        &'a self,
        requests: &'a [CommitRequest<'a>],
    ) -> StoreFuture<'a, Vec<Result<Transition, StoreError>>> {
        StoreFuture::built(|| self.commit_many_inner(requests))
    }

    fn release_many<'a>(
        &'a self,
        releases: &'a [(&'a str, &'a str)],
    ) -> StoreFuture<'a, Vec<Result<Transition, StoreError>>> {
        StoreFuture::built(|| self.release_many_inner(releases))
    }

    fn abandon(self: Arc<Self>, key: &str, owner: &str, lease: Duration) {
        self.release_in_background(key, owner, lease);
    }

    fn inspect<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Result<Inspected, StoreError>> {
        StoreFuture::built(|| self.inspect_inner(key))
    }

    fn forget<'a>(&'a self, key: &'a str, force: bool) -> StoreFuture<'a, Result<Forgotten, StoreError>> {
        StoreFuture::built(|| self.forget_inner(key, force))
    }

    fn scan<'a>(
        &'a self,
        prefix: &'a str,
        cursor: Option<&'a str>,
        count: usize,
    ) -> StoreFuture<'a, Result<ScanPage, StoreError>> {
        StoreFuture::built(|| self.scan_inner(prefix, cursor, count))
    }

    fn follow_purges(&self, handler: PurgeHandler) -> StoreFuture<'_, Result<bool, StoreError>> {
        StoreFuture::built(|| self.follow_purges_inner(handler))
    }

    fn call_timeout(&self) -> Option<Duration> {
        Some(self.inner.timeout)
    }

    fn token_secrets(&self) -> Vec<Vec<u8>> {
        self.inner.token_secrets.clone()
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

/// How many arguments acquire.lua takes per key.
const ACQUIRE_ARGS: usize = 7;

/// How many arguments fail.lua takes per key.
const FAIL_ARGS: usize = 7;

/// acquire.lua's arguments for `req` (see the script).
fn acquire_args(req: &AcquireRequest<'_>) -> [Value; ACQUIRE_ARGS] {
    [
        req.owner.into(),
        millis(req.lease).into(),
        req.fingerprint.unwrap_or("").into(),
        flag(req.will_wait),
        flag(req.report_ttl),
        Value::from_static_str(req.lapse.code()),
        millis(req.keep).into(),
    ]
}

/// fail.lua's arguments for `req` (see the script).
fn fail_args(req: &FailRequest<'_>) -> [Value; FAIL_ARGS] {
    [
        req.owner.into(),
        i64::from(req.attempt).into(),
        millis(req.keep).into(),
        flag(req.give_up),
        req.fingerprint.unwrap_or("").into(),
        crate::store::error_text(req.error).into(),
        i64::try_from(unix_ms_now()).unwrap_or(i64::MAX).into(),
    ]
}

#[cfg(test)]
mod sizes {
    use super::*;

    /// The size of what `f` returns, without calling it.
    fn returned<A, B, R>(_: impl Fn(A, B) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    /// Every call boxes its acquire's and its commit's future once (`StoreFuture`). Under 1 KB
    /// they come from the allocator's per-thread cache; past it (they were 1.9 KB and 1.7 KB
    /// while each layer of bounding kept a copy of what it awaited) each allocation cost a
    /// first execution about 1,000 instructions more, as callgrind counted them.
    #[test]
    fn every_calls_boxed_store_futures_stay_under_a_kilobyte() {
        let acquire = returned(|s: &'static RedisStore, r: AcquireRequest<'static>| s.acquire_inner(r));
        let commit = returned(|s: &'static RedisStore, r: CommitRequest<'static>| s.commit_inner(r));
        let release = returned(|s: &'static RedisStore, r: (&'static str, &'static str)| s.release_inner(r.0, r.1));
        for (what, size) in [("acquire", acquire), ("commit", commit), ("release", release)] {
            assert!(size < 1024, "the {what} future takes {size} bytes");
        }
    }
}

#[cfg(test)]
mod errors {
    use super::*;

    /// A command fred stopped re-sending while a slot moved (its write attempts used up) is a
    /// retryable unavailability, not a backend fault: the cluster test saw it during a slot
    /// migration, where the caller's right answer is to try again.
    #[test]
    fn used_up_write_attempts_are_unavailable() {
        let e = store_error("acquire", Error::new(ErrorKind::Unknown, WRITE_ATTEMPTS_EXHAUSTED));
        assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{e}");
        let other = store_error("acquire", Error::new(ErrorKind::Unknown, "something else"));
        assert_eq!(other.kind(), StoreErrorKind::Backend, "{other}");
    }
}
