//! `StoreFuture`: what a store method returns, a value already at hand or a boxed future.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A boxed future, so that [`Store`](super::Store) stays object-safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a [`Store`](super::Store) method returns: the answer itself, when the store has it at
/// once (an in-process store: no allocation per call), or a boxed future (a store behind a
/// network).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use idempotent_core::store::StoreFuture;
///
/// let at_hand: StoreFuture<'_, u32> = StoreFuture::ready(7);
/// let later: StoreFuture<'_, u32> = StoreFuture::new(async { 8 });
/// assert_eq!((at_hand.await, later.await), (7, 8));
/// # }
/// ```
#[must_use = "a store future does nothing unless awaited"]
pub struct StoreFuture<'a, T>(Inner<'a, T>);

enum Inner<'a, T> {
    /// Taken when polled.
    Ready(Option<T>),
    Boxed(BoxFuture<'a, T>),
}

impl<'a, T> StoreFuture<'a, T> {
    /// An answer already at hand.
    pub fn ready(value: T) -> Self {
        StoreFuture(Inner::Ready(Some(value)))
    }

    /// A future, boxed.
    pub fn new(fut: impl Future<Output = T> + Send + 'a) -> Self {
        StoreFuture(Inner::Boxed(Box::pin(fut)))
    }

    /// The future `make` returns, built in its box ([`boxed_in_place`]) rather than built and
    /// moved there (a copy of the whole future on every call).
    #[cfg(feature = "redis")]
    pub(crate) fn built<F: Future<Output = T> + Send + 'a>(make: impl FnOnce() -> F) -> Self {
        StoreFuture(Inner::Boxed(boxed_in_place(make)))
    }
}

impl<'a, T> From<BoxFuture<'a, T>> for StoreFuture<'a, T> {
    fn from(fut: BoxFuture<'a, T>) -> Self {
        StoreFuture(Inner::Boxed(fut))
    }
}

// The value is moved out, never pinned in place, so the future may move between polls whatever
// `T` is.
impl<T> Unpin for StoreFuture<'_, T> {}

impl<T> Future for StoreFuture<'_, T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        match &mut self.get_mut().0 {
            Inner::Ready(value) => Poll::Ready(value.take().expect("a store future polled after it completed")),
            Inner::Boxed(fut) => fut.as_mut().poll(cx),
        }
    }
}

impl<T> std::fmt::Debug for StoreFuture<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.0 {
            Inner::Ready(Some(_)) => "ready",
            Inner::Ready(None) => "done",
            Inner::Boxed(_) => "boxed",
        };
        f.debug_tuple("StoreFuture").field(&state).finish()
    }
}

/// The future `make` returns, built in the box that holds it rather than built and then moved
/// there: a client's command future can be several kilobytes (fred's `SET` is 6.8 KB), and the
/// move is a copy of all of it on every call.
#[cfg(feature = "redis")]
pub(crate) fn boxed_in_place<F: Future>(make: impl FnOnce() -> F) -> Pin<Box<F>> {
    let mut slot = Box::<F>::new_uninit();
    slot.write(make());
    // SAFETY: `write` initialized the whole value just above.
    Box::into_pin(unsafe { slot.assume_init() })
}

#[cfg(all(test, feature = "redis"))]
mod tests {
    use super::*;

    /// A future built in its box runs as the same future moved there would: its state (here
    /// 8 KB, the size of a client's command future) arrives whole, and it can be awaited.
    #[tokio::test(flavor = "current_thread")]
    async fn a_future_built_in_its_box_runs() {
        let big = [7u8; 8192];
        let fut = boxed_in_place(|| async move {
            tokio::task::yield_now().await;
            big.iter().map(|&b| u64::from(b)).sum::<u64>()
        });
        assert!(std::mem::size_of_val(&*fut) >= 8192);
        assert_eq!(fut.await, 7 * 8192);
    }
}
