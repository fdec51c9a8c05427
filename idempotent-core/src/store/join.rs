//! `join_all`: futures run concurrently, their outputs in order (a store's calls to several
//! nodes, a batch's retried commits), without a dependency for a dozen lines; and `one_by_one`,
//! its sequential sibling (a batch transition sent one item after the other).

use std::future::Future;
use std::task::Poll;

/// Runs `futs` concurrently; their outputs in order.
pub(crate) async fn join_all<F: Future>(futs: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut futs: Vec<_> = futs.into_iter().map(|f| (Box::pin(f), None)).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (fut, out) in futs.iter_mut().filter(|(_, out)| out.is_none()) {
            match fut.as_mut().poll(cx) {
                Poll::Ready(v) => *out = Some(v),
                Poll::Pending => pending = true,
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    futs.into_iter().filter_map(|(_, out)| out).collect()
}

/// Runs `f` on each item, one after the other; the outputs in order.
pub(crate) async fn one_by_one<T: Copy, F: Future>(items: &[T], mut f: impl FnMut(T) -> F) -> Vec<F::Output> {
    let mut out = Vec::with_capacity(items.len());
    for &item in items {
        out.push(f(item).await);
    }
    out
}
