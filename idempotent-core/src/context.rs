//! The current call's context, readable from inside the body: its key, its fencing token (read
//! from the store on first use where the acquisition left it unread), and whether its lease is
//! known lost.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use crate::error::Error;
use crate::ids::OwnerId;
use crate::store::Store;

tokio::task_local! {
    static CURRENT: CallContext;
}

/// What the body of a guarded call can know about the call it runs in.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use idempotent_core::{Call, CallContext, Error, Idempotency, MemoryStore};
///
/// let idem = Idempotency::new(MemoryStore::new());
/// let fence: Result<u64, Error> = idem
///     .run(Call::new("transfer:9"), || async {
///         let ctx = CallContext::current().expect("inside a guarded call");
///         // Pass the fence to the database; it rejects writes with a smaller one.
///         ctx.fence().await
///     })
///     .await;
/// assert!(fence.unwrap() > 0);
/// # }
/// ```
#[derive(Clone)]
pub struct CallContext {
    inner: Arc<Inner>,
}

struct Inner {
    key: String,
    /// The attempt holding the key.
    owner: OwnerId,
    /// The fencing token, once known: from the acquisition, or read on first use.
    fence: tokio::sync::OnceCell<u64>,
    /// Where an unread fence is read from.
    store: Arc<dyn Store>,
    /// How many acquires this call sent before it held the key.
    attempt: u32,
    /// What showed the lease lost, once it is.
    lost: OnceLock<&'static str>,
    /// Wakes the call when the lease is lost.
    on_lost: tokio::sync::Notify,
    /// How long a result committed by this call is kept (none for a lock guard's hold).
    kept: Option<Kept>,
}

/// How long a call's committed result is kept: for a while from its commit, or (token mode)
/// while any machine may still accept its token: until the token expires plus the clock skew
/// allowed between machines.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kept {
    For(Duration),
    Token { expires: SystemTime, skew: Duration },
}

impl Kept {
    /// How long a result committed at `now` (by the tokens' clock) is kept. The clock is read
    /// only in token mode: a call's `keep` needs no reading of it.
    pub(crate) fn left(self, now: impl FnOnce() -> SystemTime) -> Duration {
        match self {
            Kept::For(keep) => keep,
            Kept::Token { expires, skew } => {
                expires.duration_since(now()).unwrap_or_default().saturating_add(skew).min(crate::MAX_DURATION)
            }
        }
    }
}

impl CallContext {
    /// The context of `owner`'s hold on `key`; `fence` is `0` when the acquisition left it
    /// unread (it is read from `store` on first use).
    pub(crate) fn new(key: String, owner: OwnerId, fence: u64, attempt: u32, store: Arc<dyn Store>) -> Self {
        CallContext {
            inner: Arc::new(Inner {
                key,
                owner,
                fence: tokio::sync::OnceCell::new_with((fence != 0).then_some(fence)),
                store,
                attempt,
                lost: OnceLock::new(),
                on_lost: tokio::sync::Notify::new(),
                kept: None,
            }),
        }
    }

