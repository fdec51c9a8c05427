//! Taking a key: the acquire, and, for a call that waits, watching the key and acquiring again
//! (within a bound on how many calls of this process wait on one key); a release armed before
//! each acquire for the call that gives up.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::call::{Call, OnConflict};
use crate::error::Error;
use crate::ids;
use crate::store::{AcquireOutcome, AcquireRequest, Lapse, Store, Watcher};
use crate::telemetry::{self};

use super::resolving::{moment, Unresolved};
use super::state::{check_fingerprint, Track};
use super::{Idempotency, Inner};

impl Idempotency {
    /// Takes `key` for `owner`: acquires it, or finds it completed, or, held by another owner,
    /// fails with `Conflict` or waits for it (`how.on_conflict`). A different fingerprint than
    /// the one stored is `KeyReused`.
    pub(crate) async fn take(
        &self,
        key: &str,
        owner: ids::OwnerId,
        lease: Duration,
        fingerprint: Option<&str>,
        how: Taking,
        track: &mut Track,
    ) -> Result<Taken, Error> {
        let store = &*self.inner.store;
        // When the first acquire was sent: the wait's patience counts from there.
        let mut started: Option<Instant> = None;
        let mut watcher: Option<Watcher> = None;
        let mut _waiting: Option<WaitSlot<'_>> = None;
        // The resolver is asked once per call.
        let mut resolver_asked = false;
        loop {
            let generation = self.inner.cache_generation();
            let sent = Instant::now();
            let started = *started.get_or_insert(sent);
            let request = AcquireRequest {
                key,
                owner: owner.as_str(),
                lease,
                fingerprint,
                will_wait: watcher.is_some(),
                // The wait needs the holder's lease; the cache, how long a result is kept.
                report_ttl: watcher.is_some() || self.inner.cache.is_some(),
                fence_now: how.fence_now,
                lapse: how.lapse,
                keep: how.keep,
            };
            // Armed before the acquire is sent: if this call is dropped while the acquire is in
            // flight, or the acquire fails (it may still land later), the store releases the key
            // for this owner in the background.
            let abandon = Abandon { store: Some(&self.inner.store), key, owner: owner.as_str(), lease };
            track.attempts += 1;
            if track.attempts > 1 {
                track.waited = sent - started;
            }
            tracing::debug!(attempt = track.attempts, wait = request.will_wait, "idempotency acquire sent");
            let found = match store.acquire(request).await {
                Ok(found) => {
                    abandon.disarm();
                    found
                }
                Err(source) => {
                    drop(abandon);
                    tracing::debug!(error = %source, "idempotency acquire failed");
                    return Err(Error::Store { key: key.to_owned(), source });
                }
            };
            // One clock read serves the histogram, the wait and the lease's check below.
            let answered_at = Instant::now();
            let answered = answered_at - sent;
            telemetry::record::acquire(answered);
            tracing::debug!(
                found = found.name(),
                took_us = answered.as_micros() as u64,
                "idempotency acquire answered"
            );
            if track.attempts > 1 {
                track.waited = answered_at - started;
            }
            match found {
                AcquireOutcome::Acquired { fence, attempt } => {
                    // A reply that came after the lease may have run out (a slow link, a stalled
                    // process): another caller may hold the key by now. The body must not start;
                    // the key goes back, owner-checked, in case it is still this owner's.
                    let margin = crate::watchdog::safety_margin(lease);
                    if answered_at + margin >= sent + lease {
                        tracing::warn!(
                            key = %telemetry::logged_key(key),
                            took_ms = answered.as_millis() as u64,
                            lease_ms = lease.as_millis() as u64,
                            "idempotency acquire answered after its lease could have run out; not running the body"
                        );
                        self.release_in_background(key, owner.as_str(), lease);
                        return Err(Error::LeaseLost {
                            key: key.to_owned(),
                            reason: format!(
                                "the store answered the acquire after {answered:?}, with the lease of {lease:?} \
                                 (less its safety margin) run out: another caller may hold the key"
                            ),
                        });
                    }
                    return Ok(Taken::Held { fence, sent, attempt });
                }
                AcquireOutcome::Completed { fingerprint: theirs, result, kept_for } => {
                    check_fingerprint(key, theirs.as_deref(), fingerprint)?;
                    // Counted from before the read was sent: never past the record's end.
                    return Ok(Taken::Completed {
                        fingerprint: theirs,
                        result,
                        kept_until: sent + kept_for,
                        generation,
                    });
                }
                AcquireOutcome::GaveUp { fingerprint: theirs, attempts, last_error } => {
                    check_fingerprint(key, theirs.as_deref(), fingerprint)?;
                    return Err(Error::GaveUp { key: key.to_owned(), attempts, last_error });
                }
                AcquireOutcome::Unknown { fingerprint: theirs, owner: holder, lease_ended_ms, attempt } => {
                    check_fingerprint(key, theirs.as_deref(), fingerprint)?;
                    let lease_ended = moment(lease_ended_ms);
                    if !resolver_asked && self.inner.resolver.is_some() {
                        resolver_asked = true;
                        let unresolved = Unresolved {
                            key: key.to_owned(),
                            owner: holder.clone(),
                            lease_ended,
                            attempt,
                            fingerprint: theirs,
                        };
                        if self.ask_resolver(unresolved).await {
                            continue;
                        }
                    }
                    return Err(Error::OutcomeUnknown { key: key.to_owned(), owner: holder, lease_ended, attempt });
                }
                AcquireOutcome::Corrupt { reason } => {
                    tracing::warn!(key = %telemetry::logged_key(key), reason = %reason, "idempotency key holds something that is not a record");
                    return Err(Error::Corrupt { key: key.to_owned(), reason });
                }
                AcquireOutcome::InProgress { fingerprint: theirs, lease_left } => {
                    check_fingerprint(key, theirs.as_deref(), fingerprint)?;
                    let conflict = || Error::Conflict {
                        key: key.to_owned(),
                        retry_after: (!lease_left.is_zero()).then_some(lease_left),
                    };
                    let OnConflict::Wait(patience) = how.on_conflict else { return Err(conflict()) };
                    let now = Instant::now();
                    if now >= started + patience {
                        track.waited = now - started;
                        return Err(Error::Timeout { key: key.to_owned(), waited: now - started });
                    }
                    match &mut watcher {
                        // Watch first, then look again: a change after this look wakes us.
                        None => {
                            let Some(slot) = WaitSlot::take(&self.inner, key) else {
                                tracing::warn!(
                                    key = %telemetry::logged_key(key),
                                    max = self.inner.max_waiters_per_key,
                                    "idempotency call not waiting: too many calls already wait on this key"
                                );
                                return Err(conflict());
                            };
                            _waiting = Some(slot);
                            let w = store
                                .watch(key)
                                .await
                                .map_err(|source| Error::Store { key: key.to_owned(), source })?;
                            watcher = Some(w);
                        }
                        Some(w) => {
                            // Until a notification, the holder's lease running out, the recheck
                            // interval, or the end of patience, whichever comes first.
                            let until = (started + patience)
                                .min(now + lease_left + Duration::from_millis(2))
                                .min(now + self.inner.wait_recheck);
                            tokio::select! {
                                () = w.changed() => {}
                                () = tokio::time::sleep_until(until) => {}
                            }
                        }
                    }
                }
            }
        }
    }
}

