//! What the servers count themselves: Redis's and Valkey's commands and CPU (`INFO`), PostgreSQL's
//! statements (`pg_stat_statements`) and its processes' CPU; and raw commands fred has no
//! method for.

use std::time::Duration;

use idempotency::store::postgres::sqlx::{self, Row as _};
use idempotency::store::redis::fred::prelude::*;

/// Reads Redis's own counters of commands executed (`INFO commandstats`).
pub struct Counters {
    pub client: Client,
}

#[derive(Default, Clone, Copy, Debug)]
pub struct Counts {
    /// Script calls (EVALSHA, EVAL): each a round trip of ours.
    pub scripts: u64,
    /// SET and GET: the naive baseline's round trips (our scripts run them inside, too).
    pub plain: u64,
    /// Every command executed, inside scripts too (INFO itself excluded).
    pub commands: u64,
    /// EVAL fallbacks after NOSCRIPT.
    pub evals: u64,
    /// CPU seconds the server used (`INFO cpu`, user plus system).
    pub cpu_secs: f64,
}

impl Counters {
    pub async fn read(&self) -> Counts {
        let info: String = self.client.info(Some(fred::types::InfoKind::CommandStats)).await.expect("INFO");
        let mut c = Counts::default();
        for line in info.lines() {
            let Some((name, rest)) = line.strip_prefix("cmdstat_").and_then(|l| l.split_once(':')) else { continue };
            let calls: u64 =
                rest.split(',').find_map(|f| f.strip_prefix("calls=")).and_then(|n| n.parse().ok()).unwrap_or(0);
            if name == "info" {
                continue;
            }
            c.commands += calls;
            match name {
                "evalsha" => c.scripts += calls,
                "eval" => {
                    c.scripts += calls;
                    c.evals += calls;
                }
                "set" | "get" => c.plain += calls,
                _ => {}
            }
        }
        let cpu: String = self.client.info(Some(fred::types::InfoKind::Cpu)).await.expect("INFO cpu");
        c.cpu_secs = cpu
            .lines()
            .filter_map(|l| l.strip_prefix("used_cpu_user:").or_else(|| l.strip_prefix("used_cpu_sys:")))
            .filter_map(|v| v.trim().parse::<f64>().ok())
            .sum();
        c
    }
}

impl std::ops::Sub for Counts {
    type Output = Counts;
    fn sub(self, o: Counts) -> Counts {
        Counts {
            scripts: self.scripts - o.scripts,
            plain: self.plain - o.plain,
            commands: self.commands - o.commands,
            evals: self.evals - o.evals,
            cpu_secs: self.cpu_secs - o.cpu_secs,
        }
    }
}

/// Reads PostgreSQL's own counters (`pg_stat_statements`, top-level statements of the benchmark's
/// database, the counting's own left out) and, for a cluster of the benchmark's own, the CPU time
/// of its processes.
pub struct PgCounters {
    pub pool: sqlx::PgPool,
    /// The postmaster of a cluster of our own (its processes' CPU time is the server's).
    pub postmaster: Option<u32>,
}

impl PgCounters {
    pub async fn read(&self) -> Counts {
        // Statements, and those sent in the same message as another, statements but not round
        // trips: the `SET LOCAL statement_timeout` a transactional body's `BEGIN` carries, and the
        // savepoint a transactional batch opens with its `BEGIN` or with an item's `RELEASE`.
        let row = sqlx::query(
            "SELECT coalesce(sum(calls), 0)::bigint, \
                    coalesce(sum(calls) FILTER (WHERE query ILIKE 'SET LOCAL statement_timeout%' \
                        OR query ILIKE 'SAVEPOINT idempotency_item%'), 0)::bigint \
             FROM pg_stat_statements \
             WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
               AND query NOT ILIKE '%pg_stat_statements%'",
        )
        .fetch_one(&self.pool)
        .await
        .expect("read pg_stat_statements");
        let (statements, piggybacked): (i64, i64) = (row.get(0), row.get(1));
        Counts {
            scripts: 0,
            plain: (statements - piggybacked) as u64,
            commands: statements as u64,
            evals: 0,
            cpu_secs: self.postmaster.map_or(0.0, |pid| tree_cpu(pid).as_secs_f64()),
        }
    }
}

/// CPU time of process `pid`, its live children and the children it has reaped.
pub fn tree_cpu(pid: u32) -> Duration {
    let stat = |path: String| -> Vec<u64> {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let fields: Vec<&str> = text.rsplit_once(')').map(|(_, r)| r.split_whitespace().collect()).unwrap_or_default();
        fields.iter().map(|f| f.parse().unwrap_or(0)).collect()
    };
    // After the ')': state ppid ... utime (11) stime (12) cutime (13) cstime (14).
    let own = stat(format!("/proc/{pid}/stat"));
    let mut ticks = own.get(11..15).map_or(0, |f| f.iter().sum());
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(child) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let f = stat(format!("/proc/{child}/stat"));
        if f.get(1) == Some(&u64::from(pid)) {
            ticks += f.get(11..13).map_or(0, |f| f.iter().sum::<u64>());
        }
    }
    Duration::from_millis(ticks * 10)
}

/// A command fred has no feature of ours for.
pub async fn raw(client: &Client, name: &'static str, args: &[&str]) -> Value {
    let cmd = fred::types::CustomCommand::new_static(name, fred::types::ClusterHash::Random, false);
    client.custom(cmd, args.iter().map(|a| a.to_string()).collect::<Vec<_>>()).await.expect(name)
}
