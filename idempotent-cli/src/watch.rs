//! `watch`: records' transitions as they happen, from Redis keyspace notifications
//! (`__keyspace@<db>__:<record key>`: set, del, expired, expire...), on every primary of a
//! cluster (notifications are local to the node that holds the key). After a `set` the record is
//! read again (`inspect`) to print its new state.

use std::io::Write;
use std::time::{Duration, SystemTime};

use idempotent_core::store::redis::fred::clients::SubscriberClient;
use idempotent_core::store::redis::fred::prelude::*;
use idempotent_core::store::redis::fred::types::config::{Config, ServerConfig};
use idempotent_core::store::redis::fred::types::{ClusterHash, CustomCommand, KeyspaceEvent};
use idempotent_core::store::Inspected;
use idempotent_core::RedisStore;
use serde_json::json;

use crate::args::WatchArgs;
use crate::connect::Ctx;
use crate::failure::{Failure, EXIT_CONNECT, EXIT_FAILURE, EXIT_NOTIFICATIONS_OFF};
use crate::render;

/// The keyspace notification classes watch needs: `K` (keyspace channels), `$` (string
/// commands: SET), `g` (generic: DEL, EXPIRE), `x` (expiry). `A` stands for every class.
const NEEDED: [char; 4] = ['K', '$', 'g', 'x'];

pub async fn run(ctx: &Ctx, args: &WatchArgs, out: &mut impl Write) -> Result<(), Failure> {
    let store = ctx.redis(
        "watch",
        "it follows keyspace notifications, and PostgreSQL notifies only purges and the keys a caller \
         waits on, so most transitions would never show; run list again instead",
    )?;
    let mut nodes = Vec::new();
    for config in node_configs(store)? {
        nodes.push(Node::connect(config, ctx.timeout).await?);
    }
    let result = watch(ctx, store, args, &nodes, out).await;
    for node in &nodes {
        let _ = tokio::time::timeout(ctx.timeout, node.client.quit()).await;
    }
    result
}

async fn watch(
    ctx: &Ctx,
    store: &RedisStore,
    args: &WatchArgs,
    nodes: &[Node],
    out: &mut impl Write,
) -> Result<(), Failure> {
    let mut off = Vec::new();
    for node in nodes {
        let flags = node.notify_flags(ctx.timeout).await?;
        let wanted = with_needed(&flags);
        if wanted == flags {
            continue;
        }
        if args.enable_notifications {
            node.set_notify_flags(&wanted, ctx.timeout).await?;
            eprintln!(
                "idempotency: turned keyspace notifications on at {}: notify-keyspace-events was {flags:?}, now \
                 {wanted:?} (CONFIG SET notify-keyspace-events {wanted})",
                node.name
            );
        } else {
            off.push((node, flags, wanted));
        }
    }
    if !off.is_empty() {
        let mut message = String::from("keyspace notifications are off, so watch would see nothing:");
        for (node, flags, wanted) in &off {
            message.push_str(&format!(
                "\n  on {}, notify-keyspace-events is {flags:?}; turn them on with\n      CONFIG SET \
                 notify-keyspace-events {wanted}\n    (from a shell: redis-cli -h {} -p {} CONFIG SET \
                 notify-keyspace-events '{wanted}')",
                node.name, node.host, node.port
            ));
        }
        message.push_str(
            "\nor run watch with --enable-notifications to have it set them (the CLI's user then needs +config|set).",
        );
        return Err(Failure::new(EXIT_NOTIFICATIONS_OFF, message));
    }

    let pattern = format!("__keyspace@{}__:{}:*", nodes.first().map_or(0, |n| n.db), glob_escaped(&ctx.namespace));
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel::<KeyspaceEvent>();
    for node in nodes {
        // Listening before subscribing: no event is lost in between.
        let mut rx = node.client.keyspace_event_rx();
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Ok(event) = rx.recv().await {
                if tx.send(event).is_err() {
                    break;
                }
            }
        });
        node.client.manage_subscriptions();
        bounded("PSUBSCRIBE", ctx.timeout, node.client.psubscribe(pattern.clone())).await?;
        node.check_subscribed(&pattern, ctx.timeout).await?;
    }
    drop(tx);
    let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    let until =
        args.duration.map_or_else(|| "until Ctrl-C".to_owned(), |d| format!("for {}", render::short_duration(d)));
    eprintln!("idempotency: watching {pattern} on {} {until}", names.join(", "));

    let stop = async {
        match args.duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(stop);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let (mut seen, mut last_set) = (0u64, None::<String>);
    loop {
        let event = tokio::select! {
            _ = &mut stop => break,
            _ = &mut ctrl_c => break,
            event = events.recv() => match event {
                Some(event) => event,
                None => return Err(Failure::new(EXIT_FAILURE, "the notifications stopped")),
            },
        };
        let Some(record_key) = event.key.as_str() else { continue };
        let Some(full_key) = full_key_of(ctx, store, record_key) else { continue };
        if !full_key.starts_with(&args.prefix) {
            continue;
        }
        // A `SET ... PX` notifies `set`, then `expire` for the same key: that expiry is the SET's
        // own (a lease, or `keep`), not a transition of its own.
        let own_expiry = event.operation == "expire" && last_set.as_deref() == Some(record_key);
        last_set = (event.operation == "set").then(|| record_key.to_owned());
        if own_expiry {
            continue;
        }
        seen += 1;
        print_event(ctx, args.json, &event.operation, full_key, out).await?;
    }
    eprintln!("idempotency: {seen} events");
    Ok(())
}

