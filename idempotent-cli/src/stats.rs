//! `stats`: records counted by state and by scope over a whole scan, and their memory estimated
//! from a uniform sample of them: `MEMORY USAGE` on Redis (sent to the node that holds each
//! key), `pg_column_size` of the rows on PostgreSQL.

use std::collections::BTreeMap;
use std::io::Write;

use idempotent_core::store::redis::fred::prelude::*;
use idempotent_core::store::redis::fred::types::{ClusterHash, CustomCommand};
use idempotent_core::{PgStore, RedisStore, ScanFilter};
use serde_json::json;

use crate::args::StatsArgs;
use crate::connect::{Backend, Ctx};
use crate::failure::{Failure, EXIT_FAILURE};
use crate::render;
use crate::scan::Pages;

use render::Counts;

/// What the sampled records take, by `how` (`MEMORY USAGE`, `pg_column_size`).
struct Memory {
    sampled: u64,
    total_bytes: u64,
    how: &'static str,
}

pub async fn run(ctx: &Ctx, args: &StatsArgs, out: &mut impl Write) -> Result<(), Failure> {
    let mut pages = Pages::new(ctx, ScanFilter::prefix(args.prefix.clone()), args.progress);
    let (mut all, mut by_scope, mut foreign) = (Counts::default(), BTreeMap::<String, Counts>::new(), 0u64);
    let mut sample = Reservoir::new(args.sample);
    while let Some(page) = pages.next().await? {
        for view in &page.records {
            all.add(view.state);
            let scope = render::scope_of(&view.key).unwrap_or("(no scope)");
            // Allocate a scope's name only the first time it is seen.
            match by_scope.get_mut(scope) {
                Some(counts) => counts.add(view.state),
                None => by_scope.entry(scope.to_owned()).or_default().add(view.state),
            }
            sample.offer(&view.key);
        }
        foreign += page.foreign.len() as u64;
    }
    pages.finish();
    let memory = match &ctx.backend {
        Backend::Redis(store) => measure(ctx, store, &sample.items).await,
        Backend::Postgres(store) => measure_rows(ctx, store, &sample.items).await,
    };
    let mut scopes: Vec<(&String, &Counts)> = by_scope.iter().collect();
    scopes.sort_by(|a, b| b.1.total().cmp(&a.1.total()).then(a.0.cmp(b.0)));
    let estimate = |m: &Memory| (m.sampled > 0).then(|| m.total_bytes as f64 / m.sampled as f64);

    if args.json {
        let scopes: serde_json::Map<String, serde_json::Value> =
            scopes.iter().map(|(s, c)| ((*s).clone(), c.json())).collect();
        let memory_json = match &memory {
            Ok(m) => json!({
                "measured_by": m.how,
                "sampled": m.sampled,
                "bytes_per_record": estimate(m),
                "estimated_total_bytes": estimate(m).map(|avg| (avg * all.total() as f64).round() as u64),
            }),
            Err(e) => json!({ "error": e.message }),
        };
        let stats = json!({
            "namespace": ctx.namespace,
            "prefix": args.prefix,
            "records": all.total(),
            "completed": all.completed,
            "in_progress": all.in_progress,
            "released": all.released,
            "failed": all.failed,
            "unknown": all.unknown,
            "foreign": foreign,
            "examined": pages.examined,
            "scopes": scopes,
            "memory": memory_json,
        });
        writeln!(out, "{stats}")?;
    } else {
        let under = match &ctx.backend {
            Backend::Redis(_) => format!("{}:{{*}}:{}*", ctx.namespace, args.prefix),
            Backend::Postgres(_) => format!("{} (keys {}*)", ctx.namespace, args.prefix),
        };
        writeln!(
            out,
            "{} under {under} ({}), {}, {} examined",
            render::count(all.total(), "record"),
            all.text(),
            render::count(foreign, "foreign value"),
            render::count(pages.examined, "key")
        )?;
        if !scopes.is_empty() {
            let width = scopes.iter().map(|(s, _)| s.len()).max().unwrap_or(0).max(5);
            writeln!(
                out,
                "{:<width$}  {:>9}  {:>9}  {:>11}  {:>8}  {:>6}  {:>7}",
                "SCOPE", "RECORDS", "COMPLETED", "IN_PROGRESS", "RELEASED", "FAILED", "UNKNOWN"
            )?;
            for (scope, c) in &scopes {
                writeln!(
                    out,
                    "{scope:<width$}  {:>9}  {:>9}  {:>11}  {:>8}  {:>6}  {:>7}",
                    c.total(),
                    c.completed,
                    c.in_progress,
                    c.released,
                    c.failed,
                    c.unknown
                )?;
            }
        }
        match &memory {
            Ok(m) => match estimate(m) {
                Some(avg) => writeln!(
                    out,
                    "memory: {avg:.0} bytes per record on average ({} of {} sampled); about {} for all {} \
                     (estimate)",
                    m.how,
                    render::count(m.sampled, "record"),
                    render::bytes((avg * all.total() as f64).round() as u64),
                    render::count(all.total(), "record")
                )?,
                None if args.sample == 0 => writeln!(out, "memory: not measured (--sample 0)")?,
                None => writeln!(out, "memory: no records to measure")?,
            },
            Err(e) => writeln!(out, "memory: not measured: {}", e.message.as_deref().unwrap_or("?"))?,
        }
    }
    memory.map(|_| ())
}

