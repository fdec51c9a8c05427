//! PostgreSQL for the tests: a database of this test process's own on the server at
//! `$IDEM_PG_URL` (default `postgres://postgres@127.0.0.1:5432`), created on first use and dropped
//! when the process exits; where no server answers there, a cluster of the process's own. And
//! clusters a test starts for itself ([`PgCluster`]: `initdb` in a temporary directory, a free
//! port), to restart or kill.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use idempotency::store::postgres::sqlx::{self, Connection, Executor};
use idempotency::PgStore;

use super::{free_port, spawn_tied, LIVE};

/// Runs `f` on a runtime of its own, on a thread of its own: fixtures are set up from any test's
/// runtime, and their connections must not outlive it.
fn blocking<T: Send>(f: impl std::future::Future<Output = T> + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f))
            .join()
            .expect("setup thread")
    })
}

/// The server the shared databases live on.
fn server_url() -> String {
    std::env::var("IDEM_PG_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_owned())
}

/// The base URL (no database) of the server this process's shared database is on: the server at
/// `$IDEM_PG_URL` if it answers, else a cluster of this process's own.
fn shared_server() -> &'static str {
    static SERVER: OnceLock<String> = OnceLock::new();
    SERVER.get_or_init(|| {
        let url = server_url();
        let reachable = blocking(async {
            tokio::time::timeout(Duration::from_secs(3), sqlx::PgConnection::connect(&format!("{url}/postgres")))
                .await
                .is_ok_and(|c| c.is_ok())
        });
        if reachable {
            return url;
        }
        eprintln!("no PostgreSQL at {url}: starting a cluster of this test process's own");
        let cluster = Box::leak(Box::new(PgCluster::start()));
        cluster.base_url()
    })
}

/// Databases this process created, dropped at exit.
static CREATED: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

extern "C" fn drop_databases() {
    let Ok(mut created) = CREATED.try_lock() else { return };
    let created = std::mem::take(&mut *created);
    if created.is_empty() {
        return;
    }
    let _ = std::panic::catch_unwind(|| {
        blocking(async {
            for (server, db) in created {
                let Ok(Ok(mut conn)) = tokio::time::timeout(
                    Duration::from_secs(3),
                    sqlx::PgConnection::connect(&format!("{server}/postgres")),
                )
                .await
                else {
                    continue;
                };
                let _ = tokio::time::timeout(
                    Duration::from_secs(10),
                    conn.execute(format!("DROP DATABASE IF EXISTS \"{db}\" WITH (FORCE)").as_str()),
                )
                .await;
            }
        })
    });
}

/// A database of this process's own on the shared server (created on first use, dropped when the
/// process exits; databases left by test processes that died are dropped on the way): its URL.
pub fn shared_database() -> &'static str {
    static DB: OnceLock<String> = OnceLock::new();
    DB.get_or_init(|| {
        let server = shared_server().to_owned();
        let db = format!("idem_test_{}_{:08x}", std::process::id(), rand32());
        blocking(async {
            let mut conn =
                sqlx::PgConnection::connect(&format!("{server}/postgres")).await.expect("connect to PostgreSQL");
            let stale: Vec<(String,)> =
                sqlx::query_as("SELECT datname FROM pg_database WHERE datname LIKE 'idem\\_test\\_%'")
                    .fetch_all(&mut conn)
                    .await
                    .unwrap_or_default();
            for (name,) in stale {
                let pid = name.split('_').nth(2).and_then(|p| p.parse::<i32>().ok());
                // SAFETY: signal 0 only checks whether the process exists.
                if pid.is_some_and(|p| unsafe { libc::kill(p, 0) } != 0) {
                    let _ = conn.execute(format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)").as_str()).await;
                }
            }
            conn.execute(format!("CREATE DATABASE \"{db}\"").as_str()).await.expect("CREATE DATABASE");
        });
        let mut created = CREATED.lock().unwrap();
        if created.is_empty() {
            // SAFETY: registering a plain `extern "C"` function.
            unsafe { libc::atexit(drop_databases) };
        }
        created.push((server.clone(), db.clone()));
        format!("{server}/{db}")
    })
}

/// A schema name no other fixture of this process uses (each test's records live in its own).
pub fn unique_schema() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("t{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

fn rand32() -> u32 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    (t.subsec_nanos() ^ std::process::id().rotate_left(16)).wrapping_mul(2_654_435_761)
}

/// `clients` stores on the database at `url`, their table in `schema` (created by the first).
pub async fn connect_clients(url: &str, schema: &str, clients: usize) -> Vec<PgStore> {
    let mut stores = Vec::new();
    for i in 0..clients.max(1) {
        let mut builder = PgStore::builder(url).schema(schema).pool_size(4);
        if i == 0 {
            builder = builder.migrate();
        }
        stores.push(builder.connect().await.unwrap_or_else(|e| panic!("connect to {url}: {e}")));
    }
    stores
}

/// Deletes `key`'s row behind the runtime's back (an operator).
pub fn delete_record(store: &PgStore, key: &str) {
    let (pool, sql) = (store.pool().clone(), format!("DELETE FROM {} WHERE key = $1", store.table()));
    let key = PgStore::stored_key(key).into_owned();
    // On the test's own runtime would do, but `delete_record` is not async: a thread of its own.
    blocking(async move {
        let mut conn = sqlx::PgConnection::connect_with(&pool.connect_options()).await.expect("connect");
        sqlx::query(&sql).bind(key).execute(&mut conn).await.expect("DELETE");
    });
}