/// Prints one event, with the record's state after it: read again after a `set`, gone after a
/// `del` or an expiry.
async fn print_event(ctx: &Ctx, json: bool, op: &str, key: &str, out: &mut impl Write) -> Result<(), Failure> {
    let now = SystemTime::now();
    let time = render::iso8601(render::now_ms());
    let found = match op {
        "set" => Some(ctx.idem.inspect("", key).await?),
        "del" | "expired" | "evicted" => Some(Inspected::Absent),
        _ => None,
    };
    if json {
        let (state, record) = match &found {
            Some(Inspected::Record(view)) => (render::state(view.state), render::record_json(view, now)),
            Some(Inspected::Absent) => ("absent", serde_json::Value::Null),
            Some(Inspected::Foreign { reason }) => ("foreign", json!({ "foreign": reason })),
            None => ("-", serde_json::Value::Null),
        };
        let line = json!({ "time": time, "event": op, "key": key, "state": state, "record": record });
        writeln!(out, "{line}")?;
        return Ok(());
    }
    let dash = || "-".to_owned();
    let (state, details) = match &found {
        Some(Inspected::Record(view)) => {
            let ttl = view.ttl.map_or_else(|| "none".to_owned(), render::short_duration);
            let details = match view.state {
                // A record that keeps its lease's end (`on_crash = hold`, attempts counted)
                // lives `keep` past it: its expiry is not the lease.
                idempotent_core::store::RecordState::InProgress => match view.lease_end_ms {
                    Some(end) => format!(
                        "owner {}, lease ends {}, record kept {ttl}",
                        view.owner.as_deref().unwrap_or("-"),
                        render::iso8601(end)
                    ),
                    None => format!("owner {}, lease {ttl}", view.owner.as_deref().unwrap_or("-")),
                },
                idempotent_core::store::RecordState::Completed => format!(
                    "fence {}, result {}, kept {ttl}",
                    view.fence.map_or_else(dash, |f| f.to_string()),
                    view.result_bytes().map_or_else(|| "not stored".to_owned(), |n| format!("{n} bytes")),
                ),
                idempotent_core::store::RecordState::Released | idempotent_core::store::RecordState::Failed => {
                    format!(
                        "{} failed, last error {:?}, kept {ttl}",
                        view.attempts.unwrap_or(0),
                        view.last_error.as_deref().unwrap_or("")
                    )
                }
                idempotent_core::store::RecordState::Unknown => format!(
                    "owner {}, attempt {}, held until resolved",
                    view.owner.as_deref().unwrap_or("-"),
                    view.attempts.unwrap_or(1)
                ),
            };
            (render::state(view.state), details)
        }
        Some(Inspected::Absent) if op == "set" => ("absent", "gone already".to_owned()),
        Some(Inspected::Absent) => ("absent", String::new()),
        None if op == "expire" => ("-", "expiry set: a lease renewed".to_owned()),
        Some(Inspected::Foreign { reason }) => ("foreign", reason.clone()),
        None => ("-", String::new()),
    };
    let details = if details.is_empty() { details } else { format!("  ({details})") };
    writeln!(out, "{time}  {op:<8} {state:<12} {key}{details}")?;
    Ok(())
}

