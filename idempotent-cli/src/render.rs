//! How records, times, durations and sizes are written: for people (tables, ISO-8601 times in
//! UTC, short durations) and for scripts (JSON).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idempotent_core::store::{RecordState, RecordView};
use serde_json::{json, Value};

/// Unix milliseconds as ISO-8601 in UTC, to the millisecond: `2025-11-30T12:24:34.200Z`.
pub fn iso8601(unix_ms: u64) -> String {
    let (days, ms_of_day) = (unix_ms / 86_400_000, unix_ms % 86_400_000);
    let (year, month, day) = civil_from_days(days as i64);
    let (h, m, s, ms) = (ms_of_day / 3_600_000, ms_of_day / 60_000 % 60, ms_of_day / 1000 % 60, ms_of_day % 1000);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{ms:03}Z")
}

/// The proleptic Gregorian date of a day counted from 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// Now, in unix milliseconds.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A duration in at most two units: `850ms`, `12s`, `3m12s`, `2h05m`, `3d04h`.
pub fn short_duration(d: Duration) -> String {
    let ms = d.as_millis() as u64;
    let s = ms / 1000;
    match s {
        0 => format!("{ms}ms"),
        1..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, s / 60 % 60),
        _ => format!("{}d{:02}h", s / 86_400, s / 3600 % 24),
    }
}

/// A size in bytes: `312 B`, `1.2 KiB`, `385.0 MiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// `n` and a noun, plural when `n` is not 1: `1 record`, `2 records`.
pub fn count(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// A state as the tool writes it.
pub fn state(s: RecordState) -> &'static str {
    match s {
        RecordState::InProgress => "in_progress",
        RecordState::Completed => "completed",
    }
}

/// The scope of a full key: what comes before its first `:` that is not part of a `::` (so a
/// Rust path stays whole): `my_crate::payments::pay:stripe:1` → `my_crate::payments::pay`,
/// `orders:42` → `orders`; `None` for a key without such a `:`.
pub fn scope_of(full_key: &str) -> Option<&str> {
    let b = full_key.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b':' {
            if b.get(i + 1) == Some(&b':') {
                i += 2;
                continue;
            }
            return Some(&full_key[..i]);
        }
        i += 1;
    }
    None
}

/// The stored result as JSON: the value itself when it parses, else its bytes as a string (a
/// result is always stored as JSON; this only shows what is there if it is not).
fn result_value(view: &RecordView) -> Value {
    match (&view.result, view.result_json()) {
        (_, Some(v)) => v,
        (Some(raw), None) => Value::String(String::from_utf8_lossy(raw).into_owned()),
        (None, None) => Value::Null,
    }
}

/// A record as one JSON object: the fields of `RecordView` as the library serializes them
/// (`ttl` in milliseconds, `started_ms`/`stored_ms` unix milliseconds), with `started`/`stored`
/// in ISO-8601, `age_ms`, `result_bytes` and `result` (the stored value as JSON) added.
pub fn record_json(view: &RecordView, now: SystemTime) -> Value {
    let mut v = serde_json::to_value(view).unwrap_or_else(|_| json!({ "key": view.key }));
    if let Value::Object(map) = &mut v {
        map.insert("started".into(), view.started_ms.map(iso8601).into());
        map.insert("stored".into(), view.stored_ms.map(iso8601).into());
        map.insert("age_ms".into(), view.age(now).map(|d| d.as_millis() as u64).into());
        map.insert("result_bytes".into(), view.result_bytes().into());
        map.insert("result".into(), result_value(view));
    }
    v
}

/// A foreign value as one JSON object.
pub fn foreign_json(key: &str, reason: &str) -> Value {
    json!({ "key": key, "state": "foreign", "foreign": reason })
}

