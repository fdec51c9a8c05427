//! The `idempotency` binary driven as a subprocess, against `redis-server` processes the tests
//! start: records made by the library (`Idempotency::run`), then every command on a standalone
//! server and on a 3+3 cluster (keys on every primary), bad input with its exit codes, and the
//! ACL permissions docs/cli.md lists.

#[path = "../../tests/support/mod.rs"]
#[macro_use]
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::process::Stdio;
use std::time::{Duration, Instant};

use idempotency::store::{Inspected, RecordView};
use idempotency::{Call, Idempotency, RedisStore};
use serde_json::{json, Value};
use support::{command_at, RedisCluster, RedisServer, R};
use tokio::io::{AsyncBufReadExt, BufReader};

const BIN: &str = env!("CARGO_BIN_EXE_idempotency");

/// What one run of the binary did.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
    took: Duration,
}

impl Run {
    /// The run, after checking it exited with `code`.
    #[track_caller]
    fn expect(self, code: i32) -> Run {
        assert_eq!(self.code, code, "exit code: {self:#?}");
        self
    }

    fn lines(&self) -> Vec<&str> {
        self.stdout.lines().collect()
    }

    /// stdout as JSON lines.
    fn json_lines(&self) -> Vec<Value> {
        self.stdout.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}"))).collect()
    }
}

/// The binary with the store's variables removed from its environment (they would override
/// nothing the tests pass, but must not leak in from the machine).
fn command() -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(BIN);
    for (name, _) in std::env::vars() {
        if name.starts_with("IDEMPOTENCY_") {
            cmd.env_remove(name);
        }
    }
    cmd.stdin(Stdio::null()).kill_on_drop(true);
    cmd
}

/// Runs the binary with `args` (raw: any bytes).
async fn run_raw(args: Vec<OsString>) -> Run {
    let started = Instant::now();
    let out = command().args(&args).output().await.expect("run the binary");
    let run = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        took: started.elapsed(),
    };
    assert!(!run.stderr.contains("panicked"), "the binary panicked: {run:#?}");
    run
}

/// Where the tests' records are: a standalone server of the test's own, or the shared cluster
/// under a namespace of the test's own.
struct Target {
    url: String,
    namespace: String,
    server: Option<RedisServer>,
}

impl Target {
    fn standalone() -> Target {
        let server = RedisServer::start();
        Target { url: server.url(), namespace: "idem".into(), server: Some(server) }
    }

    fn cluster() -> Target {
        let url = tokio::task::block_in_place(|| RedisCluster::shared().url());
        Target { url, namespace: support::unique_prefix("cli"), server: None }
    }

    /// Runs the binary on this target.
    async fn cli(&self, args: &[&str]) -> Run {
        let mut all: Vec<OsString> =
            vec!["--url".into(), self.url.clone().into(), "-n".into(), self.namespace.clone().into()];
        all.extend(args.iter().map(OsString::from));
        run_raw(all).await
    }

    /// The binary on this target, started with `args`, stdout and stderr piped.
    fn spawn(&self, args: &[&str]) -> tokio::process::Child {
        command()
            .args(["--url", &self.url, "-n", &self.namespace])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the binary")
    }

    async fn store(&self) -> RedisStore {
        RedisStore::builder(&self.url).prefix(self.namespace.clone()).connect().await.expect("connect the library")
    }

    /// A raw command about a record key, sent to the node that holds it.
    fn raw(&self, args: &[&str]) -> Result<String, String> {
        match &self.server {
            Some(server) => server.command(args),
            None => tokio::task::block_in_place(|| RedisCluster::shared().command(args)),
        }
    }

    /// The ports of the primaries (one for a standalone server).
    fn primaries(&self) -> Vec<u16> {
        match &self.server {
            Some(server) => vec![server.port()],
            None => tokio::task::block_in_place(|| RedisCluster::shared().primaries()),
        }
    }
}

/// The library's own view of `key`.
async fn view(idem: &Idempotency, key: &str) -> RecordView {
    match idem.inspect("", key).await.unwrap() {
        Inspected::Record(view) => view,
        other => panic!("{key}: expected a record, got {other:?}"),
    }
}

/// Unix ms as ISO-8601 UTC, by `date` (an oracle independent of the binary's own code).
fn iso_by_date(ms: u64) -> String {
    let out = std::process::Command::new("date")
        .args(["-u", "-d", &format!("@{}", ms / 1000), "+%Y-%m-%dT%H:%M:%S"])
        .output()
        .expect("date");
    format!("{}.{:03}Z", String::from_utf8_lossy(&out.stdout).trim(), ms % 1000)
}

/// `inspect`'s text as field → value (the value starts at column 13).
fn fields(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .take_while(|l| !l.starts_with('{') && !l.starts_with('['))
        .filter_map(|l| Some((l.get(..12)?.trim().to_owned(), l.get(13..)?.to_owned())))
        .collect()
}

/// The keys of `list --json` lines, with their states.
fn listed(run: &Run) -> BTreeMap<String, String> {
    run.json_lines()
        .iter()
        .map(|v| (v["key"].as_str().unwrap().to_owned(), v["state"].as_str().unwrap().to_owned()))
        .collect()
}

/// A held key: a call whose body waits until the task is aborted.
async fn hold(idem: &Idempotency, scope: &str, key: &str) -> tokio::task::JoinHandle<R<u32>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn({
        let (idem, call) = (idem.clone(), Call::new(key).scope(scope).ttl(Duration::from_secs(30)));
        async move {
            idem.run(call, || async move {
                let _ = tx.send(());
                tokio::time::sleep(Duration::from_secs(3600)).await;
                R::Ok(0u32)
            })
            .await
        }
    });
    rx.await.expect("the held call started");
    task
}

