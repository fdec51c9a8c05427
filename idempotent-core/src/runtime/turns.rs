//! Turns: the callers of one runtime that wait for one lock take it one at a time, in the order
//! they came. The caller whose turn it is waits on the store as any waiter does; the others wait
//! here, without a store command, until it has let the lock go. So a lock handed over inside the
//! process costs one acquire, not one per waiter (the herd every release woke before).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedMutexGuard;
use tokio::time::Instant;

/// The turns of every lock key some caller of this runtime holds or waits for.
#[derive(Default)]
pub(crate) struct Turns {
    queues: Mutex<HashMap<String, Queue>>,
}

/// One key's turn, and how many callers hold or wait for it (the entry goes with the last).
struct Queue {
    users: usize,
    /// `tokio`'s mutex is fair: its waiters get it in the order they asked.
    turn: Arc<tokio::sync::Mutex<()>>,
}

/// A caller's place in a key's queue: counted while it lives.
struct Ticket {
    turns: Arc<Turns>,
    key: String,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut queues = self.turns.queues.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(queue) = queues.get_mut(&self.key) {
            queue.users -= 1;
            if queue.users == 0 {
                queues.remove(&self.key);
            }
        }
    }
}

/// A key's turn, held: by the caller taking the lock, then by its guard until the lock is let go.
/// Dropping it hands the turn to the next caller in the queue.
pub(crate) struct Turn {
    // Dropped in this order: the turn handed on, then the place given back.
    _held: OwnedMutexGuard<()>,
    _ticket: Ticket,
    /// The turn was not free when asked for: the caller waited behind another of this runtime.
    pub(crate) queued: bool,
}

/// Why a caller got no turn.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum NoTurn {
    /// The key's turn is held and `max` callers wait for it already.
    Full,
    /// The deadline came first.
    Late,
}

impl Turns {
    /// `key`'s turn, as soon as the callers before it are done and at the latest by `deadline`,
    /// unless it is held and `max` callers wait for it already.
    pub(crate) async fn wait(self: &Arc<Self>, key: &str, deadline: Instant, max: usize) -> Result<Turn, NoTurn> {
        let (ticket, turn) = {
            let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
            let queue = queues
                .entry(key.to_owned())
                .or_insert_with(|| Queue { users: 0, turn: Arc::new(tokio::sync::Mutex::new(())) });
            // The holder and `max` waiters.
            if queue.users > max {
                return Err(NoTurn::Full);
            }
            queue.users += 1;
            (Ticket { turns: self.clone(), key: key.to_owned() }, queue.turn.clone())
        };
        if let Ok(held) = turn.clone().try_lock_owned() {
            return Ok(Turn { _held: held, _ticket: ticket, queued: false });
        }
        let held = tokio::time::timeout_at(deadline, turn.lock_owned()).await.map_err(|_| NoTurn::Late)?;
        Ok(Turn { _held: held, _ticket: ticket, queued: true })
    }

    /// How many keys have a queue: for tests.
    #[cfg(test)]
    fn keys(&self) -> usize {
        self.queues.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn turns_come_in_order_and_the_queue_goes_with_its_last_user() {
        let turns = Arc::new(Turns::default());
        let far = Instant::now() + Duration::from_secs(60);
        let first = turns.wait("k", far, 5).await.unwrap();
        assert!(!first.queued);
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiting = Vec::new();
        for i in 0..3 {
            let (turns, order) = (turns.clone(), order.clone());
            waiting.push(tokio::spawn(async move {
                let turn = turns.wait("k", far, 5).await.unwrap();
                assert!(turn.queued);
                order.lock().unwrap().push(i);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }));
            // Each asks after the one before it.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Another key is not in this queue.
        assert!(!turns.wait("other", far, 5).await.unwrap().queued);
        // A caller whose deadline passes first leaves the queue without its turn.
        assert_eq!(turns.wait("k", Instant::now() + Duration::from_millis(5), 5).await.err(), Some(NoTurn::Late));
        // One past the bound gets none at once.
        assert_eq!(turns.wait("k", far, 3).await.err(), Some(NoTurn::Full));
        drop(first);
        for w in waiting {
            w.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
        assert_eq!(turns.keys(), 0);
    }
}
