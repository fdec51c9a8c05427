//! `explore`: runs schedules until a time or count is reached, prints each violation with its
//! seed, the invariant, the smallest schedule that shows it and that schedule's history, and as
//! its last line `explored: <schedules> schedules, <calls> calls, <faults> faults, <violations>
//! violations`. Exits 1 on any violation.
//!
//! ```text
//! explore [--minutes M | --schedules N] [--seed S] [--store memory|model|all] [--invariant I1,I3]
//! ```

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use idempotent_explore::check::check;
use idempotent_explore::history::{Event, Returned};
use idempotent_explore::run::{play, quiet_planned_panics, Store};
use idempotent_explore::schedule::{schedule, FaultKind, Schedule};
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};

struct Args {
    limit: Option<Duration>,
    schedules: Option<u64>,
    seed: u64,
    stores: Vec<Store>,
    /// Only violations of these invariants count (all when empty).
    only: Vec<String>,
}

fn usage(why: &str) -> ExitCode {
    eprintln!("explore: {why}\nusage: explore [--minutes M | --schedules N] [--seed S] [--store memory|model|all] [--invariant I1,I3]");
    ExitCode::from(2)
}

fn parse() -> Result<Args, String> {
    let mut args =
        Args { limit: None, schedules: None, seed: 0, stores: vec![Store::Memory, Store::Model], only: Vec::new() };
    let mut seeded = false;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--minutes" => {
                let m: f64 = value()?.parse().map_err(|e| format!("--minutes: {e}"))?;
                args.limit = Some(Duration::from_secs_f64(m * 60.0));
            }
            "--schedules" => args.schedules = Some(value()?.parse().map_err(|e| format!("--schedules: {e}"))?),
            "--seed" => {
                args.seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?;
                seeded = true;
            }
            "--invariant" => args.only.extend(value()?.split(',').map(str::to_owned)),
            "--store" => {
                args.stores = match value()?.as_str() {
                    "memory" => vec![Store::Memory],
                    "model" | "redis-model" => vec![Store::Model],
                    "all" => vec![Store::Memory, Store::Model],
                    other => {
                        return Err(format!(
                            "--store {other}: this explorer runs the deterministic layer (memory, model, all); \
                             the layer on real servers is not built yet"
                        ))
                    }
                }
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if !seeded {
        args.seed =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
                % 1_000_000_000;
    }
    if args.limit.is_none() && args.schedules.is_none() {
        args.limit = Some(Duration::from_secs(60));
    }
    Ok(args)
}

fn fault_kind(k: &FaultKind) -> &'static str {
    match k {
        FaultKind::DelayUp(_) => "command delayed",
        FaultKind::DelayDown(_) => "reply delayed",
        FaultKind::LoseReplies => "reply lost",
        FaultKind::Refuse => "command refused",
        FaultKind::Split(_) => "acquire split",
        FaultKind::PubsubDelay(_) => "pub/sub delayed",
        FaultKind::PubsubDown => "pub/sub down",
    }
}

/// What the schedules run so far held (each counted once, not its shrinking).
#[derive(Default)]
struct Stats {
    schedules: u64,
    calls: u64,
    faults: u64,
    by_kind: BTreeMap<&'static str, u64>,
    /// Replays answered by a replay cache.
    cached: u64,
    /// Batches of several calls (`with_previous`), and the calls in them.
    batches: (u64, u64),
    exceptions: BTreeMap<&'static str, usize>,
}

impl Stats {
    fn count(&mut self, s: &Schedule, exceptions: &BTreeMap<&'static str, usize>) {
        self.schedules += 1;
        self.calls += s.calls.len() as u64;
        self.faults += (s.faults.len() + s.purges.len() + s.losses.len()) as u64;
        for f in &s.faults {
            *self.by_kind.entry(fault_kind(&f.kind)).or_default() += 1;
        }
        *self.by_kind.entry("purge").or_default() += s.purges.len() as u64;
        for group in s.groups().iter().filter(|g| g.len() > 1) {
            self.batches.0 += 1;
            self.batches.1 += group.len() as u64;
        }
        *self.by_kind.entry("record lost").or_default() += s.losses.len() as u64;
        for (name, n) in exceptions {
            *self.exceptions.entry(name).or_default() += n;
        }
    }
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(why) => return usage(&why),
    };
    quiet_planned_panics();
    println!("explore: seeds from {} on, stores {:?}", args.seed, args.stores);
    let started = Instant::now();
    let stats = std::cell::RefCell::new(Stats::default());
    let mut violations = 0u64;
    for i in 0.. {
        if args.schedules.is_some_and(|n| i >= n) || args.limit.is_some_and(|l| started.elapsed() >= l) {
            break;
        }
        let seed = args.seed.wrapping_add(i);
        for &store in &args.stores {
            let mut seed_bytes = [0u8; 32];
            seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
            let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes);
            let config = Config { cases: 1, failure_persistence: None, max_shrink_iters: 4096, ..Config::default() };
            let mut runner = TestRunner::new_with_rng(config, rng);
            let first = std::cell::Cell::new(true);
            let outcome = runner.run(&schedule(), |s: Schedule| {
                let history = play(&s, store);
                let report = check(&history.events());
                if first.replace(false) {
                    stats.borrow_mut().count(&s, &report.exceptions);
                    let events = history.events();
                    let cached = events
                        .iter()
                        .filter(|(_, e)| matches!(e, Event::Return { returned: Returned::Ok { cached: true, .. }, .. }))
                        .count();
                    stats.borrow_mut().cached += cached as u64;
                }
                match report
                    .violations
                    .iter()
                    .find(|v| args.only.is_empty() || args.only.iter().any(|i| v.to_string().contains(i.as_str())))
                {
                    Some(v) => Err(TestCaseError::fail(v.to_string())),
                    None => Ok(()),
                }
            });
            if let Err(TestError::Fail(reason, minimal)) = outcome {
                violations += 1;
                println!("\nVIOLATION seed {seed} store {store:?}: {reason}");
                println!("smallest schedule:\n{minimal}");
                println!("its history (us):");
                for (t, e) in play(&minimal, store).events() {
                    println!("  {t:>9} {e:?}");
                }
                println!(
                    "reproduce: bash scripts/explore.sh --seed {seed} --schedules 1 --store {}",
                    match store {
                        Store::Memory => "memory",
                        Store::Model => "model",
                    }
                );
            }
        }
    }
    let Stats { schedules, calls, faults, by_kind, cached, batches, exceptions } = stats.into_inner();
    println!("replays answered by a replay cache: {cached}");
    println!("batches of several calls: {} ({} calls)", batches.0, batches.1);
    let kinds: Vec<String> = by_kind.iter().map(|(k, n)| format!("{k} {n}")).collect();
    println!("faults by kind: {}", kinds.join(", "));
    let named: Vec<String> = exceptions.iter().map(|(k, n)| format!("{k}: {n}")).collect();
    println!("documented exceptions met: {}", if named.is_empty() { "none".to_owned() } else { named.join(", ") });
    println!("explored: {schedules} schedules, {calls} calls, {faults} faults, {violations} violations");
    if violations > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
