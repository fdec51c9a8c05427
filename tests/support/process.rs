//! Processes of the tests' own: a free port to start a server on, and servers spawned so that
//! they die with the test process (killed at exit, or by the kernel when it is killed). A file of
//! its own so that the examples' tests can include it beside `postgres.rs`.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::{mpsc, Mutex, OnceLock};

/// A port nobody listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("no free port").port()
}

/// Every server process started and not yet reaped, with its directory, so that the ones still
/// running when the test process exits (servers shared by a whole test binary live in statics,
/// which are never dropped) are killed and their directories removed.
pub static LIVE: Mutex<Vec<(u32, PathBuf)>> = Mutex::new(Vec::new());

extern "C" fn kill_live_servers() {
    if let Ok(mut live) = LIVE.try_lock() {
        for (pid, dir) in live.drain(..) {
            // SAFETY: our own child process.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Starts `cmd` from a thread that lives as long as the test process, with `PR_SET_PDEATHSIG`
/// set: Linux kills the child when the thread that forked it ends, so servers started from a
/// test's own thread (which ends with the test) would die under the tests sharing them, and
/// servers of a test process killed by a signal would outlive it.
pub fn spawn_tied(mut cmd: Command) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        // SAFETY: registering a plain `extern "C"` function.
        unsafe { libc::atexit(kill_live_servers) };
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("server-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("spawner thread");
        Mutex::new(tx)
    });
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                // The test process is gone already (no allocation here: this runs after fork).
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    let (tx, rx) = mpsc::channel();
    spawner.lock().unwrap_or_else(|p| p.into_inner()).send((cmd, tx)).expect("spawner thread gone");
    rx.recv().expect("spawner thread gone")
}
