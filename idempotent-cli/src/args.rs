//! The command line: global connection options and one subcommand.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};
use idempotent_core::store::RecordState;

use crate::failure::EXIT_CODES_HELP;

/// Inspect, list, purge, resolve, count and watch the records the `idempotency` crate keeps in
/// Redis or PostgreSQL.
#[derive(Debug, Parser)]
#[command(name = "idempotency", version, after_help = EXIT_CODES_HELP, max_term_width = 100)]
pub struct Cli {
    #[command(flatten)]
    pub connection: Connection,
    #[command(subcommand)]
    pub command: Command,
}

/// Where the records are.
#[derive(Debug, Args)]
#[command(next_help_heading = "Connection")]
pub struct Connection {
    /// The store's URL: redis://, rediss://, redis-cluster://host:port?node=host2:port2,
    /// redis-sentinel://host:port?sentinelServiceName=NAME (and valkey:// alike); credentials as
    /// redis://user:password@host:port; or postgres://user:password@host:port/database for a
    /// PgStore's table (see --schema, --table)
    #[arg(long, env = "IDEMPOTENCY_REDIS_URL", hide_env_values = true, global = true, value_name = "URL")]
    pub url: Option<String>,

    /// Redis: the store's key prefix (RedisStoreBuilder::prefix)
    #[arg(short = 'n', long, env = "IDEMPOTENCY_PREFIX", default_value = "idem", global = true)]
    pub namespace: String,

    /// PostgreSQL: the schema of the records table (PgStoreBuilder::schema)
    #[arg(long, env = "IDEMPOTENCY_PG_SCHEMA", default_value = "public", global = true)]
    pub schema: String,

    /// PostgreSQL: the records table (PgStoreBuilder::table)
    #[arg(long, env = "IDEMPOTENCY_PG_TABLE", default_value = "idempotency", global = true)]
    pub table: String,

    /// The bound on connecting and on every store command, like 500ms, 2s
    #[arg(long, env = "IDEMPOTENCY_TIMEOUT", default_value = "2s", value_parser = duration, global = true)]
    pub timeout: Duration,

    /// A PEM file of CAs to trust for rediss:// instead of the system's
    #[arg(long, env = "IDEMPOTENCY_TLS_CA_FILE", global = true, value_name = "FILE")]
    pub tls_ca_file: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show one record whole: state, fence, owner, times, fingerprint, result
    Inspect(InspectArgs),
    /// List records, page by page (SCAN: never blocks the server; every primary of a cluster)
    List(ListArgs),
    /// Delete records (a dry run unless --yes)
    Purge(PurgeArgs),
    /// Resolve an unknown outcome (a key held under on_crash = hold whose holder stopped without
    /// a commit): it completed (with a value, or without one) or it did not (the key is
    /// released and the next call runs the body)
    Resolve(ResolveArgs),
    /// Count records by state and scope, and estimate their memory
    Stats(StatsArgs),
    /// Print records' transitions live, from keyspace notifications
    Watch(WatchArgs),
    /// Replace the token secret the store's runtimes share (the old one stays accepted until the
    /// next rotation); processes pick the new one up when they connect
    RotateTokenSecret,
}

/// A client's keys of the HTTP layer (`IdempotencyLayer::per_client`), addressed by what the
/// operator knows: the header the client sends, or its id.
#[derive(Debug, Args)]
#[command(next_help_heading = "A client's keys (the HTTP layer's per_client)")]
pub struct ClientArgs {
    /// The keys given (and --prefix) are the Idempotency-Key values of the client that sends
    /// this header, as 'NAME: VALUE' (e.g. 'Authorization: Bearer ...', 'X-Api-Key: ...'): its
    /// value is hashed as the layer's client::authorization and client::header hash it
    #[arg(long, value_name = "HEADER", conflicts_with = "client")]
    pub client_header: Option<String>,
    /// The keys given (and --prefix) are the Idempotency-Key values of this client id (what the
    /// layer's client extractor returned, e.g. a client::extension's user id)
    #[arg(long, value_name = "ID")]
    pub client: Option<String>,
    /// The HTTP layer's scope (IdempotencyLayer::scope), with --client-header or --client
    #[arg(long, value_name = "SCOPE", default_value = "http")]
    pub http_scope: String,
    /// With --client-header or --client: the keys are form tokens (require_token routes), not
    /// Idempotency-Key values
    #[arg(long)]
    pub token: bool,
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The full key: the scope, `:`, the key (e.g. `my_crate::payments::pay:stripe:1`); with
    /// --client-header or --client, the client's Idempotency-Key value
    pub key: String,
    #[command(flatten)]
    pub client: ClientArgs,
    /// Print the record as one JSON object
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("outcome").required(true).args(["completed", "completed_without_value", "release"])))]
pub struct ResolveArgs {
    /// The full key, as `inspect` takes it; with --client-header or --client, the client's
    /// Idempotency-Key value
    pub key: String,
    #[command(flatten)]
    pub client: ClientArgs,
    /// It happened: complete the key with this JSON value (the function's Ok value), which
    /// calls then replay
    #[arg(long, value_name = "JSON")]
    pub completed: Option<String>,
    /// It happened, with no value to replay: calls get Error::Duplicate
    #[arg(long)]
    pub completed_without_value: bool,
    /// It did not happen: release the key (its attempt counted); the next call runs the body
    #[arg(long)]
    pub release: bool,
}

