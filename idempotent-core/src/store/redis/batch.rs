//! A batch's transitions (`Store::acquire_many`, `commit_many`, `release_many`), each key getting
//! exactly what its one-key transition would have done.
//!
//! Where a single call's transition is one plain command (the acquire's `SET NX GET`, on servers
//! with it; the commit's `SET IFEQ`, on servers with it), a batch's is that command per key,
//! pipelined: one pipeline per connection, all sent at once, no script. Otherwise, and on a
//! cluster, one call of the batch script (`lua/many.lua` around the one-key script) per hash slot
//! and connection, every group sent at once (`claim.lua` is the plain acquire as a script).

use fred::types::scripts::Script;
use fred::types::ClusterHash;

use super::*;

/// One group's keys (their indices) and its replies, one per key, or the group's error.
type GroupReplies<'a, R> = (&'a Vec<usize>, Result<Vec<R>, StoreError>);

/// The groups' replies put back in the keys' order (`n` keys, each in one group): each reply read
/// by `read`, a group's error copied to each of its keys.
fn scattered<R, T>(
    n: usize,
    groups: Vec<GroupReplies<'_, R>>,
    read: impl Fn(R) -> Result<T, StoreError>,
) -> Vec<Result<T, StoreError>> {
    let mut out: Vec<Option<Result<T, StoreError>>> = (0..n).map(|_| None).collect();
    for (members, replies) in groups {
        match replies {
            Ok(replies) => {
                for (&i, reply) in members.iter().zip(replies) {
                    out[i] = Some(read(reply));
                }
            }
            Err(e) => {
                for &i in members {
                    out[i] = Some(Err(e.copied()));
                }
            }
        }
    }
    out.into_iter().map(|o| o.expect("every key is in one group")).collect()
}

impl RedisStore {
    /// Which connection of the pool carries `key`'s commands (see `client_for`).
    fn client_index(&self, key: &str) -> usize {
        match self.inner.pool.clients().len() {
            1 => 0,
            n => crate::hash::fnv1a(key.as_bytes()) as usize % n,
        }
    }

    /// The keys' indices by hash slot (0 on a standalone server) and connection.
    fn groups(&self, keys: &[&str], record_keys: &[String]) -> BTreeMap<(u16, usize), Vec<usize>> {
        let mut groups: BTreeMap<(u16, usize), Vec<usize>> = BTreeMap::new();
        for (i, record_key) in record_keys.iter().enumerate() {
            let slot = if self.inner.clustered { fred::util::redis_keyslot(record_key.as_bytes()) } else { 0 };
            groups.entry((slot, self.client_index(keys[i]))).or_default().push(i);
        }
        groups
    }

    /// Sends `SET <record> <args(i)...>` for each key, pipelined: one pipeline per connection,
    /// all at once (a standalone server: the callers keep clusters on the scripts). Per key, in
    /// order, its reply or its command's error; a pipeline that fails or times out as a whole
    /// fails each of its keys.
    async fn set_pipelined(
        &self,
        op: &'static str,
        keys: &[&str],
        args: impl Fn(usize) -> [Value; 5],
    ) -> Vec<Result<Result<Value, Error>, StoreError>> {
        // A standalone server: one group per connection. Each value is moved into its command,
        // not copied (a command per key is where a pipelined batch spends the client's CPU).
        let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (i, key) in keys.iter().enumerate() {
            groups.entry(self.client_index(key)).or_default().push(i);
        }
        let args = &args;
        let sends = groups.values().map(|members| async move {
            let pipeline = self.client_for(keys[members[0]]).pipeline();
            for &i in members {
                let set = CustomCommand::new_static("SET", ClusterHash::FirstKey, false);
                let mut values: Vec<Value> = Vec::with_capacity(6);
                values.push(self.record_key(keys[i]).into());
                values.extend(args(i));
                // Queued in memory: nothing is sent before `try_all`.
                let _: Result<(), Error> = pipeline.custom(set, values).await;
            }
            let replies = self.bounded(op, async { Ok(pipeline.try_all::<Value>().await) }).await;
            let replies = replies.and_then(|replies| match replies.len() == members.len() {
                true => Ok(replies),
                false => {
                    Err(StoreError::reply(op, format_args!("{} replies to {} commands", replies.len(), members.len())))
                }
            });
            (members, replies)
        });
        scattered(keys.len(), join_all(sends).await, Ok)
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
        let groups = self.groups(keys, &record_keys);
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
        scattered(keys.len(), join_all(calls).await, read)
    }

