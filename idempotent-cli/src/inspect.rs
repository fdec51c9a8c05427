//! `inspect KEY`: one record whole.

use std::io::Write;
use std::time::SystemTime;

use idempotent_core::store::Inspected;
use idempotent_core::RedisStore;

use crate::args::InspectArgs;
use crate::connect::{Backend, Ctx};
use crate::failure::{Failure, EXIT_FOREIGN, EXIT_NOT_FOUND};
use crate::render;

pub async fn run(ctx: &Ctx, args: &InspectArgs, out: &mut impl Write) -> Result<(), Failure> {
    let (what, place) = ctx.location(&args.key);
    match ctx.idem.inspect("", &args.key).await? {
        Inspected::Record(view) => {
            let now = SystemTime::now();
            if args.json {
                writeln!(out, "{}", render::record_json(&view, now))?;
            } else {
                write!(out, "{}", render::record_text(&view, (what, &place), now))?;
            }
            Ok(())
        }
        Inspected::Absent => Err(Failure::new(
            EXIT_NOT_FOUND,
            format!("no record at {:?} ({what} {place}, namespace {})", args.key, ctx.namespace),
        )),
        Inspected::Foreign { reason } => {
            let what = match &ctx.backend {
                Backend::Redis(store) => describe_foreign(ctx, store, &place, &reason).await,
                // A table's rows are typed and checked: what cannot be read says why itself.
                Backend::Postgres(_) => reason,
            };
            Err(Failure::new(EXIT_FOREIGN, format!("{place} {what}")))
        }
    }
}

/// What a foreign value is, as precisely as can be told: a record of a format this version does
/// not read (a letter and `|` first, as every record of this library starts), or another
/// program's value. The library says only that the value is not a record it reads.
async fn describe_foreign(ctx: &Ctx, store: &RedisStore, record_key: &str, reason: &str) -> String {
    use idempotent_core::store::redis::fred::prelude::*;
    let got = tokio::time::timeout(ctx.timeout, store.pool().next().get::<Option<Vec<u8>>, _>(record_key)).await;
    match got {
        Ok(Ok(Some(bytes))) if looks_like_a_record(&bytes) => format!(
            "holds a record of a format this version does not read (it starts {:?}): a newer version of the \
             library may have written it; use the CLI of that version",
            String::from_utf8_lossy(&bytes[..bytes.len().min(2)])
        ),
        Ok(Ok(Some(bytes))) => format!("{reason}: another program's value, {} bytes", bytes.len()),
        // Not a string (the reason names its type), gone since, or unreadable now.
        _ => reason.to_owned(),
    }
}

/// Whether `bytes` start like a record of this library, in some format: `X|` with `X` an ASCII
/// capital letter (the state).
fn looks_like_a_record(bytes: &[u8]) -> bool {
    matches!(bytes, [s, b'|', ..] if s.is_ascii_uppercase())
}

#[cfg(test)]
mod tests {
    #[test]
    fn records_of_other_formats_are_told_from_other_values() {
        assert!(super::looks_like_a_record(b"I|0|||||"));
        assert!(super::looks_like_a_record(b"C|12"));
        assert!(!super::looks_like_a_record(b"someone else's"));
        assert!(!super::looks_like_a_record(b"c|1"));
        assert!(!super::looks_like_a_record(b""));
    }
}
