//! A batch's transitions (`Store::acquire_many`, `commit_many`, `release_many`): the keys grouped
//! by hash slot and connection, one call of the batch script (`lua/many.lua` around the one-key
//! script) per group, every group sent at once. A standalone server with one connection takes a
//! whole batch in one command; each key gets exactly what its one-key transition would have done
//! (a batch's acquire is the plain `SET NX GET` per key where a single call's would be:
//! `claim.lua`).

use fred::types::scripts::Script;

use super::*;

/// A fresh copy of `e` for each item its command carried.
fn copied(e: &StoreError) -> StoreError {
    StoreError::new(e.kind(), e.message())
}

impl RedisStore {
    /// Which connection of the pool carries `key`'s commands (see `client_for`).
    fn client_index(&self, key: &str) -> usize {
        match self.inner.pool.clients().len() {
            1 => 0,
            n => crate::hash::fnv1a(key.as_bytes()) as usize % n,
        }
    }

    /// Runs the batch `script` over `keys`: one call per hash slot and connection, all at once;
    /// `args(i, out)` pushes the i-th key's `per_key` arguments. Per key, in order, its reply
    /// (read by `read`) or its call's error.
    async fn grouped<T>(
        &self,
        op: &'static str,
        script: &Script,
        keys: &[&str],
        per_key: usize,
        args: impl Fn(usize, &mut Vec<Value>),
        read: impl Fn(Value) -> Result<T, StoreError>,
    ) -> Vec<Result<T, StoreError>> {
        let record_keys: Vec<String> = keys.iter().map(|k| self.record_key(k)).collect();
        let mut groups: BTreeMap<(u16, usize), Vec<usize>> = BTreeMap::new();
        for (i, record_key) in record_keys.iter().enumerate() {
            let slot = if self.inner.clustered { fred::util::redis_keyslot(record_key.as_bytes()) } else { 0 };
            groups.entry((slot, self.client_index(keys[i]))).or_default().push(i);
        }
        let (record_keys, args) = (&record_keys, &args);
        let calls = groups.values().map(|members| async move {
            let call_args = || {
                let group_keys: Vec<Key> = members.iter().map(|&i| record_keys[i].as_str().into()).collect();
                let mut values: Vec<Value> = Vec::with_capacity(1 + members.len() * per_key);
                values.push((per_key as i64).into());
                for &i in members {
                    args(i, &mut values);
                }
                (group_keys, values)
            };
            let client = self.client_for(keys[members[0]]);
            let reply = self.bounded(op, scripts::run(client, script, call_args)).await;
            let replies: Result<Vec<Value>, StoreError> = reply.and_then(|reply| match reply {
                Value::Array(items) if items.len() == members.len() => Ok(items),
                other => Err(StoreError::reply(op, format_args!("expected {} replies, got {other:?}", members.len()))),
            });
            (members, replies)
        });
        let mut out: Vec<Option<Result<T, StoreError>>> = (0..keys.len()).map(|_| None).collect();
        for (members, replies) in join_all(calls).await {
            match replies {
                Ok(items) => {
                    for (&i, item) in members.iter().zip(items) {
                        out[i] = Some(read(item));
                    }
                }
                Err(e) => {
                    for &i in members {
                        out[i] = Some(Err(copied(&e)));
                    }
                }
            }
        }
        out.into_iter().map(|o| o.expect("every key is in one group")).collect()
    }