/// A record's state on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StateArg {
    InProgress,
    Completed,
    /// Released after failed attempts (the next call runs the next attempt)
    Released,
    /// Failed for good: the key gave up (give_up_after)
    Failed,
    /// Unknown: held (on_crash = hold) since its holder stopped without a commit
    Unknown,
}

impl From<StateArg> for RecordState {
    fn from(s: StateArg) -> Self {
        match s {
            StateArg::InProgress => RecordState::InProgress,
            StateArg::Completed => RecordState::Completed,
            StateArg::Released => RecordState::Released,
            StateArg::Failed => RecordState::Failed,
            StateArg::Unknown => RecordState::Unknown,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum YesNo {
    Yes,
    No,
}

/// Which records a scan keeps.
#[derive(Debug, Args)]
pub struct Filter {
    /// Only records whose full key starts with this (a scope and `:`, say); "" for all
    #[arg(long, value_name = "P")]
    pub prefix: Option<String>,
    /// Only records in this state
    #[arg(long)]
    pub state: Option<StateArg>,
    /// Only records older than this (since the call started, or its result was stored), like 10m
    #[arg(long, value_parser = duration, value_name = "AGE")]
    pub older_than: Option<Duration>,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub filter: Filter,
    #[command(flatten)]
    pub client: ClientArgs,
    /// Only records stored with (yes) or without (no) a payload fingerprint
    #[arg(long)]
    pub fingerprinted: Option<YesNo>,
    /// Stop after this many rows
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
    /// One JSON object per line instead of a table
    #[arg(long)]
    pub json: bool,
    /// Report progress on stderr even when it is not a terminal
    #[arg(long)]
    pub progress: bool,
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("target").required(true).multiple(true).args(["keys", "prefix"])))]
pub struct PurgeArgs {
    /// Full keys to delete (or use --prefix and the filters); with --client-header or --client,
    /// the client's Idempotency-Key values
    #[arg(conflicts_with_all = ["prefix", "state", "older_than"])]
    pub keys: Vec<String>,
    #[command(flatten)]
    pub filter: Filter,
    #[command(flatten)]
    pub client: ClientArgs,
    /// Delete records in progress too: a second call may then run the body while the first
    /// still runs it
    #[arg(long)]
    pub force: bool,
    /// Delete (without it, a dry run: prints what would be deleted, deletes nothing)
    #[arg(long)]
    pub yes: bool,
    /// Report progress on stderr even when it is not a terminal
    #[arg(long)]
    pub progress: bool,
}

#[derive(Debug, Args)]
pub struct StatsArgs {
    /// Only records whose full key starts with this
    #[arg(long, value_name = "P", default_value = "")]
    pub prefix: String,
    /// How many records to measure with MEMORY USAGE (0: none)
    #[arg(long, value_name = "N", default_value_t = 200)]
    pub sample: usize,
    /// One JSON object instead of text
    #[arg(long)]
    pub json: bool,
    /// Report progress on stderr even when it is not a terminal
    #[arg(long)]
    pub progress: bool,
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Only records whose full key starts with this
    #[arg(long, value_name = "P", default_value = "")]
    pub prefix: String,
    /// Turn keyspace notifications on where they are off (CONFIG SET notify-keyspace-events,
    /// keeping the classes already on), instead of failing with exit code 6
    #[arg(long)]
    pub enable_notifications: bool,
    /// Stop after this long (default: until Ctrl-C), like 10s
    #[arg(long = "for", value_parser = duration, value_name = "DURATION")]
    pub duration: Option<Duration>,
    /// One JSON object per event instead of text
    #[arg(long)]
    pub json: bool,
}

/// A duration argument: `500ms`, `2s`, `10m`, `24h`, `7d`, or seconds.
fn duration(text: &str) -> Result<Duration, String> {
    idempotent_core::parse_duration(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn purge_needs_keys_or_a_prefix_and_not_both() {
        let parse = |args: &[&str]| Cli::try_parse_from(["idempotency", "purge"].iter().chain(args));
        assert!(parse(&[]).is_err());
        assert!(parse(&["orders:1"]).is_ok());
        assert!(parse(&["--prefix", ""]).is_ok());
        assert!(parse(&["orders:1", "--prefix", "orders:"]).is_err());
        assert!(parse(&["orders:1", "--state", "completed"]).is_err());
        assert!(parse(&["--prefix", "o", "--older-than", "soon"]).is_err());
    }
}
