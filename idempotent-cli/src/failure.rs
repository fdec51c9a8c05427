//! Why a command failed, and the exit code that says so (documented in `--help` and
//! `docs/cli.md`).

use idempotent_core::{Error, StoreError};

/// Any other failure: a store error after connecting (a command timed out, the server went
/// away, a permission is missing), output that cannot be written.
pub const EXIT_FAILURE: u8 = 1;
/// The command line is wrong (clap exits with it by itself).
pub const EXIT_USAGE: u8 = 2;
/// The store cannot be reached or is misconfigured: a bad or missing URL, an unreachable server,
/// refused credentials, an unreadable CA file.
pub const EXIT_CONNECT: u8 = 3;
/// `inspect`: no record at that key.
pub const EXIT_NOT_FOUND: u8 = 4;
/// `inspect`: the key holds something that is not a record this version reads (another
/// program's value, or a record of another format).
pub const EXIT_FOREIGN: u8 = 5;
/// `watch`: the server's keyspace notifications are off.
pub const EXIT_NOTIFICATIONS_OFF: u8 = 6;
/// `watch`, `rotate-token-secret`: the command needs Redis, and the store is PostgreSQL.
pub const EXIT_REDIS_ONLY: u8 = 7;
/// `resolve`: the record is not an unknown outcome (in progress with its lease running,
/// completed, released, failed): nothing was changed.
pub const EXIT_NOT_UNKNOWN: u8 = 8;

/// The exit codes, as `--help` shows them.
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  success
  1  other failure (a store command failed or timed out after connecting, output not written)
  2  usage: the command line is wrong
  3  cannot connect, or bad configuration (bad or missing URL, unreachable server, refused
     credentials, unreadable CA file)
  4  inspect, resolve: no record at that key
  5  inspect, resolve: the key holds a foreign value, or a record of a format this version does
     not read
  6  watch: keyspace notifications are off on the server (see --enable-notifications)
  7  watch, rotate-token-secret: the store is PostgreSQL, and the command works on Redis only
  8  resolve: the record is not an unknown outcome (nothing changed)";

/// A failed command: its exit code, and a message for stderr (none when the failure was
/// already reported, or needs no words: output cut by a closed pipe).
#[derive(Debug)]
pub struct Failure {
    /// The process's exit code.
    pub code: u8,
    /// What went wrong, printed after `idempotency: `.
    pub message: Option<String>,
}

impl Failure {
    /// A failure with exit code `code` and `message`.
    pub fn new(code: u8, message: impl Into<String>) -> Failure {
        Failure { code, message: Some(message.into()) }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::new(EXIT_FAILURE, e.to_string())
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::new(EXIT_FAILURE, e.to_string())
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            // The reader went away (`idempotency list | head`): stop quietly, as other tools do.
            Failure { code: 0, message: None }
        } else {
            Failure::new(EXIT_FAILURE, format!("cannot write the output: {e}"))
        }
    }
}