/// `ops:a` completed with `result` (kept 10 minutes, with a fingerprint) and `ops:b` held in
/// progress by the task returned.
async fn ops_records(idem: &Idempotency, result: &Value) -> tokio::task::JoinHandle<R<u32>> {
    let a: R<Value> = idem
        .run(Call::new("a").scope("ops").keep(Duration::from_secs(600)).fingerprint(&1), || async {
            // Read, so that the completed record carries it (a body that never reads it leaves 0).
            idempotency::CallContext::current().unwrap().fence().await?;
            Ok(result.clone())
        })
        .await;
    assert_eq!(&a.unwrap(), result);
    hold(idem, "ops", "b").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_on_a_standalone_server() {
    every_command(Target::standalone()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_on_a_cluster() {
    every_command(Target::cluster()).await;
}

async fn every_command(t: Target) {
    let store = t.store().await;
    let idem = Idempotency::new(store.clone());
    let result = json!({ "id": 7, "note": "a|b" });
    let holder = ops_records(&idem, &result).await;
    for i in 1..=2 {
        let r: R<u32> =
            idem.run(Call::new(format!("stripe:{i}")).scope("my_crate::payments::pay"), || async { Ok(i) }).await;
        r.unwrap();
    }
    for i in 0..30 {
        let r: R<u32> = idem.run(Call::new(format!("{i}")).scope("spread"), || async move { Ok(i) }).await;
        r.unwrap();
    }
    let total = 2 + 2 + 30;

    // inspect, text: every field as the library reads it.
    let a = view(&idem, "ops:a").await;
    let text = t.cli(&["inspect", "ops:a"]).await.expect(0);
    let f = fields(&text.stdout);
    assert_eq!(f["key"], "ops:a");
    assert_eq!(f["redis key"], store.record_key("ops:a"));
    assert_eq!(f["state"], "completed");
    assert_eq!(f["fence"], a.fence.unwrap().to_string());
    assert_eq!(f["owner"], "-");
    assert_eq!(f["started"], "-");
    assert!(f["stored"].starts_with(&iso_by_date(a.stored_ms.unwrap())), "{f:?}");
    assert!(f["stored"].ends_with(" ago)"), "{f:?}");
    assert!(f["ttl"].ends_with("(kept for)") && (f["ttl"].starts_with("9m") || f["ttl"].starts_with("10m")), "{f:?}");
    assert_eq!(f["fingerprint"], a.fingerprint.clone().unwrap());
    assert_eq!(f["watched"], "no");
    assert_eq!(f["replayable"], "yes");
    assert_eq!(f["result"], format!("{} bytes", a.result_bytes().unwrap()));
    let pretty: String = text.stdout.lines().skip_while(|l| !l.starts_with('{')).collect::<Vec<_>>().join("\n");
    assert_eq!(pretty, serde_json::to_string_pretty(&result).unwrap(), "{}", text.stdout);

    // inspect --json: the RecordView's fields, the result as JSON.
    let j: Value = serde_json::from_str(&t.cli(&["inspect", "ops:a", "--json"]).await.expect(0).stdout).unwrap();
    assert_eq!(j["key"], "ops:a");
    assert_eq!(j["state"], "completed");
    assert_eq!(j["fence"], json!(a.fence));
    assert_eq!(j["owner"], Value::Null);
    assert_eq!(j["started_ms"], Value::Null);
    assert_eq!(j["stored_ms"], json!(a.stored_ms));
    assert_eq!(j["stored"], json!(iso_by_date(a.stored_ms.unwrap())));
    assert_eq!(j["fingerprint"], json!(a.fingerprint));
    assert_eq!(j["watched"], json!(false));
    assert_eq!(j["replayable"], json!(true));
    assert_eq!(j["result"], result);
    assert_eq!(j["result_bytes"], json!(a.result_bytes()));
    let ttl = j["ttl"].as_u64().unwrap();
    assert!((590_000..=600_000).contains(&ttl), "{j}");

    let b = view(&idem, "ops:b").await;
    let j: Value = serde_json::from_str(&t.cli(&["inspect", "ops:b", "--json"]).await.expect(0).stdout).unwrap();
    assert_eq!(j["state"], "in_progress");
    assert_eq!(j["owner"], json!(b.owner));
    assert_eq!(j["started_ms"], json!(b.started_ms));
    assert_eq!(j["started"], json!(iso_by_date(b.started_ms.unwrap())));
    assert_eq!(j["result"], Value::Null);
    assert_eq!(j["replayable"], json!(false));
    assert!(j["ttl"].as_u64().unwrap() <= 30_000, "{j}");
    let f = fields(&t.cli(&["inspect", "ops:b"]).await.expect(0).stdout);
    assert_eq!((f["state"].as_str(), f["owner"].as_str()), ("in_progress", b.owner.as_deref().unwrap()));
    assert!(f["ttl"].ends_with("(lease left)"), "{f:?}");
    assert_eq!(f["result"], "-");

    // inspect, absent: exit 4.
    let absent = t.cli(&["inspect", "ops:none"]).await.expect(4);
    assert!(absent.stderr.contains("no record at \"ops:none\""), "{absent:#?}");
    assert!(absent.stdout.is_empty());

    // list: the table, JSON lines, filters.
    let table = t.cli(&["list"]).await.expect(0);
    let lines = table.lines();
    assert!(lines[0].starts_with("STATE") && lines[0].ends_with("KEY"), "{lines:?}");
    assert_eq!(lines.len(), 1 + total + 1, "{}", table.stdout);
    let row_a = lines.iter().find(|l| l.ends_with(" ops:a")).expect("a row for ops:a");
    let cols: Vec<&str> = row_a.split_whitespace().collect();
    assert_eq!(cols[0], "completed");
    assert_eq!(cols[3], a.fence.unwrap().to_string());
    assert_eq!(cols[4], a.result_bytes().unwrap().to_string());
    let row_b = lines.iter().find(|l| l.ends_with(" ops:b")).expect("a row for ops:b");
    assert!(row_b.starts_with("in_progress"), "{row_b}");
    assert_eq!(
        lines.last().unwrap(),
        &format!("{total} records ({} completed, 1 in progress), 0 foreign; {total} keys examined", total - 1)
    );

    let all = t.cli(&["list", "--json"]).await.expect(0);
    let keys = listed(&all);
    assert_eq!(keys.len(), total);
    assert!((0..30).all(|i| keys.get(&format!("spread:{i}")).is_some_and(|s| s == "completed")), "{keys:?}");
    // The keys found are on every primary.
    let on: BTreeSet<u16> = keys
        .keys()
        .map(|k| match t.server {
            Some(_) => 0,
            None => tokio::task::block_in_place(|| RedisCluster::shared().primary_for_key(&store.record_key(k))),
        })
        .collect();
    assert_eq!(on.len(), if t.server.is_some() { 1 } else { 3 }, "records on {on:?}");
    let a_line = all.json_lines().into_iter().find(|v| v["key"] == "ops:a").unwrap();
    assert_eq!(a_line["result"], result);

    let ops = |run: Run| listed(&run).into_iter().collect::<Vec<_>>();
    let pair = |k: &str, s: &str| (k.to_owned(), s.to_owned());
    assert_eq!(
        ops(t.cli(&["list", "--prefix", "ops:", "--json"]).await.expect(0)),
        [pair("ops:a", "completed"), pair("ops:b", "in_progress")]
    );
    assert_eq!(
        ops(t.cli(&["list", "--prefix", "ops:", "--state", "completed", "--json"]).await.expect(0)),
        [pair("ops:a", "completed")]
    );
    assert_eq!(
        ops(t.cli(&["list", "--prefix", "ops:", "--state", "in-progress", "--json"]).await.expect(0)),
        [pair("ops:b", "in_progress")]
    );
    assert_eq!(ops(t.cli(&["list", "--fingerprinted", "yes", "--json"]).await.expect(0)), [pair("ops:a", "completed")]);
    assert_eq!(t.cli(&["list", "--fingerprinted", "no", "--json"]).await.expect(0).json_lines().len(), total - 1);
    assert!(t.cli(&["list", "--older-than", "1h", "--json"]).await.expect(0).stdout.is_empty());
    assert_eq!(
        t.cli(&["list", "--prefix", "spread:", "--older-than", "0s", "--json"]).await.expect(0).json_lines().len(),
        30
    );
    let limited = t.cli(&["list", "--limit", "3"]).await.expect(0);
    assert_eq!(limited.lines().len(), 1 + 3 + 1, "{}", limited.stdout);
    assert!(limited.stdout.contains("(--limit reached)"));
    let progress = t.cli(&["list", "--progress", "--json"]).await.expect(0);
    assert!(progress.stderr.contains(&format!("scanned: {total} keys examined")), "{progress:#?}");
    assert!(t.cli(&["list", "--json"]).await.expect(0).stderr.is_empty(), "no progress when stderr is not a terminal");

    // stats: counts by state and scope, memory sampled.
    let stats = t.cli(&["stats"]).await.expect(0);
    let lines = stats.lines();
    assert!(
        lines[0].starts_with(&format!(
            "{total} records under {}:{{*}}:* ({} completed, 1 in progress), 0 foreign",
            t.namespace,
            total - 1
        )),
        "{}",
        stats.stdout
    );
    let scope_rows: Vec<Vec<&str>> = lines[2..5].iter().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(
        scope_rows,
        [
            vec!["spread", "30", "30", "0", "0", "0", "0"],
            vec!["my_crate::payments::pay", "2", "2", "0", "0", "0", "0"],
            vec!["ops", "2", "1", "1", "0", "0", "0"]
        ],
        "{}",
        stats.stdout
    );
    let memory = lines.iter().find(|l| l.starts_with("memory: ")).expect("a memory line");
    assert!(memory.contains(&format!("(MEMORY USAGE of {total} records sampled)")), "{memory}");
    let j: Value = serde_json::from_str(&t.cli(&["stats", "--json", "--sample", "5"]).await.expect(0).stdout).unwrap();
    assert_eq!((j["records"].as_u64(), j["in_progress"].as_u64()), (Some(total as u64), Some(1)));
    assert_eq!(
        j["scopes"]["my_crate::payments::pay"],
        json!({ "records": 2, "completed": 2, "in_progress": 0, "released": 0, "failed": 0, "unknown": 0 })
    );
    assert_eq!(j["memory"]["sampled"], json!(5));
    let per_record = j["memory"]["bytes_per_record"].as_f64().unwrap();
    assert!((40.0..10_000.0).contains(&per_record), "{j}");
    let ops_only: Value =
        serde_json::from_str(&t.cli(&["stats", "--prefix", "ops:", "--json"]).await.expect(0).stdout).unwrap();
    assert_eq!(ops_only["records"], json!(2));

    // Foreign values at record keys: exit 5 for inspect, listed with what they hold.
    let foreign_key = store.record_key("ops:foreign");
    let future_key = store.record_key("ops:future");
    let hash_key = store.record_key("ops:hash");
    t.raw(&["SET", &foreign_key, "someone else's"]).unwrap();
    t.raw(&["SET", &future_key, "I|0|owner|||||"]).unwrap();
    t.raw(&["HSET", &hash_key, "f", "v"]).unwrap();
    let e = t.cli(&["inspect", "ops:foreign"]).await.expect(5);
    assert!(e.stderr.contains(&foreign_key) && e.stderr.contains("another program's value, 14 bytes"), "{e:#?}");
    let e = t.cli(&["inspect", "ops:future"]).await.expect(5);
    assert!(e.stderr.contains("a record of a format this version does not read"), "{e:#?}");
    let e = t.cli(&["inspect", "ops:hash", "--json"]).await.expect(5);
    assert!(e.stderr.contains("holds a Redis hash"), "{e:#?}");
    let listed_ops = t.cli(&["list", "--prefix", "ops:"]).await.expect(0);
    for key in ["ops:foreign", "ops:future", "ops:hash"] {
        let row = listed_ops
            .lines()
            .into_iter()
            .find(|l| l.contains(&format!(" {key}  (")))
            .unwrap_or_else(|| panic!("{key} not listed: {}", listed_ops.stdout));
        assert!(row.starts_with("foreign"), "{row}");
    }
    assert!(listed_ops.stdout.contains("holds a Redis hash"), "{}", listed_ops.stdout);
    assert!(listed_ops.stdout.contains("2 records (1 completed, 1 in progress), 3 foreign"), "{}", listed_ops.stdout);
    let foreign_json: Vec<Value> = t
        .cli(&["list", "--prefix", "ops:", "--json"])
        .await
        .expect(0)
        .json_lines()
        .into_iter()
        .filter(|v| v["state"] == "foreign")
        .collect();
    assert_eq!(foreign_json.len(), 3, "{foreign_json:?}");
    assert!(foreign_json
        .iter()
        .all(|v| v["foreign"].as_str().is_some_and(|r| r.contains("not an idempotency record"))));
    let j: Value = serde_json::from_str(&t.cli(&["stats", "--json", "--sample", "0"]).await.expect(0).stdout).unwrap();
    assert_eq!(j["foreign"], json!(3));

    // purge: a dry run deletes nothing.
    let dry = t.cli(&["purge", "--prefix", "ops:"]).await.expect(0);
    let out = dry.lines();
    assert!(out.contains(&"would delete  completed    ops:a"), "{}", dry.stdout);
    assert!(out.contains(&"would skip    in_progress  ops:b  (in progress: --force deletes it)"), "{}", dry.stdout);
    assert!(out.iter().filter(|l| l.starts_with("foreign")).count() == 3, "{}", dry.stdout);
    assert_eq!(
        out.last().unwrap(),
        &"dry run: 1 would be deleted, 1 skipped (in progress, without --force), 0 absent, 3 foreign; nothing was deleted (--yes deletes)"
    );
    let without_ttl = |v: RecordView| RecordView { ttl: None, ..v };
    assert_eq!(without_ttl(view(&idem, "ops:a").await), without_ttl(a.clone()), "a dry run changed ops:a");
    assert_eq!(t.cli(&["inspect", "ops:b"]).await.code, 0);
    let dry_keys = t.cli(&["purge", "ops:a", "ops:b", "ops:none", "ops:foreign"]).await.expect(0);
    assert_eq!(
        dry_keys.lines().last().unwrap(),
        &"dry run: 1 would be deleted, 1 skipped (in progress, without --force), 1 absent, 1 foreign; nothing was deleted (--yes deletes)"
    );
    assert!(matches!(idem.inspect("", "ops:a").await.unwrap(), Inspected::Record(_)));

    // --yes: completed records go, the one in progress stays, foreign values stay.
    let yes = t.cli(&["purge", "--prefix", "ops:", "--yes"]).await.expect(0);
    assert!(yes.lines().contains(&"deleted       completed    ops:a"), "{}", yes.stdout);
    assert!(
        yes.lines().contains(&"skipped       in_progress  ops:b  (in progress: --force deletes it)"),
        "{}",
        yes.stdout
    );
    assert_eq!(
        yes.lines().last().unwrap(),
        &"deleted 1, 1 skipped (in progress, without --force), 0 absent, 3 foreign"
    );
    assert_eq!(idem.inspect("", "ops:a").await.unwrap(), Inspected::Absent);
    assert_eq!(t.cli(&["inspect", "ops:a"]).await.code, 4);
    assert!(matches!(idem.inspect("", "ops:b").await.unwrap(), Inspected::Record(_)));
    assert_eq!(t.raw(&["EXISTS", &foreign_key]).unwrap(), "1");
    assert_eq!(t.raw(&["EXISTS", &hash_key]).unwrap(), "1");

    // --force --yes: the record in progress goes too, and the warning says what that means.
    let forced = t.cli(&["purge", "ops:b", "ops:a", "--force", "--yes"]).await.expect(0);
    assert!(forced.stderr.contains("a second call with the same key may start the body again"), "{forced:#?}");
    assert_eq!(
        forced.lines(),
        [
            "deleted       in_progress  ops:b",
            "absent        -            ops:a",
            "deleted 1, 0 skipped (in progress, without --force), 1 absent, 0 foreign"
        ]
    );
    assert_eq!(idem.inspect("", "ops:b").await.unwrap(), Inspected::Absent);
    holder.abort();

    // A scan purge of a whole scope, on every primary.
    let spread = t.cli(&["purge", "--prefix", "spread:", "--state", "completed", "--yes"]).await.expect(0);
    assert_eq!(
        spread.lines().last().unwrap(),
        &"deleted 30, 0 skipped (in progress, without --force), 0 absent, 0 foreign"
    );
    assert!(t.cli(&["list", "--prefix", "spread:", "--json"]).await.expect(0).stdout.is_empty());
    assert_eq!(
        listed(&t.cli(&["list", "--json"]).await.expect(0)).len(),
        2 + 3,
        "the payments and the foreign values remain"
    );
    for key in [&foreign_key, &future_key, &hash_key] {
        t.raw(&["DEL", key]).unwrap();
    }
}

/// Reads `child`'s stderr until a line contains `wanted` (at most `limit`); the lines read.
async fn stderr_until(child: &mut tokio::process::Child, wanted: &str, limit: Duration) -> Vec<String> {
    let stderr = child.stderr.take().expect("piped stderr");
    let mut lines = BufReader::new(stderr).lines();
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, lines.next_line()).await {
            Ok(Ok(Some(line))) => {
                let done = line.contains(wanted);
                seen.push(line);
                if done {
                    break;
                }
            }
            other => panic!("no {wanted:?} on stderr within {limit:?} ({other:?}): {seen:?}"),
        }
    }
    // Drain the rest so that the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    seen
}

/// Reads lines into `seen` until one passes `wanted` (at most `limit`).
async fn lines_until(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    seen: &mut Vec<String>,
    wanted: impl Fn(&str) -> bool,
    limit: Duration,
) {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, lines.next_line()).await {
            Ok(Ok(Some(line))) => {
                let done = wanted(&line);
                seen.push(line);
                if done {
                    return;
                }
            }
            other => panic!("no wanted line within {limit:?} ({other:?}): {seen:?}"),
        }
    }
}

