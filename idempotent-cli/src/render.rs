//! How records, times, durations and sizes are written: for people (tables, ISO-8601 times in
//! UTC, short durations) and for scripts (JSON).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idempotent_core::store::{RecordState, RecordView};
use serde_json::{json, Value};

pub use idempotent_core::utc::iso8601;

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
        RecordState::Released => "released",
        RecordState::Failed => "failed",
        RecordState::Unknown => "unknown",
    }
}

/// Records counted by state (`list`'s last line, `stats`).
#[derive(Debug, Default, Clone, Copy)]
pub struct Counts {
    pub completed: u64,
    pub in_progress: u64,
    pub released: u64,
    pub failed: u64,
    pub unknown: u64,
}

impl Counts {
    pub fn add(&mut self, state: RecordState) {
        match state {
            RecordState::Completed => self.completed += 1,
            RecordState::InProgress => self.in_progress += 1,
            RecordState::Released => self.released += 1,
            RecordState::Failed => self.failed += 1,
            RecordState::Unknown => self.unknown += 1,
        }
    }

    pub fn total(&self) -> u64 {
        self.completed + self.in_progress + self.released + self.failed + self.unknown
    }

    /// `N completed, M in progress`, and the records of failed attempts and unknown outcomes
    /// where there are any.
    pub fn text(&self) -> String {
        let mut text = format!("{} completed, {} in progress", self.completed, self.in_progress);
        for (n, what) in [(self.released, "released"), (self.failed, "failed"), (self.unknown, "unknown")] {
            if n > 0 {
                text.push_str(&format!(", {n} {what}"));
            }
        }
        text
    }

    /// The counts as JSON fields.
    pub fn json(&self) -> Value {
        json!({
            "records": self.total(),
            "completed": self.completed,
            "in_progress": self.in_progress,
            "released": self.released,
            "failed": self.failed,
            "unknown": self.unknown,
        })
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
        map.insert("lease_end".into(), view.lease_end_ms.map(iso8601).into());
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
        (Some(t), RecordState::InProgress) if view.lease_end_ms.is_some() => {
            format!("{} (kept for, past its lease's end: see lease end)", short_duration(t))
        }
        (Some(t), RecordState::InProgress) => format!("{} (lease left)", short_duration(t)),
        (Some(t), _) => format!("{} (kept for)", short_duration(t)),
    };
    let result = match (view.state, view.result_bytes()) {
        (RecordState::Completed, None) => "not stored (not replayable: over the size limit, or a value that does not read back as itself; a duplicate gets Error::Duplicate)".into(),
        (RecordState::Completed, Some(n)) => format!("{n} bytes"),
        _ => dash(),
    };
    let attempts = match (view.state, view.attempts) {
        (_, None) => dash(),
        (RecordState::Released, Some(n)) => {
            format!("{n} failed (the next call runs attempt {})", n.saturating_add(1))
        }
        (RecordState::Failed, Some(n)) => {
            format!("{n} failed: gave up (calls get Error::GaveUp until the key is purged)")
        }
        (_, Some(n)) => format!("{n} (this attempt)"),
    };
    let on_crash = if view.state == RecordState::Unknown {
        "held: its holder stopped without a commit; calls get Error::OutcomeUnknown until `idempotency resolve`"
            .to_owned()
    } else {
        "hold: once the lease ends without a commit, the outcome is unknown".to_owned()
    };
    let mut rows = vec![
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
                (None, _) => dash(),
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
    // Where the record counts attempts or holds its outcome: what it says of them.
    if view.attempts.is_some() {
        rows.push(("attempts", attempts));
    }
    if let Some(error) = &view.last_error {
        rows.push(("last error", error.clone()));
    }
    if let Some(ms) = view.lease_end_ms {
        rows.push(("lease end", format!("{} (by the store's clock)", iso8601(ms))));
    }
    if view.holds || view.state == RecordState::Unknown {
        rows.push(("on crash", on_crash));
    }
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

    /// A stored count at the top of its range (a record written by hand, or damaged) is shown,
    /// not overflowed: the next attempt's number saturates.
    #[test]
    fn a_count_at_its_limit_does_not_overflow() {
        let view = RecordView {
            key: "jobs:1".into(),
            state: RecordState::Released,
            fence: None,
            owner: Some("o".into()),
            started_ms: None,
            attempts: Some(u32::MAX),
            last_error: Some("x".into()),
            lease_end_ms: None,
            holds: false,
            stored_ms: None,
            ttl: None,
            fingerprint: None,
            watched: false,
            replayable: false,
            result: None,
        };
        let text = record_text(&view, ("redis key", "idempotency:{jobs:1}"), SystemTime::now());
        assert!(text.contains(&format!("{} failed (the next call runs attempt {})", u32::MAX, u32::MAX)), "{text}");
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
