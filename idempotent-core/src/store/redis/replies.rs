//! Reading the scripts' replies (documented in each script's header) into store outcomes.

use std::time::Duration;

use fred::prelude::Value;

use crate::error::StoreError;
use crate::store::{AcquireOutcome, Forgotten, RecordState, Resolved, Transition};

/// A reply's text, borrowed: a status word is compared where it lies, without a copy and its
/// allocation on every script reply.
fn word(v: &Value) -> Option<&str> {
    match v {
        Value::String(s) => Some(s),
        Value::Bytes(b) => std::str::from_utf8(b).ok(),
        _ => None,
    }
}

/// A reply's text, owned (a reason, a fingerprint: kept beyond the reply).
fn text(v: &Value) -> Option<String> {
    word(v).map(str::to_owned)
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Integer(i) => Some(*i),
        other => text(other)?.parse().ok(),
    }
}

fn fingerprint(v: Option<&Value>) -> Option<String> {
    v.and_then(text).filter(|s| !s.is_empty())
}

fn array(op: &str, reply: Value) -> Result<Vec<Value>, StoreError> {
    match reply {
        Value::Array(items) if !items.is_empty() => Ok(items),
        other => Err(StoreError::reply(op, format_args!("expected an array, got {other:?}"))),
    }
}

/// What a key holds, as read for an operator: its value (`None`: absent), or what it is when it is
/// not a string; its `PTTL`; and the server's clock then (unix ms).
pub(crate) type Read = (Result<Option<Vec<u8>>, String>, i64, u64);

/// `inspect.lua`'s reply: the value (or the type of a key that is not a string), the PTTL and
/// the server's clock.
pub(crate) fn inspected(reply: Value) -> Result<Read, StoreError> {
    let items = array("inspect", reply)?;
    let bad = || StoreError::reply("inspect", format_args!("unexpected reply {items:?}"));
    let ttl = items.get(1).and_then(int).ok_or_else(bad)?;
    let now = items.get(2).and_then(int).filter(|n| *n >= 0).ok_or_else(bad)? as u64;
    if let Some(kind) = items.get(3).and_then(text) {
        return Ok((Err(format!("holds a Redis {kind}, not an idempotency record")), ttl, now));
    }
    let value = match &items[0] {
        Value::Null => None,
        Value::String(s) => Some(s.as_bytes().to_vec()),
        Value::Bytes(b) => Some(b.to_vec()),
        _ => return Err(bad()),
    };
    Ok((Ok(value), ttl, now))
}

pub(crate) fn acquire(reply: Value) -> Result<AcquireOutcome, StoreError> {
    let items = array("acquire", reply)?;
    let bad = || StoreError::reply("acquire", format_args!("unexpected reply {items:?}"));
    let status = word(&items[0]).ok_or_else(bad)?;
    Ok(match status {
        "acquired" => {
            let fence = items.get(1).and_then(int).filter(|f| *f >= 0).ok_or_else(bad)?;
            // Scripts of earlier versions said no attempt: the first.
            let attempt = items.get(2).map_or(Some(1), count).ok_or_else(bad)?;
            AcquireOutcome::Acquired { fence: fence as u64, attempt }
        }
        "gave_up" => AcquireOutcome::GaveUp {
            fingerprint: fingerprint(items.get(1)),
            attempts: items.get(2).and_then(count).ok_or_else(bad)?,
            last_error: items.get(3).and_then(text).unwrap_or_default(),
        },
        "unknown" => AcquireOutcome::Unknown {
            fingerprint: fingerprint(items.get(1)),
            owner: items.get(2).and_then(text).ok_or_else(bad)?,
            lease_ended_ms: items.get(3).and_then(int).filter(|t| *t >= 0).ok_or_else(bad)? as u64,
            attempt: items.get(4).and_then(count).ok_or_else(bad)?,
        },
        "progress" => {
            let left = items.get(2).and_then(int).ok_or_else(bad)?.max(0);
            AcquireOutcome::InProgress {
                fingerprint: fingerprint(items.get(1)),
                lease_left: Duration::from_millis(left as u64),
            }
        }
        "completed" => {
            let replayable = items.get(2).and_then(int).ok_or_else(bad)? == 1;
            let result = match items.get(3) {
                Some(Value::String(s)) => s.as_bytes().to_vec(),
                Some(Value::Bytes(b)) => b.to_vec(),
                _ => return Err(bad()),
            };
            // -1 (no expiry) or absent: not cacheable.
            let kept_for = Duration::from_millis(items.get(4).and_then(int).unwrap_or(0).max(0) as u64);
            AcquireOutcome::Completed {
                fingerprint: fingerprint(items.get(1)),
                result: replayable.then_some(result),
                kept_for,
            }
        }
        "corrupt" => AcquireOutcome::Corrupt { reason: items.get(1).and_then(text).unwrap_or_default() },
        _ => return Err(bad()),
    })
}