/// The full key of a record key under the namespace: `{namespace}:{8 hex digits}:{full key}`,
/// checked by building the record key back (the hash tag must be the key's own).
fn full_key_of<'a>(ctx: &Ctx, store: &RedisStore, record_key: &'a str) -> Option<&'a str> {
    let full = record_key.strip_prefix(ctx.namespace.as_str())?.strip_prefix(":{")?.get(10..)?;
    (store.record_key(full) == record_key).then_some(full)
}

/// `text` with the glob characters of a channel pattern escaped.
fn glob_escaped(text: &str) -> String {
    text.chars()
        .flat_map(|c| matches!(c, '*' | '?' | '[' | ']' | '\\').then_some('\\').into_iter().chain([c]))
        .collect()
}

/// `flags` (a `notify-keyspace-events` value) with what watch needs added, in the order of
/// [`NEEDED`]; `flags` itself when nothing is missing.
fn with_needed(flags: &str) -> String {
    let mut wanted = flags.to_owned();
    for c in NEEDED {
        let covered = flags.contains(c) || (c != 'K' && flags.contains('A'));
        if !covered {
            wanted.push(c);
        }
    }
    wanted
}

/// The configuration of a client for each node to subscribe on: every primary of a cluster, or
/// the one server (a Sentinel group's primary) otherwise.
fn node_configs(store: &RedisStore) -> Result<Vec<Config>, Failure> {
    let client = store.pool().next();
    let config = client.client_config();
    if !config.server.is_clustered() {
        return Ok(vec![config]);
    }
    let state = client
        .cached_cluster_state()
        .ok_or_else(|| Failure::new(EXIT_FAILURE, "watch: the cluster's slot map is not known yet"))?;
    let mut primaries = state.unique_primary_nodes();
    primaries.sort_by(|a, b| (&a.host, a.port).cmp(&(&b.host, b.port)));
    Ok(primaries
        .into_iter()
        .map(|server| Config { server: ServerConfig::Centralized { server }, ..config.clone() })
        .collect())
}

/// A subscriber connection to one node.
struct Node {
    client: SubscriberClient,
    /// `host:port`, for messages.
    name: String,
    host: String,
    port: u16,
    db: u8,
}

impl Node {
    async fn connect(config: Config, timeout: Duration) -> Result<Node, Failure> {
        let db = if config.server.is_clustered() { 0 } else { config.database.unwrap_or(0) };
        let mut builder = Builder::from_config(config);
        builder.set_policy(ReconnectPolicy::new_exponential(0, 100, 2_000, 2)).with_connection_config(|c| {
            c.connection_timeout = timeout;
            c.internal_command_timeout = timeout;
        });
        let client = builder
            .build_subscriber_client()
            .map_err(|e| Failure::new(EXIT_CONNECT, format!("watch: cannot configure a subscriber: {e}")))?;
        // `init` subscribes to the connect notification before it starts the connection task;
        // `connect` then `wait_for_connect` can miss a connection that completes in between and
        // wait out the whole timeout.
        bounded("connect", timeout, client.init())
            .await
            .map_err(|f| Failure { code: EXIT_CONNECT, message: f.message })?;
        let (host, port) = match client.active_connections().into_iter().next() {
            Some(server) => (server.host.to_string(), server.port),
            None => ("?".to_owned(), 0),
        };
        Ok(Node { client, name: format!("{host}:{port}"), host, port, db })
    }