    pub(super) async fn acquire_many_inner(
        &self,
        requests: &[AcquireRequest<'_>],
    ) -> Vec<Result<AcquireOutcome, StoreError>> {
        let keys: Vec<&str> = requests.iter().map(|r| r.key).collect();
        // Nobody waits and no lifetime is asked for (no replay cache): the plain acquire per key
        // (`claim.lua`), as `acquire_plain` makes it for one call; otherwise acquire.lua per key.
        let plain = self.inner.plain_acquire
            && requests.iter().all(|r| !r.will_wait && !r.report_ttl && r.lapse == Lapse::Free);
        let pipelined = plain && !self.inner.clustered && requests.iter().all(|r| !r.fence_now);
        let mut found = if pipelined {
            self.claim_pipelined(requests, &keys).await
        } else if plain {
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

    /// `SET <pending> NX PX lease GET` per key, pipelined, each reply read as a single call's
    /// plain acquire reads it (its fence left unread). A key holding something other than a
    /// string goes to acquire.lua, which names what it is.
    async fn claim_pipelined(
        &self,
        requests: &[AcquireRequest<'_>],
        keys: &[&str],
    ) -> Vec<Result<AcquireOutcome, StoreError>> {
        let args = |i: usize| {
            let r = &requests[i];
            let pending = record::pending(r.owner, r.fingerprint);
            let word = Value::from_static_str;
            [pending.into(), word("NX"), word("PX"), millis(r.lease).into(), word("GET")]
        };
        let replies = self.set_pipelined("acquire", keys, args).await;
        let found = replies.into_iter().enumerate().map(|(i, reply)| match reply {
            Err(e) => Err(e),
            Ok(Err(e)) if e.details().starts_with("WRONGTYPE") => Ok(None),
            Ok(Err(e)) => Err(store_error("acquire", e)),
            Ok(Ok(set)) => plain_acquire_reply(set, requests[i].owner, 0),
        });
        self.scripted_where_undecided(requests, keys, found.collect()).await
    }

    /// The plain acquires' outcomes, with each key they could not decide (`Ok(None)`: something
    /// other than a string there, or a record only the script can read) sent to acquire.lua,
    /// all of them together: one more round trip per connection, however many there are.
    async fn scripted_where_undecided(
        &self,
        requests: &[AcquireRequest<'_>],
        keys: &[&str],
        found: Vec<Result<Option<AcquireOutcome>, StoreError>>,
    ) -> Vec<Result<AcquireOutcome, StoreError>> {
        let undecided: Vec<usize> = (0..found.len()).filter(|&i| matches!(found[i], Ok(None))).collect();
        let mut scripted = if undecided.is_empty() {
            Vec::new()
        } else {
            let their_requests: Vec<AcquireRequest<'_>> = undecided.iter().map(|&i| requests[i]).collect();
            let their_keys: Vec<&str> = undecided.iter().map(|&i| keys[i]).collect();
            Box::pin(self.acquire_scripts_many(&their_requests, &their_keys)).await
        }
        .into_iter();
        found
            .into_iter()
            .map(|outcome| match outcome {
                Ok(Some(found)) => Ok(found),
                Ok(None) => scripted.next().expect("one script reply per undecided key"),
                Err(e) => Err(e),
            })
            .collect()
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
                flag(r.fence_now),
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
        let found = replies.into_iter().enumerate().map(|(i, reply)| match reply {
            Err(e) => Err(e),
            Ok(None) => Ok(None),
            Ok(Some(Value::Array(items))) => match (items[0].as_i64(), &items[1]) {
                (Some(0), fence) => match fence.as_i64() {
                    Some(fence) if fence >= 0 => Ok(Some(AcquireOutcome::Acquired { fence: fence as u64, attempt: 1 })),
                    _ => Err(StoreError::reply("acquire", format_args!("unexpected fence {fence:?}"))),
                },
                // The record the key holds (never nil: claim.lua returns it only when set).
                (Some(1), held @ (Value::String(_) | Value::Bytes(_))) => {
                    plain_acquire_reply(held.clone(), requests[i].owner, 0)
                }
                (_, other) => Err(StoreError::reply("acquire", format_args!("unexpected reply {other:?}"))),
            },
            Ok(Some(other)) => Err(StoreError::reply("acquire", format_args!("unexpected reply {other:?}"))),
        });
        self.scripted_where_undecided(requests, keys, found.collect()).await
    }

    /// acquire.lua per key.
    async fn acquire_scripts_many(
        &self,
        requests: &[AcquireRequest<'_>],
        keys: &[&str],
    ) -> Vec<Result<AcquireOutcome, StoreError>> {
        let args = |i: usize, out: &mut Vec<Value>| out.extend(acquire_args(&requests[i]));
        self.grouped("acquire", &scripts::ACQUIRE_MANY, keys, ACQUIRE_ARGS, args, replies::acquire).await
    }

    pub(super) async fn commit_many_inner(
        &self,
        requests: &[CommitRequest<'_>],
    ) -> Vec<Result<Transition, StoreError>> {
        let keys: Vec<&str> = requests.iter().map(|r| r.key).collect();
        let now = unix_ms_now();
        let pending = |r: &CommitRequest<'_>| record::pending(r.owner, r.fingerprint);
        let completed = |r: &CommitRequest<'_>| record::completed(r.fence, r.owner, r.fingerprint, now, r.result);
        let mut done: Vec<Option<Result<Transition, StoreError>>> = (0..keys.len()).map(|_| None).collect();
        // `SET IFEQ` per key where a single call's commit would send it (a record that keeps its
        // lease's end goes to the script at once); the keys it did not set (anything but this
        // owner's pending record there) go to the script, which decides.
        let compare_and_set = self.inner.compare_and_set.load(Ordering::Relaxed) && !self.inner.clustered;
        let plain: Vec<usize> = (0..keys.len())
            .filter(|&i| compare_and_set && !requests[i].keep.is_zero() && !requests[i].lease_in_record)
            .collect();
        if !plain.is_empty() {
            let plain_keys: Vec<&str> = plain.iter().map(|&i| keys[i]).collect();
            let args = |j: usize| {
                let r = &requests[plain[j]];
                [
                    Value::Bytes(completed(r).into()),
                    Value::from_static_str("IFEQ"),
                    pending(r).into(),
                    Value::from_static_str("PX"),
                    millis(r.keep).into(),
                ]
            };
            for (&i, reply) in plain.iter().zip(self.set_pipelined("commit", &plain_keys, args).await) {
                // Not set: the script decides.
                done[i] = match reply.and_then(|reply| self.compare_and_set_reply(reply)) {
                    Ok(true) => Some(Ok(Transition::Done)),
                    Ok(false) => None,
                    Err(e) => Some(Err(e)),
                };
            }
        }
        let rest: Vec<usize> = (0..keys.len()).filter(|&i| done[i].is_none()).collect();
        if !rest.is_empty() {
            let rest_keys: Vec<&str> = rest.iter().map(|&i| keys[i]).collect();
            let args = |j: usize, out: &mut Vec<Value>| {
                let r = &requests[rest[j]];
                out.extend(commit_script_args(r.keep, completed(r).into()));
            };
            let read = |reply| replies::transition("commit", reply);
            let scripted = self.grouped("commit", &scripts::COMMIT_MANY, &rest_keys, COMMIT_ARGS, args, read).await;
            for (&i, outcome) in rest.iter().zip(scripted) {
                done[i] = Some(outcome);
            }
        }
        let mut done: Vec<Result<Transition, StoreError>> =
            done.into_iter().map(|d| d.expect("every key committed or scripted")).collect();
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

    pub(super) async fn fail_many_inner(&self, requests: &[FailRequest<'_>]) -> Vec<Result<Transition, StoreError>> {
        let keys: Vec<&str> = requests.iter().map(|r| r.key).collect();
        let args = |i: usize, out: &mut Vec<Value>| out.extend(fail_args(&requests[i]));
        let read = |reply| replies::transition("fail", reply);
        self.grouped("fail", &scripts::FAIL_MANY, &keys, FAIL_ARGS, args, read).await
    }
}