    pub(super) async fn acquire_many_inner(
        &self,
        requests: &[AcquireRequest<'_>],
    ) -> Vec<Result<AcquireOutcome, StoreError>> {
        let keys: Vec<&str> = requests.iter().map(|r| r.key).collect();
        // Nobody waits and no lifetime is asked for (no replay cache): the plain acquire per key
        // (`claim.lua`), as `acquire_plain` makes it for one call; otherwise acquire.lua per key.
        let plain = self.inner.plain_acquire && requests.iter().all(|r| !r.will_wait && !r.report_ttl);
        let mut found = if plain {
            self.claim_many(requests, &keys).await
        } else {
            self.acquire_scripts_many(requests, &keys).await
        };
        // With replica acknowledgement: a key not durable enough to act on goes back, and says why.
        if self.inner.acks.is_some() {
            for (i, outcome) in found.iter_mut().enumerate() {
                if matches!(outcome, Ok(AcquireOutcome::Acquired { .. })) {
                    if let Err(e) = self.replicated("acquire", keys[i]).await {
                        let _ = Box::pin(self.release_inner(keys[i], requests[i].owner)).await;
                        *outcome = Err(e);
                    }
                }
            }
        }
        found
    }

    /// `claim.lua` per key: one `SET NX GET` each, the reply read as the plain acquire's. A key
    /// holding something other than a string goes to acquire.lua, which names what it is.
    async fn claim_many(
        &self,
        requests: &[AcquireRequest<'_>],
        keys: &[&str],
    ) -> Vec<Result<AcquireOutcome, StoreError>> {
        let args = |i: usize, out: &mut Vec<Value>| {
            let r = &requests[i];
            out.extend([
                record::pending(r.owner, r.fingerprint).as_str().into(),
                millis(r.lease).into(),
                if r.fence_now { "1" } else { "0" }.into(),
            ]);
        };
        let read = |reply: Value| -> Result<Option<Value>, StoreError> {
            let bad = |reply: &Value| StoreError::reply("acquire", format_args!("unexpected reply {reply:?}"));
            match &reply {
                Value::Array(items) if items.first().and_then(Value::as_i64) == Some(2) => Ok(None),
                Value::Array(items) if items.len() == 2 => Ok(Some(reply)),
                _ => Err(bad(&reply)),
            }
        };
        let replies = self.grouped("acquire", &scripts::CLAIM_MANY, keys, 3, args, read).await;
        let mut out = Vec::with_capacity(replies.len());
        for (i, reply) in replies.into_iter().enumerate() {
            let owner = requests[i].owner;
            out.push(match reply {
                Err(e) => Err(e),
                Ok(None) => Box::pin(self.acquire_script(&requests[i])).await,
                Ok(Some(Value::Array(items))) => match (items[0].as_i64(), &items[1]) {
                    (Some(0), fence) => match fence.as_i64() {
                        Some(fence) if fence >= 0 => Ok(AcquireOutcome::Acquired { fence: fence as u64 }),
                        _ => Err(StoreError::reply("acquire", format_args!("unexpected fence {fence:?}"))),
                    },
                    (Some(1), Value::String(s)) => Ok(record::found(s.as_bytes(), owner, 0, None)),
                    (Some(1), Value::Bytes(b)) => Ok(record::found(b, owner, 0, None)),
                    (_, other) => Err(StoreError::reply("acquire", format_args!("unexpected reply {other:?}"))),
                },
                Ok(Some(other)) => Err(StoreError::reply("acquire", format_args!("unexpected reply {other:?}"))),
            });
        }
        out
    }

    /// acquire.lua per key.
    async fn acquire_scripts_many(
        &self,
        requests: &[AcquireRequest<'_>],
        keys: &[&str],
    ) -> Vec<Result<AcquireOutcome, StoreError>> {
        let args = |i: usize, out: &mut Vec<Value>| out.extend(acquire_args(&requests[i]));
        self.grouped("acquire", &scripts::ACQUIRE_MANY, keys, 5, args, replies::acquire).await
    }

    pub(super) async fn commit_many_inner(
        &self,
        requests: &[CommitRequest<'_>],
    ) -> Vec<Result<Transition, StoreError>> {
        let keys: Vec<&str> = requests.iter().map(|r| r.key).collect();
        let now = unix_ms_now();
        let args = |i: usize, out: &mut Vec<Value>| {
            let r = &requests[i];
            out.extend([
                r.owner.into(),
                millis(r.keep).into(),
                itoa::Buffer::new().format(r.fence).into(),
                record::pending(r.owner, r.fingerprint).as_str().into(),
                Value::Bytes(record::completed(r.fence, r.owner, r.fingerprint, now, r.result).into()),
            ]);
        };
        let read = |reply| replies::transition("commit", reply);
        let mut done = self.grouped("commit", &scripts::COMMIT_MANY, &keys, 5, args, read).await;
        if self.inner.acks.is_some() {
            for (i, outcome) in done.iter_mut().enumerate() {
                if matches!(outcome, Ok(Transition::Done)) {
                    if let Err(e) = self.replicated("commit", keys[i]).await {
                        *outcome = Err(e);
                    }
                }
            }
        }
        done
    }

    pub(super) async fn release_many_inner(&self, releases: &[(&str, &str)]) -> Vec<Result<Transition, StoreError>> {
        let keys: Vec<&str> = releases.iter().map(|r| r.0).collect();
        let args = |i: usize, out: &mut Vec<Value>| out.push(releases[i].1.into());
        let read = |reply| replies::transition("release", reply);
        self.grouped("release", &scripts::RELEASE_MANY, &keys, 1, args, read).await
    }
}
