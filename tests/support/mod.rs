//! Test support: real `redis-server` processes (standalone, Cluster, Sentinel) started on free
//! ports and stopped by the tests themselves, a fault-injecting TCP proxy, and fixtures that run
//! one suite on every store.
#![allow(dead_code)]

pub mod cluster;
pub mod dying;
pub mod handover;
pub mod postgres;
pub mod process;
pub mod proxy;
pub mod sentinel;
pub mod tls;
pub mod watchdog;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use idempotency::{Idempotency, MemoryStore, PgStore, RedisStore, Store};

pub use cluster::RedisCluster;
use process::LIVE;
pub use process::{free_port, spawn_tied};
pub use sentinel::SentinelGroup;

/// The error type of the tests' guarded functions: the library's errors, or the body's own.
#[derive(Debug)]
pub enum AppError {
    Idem(idempotency::Error),
    Failed(&'static str),
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppError::Idem(e) => e.fmt(f),
            AppError::Failed(why) => f.write_str(why),
        }
    }
}

impl From<idempotency::Error> for AppError {
    fn from(e: idempotency::Error) -> Self {
        AppError::Idem(e)
    }
}

/// A guarded function's result.
pub type R<T> = Result<T, AppError>;

/// A shared counter starting at 0 (bodies count their runs with it).
pub fn counter() -> Arc<std::sync::atomic::AtomicUsize> {
    Arc::new(std::sync::atomic::AtomicUsize::new(0))
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// One test of a store module: `super::$name` on `Backend::$backend`, under a [`watchdog`] (a test
/// still running after [`watchdog::TEST_LIMIT`] names itself and aborts the binary).
#[allow(unused_macros)]
macro_rules! store_test {
    ($name:ident, $backend:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let _watchdog = super::support::watchdog::Watchdog::test(concat!(module_path!(), "::", stringify!($name)));
            super::$name(super::Backend::$backend).await
        }
    };
}

/// Runs each named `async fn(Backend)` of the including file as two tests, `memory::name` and
/// `redis::name`: one suite, two stores.
#[allow(unused_macros)]
macro_rules! both_stores {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                store_test!($name, Memory);
            )*
        }
        mod redis {
            $(
                store_test!($name, Redis);
            )*
        }
    };
}

/// Runs each named `async fn(Backend)` of the including file as six tests: `memory::name`,
/// `redis::name` (a standalone server of the test's own), `cluster::name` (a 3-primary,
/// 3-replica Redis Cluster), `sentinel::name` (a Sentinel group), `acl::name` (a standalone
/// server, the store logged in as a user with only the permissions docs/security.md lists) and
/// `postgres::name` (`PgStore`, in a schema of the test's own). The cluster, the Sentinel group
/// and the PostgreSQL database are shared by the tests of one binary; each test gets its own key
/// prefix or schema.
#[allow(unused_macros)]
macro_rules! all_stores {
    ($($name:ident),* $(,)?) => {
        both_stores!($($name),*);
        mod postgres {
            $(
                store_test!($name, Postgres);
            )*
        }
        mod cluster {
            $(
                store_test!($name, Cluster);
            )*
        }
        mod sentinel {
            $(
                store_test!($name, Sentinel);
            )*
        }
        mod acl {
            $(
                store_test!($name, RedisAcl);
            )*
        }
    };
}

/// A `redis-server` of the test's own, on a free port, killed when dropped (and, whatever
/// happens, when the test process dies: see [`spawn_tied`]).
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    /// What the server is started with besides the common options (see [`RedisServer::start_with`]).
    setup: Arc<Setup>,
    /// The server binary: `$REDIS_SERVER`, `redis-server`, or one a test names.
    binary: String,
}

/// How a server is started: `leading` arguments (a config file must come first) and `trailing`
/// ones, given its port and directory; the common options (port, bind, no persistence, dir,
/// log file) go between them.
pub type Setup = dyn Fn(u16, &Path) -> (Vec<String>, Vec<String>) + Send + Sync;

/// Runs `call` in a task whose body holds the key until the returned sender fires (or is
/// dropped), then returns `Err` (`fail`) or `Ok(1)`; returns once the body has started.
pub fn hold(
    idem: &Idempotency,
    call: idempotency::Call,
    fail: bool,
) -> (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<R<u32>>) {
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let (started_tx, started) = std::sync::mpsc::channel();
    let idem = idem.clone();
    let task = tokio::spawn(async move {
        idem.run(call, || async move {
            started_tx.send(()).unwrap();
            let _ = released.await;
            if fail {
                Err(AppError::Failed("holder failed"))
            } else {
                Ok(1)
            }
        })
        .await
    });
    tokio::task::block_in_place(|| started.recv_timeout(Duration::from_secs(10)).expect("the holder started"));
    (release, task)
}