/// Runs `keys` (full keys `scope:key`) through the library at once, each body sleeping a second.
async fn calls(idem: &Idempotency, keys: &[String]) {
    let tasks: Vec<_> = keys
        .iter()
        .map(|full| {
            let (scope, key) = full.split_once(':').unwrap();
            let (idem, call) = (idem.clone(), Call::new(key).scope(scope));
            tokio::spawn(async move {
                let r: R<u32> = idem
                    .run(call, || async {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        Ok(5)
                    })
                    .await;
                r.unwrap()
            })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap(), 5);
    }
}

/// `watch` output lines mentioning `key` (as a whole word).
fn about<'a>(out: &'a str, key: &str) -> Vec<&'a str> {
    out.lines().filter(|l| l.split_whitespace().any(|w| w == key)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_on_a_standalone_server() {
    let t = Target::standalone();
    let idem = Idempotency::new(t.store().await);

    // Notifications are off by default: exit 6 with the line that turns them on.
    let off = t.cli(&["watch", "--for", "1s"]).await.expect(6);
    assert!(off.stderr.contains("CONFIG SET notify-keyspace-events K$gx"), "{off:#?}");
    assert!(off.stderr.contains("--enable-notifications"), "{off:#?}");
    assert_eq!(t.raw(&["CONFIG", "GET", "notify-keyspace-events"]).unwrap(), "notify-keyspace-events\n");

    // --enable-notifications turns them on and says so; a call's transitions appear.
    let mut child = t.spawn(&["watch", "--for", "4s", "--enable-notifications", "--prefix", "w:"]);
    let started = stderr_until(&mut child, "watching", Duration::from_secs(10)).await;
    assert!(started.iter().any(|l| l.contains("turned keyspace notifications on")), "{started:?}");
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    calls(&idem, &["w:1".to_owned(), "x:1".to_owned()]).await;
    // A call under on_crash = hold: its record keeps its lease's end and outlives it by `keep`;
    // a short lease, renewed while the body runs.
    let held: R<u32> = idem
        .run(Call::new("2").scope("w").on_crash(idempotency::OnCrash::Hold).ttl(Duration::from_millis(300)), || async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok(6)
        })
        .await;
    assert_eq!(held.unwrap(), 6);
    // The completion is printed (the record read after its set) before the key is forgotten.
    let completed = |l: &str| l.contains(" set ") && l.contains(" completed ") && !about(l, "w:1").is_empty();
    lines_until(&mut stdout, &mut seen, completed, Duration::from_secs(10)).await;
    idem.forget("w", "1", idempotency::Force::CompletedOnly).await.unwrap();
    while let Ok(Some(line)) = stdout.next_line().await {
        seen.push(line);
    }
    assert_eq!(child.wait().await.unwrap().code(), Some(0));
    let stdout = seen.join("\n");
    let w1 = about(&stdout, "w:1");
    assert!(w1.iter().any(|l| l.contains(" set ") && l.contains(" in_progress ")), "{stdout}");
    assert!(w1.iter().any(|l| l.contains(" del ") && l.contains(" absent ")), "{stdout}");
    // Its lease's end is shown as such, not the record's expiry (lease plus a day's keep).
    let w2 = about(&stdout, "w:2");
    let held: Vec<&&str> = w2.iter().filter(|l| l.contains(" set ") && l.contains(" in_progress ")).collect();
    assert!(held.iter().all(|l| l.contains("lease ends 20") && l.contains("record kept 1d")), "{stdout}");
    // Its renewals (a 300 ms lease renewed every 100 ms through a one-second body) rewrite the
    // record: they show as sets too, each with the lease's end it moved to.
    assert!(held.len() >= 3, "the acquire and its renewals: {stdout}");
    assert!(about(&stdout, "x:1").is_empty(), "--prefix w: let x:1 through: {stdout}");
    let flags = t.raw(&["CONFIG", "GET", "notify-keyspace-events"]).unwrap();
    assert!(["K", "$", "g", "x"].iter().all(|c| flags.lines().nth(1).unwrap().contains(c)), "{flags}");

    // Notifications on: watch runs without the flag; --json for scripts.
    let mut child = t.spawn(&["watch", "--for", "3s", "--json"]);
    stderr_until(&mut child, "watching", Duration::from_secs(10)).await;
    calls(&idem, &["j:1".to_owned()]).await;
    let out = child.wait_with_output().await.unwrap();
    assert_eq!(out.status.code(), Some(0));
    let events: Vec<Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let done = events.iter().find(|e| e["event"] == "set" && e["state"] == "completed").expect("a completion");
    assert_eq!((done["key"].as_str(), done["record"]["result"].as_u64()), (Some("j:1"), Some(5)), "{events:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_on_a_cluster() {
    let t = Target::cluster();
    let store = t.store().await;
    let idem = Idempotency::new(store.clone());
    let keys: Vec<String> = (0..9).map(|i| format!("w:{i}")).collect();
    let primaries = t.primaries();
    let on: BTreeSet<u16> = keys
        .iter()
        .map(|k| tokio::task::block_in_place(|| RedisCluster::shared().primary_for_key(&store.record_key(k))))
        .collect();
    assert_eq!(on.len(), 3, "the keys are not on every primary: {on:?}");

    let mut child = t.spawn(&["watch", "--for", "4s", "--enable-notifications"]);
    let started = stderr_until(&mut child, "watching", Duration::from_secs(10)).await;
    let watching = started.last().unwrap();
    assert!(primaries.iter().all(|p| watching.contains(&format!("127.0.0.1:{p}"))), "{watching} {primaries:?}");
    calls(&idem, &keys).await;
    let out = child.wait_with_output().await.unwrap();
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for key in &keys {
        assert!(
            about(&stdout, key).iter().any(|l| l.contains(" set ") && l.contains(" completed ")),
            "{key}: {stdout}"
        );
    }
    for port in primaries {
        let flags = command_at(port, &["CONFIG", "GET", "notify-keyspace-events"]).unwrap();
        assert!(flags.contains('K'), "{port}: {flags}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_clear_message_and_an_exit_code() {
    let args = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();

    // An unknown URL scheme: exit 3, the password masked.
    let e = run_raw(args(&["--url", "http://admin:hunter2@127.0.0.1:6379", "list"])).await.expect(3);
    assert!(e.stderr.contains("http://admin:***@127.0.0.1:6379") && !e.stderr.contains("hunter2"), "{e:#?}");

    // A password holding what would end a URL's authority, unencoded: masked whatever it holds.
    let port = support::free_port();
    for password in ["hun/ter2", "hun?ter2", "hun#ter2", "hun@ter2", "hun:ter2"] {
        let url = format!("redis://default:{password}@127.0.0.1:{port}");
        let e = run_raw(args(&["--url", &url, "--timeout", "1s", "inspect", "k"])).await.expect(3);
        assert!(!e.stderr.contains("ter2") && !e.stdout.contains("ter2"), "{password}: {e:#?}");
    }

    // Nothing listens: exit 3 within the timeout (and a margin for starting the process).
    let e = run_raw(args(&["--url", &format!("redis://127.0.0.1:{port}"), "--timeout", "1s", "inspect", "k"]))
        .await
        .expect(3);
    assert!(e.stderr.contains("cannot connect") && e.stderr.contains(&port.to_string()), "{e:#?}");
    assert!(e.took < Duration::from_secs(8), "{e:#?}");

    // No URL at all.
    let e = run_raw(args(&["stats"])).await.expect(3);
    assert!(e.stderr.contains("IDEMPOTENCY_REDIS_URL") && e.stderr.contains("--url"), "{e:#?}");

    // A non-UTF-8 argument, an unknown command, a bad duration, a missing key: clap's usage errors.
    use std::os::unix::ffi::OsStringExt;
    let e = run_raw(vec!["inspect".into(), OsString::from_vec(vec![b'k', 0xff])]).await.expect(2);
    assert!(e.stderr.contains("invalid UTF-8"), "{e:#?}");
    let e = run_raw(args(&["frobnicate"])).await.expect(2);
    assert!(e.stderr.contains("unrecognized subcommand"), "{e:#?}");
    let e = run_raw(args(&["list", "--older-than", "soon"])).await.expect(2);
    assert!(e.stderr.contains("is not a duration"), "{e:#?}");
    let e = run_raw(args(&["purge"])).await.expect(2);
    assert!(e.stderr.contains("--prefix"), "{e:#?}");

    // A reader that goes away (`idempotency list | head -1`): the output stops quietly.
    let t = Target::standalone();
    let idem = Idempotency::new(t.store().await);
    for i in 0..200 {
        let r: R<u32> = idem.run(Call::new(format!("{i}")).scope("pipe"), || async move { Ok(i) }).await;
        r.unwrap();
    }
    let mut child = t.spawn(&["list"]);
    drop(child.stdout.take());
    let out = child.wait_with_output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");

    // --help documents the exit codes.
    let help = run_raw(args(&["--help"])).await.expect(0);
    for code in [
        "3  cannot connect",
        "4  inspect, resolve: no record",
        "5  inspect, resolve: the key holds a foreign value",
        "6  watch",
        "8  resolve",
    ] {
        assert!(help.stdout.contains(code), "{code:?} not in --help: {}", help.stdout);
    }
}

/// The permissions docs/cli.md lists, on top of the store's least-privilege user: every command
/// works with them, and `stats` and `watch` fail clearly without them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_acl_user_runs_every_command() {
    let server = RedisServer::start();
    let extra = "+memory|usage +config|get +psubscribe &__keyspace@0__:idem:*";
    support::create_acl_user(server.port(), &format!("{} {extra}", support::ACL_RULES));
    let mut bare = vec!["ACL", "SETUSER", "bare"];
    bare.extend(support::ACL_RULES.split(' '));
    assert_eq!(command_at(server.port(), &bare).unwrap(), "OK");
    assert_eq!(server.command(&["CONFIG", "SET", "notify-keyspace-events", "K$gx"]).unwrap(), "OK");
    let t = Target {
        url: format!("redis://idem:s3cret@127.0.0.1:{}", server.port()),
        namespace: "idem".into(),
        server: None,
    };
    let bare_t = Target {
        url: format!("redis://bare:s3cret@127.0.0.1:{}", server.port()),
        namespace: "idem".into(),
        server: None,
    };

    let idem = Idempotency::new(t.store().await);
    let held = hold(&idem, "acl", "held").await;
    calls(&idem, &["acl:1".to_owned()]).await;
    t.cli(&["inspect", "acl:1"]).await.expect(0);
    assert_eq!(listed(&t.cli(&["list", "--json"]).await.expect(0)).len(), 2);
    let stats = t.cli(&["stats"]).await.expect(0);
    assert!(stats.stdout.contains("(MEMORY USAGE of 2 records sampled)"), "{stats:#?}");
    let mut child = t.spawn(&["watch", "--for", "3s"]);
    stderr_until(&mut child, "watching", Duration::from_secs(10)).await;
    calls(&idem, &["acl:2".to_owned()]).await;
    let out = child.wait_with_output().await.unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(about(&String::from_utf8_lossy(&out.stdout), "acl:2").iter().any(|l| l.contains(" completed ")));
    // --enable-notifications needs +config|set besides.
    assert_eq!(server.command(&["CONFIG", "SET", "notify-keyspace-events", ""]).unwrap(), "OK");
    let e = t.cli(&["watch", "--for", "1s", "--enable-notifications"]).await.expect(1);
    assert!(e.stderr.contains("NOPERM") && e.stderr.contains("config|set"), "{e:#?}");
    assert_eq!(server.command(&["ACL", "SETUSER", "idem", "+config|set"]).unwrap(), "OK");
    let on = t.cli(&["watch", "--for", "1s", "--enable-notifications"]).await.expect(0);
    assert!(on.stderr.contains("turned keyspace notifications on"), "{on:#?}");

    let purged = t.cli(&["purge", "--prefix", "acl:", "--force", "--yes"]).await.expect(0);
    assert_eq!(
        purged.lines().last().unwrap(),
        &"deleted 3, 0 skipped (in progress, without --force), 0 absent, 0 foreign"
    );
    held.abort();

    // The store's user alone: inspect, list and purge work; stats and watch name what is missing.
    calls(&idem, &["acl:3".to_owned()]).await;
    bare_t.cli(&["inspect", "acl:3"]).await.expect(0);
    bare_t.cli(&["list"]).await.expect(0);
    let e = bare_t.cli(&["stats"]).await.expect(1);
    assert!(e.stderr.contains("NOPERM") && e.stderr.contains("+memory|usage"), "{e:#?}");
    let e = bare_t.cli(&["watch", "--for", "1s"]).await.expect(1);
    assert!(e.stderr.contains("NOPERM") && e.stderr.contains("docs/cli.md"), "{e:#?}");
    bare_t.cli(&["purge", "acl:3", "--yes"]).await.expect(0);

    // Redis checks a PSUBSCRIBE pattern literally against the user's channel rules: a broader rule
    // does not let the CLI's pattern through.
    let broader = ["ACL", "SETUSER", "idem", "resetchannels", "&idem:*", "&__keyspace@*"];
    assert_eq!(command_at(server.port(), &broader).unwrap(), "OK");
    let e = t.cli(&["watch", "--for", "1s"]).await.expect(1);
    assert!(e.stderr.contains("PSUBSCRIBE __keyspace@0__:idem:* was refused"), "{e:#?}");
}

/// `rediss://` with a private CA: `--tls-ca-file` (or `IDEMPOTENCY_TLS_CA_FILE`) connects; without
/// it the server's certificate is not trusted, exit 3; a CA file for a plaintext URL is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_private_ca() {
    let ca = support::tls::TestCa::new("cli");
    let tls = support::tls::TlsRedis::start(&ca);
    let ca_file = ca.ca().to_str().unwrap().to_owned();
    let url = tls.tls_url();
    let args = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();

    let e = run_raw(args(&["--url", &url, "--tls-ca-file", &ca_file, "inspect", "orders:1"])).await.expect(4);
    assert!(e.stderr.contains("no record at \"orders:1\""), "{e:#?}");
    let out = command().args(["--url", &url, "list"]).env("IDEMPOTENCY_TLS_CA_FILE", &ca_file).output().await.unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let e = run_raw(args(&["--url", &url, "inspect", "orders:1"])).await.expect(3);
    assert!(e.stderr.contains("not trusted"), "{e:#?}");
    let plain = tls.server.url();
    let e = run_raw(args(&["--url", &plain, "--tls-ca-file", &ca_file, "inspect", "orders:1"])).await.expect(3);
    assert!(e.stderr.contains("is not a TLS URL"), "{e:#?}");
    let e = run_raw(args(&["--url", &url, "--tls-ca-file", "/nonexistent/ca.pem", "inspect", "k"])).await.expect(3);
    assert!(e.stderr.contains("/nonexistent/ca.pem"), "{e:#?}");
}

/// The HTTP layer keeps a client's keys under a hash of its credential (`http:key:32:<hash>:`),
/// which nobody can type: `--client-header 'Authorization: ...'` (or `--client ID`) addresses them
/// by what the operator knows. Records made through the real layer (`per_client` with
/// `client::authorization()`), then `inspect`, `list` and `purge` of one client's keys, another
/// client's untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_keys_by_the_header_it_sends() {
    use idempotency::http::{client, IdempotencyLayer};
    use tower::ServiceExt;

    let t = Target::standalone();
    let idem = Idempotency::new(t.store().await);
    let app = axum::Router::new()
        .route("/charges", axum::routing::post(|body: String| async move { format!("charged {body}") }))
        .route_layer(IdempotencyLayer::per_client(idem.clone(), client::authorization()));
    for (who, key) in [("alice", "k-a"), ("alice", "k-b"), ("bob", "k-a")] {
        let request = axum::http::Request::post("/charges")
            .header("authorization", format!("Bearer {who}-secret"))
            .header("idempotency-key", format!("\"{key}\""))
            .body(axum::body::Body::from(format!("{who} {key}")))
            .unwrap();
        assert_eq!(app.clone().oneshot(request).await.unwrap().status(), 200);
    }
    let alice = ["--client-header", "Authorization: Bearer alice-secret"];

    let shown = t.cli(&[&["inspect", "k-a", "--json"][..], &alice[..]].concat()).await.expect(0);
    let j: Value = serde_json::from_str(&shown.stdout).unwrap();
    assert_eq!(j["state"], "completed");
    let key = j["key"].as_str().unwrap();
    assert!(key.starts_with("http:key:32:") && key.ends_with(":k-a") && !key.contains("alice"), "{key}");

    let listed = t.cli(&[&["list", "--json"][..], &alice[..]].concat()).await.expect(0);
    let keys: BTreeSet<String> =
        listed.json_lines().iter().map(|r| r["key"].as_str().unwrap().rsplit(':').next().unwrap().to_owned()).collect();
    assert_eq!(keys, BTreeSet::from(["k-a".to_owned(), "k-b".to_owned()]), "{}", listed.stdout);

    t.cli(&[&["purge", "k-a", "--yes"][..], &alice[..]].concat()).await.expect(0);
    t.cli(&[&["inspect", "k-a"][..], &alice[..]].concat()).await.expect(4);
    let bob = ["--client-header", "Authorization: Bearer bob-secret"];
    t.cli(&[&["inspect", "k-a"][..], &bob[..]].concat()).await.expect(0);
    // A header without its name is a usage error, before any connection.
    let bad = t.cli(&["inspect", "k-a", "--client-header", "Bearer bob-secret"]).await.expect(2);
    assert!(bad.stderr.contains("'NAME: VALUE'"), "{bad:?}");
}