/// A record whole, for `inspect`: one field a line, then the result pretty-printed.
/// `place` says where the record is: ("redis key", its key) or ("postgres row", its row).
pub fn record_text(view: &RecordView, place: (&str, &str), now: SystemTime) -> String {
    let dash = || "-".to_owned();
    let ago = |at: Option<u64>| {
        at.map_or_else(dash, |ms| {
            let now_ms = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
            format!("{} ({} ago)", iso8601(ms), short_duration(Duration::from_millis(now_ms.saturating_sub(ms))))
        })
    };
    let yes_no = |b: bool| if b { "yes" } else { "no" }.to_owned();
    let ttl = match (view.ttl, view.state) {
        (None, _) => "none (the key does not expire)".to_owned(),
        (Some(t), RecordState::InProgress) => format!("{} (lease left)", short_duration(t)),
        (Some(t), RecordState::Completed) => format!("{} (kept for)", short_duration(t)),
    };
    let result = match (view.state, view.result_bytes()) {
        (RecordState::InProgress, _) => dash(),
        (RecordState::Completed, None) => "not stored (not replayable: over the size limit, or a value that does not read back as itself; a duplicate gets Error::Duplicate)".into(),
        (RecordState::Completed, Some(n)) => format!("{n} bytes"),
    };
    let rows = [
        ("key", view.key.clone()),
        (place.0, place.1.to_owned()),
        ("state", state(view.state).to_owned()),
        (
            "fence",
            match (view.fence, view.state) {
                (Some(f), _) => f.to_string(),
                (None, RecordState::InProgress) => {
                    "- (not in the record while in progress: the holder reads its fence from the server when it needs one)"
                        .into()
                }
                (None, RecordState::Completed) => "- (the body never read its fence)".into(),
            },
        ),
        ("owner", view.owner.clone().unwrap_or_else(dash)),
        ("started", ago(view.started_ms)),
        ("stored", ago(view.stored_ms)),
        ("ttl", ttl),
        ("fingerprint", view.fingerprint.clone().unwrap_or_else(dash)),
        ("watched", yes_no(view.watched)),
        ("replayable", yes_no(view.replayable)),
        ("result", result),
    ];
    let mut text = String::new();
    for (name, value) in rows {
        text.push_str(&format!("{name:<12} {value}\n"));
    }
    if view.result.is_some() {
        let pretty = serde_json::to_string_pretty(&result_value(view)).unwrap_or_default();
        text.push_str(&pretty);
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_iso8601_utc() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601(1_764_505_474_200), "2025-11-30T12:24:34.200Z");
        assert_eq!(iso8601(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(iso8601(4_107_542_399_999), "2100-02-28T23:59:59.999Z");
    }

    #[test]
    fn durations_and_sizes_are_short() {
        assert_eq!(short_duration(Duration::from_millis(850)), "850ms");
        assert_eq!(short_duration(Duration::from_secs(12)), "12s");
        assert_eq!(short_duration(Duration::from_secs(192)), "3m12s");
        assert_eq!(short_duration(Duration::from_secs(7500)), "2h05m");
        assert_eq!(short_duration(Duration::from_secs(86_400 * 3 + 3600 * 4 + 5)), "3d04h");
        assert_eq!(bytes(312), "312 B");
        assert_eq!(bytes(1229), "1.2 KiB");
        assert_eq!(bytes(5 * 1024 * 1024), "5.0 MiB");
        assert_eq!((count(1, "record"), count(0, "record")), ("1 record".to_owned(), "0 records".to_owned()));
    }

    #[test]
    fn scopes_keep_rust_paths_whole() {
        assert_eq!(scope_of("my_crate::payments::pay:stripe:1"), Some("my_crate::payments::pay"));
        assert_eq!(scope_of("orders:42"), Some("orders"));
        assert_eq!(scope_of("orders:a::b"), Some("orders"));
        assert_eq!(scope_of("no_scope"), None);
        assert_eq!(scope_of("a::b"), None);
        assert_eq!(scope_of(":x"), Some(""));
    }
}