/// The directory of PostgreSQL's programs: `$PG_BIN`, the one `initdb` on the PATH is in, or
/// Debian's newest `/usr/lib/postgresql/<version>/bin`.
fn pg_bin() -> PathBuf {
    if let Ok(dir) = std::env::var("PG_BIN") {
        return dir.into();
    }
    if let Ok(out) = Command::new("sh").args(["-c", "command -v initdb"]).output() {
        let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if !path.is_empty() {
            let path = std::fs::canonicalize(&path).unwrap_or_else(|_| path.into());
            return path.parent().expect("initdb's directory").to_owned();
        }
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path().join("bin")).filter(|p| p.join("initdb").exists()).collect())
        .unwrap_or_default();
    versions.sort();
    versions.pop().expect("no initdb found (scripts/install-postgres.sh installs PostgreSQL)")
}

/// The user a cluster runs as: PostgreSQL refuses to run as root, so when the tests are root, the
/// `postgres` user Debian's package creates.
fn run_as() -> Option<(u32, u32)> {
    // SAFETY: plain libc calls.
    unsafe {
        if libc::geteuid() != 0 {
            return None;
        }
        let pw = libc::getpwnam(c"postgres".as_ptr());
        assert!(!pw.is_null(), "running as root and there is no postgres user to run PostgreSQL as");
        Some(((*pw).pw_uid, (*pw).pw_gid))
    }
}

/// A PostgreSQL cluster of a test's own: `initdb` in a temporary directory, the server on a free
/// port of 127.0.0.1 (trust authentication, user `postgres`), stopped and removed when dropped.
pub struct PgCluster {
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
    extra: Vec<String>,
}

impl PgCluster {
    /// A new cluster, started.
    pub fn start() -> PgCluster {
        Self::start_with(&[])
    }

    /// A new cluster started with `-c` settings of its own (`"shared_preload_libraries=..."`).
    pub fn start_with(settings: &[&str]) -> PgCluster {
        let dir = std::env::temp_dir().join(format!("idem-pg-{}-{:08x}", std::process::id(), rand32()));
        std::fs::create_dir_all(&dir).expect("cluster directory");
        let ids = run_as();
        if let Some((uid, gid)) = ids {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).expect("chown the cluster directory");
        }
        let mut initdb = Command::new(pg_bin().join("initdb"));
        initdb
            .args([
                "-D",
                dir.join("data").to_str().unwrap(),
                "-U",
                "postgres",
                "-A",
                "trust",
                "--no-sync",
                "-E",
                "UTF8",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some((uid, gid)) = ids {
            use std::os::unix::process::CommandExt;
            initdb.uid(uid).gid(gid);
        }
        let out = initdb.output().expect("run initdb");
        assert!(out.status.success(), "initdb failed: {}", String::from_utf8_lossy(&out.stderr));
        let mut cluster =
            PgCluster { dir, port: free_port(), child: None, extra: settings.iter().map(|s| s.to_string()).collect() };
        cluster.spawn();
        cluster
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new(pg_bin().join("postgres"));
        cmd.args(["-D", self.dir.join("data").to_str().unwrap(), "-p", &self.port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=", "-c", "fsync=off"])
            .args(["-c", "max_connections=200", "-c", "logging_collector=off"])
            .args(self.extra.iter().flat_map(|s| ["-c", s.as_str()]))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.join("server.log")).map(Stdio::from).unwrap_or(Stdio::null()));
        if let Some((uid, gid)) = run_as() {
            use std::os::unix::process::CommandExt;
            cmd.uid(uid).gid(gid);
        }
        let child = spawn_tied(cmd).expect("start postgres");
        LIVE.lock().unwrap_or_else(|p| p.into_inner()).push((child.id(), self.dir.clone()));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        let url = self.url("postgres");
        loop {
            let up = blocking(async {
                tokio::time::timeout(Duration::from_secs(1), sqlx::PgConnection::connect(&url))
                    .await
                    .is_ok_and(|c| c.is_ok())
            });
            if up {
                return;
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
                panic!("postgres exited ({status}): {log}");
            }
            assert!(Instant::now() < deadline, "postgres did not accept connections on port {}", self.port);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `postgres://postgres@127.0.0.1:<port>`.
    pub fn base_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}", self.port)
    }

    /// The port the server listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of database `db`.
    pub fn url(&self, db: &str) -> String {
        format!("{}/{db}", self.base_url())
    }

    /// The server's process id (the postmaster).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("not running").id()
    }

    /// Stops the server at once, as a crash would (`pg_ctl stop -m immediate`: SIGQUIT to the
    /// postmaster, no checkpoint; committed transactions survive in the WAL).
    pub fn stop_immediate(&mut self) {
        if let Some(mut child) = self.child.take() {
            LIVE.lock().unwrap_or_else(|p| p.into_inner()).retain(|(pid, _)| *pid != child.id());
            // SAFETY: our own child process.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGQUIT) };
            let _ = child.wait();
        }
    }

    /// `pg_ctl restart -m immediate`: stopped as by a crash, started again on the same port
    /// (crash recovery replays the WAL).
    pub fn restart_immediate(&mut self) {
        self.stop_immediate();
        self.spawn();
    }

    /// Starts a stopped server again.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "already running");
        self.spawn();
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        self.stop_immediate();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