    /// This context, saying how long the call's result will be kept (before it is shared).
    pub(crate) fn keeping(mut self, kept: Kept) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.kept = Some(kept);
        }
        self
    }

    /// The context of the guarded call whose body is running on this task, if any. (A task the
    /// body spawns does not inherit it: pass it along.)
    pub fn current() -> Option<CallContext> {
        CURRENT.try_with(Clone::clone).ok()
    }

    /// The full key of the call.
    pub fn key(&self) -> &str {
        &self.inner.key
    }

    /// The owner id of the attempt holding the key (as [`inspect`](crate::Idempotency::inspect)
    /// shows it while the key is in progress).
    pub fn owner(&self) -> &str {
        self.inner.owner.as_str()
    }

    /// The fencing token of this acquisition: larger than that of every earlier holder of the
    /// key. A store downstream that remembers the largest token it has seen can refuse a stale
    /// holder's writes.
    ///
    /// A body that never asks for it pays nothing for it: on Redis the token is read on first
    /// use (one round trip, an owner-checked script reading the server's clock), and the same
    /// value is returned from then on. It is still larger than every earlier holder's: this
    /// owner reads it while it holds the key, so after every earlier holder's record was gone.
    /// The memory and PostgreSQL stores, and lock guards, have it from the acquisition.
    ///
    /// Fails with `LeaseLost` when the read finds the key no longer held by this call (the
    /// lease ran out: the context is then marked lost), and with `Store` when the store
    /// cannot be reached.
    pub async fn fence(&self) -> Result<u64, Error> {
        let inner = &*self.inner;
        let read = inner.fence.get_or_try_init(|| async {
            let lost = |reason: &str| Error::LeaseLost {
                key: inner.key.clone(),
                reason: format!("the fencing token was asked for after the lease was lost ({reason})"),
            };
            if let Some(reason) = inner.lost.get() {
                return Err(lost(reason));
            }
            match inner.store.fence(&inner.key, inner.owner.as_str()).await {
                Ok(Some(fence)) => Ok(fence),
                Ok(None) => {
                    let reason = "the store no longer held the key for this call when its fence was read";
                    self.mark_lost(reason);
                    Err(lost(reason))
                }
                Err(source) => Err(Error::Store { key: inner.key.clone(), source }),
            }
        });
        read.await.copied()
    }

    /// The fencing token if it is known (from the acquisition, or read by the body).
    pub(crate) fn fence_read(&self) -> Option<u64> {
        self.inner.fence.get().copied()
    }

    /// Which attempt of the key this is, counted across retries and processes: 1, or one more
    /// than the attempts that failed before it (a body's `Err` or panic, by any caller, while
    /// the record of it is kept: the call's `keep`), so the body of the third try after two
    /// failures sees 3. A dropped call is not counted, nor a first attempt whose process died
    /// (unless its call counts crashes: `on_crash = hold`, `give_up_after`; from the second
    /// attempt on a crash counts too). Counted by a store that keeps attempts (memory, Redis,
    /// PostgreSQL); 1 on another.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use idempotency::{Call, CallContext, Error, Idempotency, MemoryStore};
    ///
    /// let idem = Idempotency::new(MemoryStore::new());
    /// let attempt = idem
    ///     .run(Call::new("k"), || async { Ok::<_, Error>(CallContext::current().unwrap().attempt()) })
    ///     .await;
    /// assert_eq!(attempt.unwrap(), 1);
    /// # }
    /// ```
    pub fn attempt(&self) -> u32 {
        self.inner.attempt
    }

    /// Until when a result committed now would be replayed, by this machine's clock: now plus
    /// the call's `keep` (or the runtime's), or in token mode the token's expiry plus the clock
    /// skew allowed between machines. A duplicate sent before then gets the stored result
    /// (unless an operator forgets the key, or the store loses it: an evicting Redis, say).
    /// `None` for a lock guard's hold, which keeps nothing.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::{Duration, SystemTime};
    /// use idempotent_core::{Call, CallContext, Idempotency, MemoryStore};
    ///
    /// let idem = Idempotency::new(MemoryStore::new());
    /// let call = Call::new("invoice:4").keep(Duration::from_secs(3600));
    /// let until = idem
    ///     .run(call, || async { Ok::<_, idempotent_core::Error>(CallContext::current().unwrap().kept_until()) })
    ///     .await
    ///     .unwrap()
    ///     .unwrap();
    /// let left = until.duration_since(SystemTime::now()).unwrap();
    /// assert!(left <= Duration::from_secs(3600) && left > Duration::from_secs(3590));
    /// # }
    /// ```
    pub fn kept_until(&self) -> Option<SystemTime> {
        match self.inner.kept? {
            Kept::For(keep) => SystemTime::now().checked_add(keep),
            Kept::Token { expires, skew } => expires.checked_add(skew),
        }
    }

    /// Whether the lease is known lost: another caller may be running the same key.
    pub fn is_lease_lost(&self) -> bool {
        self.inner.lost.get().is_some()
    }

    pub(crate) fn mark_lost(&self, reason: &'static str) {
        let _ = self.inner.lost.set(reason);
        // Every waiter, not one: a body, the runtime aborting it and a lock's holders may all
        // wait on the same loss. Waiters that come later see the flag.
        self.inner.on_lost.notify_waiters();
    }

    /// Resolves once the lease is known lost, with what showed it: `select!` it against work
    /// that must stop when another caller may run the same key.
    pub async fn lost(&self) -> &'static str {
        loop {
            // Registered before the flag is read: a loss marked in between still wakes it.
            let notified = self.inner.on_lost.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if let Some(reason) = self.inner.lost.get() {
                return reason;
            }
            notified.await;
        }
    }

    /// Runs `fut` with this context as the current one.
    pub(crate) async fn scope<F: std::future::Future>(self, fut: F) -> F::Output {
        CURRENT.scope(self, fut).await
    }
}

impl std::fmt::Debug for CallContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = &*self.inner;
        f.debug_struct("CallContext")
            .field("key", &inner.key)
            .field("owner", &inner.owner)
            .field("fence", &inner.fence.get())
            .field("attempt", &inner.attempt)
            .field("lost", &inner.lost.get())
            .finish_non_exhaustive()
    }
}