/// Runs `cmd` (its stdout and stderr piped) to its end, or kills it once `limit` has passed and
/// says what it had printed by then.
pub fn output_within(mut cmd: Command, limit: Duration) -> Result<std::process::Output, String> {
    fn drain(pipe: Option<impl std::io::Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    }
    let mut child = cmd.spawn().map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    let (stdout, stderr) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let (stdout, stderr) = (stdout.join().unwrap_or_default(), stderr.join().unwrap_or_default());
    match status {
        Some(status) => Ok(std::process::Output { status, stdout, stderr }),
        None => Err(format!(
            "still running after {limit:?}, killed; it had printed {:?}{:?}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        )),
    }
}

/// The server binary the tests run: `$REDIS_SERVER` (scripts/test.sh runs the suites whose
/// behaviour depends on the server a second time with a Valkey there), or `redis-server`.
pub fn redis_server_binary() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into())
}

/// A Valkey 8.1 server binary: `$VALKEY_SERVER`, else what `scripts/install-valkey.sh` prints
/// (a cached build at once; the first time on a machine it builds one, about 5 minutes).
pub fn valkey_server_binary() -> String {
    static BINARY: OnceLock<String> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            if let Ok(path) = std::env::var("VALKEY_SERVER") {
                return path;
            }
            // The workspace root, from this crate or from a member crate's tests.
            let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
            let script = [manifest, manifest.parent().unwrap_or(manifest)]
                .iter()
                .map(|dir| dir.join("scripts/install-valkey.sh"))
                .find(|s| s.exists())
                .expect("scripts/install-valkey.sh");
            let out =
                Command::new("bash").arg(&script).stderr(Stdio::inherit()).output().expect("run install-valkey.sh");
            assert!(out.status.success(), "scripts/install-valkey.sh failed");
            String::from_utf8(out.stdout).unwrap().lines().last().expect("install-valkey.sh printed no path").to_owned()
        })
        .clone()
}