/// One of the places to wait on a key ([`IdempotencyBuilder::max_waiters_per_key`]), given
/// back when dropped.
pub(super) struct WaitSlot<'a> {
    pub(super) inner: &'a Inner,
    pub(super) key: String,
}

impl<'a> WaitSlot<'a> {
    pub(super) fn take(inner: &'a Inner, key: &str) -> Option<WaitSlot<'a>> {
        let mut waiting = inner.waiting.lock().unwrap_or_else(|p| p.into_inner());
        let count = waiting.entry(key.to_owned()).or_default();
        if *count >= inner.max_waiters_per_key {
            return None;
        }
        *count += 1;
        Some(WaitSlot { inner, key: key.to_owned() })
    }
}

impl Drop for WaitSlot<'_> {
    fn drop(&mut self) {
        let mut waiting = self.inner.waiting.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = waiting.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                waiting.remove(&self.key);
            }
        }
    }
}

/// What [`Idempotency::take`] found.
pub(crate) enum Taken {
    /// The key is held: the acquisition's fence (`0`: left unread, see `Store::fence`), when
    /// its acquire was sent, and which attempt of the key it is.
    Held { fence: u64, sent: Instant, attempt: u32 },
    /// The key completed: what it keeps, until when it may be cached, and the replay cache's
    /// purge generation when the read was sent.
    Completed { fingerprint: Option<String>, result: Option<Vec<u8>>, kept_until: Instant, generation: u64 },
}

/// Armed around an acquire: dropped armed (the call was dropped mid-acquire, or the acquire
/// failed and may still land), it has the store release the key for this owner
/// ([`Store::abandon`]).
pub(super) struct Abandon<'a> {
    pub(super) store: Option<&'a Arc<dyn Store>>,
    pub(super) key: &'a str,
    pub(super) owner: &'a str,
    pub(super) lease: Duration,
}

impl Abandon<'_> {
    pub(super) fn disarm(mut self) {
        self.store = None;
    }
}

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if let Some(store) = self.store.take() {
            tracing::warn!(
                key = %telemetry::logged_key(self.key),
                "idempotency acquire failed or dropped in flight; releasing the key in the background"
            );
            store.clone().abandon(self.key, self.owner, self.lease);
        }
    }
}

/// How a key is taken: what to do while another caller holds it, and whether the fencing token
/// is needed with the acquisition (a lock guard hands it out at once) or may be left for the
/// body to read on first use (`CallContext::fence`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Taking {
    pub on_conflict: OnConflict,
    pub fence_now: bool,
    /// What the key becomes if the lease runs out.
    pub lapse: Lapse,
    /// How long a record that keeps its lease's end outlives it.
    pub keep: Duration,
}

impl Idempotency {
    /// How `call` takes `key`: its conflict policy, and what its lease's end means, refused
    /// where the store cannot keep it or `keep` (how long its record is kept) leaves nothing
    /// to hold.
    pub(super) fn taking(&self, call: &Call, key: &str, keep: Duration) -> Result<Taking, Error> {
        let lapse = call.lapse();
        if lapse != Lapse::Free {
            let what = if lapse == Lapse::Hold { "on_crash = hold" } else { "give_up_after" };
            let invalid = |reason: String| Error::InvalidCall { key: key.to_owned(), reason };
            if !self.inner.store.keeps_attempts() {
                return Err(invalid(format!(
                    "{what} needs a store that keeps attempts (MemoryStore, RedisStore, PgStore): this one does not"
                )));
            }
            if keep.is_zero() {
                return Err(invalid(format!(
                    "{what} keeps the key's record for `keep` after its lease: a keep of zero keeps nothing"
                )));
            }
        }
        Ok(Taking { on_conflict: call.on_conflict, fence_now: false, lapse, keep })
    }
}