/// `fence.lua`'s reply: the token, or `None` when the owner no longer holds the key.
pub(crate) fn fence(reply: Value) -> Result<Option<u64>, StoreError> {
    let items = array("fence", reply)?;
    let bad = || StoreError::reply("fence", format_args!("unexpected reply {items:?}"));
    match word(&items[0]) {
        Some("fence") => Ok(Some(items.get(1).and_then(int).filter(|f| *f > 0).ok_or_else(bad)? as u64)),
        Some("lost") => Ok(None),
        _ => Err(bad()),
    }
}

pub(crate) fn transition(op: &str, reply: Value) -> Result<Transition, StoreError> {
    let items = array(op, reply)?;
    match word(&items[0]) {
        Some("ok") => Ok(Transition::Done),
        Some("lost") => Ok(Transition::Lost),
        Some("corrupt") => Ok(Transition::Corrupt { reason: items.get(1).and_then(text).unwrap_or_default() }),
        _ => Err(StoreError::reply(op, format_args!("unexpected reply {items:?}"))),
    }
}

pub(crate) fn renewed(reply: Value, expected: usize) -> Result<Vec<bool>, StoreError> {
    let items = match reply {
        Value::Array(items) => items,
        other => return Err(StoreError::reply("renew", format_args!("expected an array, got {other:?}"))),
    };
    let flags: Option<Vec<bool>> = items.iter().map(|v| int(v).map(|i| i == 1)).collect();
    match flags {
        Some(flags) if flags.len() == expected => Ok(flags),
        _ => Err(StoreError::reply("renew", format_args!("unexpected reply {items:?}"))),
    }
}

/// A record's state as the scripts name it: its letter, or `U` for unknown.
fn state(letter: Option<String>) -> Option<RecordState> {
    Some(match letter.as_deref()? {
        "P" => RecordState::InProgress,
        "C" => RecordState::Completed,
        "R" => RecordState::Released,
        "F" => RecordState::Failed,
        "U" => RecordState::Unknown,
        _ => return None,
    })
}

/// An attempt count in a reply.
fn count(v: &Value) -> Option<u32> {
    int(v).and_then(|n| u32::try_from(n).ok())
}

pub(crate) fn forgotten(reply: Value) -> Result<Forgotten, StoreError> {
    let items = array("forget", reply)?;
    let bad = || StoreError::reply("forget", format_args!("unexpected reply {items:?}"));
    Ok(match word(&items[0]) {
        Some("deleted") => Forgotten::Deleted(state(items.get(1).and_then(text)).ok_or_else(bad)?),
        Some("absent") => Forgotten::Absent,
        Some("in_progress") => Forgotten::InProgress,
        Some("corrupt") => Forgotten::Foreign { reason: items.get(1).and_then(text).unwrap_or_default() },
        _ => return Err(bad()),
    })
}

/// `resolve.lua`'s reply.
pub(crate) fn resolved(reply: Value) -> Result<Resolved, StoreError> {
    let items = array("resolve", reply)?;
    let bad = || StoreError::reply("resolve", format_args!("unexpected reply {items:?}"));
    Ok(match word(&items[0]) {
        Some("ok") => Resolved::Done,
        Some("absent") => Resolved::Absent,
        Some("running") => Resolved::Running,
        Some("state") => Resolved::NotUnknown(state(items.get(1).and_then(text)).ok_or_else(bad)?),
        Some("corrupt") => Resolved::Corrupt { reason: items.get(1).and_then(text).unwrap_or_default() },
        _ => return Err(bad()),
    })
}

/// A `SCAN` page: the next cursor and the keys.
pub(crate) fn scan_page(reply: Value) -> Result<(String, Vec<String>), StoreError> {
    let bad = |reply: &Value| StoreError::reply("scan", format_args!("unexpected reply {reply:?}"));
    let Value::Array(items) = &reply else { return Err(bad(&reply)) };
    let (Some(cursor), Some(Value::Array(keys))) = (items.first().and_then(text), items.get(1)) else {
        return Err(bad(&reply));
    };
    // Keys that are not UTF-8 are not ours (ours are built from `&str`): skipped.
    Ok((cursor, keys.iter().filter_map(text).collect()))
}
