//! A consumer process of a kill -9 test, as the test sees it: what it printed (`RUN key` as each
//! body starts its effect, `STORED key...` after each poll, `DRAINED` and what it counted when it
//! stopped with nothing left), killed with SIGKILL once some bodies have started, or waited for
//! until it drains. Shared by the consumers' tests.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::process::Child;
use std::time::{Duration, Instant};

/// What one consumer process printed.
#[derive(Default)]
pub struct Seen {
    /// Keys whose bodies started, in order.
    pub ran: Vec<String>,
    /// Keys whose records a poll stored.
    pub stored: BTreeSet<String>,
    /// The rest of its `DRAINED` line, if it printed one.
    pub drained: Option<String>,
}

impl Seen {
    fn read(&mut self, line: &str) {
        if let Some(key) = line.strip_prefix("RUN ") {
            self.ran.push(key.to_owned());
        } else if let Some(keys) = line.strip_prefix("STORED") {
            self.stored.extend(keys.split_whitespace().map(str::to_owned));
        } else if let Some(rest) = line.strip_prefix("DRAINED") {
            self.drained = Some(rest.trim().to_owned());
        }
    }

    /// Bodies started whose batch did not store them before the kill.
    pub fn in_flight(&self) -> BTreeSet<String> {
        self.ran.iter().filter(|k| !self.stored.contains(*k)).cloned().collect()
    }
}

/// Reads `child`'s lines until `bodies` bodies have started, kills it (SIGKILL), and reads what
/// it printed before it died.
pub fn kill_after(mut child: Child, bodies: usize) -> Seen {
    let mut lines = BufReader::new(child.stdout.take().expect("the consumer's stdout piped")).lines();
    let mut seen = Seen::default();
    while seen.ran.len() < bodies {
        let line = lines.next().expect("the consumer stopped before its bodies ran").unwrap();
        seen.read(&line);
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    lines.map_while(Result::ok).for_each(|l| seen.read(&l));
    seen
}

/// Waits for `child` to exit on its own within `within` (killed, and the test failed, if not),
/// and reads all it printed.
pub fn run_to_end(mut child: Child, within: Duration) -> Seen {
    let mut stdout = child.stdout.take().expect("the consumer's stdout piped");
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        stdout.read_to_string(&mut out).unwrap();
        out
    });
    let deadline = Instant::now() + within;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("the last consumer did not drain the stream within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut seen = Seen::default();
    reader.join().unwrap().lines().for_each(|l| seen.read(l));
    seen
}
