//! Scanning the store page by page (`Idempotency::scan`: `SCAN` on every primary in turn, each
//! key's record read), with progress on stderr for long scans.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use idempotent_core::store::ScanPage;
use idempotent_core::ScanFilter;

use crate::connect::Ctx;
use crate::failure::Failure;

/// Keys examined per page: large enough for few round trips, small enough that no page holds
/// the server or the client long.
pub const PAGE: usize = 500;

/// The pages of one scan.
pub struct Pages<'a> {
    ctx: &'a Ctx,
    filter: ScanFilter,
    cursor: Option<String>,
    done: bool,
    /// Keys the store has examined so far.
    pub examined: u64,
    progress: Progress,
}

impl<'a> Pages<'a> {
    /// A scan of the records `filter` keeps; progress shown on stderr when it is a terminal or
    /// `show_progress` is set.
    pub fn new(ctx: &'a Ctx, filter: ScanFilter, show_progress: bool) -> Pages<'a> {
        Pages { ctx, filter, cursor: None, done: false, examined: 0, progress: Progress::new(show_progress) }
    }

    /// The next page, `None` once the scan is complete.
    pub async fn next(&mut self) -> Result<Option<ScanPage>, Failure> {
        if self.done {
            return Ok(None);
        }
        let page = self.ctx.idem.scan(&self.filter, self.cursor.as_deref(), PAGE).await?;
        self.examined += page.examined as u64;
        self.cursor.clone_from(&page.next);
        self.done = page.next.is_none();
        self.progress.update(self.examined);
        Ok(Some(page))
    }

    /// Ends the progress display (a terminal's line cleared; elsewhere a last line).
    pub fn finish(&mut self) {
        self.progress.finish(self.examined);
    }
}

/// A scan that ends early (an error, `--limit`) leaves no progress line behind on a terminal.
impl Drop for Progress {
    fn drop(&mut self) {
        if self.mode == Mode::Terminal {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}

/// Progress on stderr: rewritten in place on a terminal, a line at most every second elsewhere
/// (with `--progress`), nothing otherwise.
struct Progress {
    mode: Mode,
    last: Option<Instant>,
}

#[derive(PartialEq)]
enum Mode {
    Off,
    Terminal,
    Lines,
}

impl Progress {
    fn new(asked: bool) -> Progress {
        let mode = match (std::io::stderr().is_terminal(), asked) {
            (true, _) => Mode::Terminal,
            (false, true) => Mode::Lines,
            (false, false) => Mode::Off,
        };
        Progress { mode, last: None }
    }

    fn update(&mut self, examined: u64) {
        let due = self.last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
        let mut err = std::io::stderr().lock();
        // Progress is best effort: a stderr that cannot be written stops nothing.
        match self.mode {
            Mode::Off => {}
            Mode::Terminal => {
                let _ = write!(err, "\r\x1b[2Kscanning: {examined} keys examined");
                let _ = err.flush();
            }
            Mode::Lines if due => {
                let _ = writeln!(err, "scanning: {examined} keys examined");
                self.last = Some(Instant::now());
            }
            Mode::Lines => {}
        }
    }

    fn finish(&mut self, examined: u64) {
        let mut err = std::io::stderr().lock();
        match self.mode {
            Mode::Off => {}
            Mode::Terminal => {
                let _ = write!(err, "\r\x1b[2K");
                let _ = err.flush();
            }
            Mode::Lines => {
                let _ = writeln!(err, "scanned: {examined} keys examined");
            }
        }
        self.mode = Mode::Off;
    }
}