/// `redis-cli` (for `--cluster create`), or `$REDIS_CLI`.
pub fn redis_cli_binary() -> String {
    std::env::var("REDIS_CLI").unwrap_or_else(|_| "redis-cli".into())
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers PING.
    pub fn start() -> RedisServer {
        Self::start_with(Arc::new(|_, _| (Vec::new(), Vec::new())))
    }

    /// Starts a server with arguments of its own (see [`Setup`]) on a free port and waits until
    /// it answers PING.
    pub fn start_with(setup: Arc<Setup>) -> RedisServer {
        Self::launch(&redis_server_binary(), setup)
    }

    /// Starts `binary` (a `redis-server` or a `valkey-server`) on a free port and waits until it
    /// answers PING.
    pub fn start_binary(binary: &str) -> RedisServer {
        Self::launch(binary, Arc::new(|_, _| (Vec::new(), Vec::new())))
    }

    fn launch(binary: &str, setup: Arc<Setup>) -> RedisServer {
        for _ in 0..5 {
            let port = free_port();
            let dir = std::env::temp_dir().join(format!("idem-redis-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("temp dir");
            let mut server = RedisServer { child: None, port, dir, setup: setup.clone(), binary: binary.to_owned() };
            if server.spawn() {
                return server;
            }
        }
        panic!("could not start redis-server on a free port (is it installed? scripts/install-redis.sh)");
    }

    fn spawn(&mut self) -> bool {
        let (leading, trailing) = (self.setup)(self.port, &self.dir);
        let mut cmd = Command::new(&self.binary);
        cmd.args(leading)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--dir", self.dir.to_str().unwrap(), "--logfile", "redis.log", "--daemonize", "no"])
            .args(trailing)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = match spawn_tied(cmd) {
            Ok(c) => c,
            Err(e) => panic!("cannot run {}: {e} (scripts/install-redis.sh installs it)", self.binary),
        };
        LIVE.lock().unwrap_or_else(|p| p.into_inner()).push((child.id(), self.dir.clone()));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.forget_child();
                self.child = None; // exited: port taken
                return false;
            }
            if self.command(&["PING"]).map(|r| r == "PONG").unwrap_or(false) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        false
    }

    fn forget_child(&self) {
        if let Some(child) = &self.child {
            LIVE.lock().unwrap_or_else(|p| p.into_inner()).retain(|(pid, _)| *pid != child.id());
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `calls` of each command since the last `CONFIG RESETSTAT` (`INFO commandstats`; commands
    /// run by scripts count too), by name (`set`, `evalsha`, `config|resetstat`).
    pub fn command_calls(&self) -> std::collections::HashMap<String, u64> {
        let info = self.command(&["INFO", "commandstats"]).expect("INFO commandstats");
        info.lines()
            .filter_map(|l| {
                let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = rest.split(',').find_map(|f| f.strip_prefix("calls="))?.parse().ok()?;
                Some((name.to_owned(), calls))
            })
            .collect()
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Whether the process runs (it was not killed).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Kills the server with SIGKILL (all data is lost: it keeps nothing on disk).
    pub fn kill(&mut self) {
        self.forget_child();
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        assert!(self.spawn(), "redis-server did not come back on port {}", self.port);
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, sig: libc::c_int) {
        signal_pid(self.pid(), sig);
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server not running").id()
    }

    /// Sends one command over a fresh connection and returns the reply as text: simple and bulk
    /// strings as they are, integers as digits, arrays as lines, nil as "(nil)", errors as
    /// `Err(message)`.
    pub fn command(&self, args: &[&str]) -> Result<String, String> {
        command_at(self.port, args)
    }
}

/// Sends `sig` to the process `pid` (a server of the test's own), from any thread.
pub fn signal_pid(pid: u32, sig: libc::c_int) {
    // SAFETY: sending a signal to our own child process.
    let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
    assert_eq!(rc, 0, "signal {sig} to process {pid} failed");
}

/// Watches a server with `MONITOR`: every command it runs, one line each, as Redis prints them
/// (`+1764… [0 127.0.0.1:5000] "SET" "key" …`; a command run by a script shows `[0 lua]`).
///
/// Dropping it closes its connection, which ends the server's monitoring and the reading thread:
/// a monitor left open makes the server write every later command to it, and its thread keep
/// each line (the benchmark, whose round-trip checks start one per path, grew by about 1 KB per
/// command and ran every later case with a dozen monitors attached).
pub struct Monitor {
    lines: Arc<Mutex<Vec<String>>>,
    addr: (String, u16),
    /// The monitoring connection, shut down on drop.
    connection: TcpStream,
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.connection.shutdown(std::net::Shutdown::Both);
    }
}

impl Monitor {
    /// Starts watching the server on `port`; commands from now on are seen.
    pub fn start(port: u16) -> Monitor {
        Self::start_at("127.0.0.1", port)
    }

    /// Starts watching the server at `host:port`.
    pub fn start_at(host: &str, port: u16) -> Monitor {
        let stream = TcpStream::connect((host, port)).expect("connect for MONITOR");
        let mut reader = BufReader::new(stream);
        reader.get_mut().write_all(b"*1\r\n$7\r\nMONITOR\r\n").expect("send MONITOR");
        let mut ok = String::new();
        reader.read_line(&mut ok).expect("MONITOR reply");
        assert!(ok.starts_with("+OK"), "MONITOR replied {ok:?}");
        let connection = reader.get_ref().try_clone().expect("a handle on the MONITOR connection");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in reader.lines() {
                let Ok(line) = line else { return };
                sink.lock().unwrap().push(line);
            }
        });
        Monitor { lines, addr: (host.to_owned(), port), connection }
    }

    /// Every line seen so far, once the server has shown every command sent before this call:
    /// an `ECHO` of a marker goes after them, and the stream is read until the marker.
    fn settled(&self) -> Vec<String> {
        static MARKS: AtomicUsize = AtomicUsize::new(0);
        let marker = format!("monitor-mark-{}", MARKS.fetch_add(1, Ordering::Relaxed));
        let mut stream = TcpStream::connect((self.addr.0.as_str(), self.addr.1)).expect("connect to send the marker");
        let echo = format!("*2\r\n$4\r\nECHO\r\n${}\r\n{marker}\r\n", marker.len());
        stream.write_all(echo.as_bytes()).expect("send the marker");
        wait_for(Duration::from_secs(10), "the monitor to show the marker", || {
            let lines = self.lines.lock().unwrap();
            match lines.iter().position(|l| l.contains(&marker)) {
                Some(at) => Ok(lines[..at].to_vec()),
                None => Err("not yet".to_owned()),
            }
        })
    }

    /// The commands clients sent so far (not those scripts ran, shown as `[0 lua]`) naming a
    /// key that starts with `prefix`, as their lines.
    pub fn client_commands(&self, prefix: &str) -> Vec<String> {
        let quoted = format!("\"{prefix}");
        self.settled()
            .into_iter()
            .filter(|l| {
                l.split_once("] ")
                    .is_some_and(|(source, command)| !source.ends_with(" lua") && command.contains(&quoted))
            })
            .collect()
    }

    /// The commands clients have sent so far that name a key starting with `prefix`, or that are
    /// one of `keyless` (commands naming no key, `TIME` say), never those a script ran.
    pub fn client_commands_about(&self, prefix: &str, keyless: &[&str]) -> Vec<String> {
        let quoted = format!("\"{prefix}");
        self.settled()
            .into_iter()
            .filter(|l| {
                l.split_once("] ").is_some_and(|(source, command)| {
                    !source.ends_with(" lua")
                        && (command.contains(&quoted)
                            || keyless.iter().any(|k| command.trim_matches('"').eq_ignore_ascii_case(k)))
                })
            })
            .collect()
    }

    /// How many commands naming exactly `key` clients have sent so far.
    pub fn client_commands_on(&self, key: &str) -> usize {
        let quoted = format!("\"{key}\"");
        self.client_commands(key).iter().filter(|l| l.contains(&quoted)).count()
    }
}

/// Sends one command to the server on `port` over a fresh connection (see
/// [`RedisServer::command`]).
pub fn command_at(port: u16, args: &[&str]) -> Result<String, String> {
    commands_at(port, &[args]).pop().expect("one reply per command")
}

/// Sends commands to the server on `port` one after the other over one fresh connection, and
/// returns their replies (see [`RedisServer::command`]).
pub fn commands_at(port: u16, commands: &[&[&str]]) -> Vec<Result<String, String>> {
    let stream = match TcpStream::connect(("127.0.0.1", port)) {
        Ok(s) => s,
        Err(e) => return commands.iter().map(|_| Err(e.to_string())).collect(),
    };
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let mut reader = BufReader::new(stream);
    let mut replies = Vec::new();
    for args in commands {
        let mut req = format!("*{}\r\n", args.len()).into_bytes();
        for a in *args {
            req.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            req.extend_from_slice(a.as_bytes());
            req.extend_from_slice(b"\r\n");
        }
        let reply = match reader.get_mut().write_all(&req) {
            Ok(()) => read_reply(&mut reader),
            Err(e) => Err(e.to_string()),
        };
        replies.push(reply);
    }
    replies
}

/// The value of `field` in an `INFO`-style reply (`field:value` lines).
pub fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':')).map(|v| v.trim().to_owned())
}

