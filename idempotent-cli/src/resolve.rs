//! `resolve KEY --completed JSON | --completed-without-value | --release`: an unknown outcome
//! (a key held under `on_crash = hold` whose holder stopped without a commit) resolved by the
//! operator who found out what became of it, through the library's `Idempotency::resolve`
//! (owner-checked against the record, logged and counted as the library does).

use std::io::Write;

use idempotent_core::store::Resolved;
use idempotent_core::Resolve;

use crate::args::ResolveArgs;
use crate::connect::Ctx;
use crate::failure::{Failure, EXIT_FOREIGN, EXIT_NOT_FOUND, EXIT_NOT_UNKNOWN, EXIT_USAGE};
use crate::render;

pub async fn run(ctx: &Ctx, args: &ResolveArgs, out: &mut impl Write) -> Result<(), Failure> {
    let resolve = match (&args.completed, args.completed_without_value, args.release) {
        (Some(json), false, false) => match serde_json::from_str(json) {
            Ok(value) => Resolve::Completed(value),
            Err(e) => return Err(Failure::new(EXIT_USAGE, format!("--completed {json:?} is not JSON: {e}"))),
        },
        (None, true, false) => Resolve::CompletedWithoutValue,
        (None, false, true) => Resolve::NotDone,
        // clap's group takes exactly one.
        _ => return Err(Failure::new(EXIT_USAGE, "give one of --completed, --completed-without-value, --release")),
    };
    let (what, place) = ctx.location(&args.key);
    match ctx.idem.resolve("", &args.key, resolve.clone()).await? {
        Resolved::Done => {
            let how = match resolve {
                Resolve::NotDone => "released: the next call runs the body",
                Resolve::CompletedWithoutValue => "completed without a value: calls get Error::Duplicate",
                _ => "completed: calls replay the value given",
            };
            writeln!(out, "resolved     {} ({how})", args.key)?;
            Ok(())
        }
        Resolved::Absent => Err(Failure::new(
            EXIT_NOT_FOUND,
            format!("no record at {:?} ({what} {place}, namespace {})", args.key, ctx.namespace),
        )),
        Resolved::Running => Err(Failure::new(
            EXIT_NOT_UNKNOWN,
            format!(
                "{:?} is held and its holder's lease has not ended: it may still commit or release; nothing changed",
                args.key
            ),
        )),
        Resolved::NotUnknown(state) => Err(Failure::new(
            EXIT_NOT_UNKNOWN,
            format!("{:?} is {}, not an unknown outcome: nothing changed", args.key, render::state(state)),
        )),
        Resolved::Corrupt { reason } => Err(Failure::new(EXIT_FOREIGN, format!("{place} {reason}"))),
    }
}
