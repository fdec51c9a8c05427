//! `purge`: deletes records (`Idempotency::forget`: owner-checked, waiters woken, replay caches
//! told), named one by one or found by a scan. A dry run unless `--yes`; records in progress
//! only with `--force`.

use std::io::Write;

use idempotent_core::store::{Forgotten, Inspected, RecordState};
use idempotent_core::{Force, Idempotency};

use crate::args::PurgeArgs;
use crate::connect::Ctx;
use crate::failure::Failure;
use crate::list::scan_filter;
use crate::render;
use crate::scan::Pages;

/// What deleting a key did, or would do.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// Deleted (or would be), in this state.
    Delete(RecordState),
    /// In progress, and not forced: left alone.
    Skip,
    /// No record.
    Absent,
    /// Not a record of this library: left alone.
    Foreign(String),
}

impl From<Forgotten> for Outcome {
    fn from(f: Forgotten) -> Self {
        match f {
            Forgotten::Deleted(state) => Outcome::Delete(state),
            Forgotten::InProgress => Outcome::Skip,
            Forgotten::Absent => Outcome::Absent,
            Forgotten::Foreign { reason } => Outcome::Foreign(reason),
        }
    }
}

/// What a dry run says of a record in `state`.
fn planned(state: RecordState, force: bool) -> Outcome {
    match state {
        RecordState::InProgress if !force => Outcome::Skip,
        state => Outcome::Delete(state),
    }
}

#[derive(Default)]
struct Tally {
    deleted: u64,
    skipped: u64,
    absent: u64,
    foreign: u64,
}

struct Purge<'o, W> {
    out: &'o mut W,
    delete: bool,
    tally: Tally,
}

impl<W: Write> Purge<'_, W> {
    fn report(&mut self, key: &str, outcome: &Outcome) -> std::io::Result<()> {
        let (done, state, note) = match outcome {
            Outcome::Delete(s) => {
                self.tally.deleted += 1;
                (if self.delete { "deleted" } else { "would delete" }, render::state(*s), String::new())
            }
            Outcome::Skip => {
                self.tally.skipped += 1;
                let verb = if self.delete { "skipped" } else { "would skip" };
                (verb, "in_progress", "  (in progress: --force deletes it)".to_owned())
            }
            Outcome::Absent => {
                self.tally.absent += 1;
                ("absent", "-", String::new())
            }
            Outcome::Foreign(reason) => {
                self.tally.foreign += 1;
                ("foreign", "-", format!("  ({reason}; left alone)"))
            }
        };
        writeln!(self.out, "{done:<13} {state:<12} {key}{note}")
    }

    /// Reports every outcome; on the first failure, the summary of what was done and the failure.
    fn report_all<'k>(
        &mut self,
        outcomes: impl IntoIterator<Item = (&'k str, Result<Outcome, Failure>)>,
    ) -> Result<(), Failure> {
        let mut failed = None;
        for (key, outcome) in outcomes {
            match outcome {
                Ok(outcome) => self.report(key, &outcome)?,
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        match failed {
            None => Ok(()),
            Some(e) => {
                self.summary()?;
                Err(e)
            }
        }
    }

    fn summary(&mut self) -> std::io::Result<()> {
        let Tally { deleted, skipped, absent, foreign } = self.tally;
        let rest = format!("{skipped} skipped (in progress, without --force), {absent} absent, {foreign} foreign");
        if self.delete {
            writeln!(self.out, "deleted {deleted}, {rest}")
        } else {
            writeln!(self.out, "dry run: {deleted} would be deleted, {rest}; nothing was deleted (--yes deletes)")
        }
    }
}

pub async fn run<W: Write>(ctx: &Ctx, args: &PurgeArgs, out: &mut W) -> Result<(), Failure> {
    if args.force {
        eprintln!(
            "idempotency: --force: records in progress are {} too. Their bodies keep running: a second call \
             with the same key may start the body again while the first still runs it (the first learns \
             at its next renewal that its lease is lost).",
            if args.yes { "deleted" } else { "counted as deletable" }
        );
    }
    let force = if args.force { Force::InProgress } else { Force::CompletedOnly };
    let mut purge = Purge { out, delete: args.yes, tally: Tally::default() };
    if args.keys.is_empty() {
        let mut pages = Pages::new(ctx, scan_filter(&args.filter), args.progress);
        while let Some(page) = pages.next().await? {
            let keys: Vec<&str> = page.records.iter().map(|r| r.key.as_str()).collect();
            let outcomes = if args.yes {
                forget_all(&ctx.idem, &keys, force).await
            } else {
                page.records.iter().map(|r| Ok(planned(r.state, args.force))).collect()
            };
            let foreign = page.foreign.iter().map(|(key, reason)| (key.as_str(), Ok(Outcome::Foreign(reason.clone()))));
            purge.report_all(keys.into_iter().zip(outcomes).chain(foreign))?;
        }
        pages.finish();
    } else {
        let keys: Vec<&str> = args.keys.iter().map(String::as_str).collect();
        let outcomes = if args.yes {
            forget_all(&ctx.idem, &keys, force).await
        } else {
            let mut planned_outcomes = Vec::with_capacity(keys.len());
            for key in &keys {
                planned_outcomes.push(ctx.idem.inspect("", key).await.map_err(Failure::from).map(
                    |found| match found {
                        Inspected::Record(view) => planned(view.state, args.force),
                        Inspected::Absent => Outcome::Absent,
                        Inspected::Foreign { reason } => Outcome::Foreign(reason),
                    },
                ));
            }
            planned_outcomes
        };
        purge.report_all(keys.into_iter().zip(outcomes))?;
    }
    purge.summary()?;
    Ok(())
}

/// Forgets `keys` concurrently (one connection pipelines them); outcomes in their order.
async fn forget_all(idem: &Idempotency, keys: &[&str], force: Force) -> Vec<Result<Outcome, Failure>> {
    let tasks: Vec<_> = keys
        .iter()
        .map(|key| {
            let (idem, key) = (idem.clone(), (*key).to_owned());
            tokio::spawn(async move { idem.forget("", &key, force).await })
        })
        .collect();
    let mut outcomes = Vec::with_capacity(tasks.len());
    for task in tasks {
        let outcome = match task.await {
            Ok(forgotten) => forgotten.map(Outcome::from).map_err(Failure::from),
            Err(e) => Err(Failure::new(crate::failure::EXIT_FAILURE, e.to_string())),
        };
        outcomes.push(outcome);
    }
    outcomes
}
