//! `Within`: a store call bounded by the client's timeout, its error read into a `StoreError`.
//!
//! A combinator rather than an `async fn`: each `async` layer keeps its argument beside the
//! future it awaits, so three layers of bounding and mapping made the future of every store
//! call three times the size of what it waits for (1.4 KB for a script call, boxed once per
//! call: past the allocator's small-size cache, and copied at each move). This keeps one copy.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::error::StoreError;

pin_project_lite::pin_project! {
    /// `fut`, failing with a store error of kind `Timeout` after `bound`, its own error read by
    /// `read` (see [`within`] and [`Within::reading`]). The clock starts at the first poll, as
    /// an `async fn`'s would, so a call may be built outside a runtime and awaited in one.
    #[must_use = "a bounded store call does nothing unless awaited"]
    pub(crate) struct Within<'a, F, E> {
        #[pin]
        fut: F,
        #[pin]
        deadline: Option<tokio::time::Sleep>,
        op: &'a str,
        bound: Duration,
        read: fn(&str, E) -> StoreError,
    }
}

/// `fut`, failing with a store error of kind `Timeout` after `bound`: a store call's client-side
/// bound.
pub(crate) fn within<'a, T, F>(op: &'a str, bound: Duration, fut: F) -> Within<'a, F, StoreError>
where
    F: Future<Output = Result<T, StoreError>>,
{
    Within::reading(op, bound, fut, |_, e| e)
}

impl<'a, T, E, F> Within<'a, F, E>
where
    F: Future<Output = Result<T, E>>,
{
    /// `fut` (a client's call, failing with the client's error `E`, read into a store error by
    /// `read`), failing with a store error of kind `Timeout` after `bound`.
    pub(crate) fn reading(op: &'a str, bound: Duration, fut: F, read: fn(&str, E) -> StoreError) -> Self {
        Within { fut, deadline: None, op, bound, read }
    }
}

impl<T, E, F> Future for Within<'_, F, E>
where
    F: Future<Output = Result<T, E>>,
{
    type Output = Result<T, StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if this.deadline.is_none() {
            this.deadline.set(Some(tokio::time::sleep(*this.bound)));
        }
        // As `tokio::time::timeout` does: the call first (an answer that is there wins), then
        // the deadline, outside the task's budget when the call spent the last of it (else a
        // call that keeps spending it would keep the deadline from ever being seen).
        let had_budget = tokio::task::coop::has_budget_remaining();
        if let Poll::Ready(done) = this.fut.poll(cx) {
            return Poll::Ready(done.map_err(|e| (this.read)(this.op, e)));
        }
        let deadline = this.deadline.as_pin_mut().expect("the deadline is set at the first poll");
        let passed = if had_budget && !tokio::task::coop::has_budget_remaining() {
            Pin::new(&mut tokio::task::unconstrained(deadline)).poll(cx)
        } else {
            deadline.poll(cx)
        };
        match passed {
            Poll::Ready(()) => Poll::Ready(Err(StoreError::timeout(this.op, *this.bound))),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::StoreErrorKind;

    #[tokio::test(flavor = "current_thread")]
    async fn answers_errors_and_timeouts_come_through() {
        let bound = Duration::from_millis(20);
        assert_eq!(within("acquire", bound, async { Ok::<_, StoreError>(7) }).await.unwrap(), 7);
        let read = |op: &str, e: &str| StoreError::new(StoreErrorKind::Backend, format!("{op}: {e}"));
        let failed = Within::reading("commit", bound, async { Err::<u8, _>("refused") }, read).await.unwrap_err();
        assert_eq!((failed.kind(), failed.to_string().contains("commit: refused")), (StoreErrorKind::Backend, true));
        let slow = within("release", bound, std::future::pending::<Result<u8, StoreError>>()).await.unwrap_err();
        assert_eq!(slow.kind(), StoreErrorKind::Timeout);
        assert!(slow.to_string().contains("release"), "{slow}");
    }

    /// A call that spends the task's whole budget at every poll (here: reading a channel that
    /// always has more) still sees its deadline, as under `tokio::time::timeout`.
    #[tokio::test(flavor = "current_thread")]
    async fn a_call_that_spends_the_budget_still_times_out() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<u8>();
        let greedy = std::future::poll_fn(move |cx| {
            loop {
                for _ in 0..16 {
                    let _ = tx.send(0);
                }
                match rx.poll_recv(cx) {
                    Poll::Ready(_) => continue,
                    // Out of budget: tokio has the task polled again.
                    Poll::Pending => return Poll::<Result<u8, StoreError>>::Pending,
                }
            }
        });
        let bounded = within("acquire", Duration::from_millis(20), greedy);
        let outcome = tokio::time::timeout(Duration::from_secs(5), bounded).await;
        let e = outcome.expect("the deadline was never seen").unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Timeout);
    }

    #[test]
    fn is_built_outside_a_runtime_and_keeps_one_copy_of_what_it_waits_for() {
        let waited = std::future::ready(Ok::<_, StoreError>([0u8; 1024]));
        let inner = std::mem::size_of_val(&waited);
        let whole = std::mem::size_of_val(&within("x", Duration::ZERO, waited));
        assert!(whole < inner + 256, "a bounded future of {inner} bytes takes {whole}");
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let built = within("x", Duration::from_secs(1), std::future::ready(Ok::<_, StoreError>(3)));
        assert_eq!(rt.block_on(built).unwrap(), 3);
    }
}
