//! The table's rows as the store reads them: what an acquire found, a record as operators see
//! it, keys as the table keeps them, and the integer types the table uses.

use super::*;

/// What the acquire statement's row says; `None` when it must run again.
pub(super) fn found(row: Option<&PgRow>, will_wait: bool) -> Result<Option<AcquireOutcome>, StoreError> {
    let Some(row) = row else { return Ok(None) };
    let get_err = |e| pg_error("acquire", e);
    let found: &str = row.try_get("found").map_err(get_err)?;
    let fingerprint = || row.try_get::<Option<String>, _>("fingerprint").map_err(get_err);
    let left = || row.try_get::<i64, _>("left_ms").map(|ms| Duration::from_millis(ms.max(0) as u64)).map_err(get_err);
    let attempt =
        || row.try_get::<Option<i32>, _>("attempt").map(|a| a.map_or(1, |a| a.max(0) as u32)).map_err(get_err);
    Ok(Some(match found {
        "A" => match row.try_get::<Option<i64>, _>("fence").map_err(get_err)? {
            Some(fence) => AcquireOutcome::Acquired { fence: fence as u64, attempt: attempt()? },
            None => return Ok(None),
        },
        "F" => AcquireOutcome::GaveUp {
            fingerprint: fingerprint()?,
            attempts: attempt()?,
            last_error: row.try_get::<Option<String>, _>("last_error").map_err(get_err)?.unwrap_or_default(),
        },
        "U" => AcquireOutcome::Unknown {
            fingerprint: fingerprint()?,
            owner: row.try_get::<Option<String>, _>("owner").map_err(get_err)?.unwrap_or_default(),
            lease_ended_ms: row.try_get::<Option<i64>, _>("lease_end_ms").map_err(get_err)?.unwrap_or(0).max(0) as u64,
            attempt: attempt()?,
        },
        "P" => {
            let watched: bool = row.try_get("watched").map_err(get_err)?;
            let marked: i64 = row.try_get("marked").map_err(get_err)?;
            // The caller will wait, and the row was not marked: it changed meanwhile (committed,
            // say), and its holder would not notify. Look again.
            if will_wait && !watched && marked == 0 {
                return Ok(None);
            }
            AcquireOutcome::InProgress { fingerprint: fingerprint()?, lease_left: left()? }
        }
        "C" => AcquireOutcome::Completed {
            fingerprint: fingerprint()?,
            result: row.try_get::<Option<Vec<u8>>, _>("result").map_err(get_err)?,
            kept_for: left()?,
        },
        _ => return Ok(None),
    }))
}

/// A state as the statements name it: the row's own, or 'U' for unknown.
pub(super) fn record_state(state: &str) -> RecordState {
    match state {
        "P" => RecordState::InProgress,
        "R" => RecordState::Released,
        "F" => RecordState::Failed,
        "U" => RecordState::Unknown,
        _ => RecordState::Completed,
    }
}

/// A row of `inspect` or `scan` as operators see it.
pub(super) fn view(row: &PgRow) -> Result<RecordView, sqlx::Error> {
    let letter: &str = row.try_get("state")?;
    let lapsed: bool = row.try_get::<Option<bool>, _>("lapsed")?.unwrap_or(false);
    let hold: bool = row.try_get("hold")?;
    let state = match (letter, lapsed) {
        ("P", true) if hold => RecordState::Unknown,
        ("P", true) => RecordState::Released,
        (letter, _) => record_state(letter),
    };
    let in_progress = letter == "P";
    let owner: Option<String> = row.try_get::<Option<String>, _>("owner")?.filter(|_| in_progress);
    let result: Option<Vec<u8>> = row.try_get("result")?;
    let left: i64 = row.try_get("left_ms")?;
    let lease_end_ms: Option<i64> = row.try_get("lease_end_ms")?;
    let attempt: Option<i32> = row.try_get("attempt")?;
    let last_error: Option<String> = row.try_get("last_error")?;
    Ok(RecordView {
        key: unstored(row.try_get("key")?).into_owned(),
        state,
        fence: row.try_get::<Option<i64>, _>("fence")?.filter(|f| *f != 0).map(|f| f as u64),
        started_ms: owner.as_deref().and_then(crate::ids::started_ms),
        owner,
        attempts: match letter {
            "P" => lease_end_ms.map(|_| attempt.unwrap_or(1).max(0) as u32),
            "R" | "F" => Some(attempt.unwrap_or(0).max(0) as u32),
            _ => None,
        },
        last_error: match (letter, lapsed && !hold) {
            ("R" | "F", _) => last_error.filter(|e| !e.is_empty()),
            (_, true) => Some(crate::store::LAPSED.to_owned()),
            _ => None,
        },
        lease_end_ms: lease_end_ms.map(|ms| ms.max(0) as u64),
        holds: hold,
        stored_ms: row.try_get::<Option<i64>, _>("stored_ms")?.map(|ms| ms as u64),
        ttl: Some(Duration::from_millis(left.max(0) as u64)),
        fingerprint: row.try_get("fingerprint")?,
        watched: row.try_get("watched")?,
        replayable: state == RecordState::Completed && result.is_some(),
        result,
    })
}

/// A full key as the table keeps it: PostgreSQL's `text` cannot hold NUL, so NUL is written `\0`
/// and a backslash `\\` (an escape that keeps distinct keys distinct and prefixes prefixes).
pub(crate) fn stored(key: &str) -> Cow<'_, str> {
    if !key.contains(['\\', '\0']) {
        return Cow::Borrowed(key);
    }
    Cow::Owned(key.replace('\\', "\\\\").replace('\0', "\\0"))
}

/// The full key of a stored one (see [`stored`]).
pub(crate) fn unstored(key: &str) -> Cow<'_, str> {
    if !key.contains('\\') {
        return Cow::Borrowed(key);
    }
    let mut out = String::with_capacity(key.len());
    let mut chars = key.chars();
    while let Some(c) = chars.next() {
        match (c, c == '\\') {
            (_, true) => match chars.next() {
                Some('0') => out.push('\0'),
                Some(other) => out.push(other),
                None => out.push('\\'),
            },
            (c, false) => out.push(c),
        }
    }
    Cow::Owned(out)
}

pub(super) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A fencing token as the `bigint` the table keeps (tokens come from a `bigint` sequence).
pub(super) fn fence_param(fence: u64) -> i64 {
    i64::try_from(fence).unwrap_or(i64::MAX)
}
