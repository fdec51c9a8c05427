//! `list`: the records a filter keeps, as a table streamed page by page, or one JSON object a
//! line. Foreign values under the prefix are listed too, with what they hold.

use std::io::Write;
use std::time::SystemTime;

use idempotent_core::store::RecordView;
use idempotent_core::ScanFilter;

use crate::args::{Filter, ListArgs, YesNo};
use crate::connect::Ctx;
use crate::failure::Failure;
use crate::render;
use crate::scan::Pages;

/// A row of the table. The key comes last so that every other column has a fixed width and the
/// table can be printed as the scan goes.
fn columns(state: &str, age: &str, ttl: &str, fence: &str, result: &str, key: &str) -> String {
    format!("{state:<12} {age:<8} {ttl:<8} {fence:<18} {result:>6}  {key}")
}

pub async fn run(ctx: &Ctx, args: &ListArgs, out: &mut impl Write) -> Result<(), Failure> {
    let mut filter = scan_filter(&args.filter);
    filter.fingerprinted = args.fingerprinted.map(|f| f == YesNo::Yes);
    let limit = args.limit.unwrap_or(u64::MAX);
    let mut pages = Pages::new(ctx, filter, args.progress);
    let (mut counts, mut foreign, mut cut) = (render::Counts::default(), 0u64, false);
    if !args.json {
        writeln!(out, "{}", columns("STATE", "AGE", "TTL", "FENCE", "RESULT", "KEY"))?;
    }
    'scan: while let Some(page) = pages.next().await? {
        let now = SystemTime::now();
        for view in &page.records {
            if counts.total() + foreign >= limit {
                cut = true;
                break 'scan;
            }
            counts.add(view.state);
            if args.json {
                writeln!(out, "{}", render::record_json(view, now))?;
            } else {
                writeln!(out, "{}", row(view, now))?;
            }
        }
        for (key, reason) in &page.foreign {
            if counts.total() + foreign >= limit {
                cut = true;
                break 'scan;
            }
            foreign += 1;
            if args.json {
                writeln!(out, "{}", render::foreign_json(key, reason))?;
            } else {
                writeln!(out, "{}  ({reason})", columns("foreign", "-", "-", "-", "-", key))?;
            }
        }
    }
    pages.finish();
    if !args.json {
        let cut = if cut { " (--limit reached)" } else { "" };
        writeln!(
            out,
            "{} ({}), {foreign} foreign; {} examined{cut}",
            render::count(counts.total(), "record"),
            counts.text(),
            render::count(pages.examined, "key")
        )?;
    }
    Ok(())
}

/// The library's filter for `--prefix`, `--state`, `--older-than`.
pub fn scan_filter(f: &Filter) -> ScanFilter {
    ScanFilter {
        prefix: f.prefix.clone().unwrap_or_default(),
        state: f.state.map(Into::into),
        older_than: f.older_than,
        fingerprinted: None,
    }
}

/// One record as a row of the table.
fn row(view: &RecordView, now: SystemTime) -> String {
    let dash = || "-".to_owned();
    let age = view.age(now).map_or_else(dash, render::short_duration);
    let ttl = view.ttl.map_or_else(|| "none".to_owned(), render::short_duration);
    let fence = view.fence.map_or_else(dash, |f| f.to_string());
    let result = view.result_bytes().map_or_else(dash, |n| n.to_string());
    columns(render::state(view.state), &age, &ttl, &fence, &result, &view.key)
}