/// `MEMORY USAGE` of each record key of `keys` (full keys), sent at once; keys gone since the
/// scan are left out.
async fn measure(ctx: &Ctx, store: &RedisStore, keys: &[String]) -> Result<Memory, Failure> {
    let client = store.pool().next();
    let asks: Vec<_> = keys
        .iter()
        .map(|key| {
            let (client, record_key) = (client.clone(), store.record_key(key));
            let slot = idempotent_core::store::redis::fred::util::redis_keyslot(record_key.as_bytes());
            let cmd = CustomCommand::new_static("MEMORY USAGE", ClusterHash::Custom(slot), false);
            let bound = ctx.timeout;
            tokio::spawn(async move {
                tokio::time::timeout(bound, client.custom::<Option<u64>, _>(cmd, vec![record_key])).await
            })
        })
        .collect();
    let mut memory = Memory { sampled: 0, total_bytes: 0, how: "MEMORY USAGE" };
    for ask in asks {
        let used = match ask.await {
            Ok(Ok(Ok(used))) => used,
            Ok(Ok(Err(e))) => {
                let hint = if e.details().starts_with("NOPERM") { " (the CLI's user needs +memory|usage)" } else { "" };
                return Err(Failure::new(EXIT_FAILURE, format!("MEMORY USAGE: {}{hint}", e.details())));
            }
            Ok(Err(_)) => {
                return Err(Failure::new(EXIT_FAILURE, format!("MEMORY USAGE: timed out after {:?}", ctx.timeout)))
            }
            Err(e) => return Err(Failure::new(EXIT_FAILURE, format!("MEMORY USAGE: {e}"))),
        };
        if let Some(bytes) = used {
            memory.sampled += 1;
            memory.total_bytes += bytes;
        }
    }
    Ok(memory)
}

/// `pg_column_size` of the rows of `keys` (full keys), in one statement; rows gone since the
/// scan are left out. (The table's indexes and dead rows are not counted: `pg_total_relation_size`
/// says what the whole table takes.)
async fn measure_rows(ctx: &Ctx, store: &PgStore, keys: &[String]) -> Result<Memory, Failure> {
    use idempotent_core::store::postgres::sqlx::{self, Row};
    let stored: Vec<String> = keys.iter().map(|k| PgStore::stored_key(k).into_owned()).collect();
    let sql = format!(
        "SELECT count(*), coalesce(sum(pg_column_size(t.*)), 0)::bigint FROM {} t WHERE key = ANY($1)",
        store.table()
    );
    let query = sqlx::query(&sql).bind(stored).fetch_one(store.pool());
    let row = match tokio::time::timeout(ctx.timeout, query).await {
        Ok(Ok(row)) => row,
        Ok(Err(e)) => return Err(Failure::new(EXIT_FAILURE, format!("pg_column_size: {e}"))),
        Err(_) => return Err(Failure::new(EXIT_FAILURE, format!("pg_column_size: timed out after {:?}", ctx.timeout))),
    };
    let get =
        |i: usize| row.try_get::<i64, _>(i).map_err(|e| Failure::new(EXIT_FAILURE, format!("pg_column_size: {e}")));
    Ok(Memory { sampled: get(0)? as u64, total_bytes: get(1)? as u64, how: "pg_column_size" })
}

/// A uniform sample of at most `capacity` keys from a stream of unknown length (reservoir
/// sampling, algorithm R).
struct Reservoir {
    capacity: usize,
    seen: u64,
    items: Vec<String>,
    rng: u64,
}

impl Reservoir {
    fn new(capacity: usize) -> Reservoir {
        let seed = render::now_ms() ^ (u64::from(std::process::id()) << 32) | 1;
        Reservoir { capacity, seen: 0, items: Vec::with_capacity(capacity.min(10_000)), rng: seed }
    }

    fn offer(&mut self, key: &str) {
        self.seen += 1;
        if self.items.len() < self.capacity {
            self.items.push(key.to_owned());
            return;
        }
        let j = self.next() % self.seen;
        if (j as usize) < self.capacity {
            self.items[j as usize] = key.to_owned();
        }
    }

    /// xorshift64*: enough to pick a sample.
    fn next(&mut self) -> u64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_is_bounded_and_spread() {
        let mut r = Reservoir::new(100);
        for i in 0..10_000 {
            r.offer(&i.to_string());
        }
        assert_eq!(r.items.len(), 100);
        let late = r.items.iter().filter(|k| k.parse::<u32>().unwrap() >= 5_000).count();
        assert!((20..=80).contains(&late), "{late} of 100 from the second half");
        let mut none = Reservoir::new(0);
        none.offer("k");
        assert!(none.items.is_empty());
    }
}