fn read_reply(r: &mut impl BufRead) -> Result<String, String> {
    let mut line = String::new();
    r.read_line(&mut line).map_err(|e| e.to_string())?;
    let line = line.trim_end_matches("\r\n");
    let (kind, rest) = line.split_at(1.min(line.len()));
    match kind {
        "+" | ":" => Ok(rest.to_owned()),
        "-" => Err(rest.to_owned()),
        "$" => {
            let n: i64 = rest.parse().map_err(|_| format!("bad bulk length {rest}"))?;
            if n < 0 {
                return Ok("(nil)".into());
            }
            let mut buf = vec![0; n as usize + 2];
            r.read_exact(&mut buf).map_err(|e| e.to_string())?;
            buf.truncate(n as usize);
            Ok(String::from_utf8_lossy(&buf).into_owned())
        }
        "*" => {
            let n: i64 = rest.parse().map_err(|_| format!("bad array length {rest}"))?;
            let mut items = Vec::new();
            for _ in 0..n.max(0) {
                items.push(read_reply(r)?);
            }
            Ok(items.join("\n"))
        }
        _ => Err(format!("unexpected reply line {line:?}")),
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.resume_quietly();
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl RedisServer {
    fn resume_quietly(&self) {
        if let Some(child) = &self.child {
            // SAFETY: sending a signal to our own child process.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGCONT) };
        }
    }
}

/// Which store a suite runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Memory,
    /// A standalone `redis-server` of the test's own.
    Redis,
    /// The test binary's shared Redis Cluster (3 primaries, 3 replicas), under a key prefix of
    /// the test's own.
    Cluster,
    /// The test binary's shared Sentinel group (1 primary, 2 replicas, 3 sentinels), under a key
    /// prefix of the test's own.
    Sentinel,
    /// A standalone server of the test's own, the store logged in (username and password in the
    /// URL) as a user restricted by [`ACL_RULES`].
    RedisAcl,
    /// `PgStore` on the test binary's PostgreSQL database (see [`postgres::shared_database`]),
    /// its table in a schema of the test's own.
    Postgres,
}

/// The least-privilege user of docs/security.md: the store's key prefix and channels, and the
/// commands the store sends (a test checks the page shows exactly these rules).
pub const ACL_RULES: &str = "on >s3cret resetkeys ~idem:* resetchannels &idem:* -@all +auth +hello +ping +select +client|id +get +set +del +pexpire +pttl +time +type +publish +subscribe +unsubscribe +eval +evalsha +script|load +info +scan";

/// Creates the user `idem` with `rules` on the server at `port`.
pub fn create_acl_user(port: u16, rules: &str) {
    let mut args = vec!["ACL", "SETUSER", "idem"];
    args.extend(rules.split(' '));
    assert_eq!(command_at(port, &args).expect("ACL SETUSER"), "OK");
}

/// A key prefix no other fixture of this process uses.
pub fn unique_prefix(what: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("idem-{what}{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Stores for one test: `clients` separate clients of one backend (separate `RedisStore`
/// connections to one server, cluster or Sentinel group, or one `MemoryStore` shared).
pub struct Fixture {
    pub backend: Backend,
    pub server: Option<RedisServer>,
    memory: Option<Arc<MemoryStore>>,
    redis: Vec<RedisStore>,
    pg: Vec<PgStore>,
}

impl Fixture {
    pub async fn new(backend: Backend, clients: usize) -> Fixture {
        let connect_all = |url: String, prefix: Option<String>| async move {
            let mut redis = Vec::new();
            for _ in 0..clients.max(1) {
                let mut builder = RedisStore::builder(&url);
                if let Some(prefix) = &prefix {
                    builder = builder.prefix(prefix.clone());
                }
                redis.push(builder.connect().await.unwrap_or_else(|e| panic!("connect to {url}: {e}")));
            }
            redis
        };
        match backend {
            Backend::Memory => Fixture {
                backend,
                server: None,
                memory: Some(Arc::new(MemoryStore::new())),
                redis: Vec::new(),
                pg: Vec::new(),
            },
            Backend::Redis => {
                let server = RedisServer::start();
                let redis = connect_all(server.url(), None).await;
                Fixture { backend, server: Some(server), memory: None, redis, pg: Vec::new() }
            }
            Backend::RedisAcl => {
                let server = RedisServer::start();
                create_acl_user(server.port(), ACL_RULES);
                let redis = connect_all(format!("redis://idem:s3cret@127.0.0.1:{}", server.port()), None).await;
                Fixture { backend, server: Some(server), memory: None, redis, pg: Vec::new() }
            }
            Backend::Cluster => {
                let url = tokio::task::block_in_place(|| RedisCluster::shared().url());
                let redis = connect_all(url, Some(unique_prefix("c"))).await;
                Fixture { backend, server: None, memory: None, redis, pg: Vec::new() }
            }
            Backend::Sentinel => {
                let url = tokio::task::block_in_place(|| SentinelGroup::shared().url());
                let redis = connect_all(url, Some(unique_prefix("s"))).await;
                Fixture { backend, server: None, memory: None, redis, pg: Vec::new() }
            }
            Backend::Postgres => {
                let url = tokio::task::block_in_place(postgres::shared_database);
                let pg = postgres::connect_clients(url, &postgres::unique_schema(), clients).await;
                Fixture { backend, server: None, memory: None, redis: Vec::new(), pg }
            }
        }
    }

    /// The `PgStore` of client `i` (on `Backend::Postgres` only).
    pub fn pg_store(&self, i: usize) -> &PgStore {
        &self.pg[i % self.pg.len()]
    }

    /// The store of client `i`.
    pub fn store(&self, i: usize) -> Arc<dyn Store> {
        match self.backend {
            Backend::Memory => self.memory.clone().unwrap(),
            Backend::Redis | Backend::RedisAcl | Backend::Cluster | Backend::Sentinel => {
                Arc::new(self.redis[i % self.redis.len()].clone())
            }
            Backend::Postgres => Arc::new(self.pg_store(i).clone()),
        }
    }

    /// The `RedisStore` of client `i` (not on `Backend::Memory`).
    pub fn redis_store(&self, i: usize) -> &RedisStore {
        &self.redis[i % self.redis.len()]
    }

    /// A runtime on client `i`. Every runtime of the tests shares one token key, as every
    /// instance of a service would.
    pub fn idem(&self, i: usize) -> Idempotency {
        Idempotency::builder_shared(self.store(i)).token_keys(test_token_keys()).build()
    }

    /// A runtime on client `i` with a builder step applied.
    pub fn idem_with(
        &self,
        i: usize,
        f: impl FnOnce(idempotency::IdempotencyBuilder) -> idempotency::IdempotencyBuilder,
    ) -> Idempotency {
        f(Idempotency::builder_shared(self.store(i)).token_keys(test_token_keys())).build()
    }

    /// Sends a raw command about one of this fixture's record keys to the node that holds it.
    pub fn raw_command(&self, args: &[&str]) -> Result<String, String> {
        match self.backend {
            Backend::Memory | Backend::Postgres => panic!("no raw Redis commands on {:?}", self.backend),
            Backend::Redis | Backend::RedisAcl => self.server.as_ref().unwrap().command(args),
            Backend::Cluster => RedisCluster::shared().command(args),
            Backend::Sentinel => SentinelGroup::shared().primary_command(args),
        }
    }

    /// Deletes a key's record behind the runtime's back (an operator, or an eviction).
    pub fn delete_record(&self, key: &str) {
        match self.backend {
            Backend::Memory => {
                self.memory.as_ref().unwrap().remove(key);
            }
            Backend::Redis | Backend::RedisAcl | Backend::Cluster | Backend::Sentinel => {
                let rk = self.redis[0].record_key(key);
                self.raw_command(&["DEL", &rk]).expect("DEL");
            }
            Backend::Postgres => postgres::delete_record(self.pg_store(0), key),
        }
    }

    /// Whether the store is one of the Redis backends (raw commands, foreign values at keys).
    pub fn is_redis(&self) -> bool {
        matches!(self.backend, Backend::Redis | Backend::RedisAcl | Backend::Cluster | Backend::Sentinel)
    }
}

/// The token key every runtime of the tests shares.
pub fn test_token_keys() -> idempotency::TokenKeys {
    idempotency::TokenKeys::new(b"the tests' token key, 32 bytes or more").expect("a long enough secret")
}

/// Runs `f` until it returns `Some`, for at most `limit`; panics with `what` otherwise.
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The blocking counterpart of [`eventually`], for fixtures outside the runtime: runs `attempt`
/// every 20 ms until it returns `Ok`, for at most `limit`; panics with `what` and the last `Err`
/// (what is still wrong) otherwise.
pub fn wait_for<T>(limit: Duration, what: &str, attempt: impl FnMut() -> Result<T, String>) -> T {
    try_wait_for(limit, attempt).unwrap_or_else(|problem| panic!("{what} not within {limit:?}: {problem}"))
}

/// [`wait_for`] that gives the last problem back instead of panicking.
pub fn try_wait_for<T>(limit: Duration, mut attempt: impl FnMut() -> Result<T, String>) -> Result<T, String> {
    let deadline = Instant::now() + limit;
    loop {
        match attempt() {
            Ok(v) => return Ok(v),
            Err(problem) if Instant::now() >= deadline => return Err(problem),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// One execution of a [`Churn`] body.
#[derive(Debug, Clone)]
pub struct Execution {
    pub key: usize,
    pub value: String,
    pub started: tokio::time::Instant,
    pub ended: Option<tokio::time::Instant>,
}

/// What one [`Churn`] call returned.
#[derive(Debug)]
pub struct Outcome {
    pub key: usize,
    pub started: tokio::time::Instant,
    pub ended: tokio::time::Instant,
    /// The value, or `"conflict"`, `"store <kind>: <message>"`, or `"unexpected ..."`.
    pub result: Result<String, String>,
}

type Executions = Arc<Mutex<Vec<Execution>>>;

/// A workload for failover tests: workers calling keys `churn:<i>` of a window of 20 keys that
/// moves on by one key every 25 ms, so that at any moment some keys are fresh, some in progress
/// and some completed and called again. Every body execution and every call's outcome is
/// recorded, to be checked by [`ChurnResult::check`].
pub struct Churn {
    executions: Executions,
    outcomes: Arc<Mutex<Vec<Outcome>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    workers: Vec<tokio::task::JoinHandle<()>>,
    started: tokio::time::Instant,
    lease: Duration,
}

/// A recorded [`Churn`] run.
pub struct ChurnResult {
    pub executions: Vec<Execution>,
    pub outcomes: Vec<Outcome>,
    /// Keys `0..used` were called.
    pub used: usize,
    /// The value each key replayed (or got) in the final pass.
    pub final_values: std::collections::HashMap<usize, String>,
    /// Executions in the final pass (keys no worker got to, or whose record was lost).
    pub final_executions: usize,
}

/// A [`Churn`] key that ran more than once.
#[derive(Debug)]
pub struct Rerun {
    pub key: usize,
    /// Each run's start and end, in ms from the fault.
    pub runs: Vec<(i64, Option<i64>)>,
    /// Whether the first run's caller got `Ok`.
    pub first_ok: bool,
}

/// What [`ChurnResult::check`] counted.
#[derive(Debug, Default)]
pub struct ChurnSummary {
    pub calls: usize,
    pub oks: usize,
    pub conflicts: usize,
    pub store_errors: std::collections::BTreeMap<String, usize>,
    /// Store errors on keys not exposed to the fault.
    pub store_errors_unexposed: usize,
    /// Keys that ran more than once.
    pub reruns: Vec<Rerun>,
    pub executions: usize,
    pub final_executions: usize,
    pub sample_error: Option<String>,
}

pub fn churn_key(i: usize) -> String {
    format!("churn:{i}")
}

const CHURN_WINDOW: usize = 20;
const CHURN_STEP_MS: u128 = 25;

/// A body that records its execution, sleeps `pause`, and returns a value naming the execution.
fn tracked(
    execs: Executions,
    key: usize,
    pause: Duration,
) -> impl FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = R<String>> + Send>> {
    move || {
        Box::pin(async move {
            let id = {
                let mut e = execs.lock().unwrap();
                e.push(Execution { key, value: String::new(), started: tokio::time::Instant::now(), ended: None });
                e.len() - 1
            };
            tokio::time::sleep(pause).await;
            let value = format!("{} by execution {id}", churn_key(key));
            let mut e = execs.lock().unwrap();
            e[id].value = value.clone();
            e[id].ended = Some(tokio::time::Instant::now());
            R::Ok(value)
        })
    }
}

fn describe(e: AppError) -> String {
    match e {
        AppError::Idem(idempotency::Error::Conflict { .. }) => "conflict".to_owned(),
        AppError::Idem(idempotency::Error::Store { source, .. }) => format!("store {:?}: {source}", source.kind()),
        other => format!("unexpected {other:?}"),
    }
}

impl Churn {
    /// Starts `workers` workers spread over `clients`, each call with lease `lease` and a body of
    /// 20 to 80 ms.
    pub fn start(clients: &[Idempotency], workers: usize, lease: Duration) -> Churn {
        let executions: Executions = Arc::default();
        let outcomes: Arc<Mutex<Vec<Outcome>>> = Arc::default();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let started = tokio::time::Instant::now();
        let handles = (0..workers)
            .map(|w| {
                let (idem, executions, outcomes, stop) =
                    (clients[w % clients.len()].clone(), executions.clone(), outcomes.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut n = w * 7919;
                    while !stop.load(Ordering::SeqCst) {
                        n = (n * 31 + 17) % 1_000_003;
                        let key = Self::base_at(started) + n % CHURN_WINDOW;
                        let call_started = tokio::time::Instant::now();
                        let body = tracked(executions.clone(), key, ms(20 + (n % 60) as u64));
                        let result = idem.run(idempotency::Call::new(churn_key(key)).ttl(lease), body).await;
                        let result = result.map_err(describe);
                        let ended = tokio::time::Instant::now();
                        outcomes.lock().unwrap().push(Outcome { key, started: call_started, ended, result });
                        tokio::time::sleep(ms(5)).await;
                    }
                })
            })
            .collect();
        Churn { executions, outcomes, stop, workers: handles, started, lease }
    }

    fn base_at(started: tokio::time::Instant) -> usize {
        (started.elapsed().as_millis() / CHURN_STEP_MS) as usize
    }

    /// The first key of the window now.
    pub fn base(&self) -> usize {
        Self::base_at(self.started)
    }

    /// Retries a call on the first key from the window on for which `pick` holds, through
    /// `client`, until it succeeds (within `limit`).
    pub async fn wait_until_calls_work(&self, client: &Idempotency, pick: impl Fn(usize) -> bool, limit: Duration) {
        let key = (self.base()..).find(|&k| pick(k)).unwrap();
        eventually(limit, "calls to work again", || {
            let body = tracked(self.executions.clone(), key, Duration::ZERO);
            let call = idempotency::Call::new(churn_key(key)).ttl(self.lease);
            async move { client.run(call, body).await.ok() }
        })
        .await;
    }

    /// Stops the workers, waits until every lease taken has run out, and calls every key used
    /// once more through `client`: each must replay or run (a key still held is a failure:
    /// stuck past its lease).
    pub async fn stop(self, client: &Idempotency) -> ChurnResult {
        self.stop.store(true, Ordering::SeqCst);
        for w in self.workers {
            w.await.unwrap();
        }
        let used = Self::base_at(self.started) + CHURN_WINDOW;
        tokio::time::sleep(self.lease + ms(300)).await;
        let before = self.executions.lock().unwrap().len();
        let mut final_values = std::collections::HashMap::new();
        for key in 0..used {
            let body = tracked(self.executions.clone(), key, Duration::ZERO);
            match client.run(idempotency::Call::new(churn_key(key)).ttl(self.lease), body).await {
                Ok(v) => final_values.insert(key, v),
                Err(e) => panic!("{} after every lease ran out: {e:?} (stuck past its lease?)", churn_key(key)),
            };
        }
        let executions = self.executions.lock().unwrap().clone();
        let final_executions = executions.len() - before;
        let outcomes = std::mem::take(&mut *self.outcomes.lock().unwrap());
        ChurnResult { executions, outcomes, used, final_values, final_executions }
    }
}

/// What [`churn_through_fault`] saw.
pub struct FaultRun<T> {
    /// What the fault returned.
    pub fault: T,
    pub result: ChurnResult,
    pub summary: ChurnSummary,
    /// When the fault began, when the deployment said it was repaired, and when calls worked
    /// again through every client.
    pub broken: tokio::time::Instant,
    pub repaired: tokio::time::Instant,
    pub recovered: tokio::time::Instant,
}

/// A [`Churn`] of `workers` on `clients` through a fault: two seconds of calls, then `fault`
/// (blocking: it breaks something and waits until the deployment says it is repaired), then
/// calls working again through every client on the keys `exposed` picks (within
/// `recover_limit`), 1.5 s more, and the run checked. Prints the counts, and asserts that at
/// least `min_oks` calls completed and that the fault caught some of them.
pub async fn churn_through_fault<T>(
    clients: &[Idempotency],
    workers: usize,
    lease: Duration,
    exposed: impl Fn(usize) -> bool,
    recover_limit: Duration,
    min_oks: usize,
    fault: impl FnOnce() -> T,
) -> FaultRun<T> {
    let churn = Churn::start(clients, workers, lease);
    tokio::time::sleep(ms(2000)).await;
    let broken = tokio::time::Instant::now();
    let fault = tokio::task::block_in_place(fault);
    let repaired = tokio::time::Instant::now();
    for client in clients {
        churn.wait_until_calls_work(client, &exposed, recover_limit).await;
    }
    let recovered = tokio::time::Instant::now();
    tokio::time::sleep(ms(1500)).await;
    let result = churn.stop(&clients[1]).await;
    let summary = result.check(broken, recovered, &exposed);
    println!(
        "{} calls on {} keys: {} ok, {} conflicts, store errors {:?} ({} of them on keys the fault did not touch); \
         {} executions ({} in the final pass)",
        summary.calls,
        result.used,
        summary.oks,
        summary.conflicts,
        summary.store_errors,
        summary.store_errors_unexposed,
        summary.executions,
        summary.final_executions
    );
    summary.print_reruns_and_sample();
    assert!(summary.oks > min_oks, "too few calls completed for the run to mean anything");
    assert!(!summary.store_errors.is_empty(), "no call was caught in the fault: it did not hit the run");
    FaultRun { fault, result, summary, broken, repaired, recovered }
}

impl ChurnSummary {
    /// Prints the keys run twice and one store error as callers saw it.
    pub fn print_reruns_and_sample(&self) {
        println!(
            "keys run twice (first run in flight during the failover), each run's start and end in ms from the kill, \
             and whether the first run's caller got Ok: {:?}",
            self.reruns
        );
        if let Some(e) = &self.sample_error {
            println!("a store error as callers see it: {e}");
        }
    }
}

impl ChurnResult {
    /// Checks the run against a fault at `fault` that ended at `recovered` (calls worked again)
    /// and could only have touched keys for which `exposed` holds:
    /// - a key ran twice only if it is exposed and its first run was in flight in the fault's
    ///   window (from 500 ms before the fault, for writes not yet replicated, to a second after
    ///   the recovery, for calls sent before it), and never more than twice;
    /// - every value a caller got is an execution's value, and every other key's callers all got
    ///   the value its record replays in the end;
    /// - every error is a conflict or a store error, and store errors only happen in the window.
    pub fn check(
        &self,
        fault: tokio::time::Instant,
        recovered: tokio::time::Instant,
        exposed: impl Fn(usize) -> bool,
    ) -> ChurnSummary {
        let window = (fault - ms(500), recovered + ms(1000));
        let in_window = |from: tokio::time::Instant, to: tokio::time::Instant| from <= window.1 && to >= window.0;
        let rel = |t: tokio::time::Instant| {
            t.saturating_duration_since(fault).as_millis() as i64
                - fault.saturating_duration_since(t).as_millis() as i64
        };
        let mut per_key: std::collections::BTreeMap<usize, Vec<&Execution>> = Default::default();
        for e in &self.executions {
            per_key.entry(e.key).or_default().push(e);
        }
        let mut summary = ChurnSummary {
            executions: self.executions.len(),
            final_executions: self.final_executions,
            calls: self.outcomes.len(),
            ..Default::default()
        };
        for (&key, execs) in &per_key {
            if execs.len() < 2 {
                continue;
            }
            let first = execs[0];
            let first_end = first.ended.unwrap_or(recovered);
            assert!(
                exposed(key) && in_window(first.started, first_end) && execs.len() == 2,
                "{} ran {} times, but {}: {execs:#?}",
                churn_key(key),
                execs.len(),
                if !exposed(key) {
                    "the fault could not touch it"
                } else if execs.len() > 2 {
                    "more than twice"
                } else {
                    "its first run was not in the fault's window"
                }
            );
            let spans = execs.iter().map(|e| (rel(e.started), e.ended.map(rel))).collect();
            let first_ok = self.outcomes.iter().any(|o| o.result.as_deref() == Ok(first.value.as_str()));
            summary.reruns.push(Rerun { key, runs: spans, first_ok });
        }
        let values: std::collections::HashSet<&str> = self.executions.iter().map(|e| e.value.as_str()).collect();
        for o in &self.outcomes {
            match &o.result {
                Ok(v) => {
                    summary.oks += 1;
                    assert!(values.contains(v.as_str()), "{}: {v:?} is no execution's value", churn_key(o.key));
                    if !summary.reruns.iter().any(|r| r.key == o.key) {
                        assert_eq!(v, &self.final_values[&o.key], "{} replayed another value", churn_key(o.key));
                    }
                }
                Err(e) if e == "conflict" => summary.conflicts += 1,
                Err(e) if e.starts_with("store ") => {
                    assert!(
                        in_window(o.started, o.ended),
                        "store error outside the fault's window ({} ms from the fault): {e}",
                        rel(o.ended)
                    );
                    *summary.store_errors.entry(e.split(':').next().unwrap().to_owned()).or_default() += 1;
                    if !exposed(o.key) {
                        summary.store_errors_unexposed += 1;
                    }
                    summary.sample_error.get_or_insert_with(|| e.clone());
                }
                Err(e) => panic!("{}: {e}", churn_key(o.key)),
            }
        }
        summary
    }
}
