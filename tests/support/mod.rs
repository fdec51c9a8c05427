//! Test support: real `redis-server` processes started on free ports and stopped by the tests
//! themselves, and fixtures that run one suite on both stores.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idempotent::{Idempotency, MemoryStore, RedisStore, Store};

/// The error type of the tests' guarded functions: the library's errors, or the body's own.
#[derive(Debug)]
pub enum AppError {
    Idem(idempotent::Error),
    Failed(&'static str),
}

impl From<idempotent::Error> for AppError {
    fn from(e: idempotent::Error) -> Self {
        AppError::Idem(e)
    }
}

/// A guarded function's result.
pub type R<T> = Result<T, AppError>;

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Runs each named `async fn(Backend)` of the including file as two tests, `memory::name` and
/// `redis::name`: one suite, two stores.
#[allow(unused_macros)]
macro_rules! both_stores {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Backend::Memory).await
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::Backend::Redis).await
                }
            )*
        }
    };
}

/// A `redis-server` of the test's own, on a free port, killed when dropped.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("no free port").port()
}

fn redis_server_binary() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into())
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers PING.
    pub fn start() -> RedisServer {
        for _ in 0..5 {
            let port = free_port();
            let dir = std::env::temp_dir().join(format!("idem-redis-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("temp dir");
            let mut server = RedisServer { child: None, port, dir };
            if server.spawn() {
                return server;
            }
        }
        panic!("could not start redis-server on a free port (is it installed? scripts/install-redis.sh)");
    }

    fn spawn(&mut self) -> bool {
        let mut cmd = Command::new(redis_server_binary());
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--dir", self.dir.to_str().unwrap(), "--logfile", "redis.log", "--daemonize", "no"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => panic!("cannot run {}: {e} (scripts/install-redis.sh installs it)", redis_server_binary()),
        };
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
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

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server with SIGKILL (all data is lost: it keeps nothing on disk).
    pub fn kill(&mut self) {
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
        let pid = self.child.as_ref().expect("server not running").id();
        // SAFETY: sending a signal to our own child process.
        let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
        assert_eq!(rc, 0, "signal {sig} to redis-server failed");
    }

    /// Sends one command over a fresh connection and returns the reply as text: simple and bulk
    /// strings as they are, integers as digits, arrays as lines, nil as "(nil)", errors as
    /// `Err(message)`.
    pub fn command(&self, args: &[&str]) -> Result<String, String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).map_err(|e| e.to_string())?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok();
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        stream.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
        let mut reader = BufReader::new(stream);
        read_reply(&mut reader)
    }
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
    Redis,
}

/// Stores for one test: `clients` separate clients of one backend (separate `RedisStore`
/// connections to one server, or one `MemoryStore` shared).
pub struct Fixture {
    pub backend: Backend,
    pub server: Option<RedisServer>,
    memory: Option<Arc<MemoryStore>>,
    redis: Vec<RedisStore>,
}

impl Fixture {
    pub async fn new(backend: Backend, clients: usize) -> Fixture {
        match backend {
            Backend::Memory => {
                Fixture { backend, server: None, memory: Some(Arc::new(MemoryStore::new())), redis: Vec::new() }
            }
            Backend::Redis => {
                let server = RedisServer::start();
                let mut redis = Vec::new();
                for _ in 0..clients.max(1) {
                    redis.push(RedisStore::connect(&server.url()).await.expect("connect to the test's redis"));
                }
                Fixture { backend, server: Some(server), memory: None, redis }
            }
        }
    }

    /// The store of client `i`.
    pub fn store(&self, i: usize) -> Arc<dyn Store> {
        match self.backend {
            Backend::Memory => self.memory.clone().unwrap(),
            Backend::Redis => Arc::new(self.redis[i % self.redis.len()].clone()),
        }
    }

    /// A runtime on client `i`.
    pub fn idem(&self, i: usize) -> Idempotency {
        Idempotency::builder_shared(self.store(i)).build()
    }

    /// A runtime on client `i` with a builder step applied.
    pub fn idem_with(
        &self,
        i: usize,
        f: impl FnOnce(idempotent::IdempotencyBuilder) -> idempotent::IdempotencyBuilder,
    ) -> Idempotency {
        f(Idempotency::builder_shared(self.store(i))).build()
    }

    /// Deletes a key's record behind the runtime's back (an operator, or an eviction).
    pub fn delete_record(&self, key: &str) {
        match self.backend {
            Backend::Memory => {
                self.memory.as_ref().unwrap().remove(key);
            }
            Backend::Redis => {
                let rk = self.redis[0].record_key(key);
                self.server.as_ref().unwrap().command(&["DEL", &rk]).expect("DEL");
            }
        }
    }
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
