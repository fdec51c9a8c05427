//! The test kit (feature `testing`): the scenarios our own suites put a call through, pointed at
//! your function or route. Given something to call ([`function`], or an HTTP route with
//! `idempotency::testing::route`) and a way to count its effect, [`Kit::check`] runs the standard
//! scenarios on an in-memory [`TestStore`] that can go away and hold commits, and reports, for
//! each, the effects made and what every caller was answered:
//!
//! | scenario | expected |
//! |---|---|
//! | N identical calls at once | one effect; the others in flight or given the same answer |
//! | a duplicate after completion | the same answer, no new effect |
//! | the same key, another payload | refused as a reused key, no new effect |
//! | a body that fails, then a retry | the retry runs once and its answer is kept |
//! | a caller cancelled after the effect, before the commit | one effect in all, once a retry is answered |
//! | the store away after the effect, before the commit | a duplicate meanwhile is refused, nothing runs; once it is back, one effect in all |
//!
//! [`pass_through`] is the other tool: a runtime that runs every body, for unit tests of a body
//! that should not need a store.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
//! use std::sync::Arc;
//! use idempotency::testing::{function, Kit, Scenario};
//! use idempotency::{Call, Error};
//!
//! let kit = Kit::new();
//! let sent = Arc::new(AtomicUsize::new(0));
//! let (idem, counted) = (kit.idempotency(), sent.clone());
//! // Cancelled after its effect and before it returns, a body run with `run` is dropped with its
//! // caller, and the retry sends the e-mail again: the kit says so.
//! let send_receipt = move |order: u32| {
//!     let (idem, sent) = (idem.clone(), counted.clone());
//!     async move {
//!         idem.run(Call::new(format!("receipt:{order}")), || async move {
//!             sent.fetch_add(1, SeqCst);
//!             tokio::time::sleep(std::time::Duration::from_millis(20)).await; // the mail server's answer
//!             Ok::<_, Error>(String::from("sent"))
//!         })
//!         .await
//!     }
//! };
//! let report = kit.check(function(send_receipt, 7), move || sent.load(SeqCst)).await;
//! println!("{report}");
//! assert!(!report.passed());
//! assert_eq!(report.outcome(Scenario::CancelledCaller).unwrap().effects, 2);
//! # }
//! ```

mod function;
mod pass_through;
mod report;
mod scenarios;
mod store;

use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::runtime::{Idempotency, IdempotencyBuilder};

pub use function::{function, Function};
pub use pass_through::{pass_through, PassThroughStore};
pub use report::{Outcome, Report, Scenario, Verdict};
pub use scenarios::{Answer, Answering, Ask, Subject};
pub use store::TestStore;

/// How many identical calls the kit sends at once by default.
pub const DEFAULT_DUPLICATES: usize = 20;

/// How long the kit waits by default for a key in flight to settle or an effect to show.
pub const DEFAULT_PATIENCE: Duration = Duration::from_secs(10);

/// The commit deadline of the kit's runtime: a commit the store does not take within it is
/// retried in the background while its caller is answered (`IdempotencyBuilder::commit_deadline`).
pub const KIT_COMMIT_DEADLINE: Duration = Duration::from_millis(200);

/// A [`TestStore`], a runtime on it, and the scenarios; see the [module](self).
#[derive(Debug, Clone)]
pub struct Kit {
    store: Arc<TestStore>,
    idem: Idempotency,
    duplicates: usize,
    patience: Duration,
}

impl Default for Kit {
    fn default() -> Self {
        Kit::new()
    }
}

impl Kit {
    /// A kit whose runtime has the default settings, but for a short commit deadline
    /// ([`KIT_COMMIT_DEADLINE`]).
    pub fn new() -> Self {
        Kit::with_runtime(|builder| builder)
    }

    /// A kit whose runtime is built by `settings` from a builder on the kit's store (with the
    /// kit's commit deadline already set): the same settings as the service's, say.
    pub fn with_runtime(settings: impl FnOnce(IdempotencyBuilder) -> IdempotencyBuilder) -> Self {
        let store = Arc::new(TestStore::new());
        let builder = Idempotency::builder_shared(store.clone()).commit_deadline(KIT_COMMIT_DEADLINE);
        Kit { store, idem: settings(builder).build(), duplicates: DEFAULT_DUPLICATES, patience: DEFAULT_PATIENCE }
    }

    /// The runtime the subject must run on.
    pub fn idempotency(&self) -> Idempotency {
        self.idem.clone()
    }

    /// The store under it.
    pub fn store(&self) -> &Arc<TestStore> {
        &self.store
    }

    /// Makes the kit's runtime the global one (`idempotency::init`), for functions with the
    /// attribute and no `store = ...`. The global runtime is set once per process: an error when
    /// another one was set first (a test binary whose tests use the kit this way shares one kit).
    pub fn install_global(&self) -> Result<(), Error> {
        match crate::global::init(self.idem.clone()) {
            Ok(()) => Ok(()),
            Err(_) if crate::global::global().get().is_some_and(|set| set.same_runtime(&self.idem)) => Ok(()),
            Err(_) => Err(Error::InvalidCall {
                key: "testing".into(),
                reason: "the global runtime is already set, to a runtime not on this kit's store".into(),
            }),
        }
    }

    /// How many identical calls to send at once (default [`DEFAULT_DUPLICATES`]).
    pub fn duplicates(mut self, n: usize) -> Self {
        self.duplicates = n.max(2);
        self
    }

    /// How long to wait for a key in flight to settle or an effect to show (default
    /// [`DEFAULT_PATIENCE`]).
    pub fn patience(mut self, patience: Duration) -> Self {
        self.patience = patience;
        self
    }

    /// Runs every scenario against `subject`, counting its effects with `effects` (a counter the
    /// body bumps, rows in a table, messages sent: anything that grows by one per effect).
    /// Scenarios that need more (another payload) are reported skipped without it.
    pub async fn check(&self, subject: impl Subject, effects: impl Fn() -> usize) -> Report {
        self.check_failing(subject, effects, None::<fn()>).await
    }

    /// [`check`](Self::check), and the failure scenario: `fail_next` makes the subject's next
    /// body fail (a payment provider stub told to decline once, a handler's 503 switch).
    pub async fn check_failing(
        &self,
        subject: impl Subject,
        effects: impl Fn() -> usize,
        fail_next: Option<impl Fn()>,
    ) -> Report {
        let bench = scenarios::Bench {
            subject: &subject,
            store: &self.store,
            effects: &effects,
            fail_next: fail_next.as_ref().map(|f| f as &dyn Fn()),
            duplicates: self.duplicates,
            patience: self.patience,
        };
        let outcomes = scenarios::run_all(&bench).await;
        Report { subject: subject.describe(), outcomes }
    }
}
