//! Moments as people read them: unix milliseconds written as ISO-8601 in UTC, for error messages
//! and the operator's tool.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

/// Unix milliseconds as ISO-8601 in UTC, to the millisecond.
///
/// ```
/// assert_eq!(idempotency::utc::iso8601(1_764_505_474_200), "2025-11-30T12:24:34.200Z");
/// ```
pub fn iso8601(unix_ms: u64) -> String {
    let (days, ms_of_day) = (unix_ms / 86_400_000, unix_ms % 86_400_000);
    let (year, month, day) = civil_from_days(days as i64);
    let (h, m, s, ms) = (ms_of_day / 3_600_000, ms_of_day / 60_000 % 60, ms_of_day / 1000 % 60, ms_of_day % 1000);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{ms:03}Z")
}

/// A moment as [`iso8601`] writes it (a moment before 1970 as 1970's first).
pub(crate) struct Iso8601(pub(crate) SystemTime);

impl fmt::Display for Iso8601 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        f.write_str(&iso8601(ms))
    }
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
}