    /// The node's `notify-keyspace-events`.
    async fn notify_flags(&self, timeout: Duration) -> Result<String, Failure> {
        let get = CustomCommand::new_static("CONFIG GET", ClusterHash::Random, false);
        let reply: Value =
            bounded("CONFIG GET", timeout, self.client.custom(get, vec!["notify-keyspace-events"])).await?;
        let flags = match reply {
            Value::Array(items) => items.get(1).and_then(Value::as_string),
            Value::Map(map) => map.inner().into_iter().next().and_then(|(_, v)| v.as_string()),
            _ => None,
        };
        flags.ok_or_else(|| {
            Failure::new(EXIT_FAILURE, format!("CONFIG GET notify-keyspace-events on {}: no value", self.name))
        })
    }

    /// Whether the connection is subscribed: fred 10 sends PSUBSCRIBE without waiting for an
    /// answer, so a refusal (`NOPERM`: the command, or a channel pattern the user may not use) is
    /// lost. Redis answers PING on a RESP2 connection with `pong` and an empty string in an array
    /// once the connection has subscribed to something, with plain `PONG` before.
    /// The refusal itself may also arrive as the answer to the PING: the reply frames are matched
    /// to commands in order, and fred does not count the unanswered PSUBSCRIBE, so the `NOPERM`
    /// error frame can be taken for the PING's answer. Both mean the same.
    async fn check_subscribed(&self, pattern: &str, timeout: Duration) -> Result<(), Failure> {
        let refused = match tokio::time::timeout(timeout, self.client.ping::<Value>(None)).await {
            Ok(Ok(pong)) => {
                matches!(&pong, Value::String(s) if &**s == "PONG")
                    && self.client.protocol_version() == idempotent_core::store::redis::fred::types::RespVersion::RESP2
            }
            Ok(Err(e)) if e.details().starts_with("NOPERM") && e.details().contains("channels") => true,
            Ok(Err(e)) => return Err(command_failure("PING", &e)),
            Err(_) => return Err(unanswered("PING", timeout)),
        };
        if refused {
            return Err(Failure::new(
                EXIT_FAILURE,
                format!(
                    "watch: PSUBSCRIBE {pattern} was refused on {}: the CLI's user needs +psubscribe and the \
                     channel pattern &{pattern} exactly (Redis checks a subscribed pattern literally against \
                     the user's channel rules; docs/cli.md lists the permissions)",
                    self.name
                ),
            ));
        }
        Ok(())
    }

    async fn set_notify_flags(&self, flags: &str, timeout: Duration) -> Result<(), Failure> {
        let set = CustomCommand::new_static("CONFIG SET", ClusterHash::Random, false);
        let _: Value =
            bounded("CONFIG SET", timeout, self.client.custom(set, vec!["notify-keyspace-events", flags])).await?;
        Ok(())
    }
}

/// A fred command bounded by `timeout`; a refused permission named with what the CLI needs.
async fn bounded<T>(
    op: &str,
    timeout: Duration,
    fut: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<T, Failure> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(command_failure(op, &e)),
        Err(_) => Err(unanswered(op, timeout)),
    }
}

/// A command's error, a refused permission named with where the CLI's permissions are listed.
fn command_failure(op: &str, e: &Error) -> Failure {
    let hint =
        if e.details().starts_with("NOPERM") { " (docs/cli.md lists the permissions the CLI needs)" } else { "" };
    Failure::new(EXIT_FAILURE, format!("watch: {op}: {}{hint}", e.details()))
}

fn unanswered(op: &str, timeout: Duration) -> Failure {
    Failure::new(EXIT_FAILURE, format!("watch: {op}: no answer within {timeout:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_notification_classes_are_added_to_those_on() {
        assert_eq!(with_needed(""), "K$gx");
        assert_eq!(with_needed("Ex"), "ExK$g");
        assert_eq!(with_needed("AK"), "AK");
        assert_eq!(with_needed("KA"), "KA");
        assert_eq!(with_needed("gxK$"), "gxK$");
        assert_eq!(with_needed("A"), "AK");
    }

    #[test]
    fn patterns_escape_globs() {
        assert_eq!(glob_escaped("idem"), "idem");
        assert_eq!(glob_escaped("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
