//! `idempotency`: the operator's tool for the records the `idempotency` crate keeps in Redis or
//! PostgreSQL.
//!
//! It reads and deletes records through the library's own operator API (`inspect`, `forget`,
//! `scan` of `idempotent-core`), so it reads the record format exactly as the library writes
//! it, and deletes records the way the library does (owner-checked, waiters woken, replay caches
//! told). The commands, their output and the exit codes are described in `docs/cli.md`.
//!
//! Layout: [`args`] declares the command line, [`connect`] turns it into a store, one module per
//! command ([`inspect`], [`list`], [`purge`], [`resolve`], [`stats`], [`watch`]), and [`client`] (a client's
//! keys of the HTTP layer), [`scan`], [`render`] and [`failure`] serve them all.

mod args;
mod client;
mod connect;
mod failure;
mod inspect;
mod list;
mod purge;
mod render;
mod resolve;
mod scan;
mod stats;
mod watch;

use std::process::ExitCode;

use clap::Parser;

use args::{Cli, Command};
use failure::{Failure, EXIT_FAILURE};

fn main() -> ExitCode {
    // Parse errors (and --help, --version) exit by themselves: 2 for usage, 0 for help.
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return report(Failure::new(EXIT_FAILURE, format!("cannot start the async runtime: {e}"))),
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => report(failure),
    }
}

/// `rotate-token-secret`: a new shared token secret, the current one kept as the previous.
async fn rotate(ctx: &connect::Ctx, out: &mut impl std::io::Write) -> Result<(), Failure> {
    let store = ctx.redis(
        "rotate-token-secret",
        "a PgStore's secret is the row 'token' of its _secret table (the one before, 'token:previous')",
    )?;
    store.rotate_token_secret().await.map_err(|e| Failure::new(failure::EXIT_FAILURE, format!("rotate: {e}")))?;
    writeln!(
        out,
        "rotated the token secret of {}: processes sign with the new one once they connect again; tokens \
         signed with the one before stay accepted until the next rotation",
        ctx.namespace
    )
    .map_err(|e| Failure::new(failure::EXIT_FAILURE, e.to_string()))
}

/// Prints a failure's message (if any) on stderr and turns it into the process's exit code.
fn report(failure: Failure) -> ExitCode {
    if let Some(message) = &failure.message {
        eprintln!("idempotency: {message}");
    }
    ExitCode::from(failure.code)
}

async fn run(mut cli: Cli) -> Result<(), Failure> {
    client::resolve(&mut cli.command)?;
    let ctx = connect::connect(&cli.connection).await?;
    let mut out = std::io::stdout().lock();
    let result = match &cli.command {
        Command::Inspect(a) => inspect::run(&ctx, a, &mut out).await,
        Command::List(a) => list::run(&ctx, a, &mut out).await,
        Command::Purge(a) => purge::run(&ctx, a, &mut out).await,
        Command::Resolve(a) => resolve::run(&ctx, a, &mut out).await,
        Command::Stats(a) => stats::run(&ctx, a, &mut out).await,
        Command::Watch(a) => watch::run(&ctx, a, &mut out).await,
        Command::RotateTokenSecret => rotate(&ctx, &mut out).await,
    };
    ctx.close().await;
    result
}
