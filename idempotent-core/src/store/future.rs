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