/// Every command on a `PgStore`'s table (`postgres://` URL, `--schema`): what it reads and
/// deletes is what the library sees; `watch` and `rotate-token-secret`, which need Redis, exit 7
/// saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_on_postgres() {
    let url = tokio::task::block_in_place(support::postgres::shared_database);
    let schema = support::postgres::unique_schema();
    let store = support::postgres::connect_clients(url, &schema, 1).await.remove(0);
    let idem = Idempotency::new(store.clone());
    let pg = |args: &[&str]| {
        let mut all: Vec<OsString> = vec!["--url".into(), url.into(), "--schema".into(), schema.clone().into()];
        all.extend(args.iter().map(OsString::from));
        run_raw(all)
    };
    let result = json!({ "id": 7, "note": "it's" });
    let holder = ops_records(&idem, &result).await;
    for i in 0..5 {
        let r: R<u32> = idem.run(Call::new(format!("{i}")).scope("spread"), || async move { Ok(i) }).await;
        r.unwrap();
    }
    let total = 2 + 5;

    // inspect: the row whole, and where it is.
    let a = view(&idem, "ops:a").await;
    let f = fields(&pg(&["inspect", "ops:a"]).await.expect(0).stdout);
    assert_eq!(f["key"], "ops:a");
    assert_eq!(f["postgres row"], format!("{} WHERE key = 'ops:a'", store.table()));
    assert_eq!((f["state"].as_str(), f["fence"].clone()), ("completed", a.fence.unwrap().to_string()));
    assert_eq!(f["fingerprint"], a.fingerprint.clone().unwrap());
    let j: Value = serde_json::from_str(&pg(&["inspect", "ops:a", "--json"]).await.expect(0).stdout).unwrap();
    assert_eq!((j["result"].clone(), j["stored_ms"].clone()), (result.clone(), json!(a.stored_ms)));
    let j: Value = serde_json::from_str(&pg(&["inspect", "ops:b", "--json"]).await.expect(0).stdout).unwrap();
    assert_eq!(
        (j["state"].as_str(), j["owner"].clone()),
        (Some("in_progress"), json!(view(&idem, "ops:b").await.owner))
    );
    let absent = pg(&["inspect", "ops:none"]).await.expect(4);
    assert!(
        absent.stderr.contains(&format!("no record at \"ops:none\" (postgres row {}", store.table())),
        "{absent:#?}"
    );

    // list and stats: every row, by state and scope; the rows' size measured.
    let listed_all = listed(&pg(&["list", "--json"]).await.expect(0));
    assert_eq!(listed_all.len(), total, "{listed_all:?}");
    assert_eq!(listed_all["ops:b"], "in_progress");
    let in_progress = listed(&pg(&["list", "--state", "in-progress", "--json"]).await.expect(0));
    assert_eq!(in_progress.into_keys().collect::<Vec<_>>(), ["ops:b"]);
    let stats: Value = serde_json::from_str(&pg(&["stats", "--json"]).await.expect(0).stdout).unwrap();
    assert_eq!((stats["records"].as_u64(), stats["in_progress"].as_u64()), (Some(total as u64), Some(1)));
    assert_eq!(
        stats["scopes"]["spread"],
        json!({ "records": 5, "completed": 5, "in_progress": 0, "released": 0, "failed": 0, "unknown": 0 })
    );
    assert_eq!(
        (stats["memory"]["measured_by"].as_str(), stats["memory"]["sampled"].as_u64()),
        (Some("pg_column_size"), Some(total as u64))
    );
    let text = pg(&["stats"]).await.expect(0);
    assert!(text.stdout.starts_with(&format!("{total} records under {} (keys *)", store.table())), "{}", text.stdout);

    // purge: a dry run deletes nothing; --yes deletes completed rows; --force the one in progress.
    let dry = pg(&["purge", "--prefix", "ops:"]).await.expect(0);
    assert!(dry.lines().contains(&"would delete  completed    ops:a"), "{}", dry.stdout);
    assert!(matches!(idem.inspect("", "ops:a").await.unwrap(), Inspected::Record(_)));
    let yes = pg(&["purge", "--prefix", "spread:", "--yes"]).await.expect(0);
    assert_eq!(
        yes.lines().last().unwrap(),
        &"deleted 5, 0 skipped (in progress, without --force), 0 absent, 0 foreign"
    );
    assert_eq!(idem.inspect("", "spread:3").await.unwrap(), Inspected::Absent);
    let skipped = pg(&["purge", "ops:b", "--yes"]).await.expect(0);
    assert!(
        skipped.lines().contains(&"skipped       in_progress  ops:b  (in progress: --force deletes it)"),
        "{skipped:#?}"
    );
    pg(&["purge", "ops:b", "ops:a", "--force", "--yes"]).await.expect(0);
    assert_eq!(idem.inspect("", "ops:b").await.unwrap(), Inspected::Absent);
    assert_eq!(idem.inspect("", "ops:a").await.unwrap(), Inspected::Absent);
    holder.abort();
    let again: R<u32> = idem.run(Call::new("a").scope("ops").fingerprint(&2), || async { Ok(8) }).await;
    assert_eq!(again.unwrap(), 8, "a key purged by the CLI did not run again");

    // What needs Redis says so, with its own exit code.
    let watch = pg(&["watch", "--for", "1s"]).await.expect(7);
    assert!(
        watch.stderr.contains("watch works on Redis only") && watch.stderr.contains("run list again"),
        "{watch:#?}"
    );
    let rotate = pg(&["rotate-token-secret"]).await.expect(7);
    assert!(rotate.stderr.contains("_secret table"), "{rotate:#?}");
    // A server that is not there, and a table that is not there: exit 3, saying which.
    let unreachable = run_raw(vec![
        "--url".into(),
        "postgres://127.0.0.1:1/none".into(),
        "--timeout".into(),
        "500ms".into(),
        "list".into(),
    ])
    .await
    .expect(3);
    assert!(unreachable.stderr.contains("cannot connect"), "{unreachable:#?}");
    let no_table = pg(&["--table", "nothing_here", "list"]).await.expect(3);
    assert!(no_table.stderr.contains("nothing_here\" does not exist"), "{no_table:#?}");
}
