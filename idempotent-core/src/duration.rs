//! Durations as the attribute and configuration write them: "500ms", "30s", "5m", "24h", "7d",
//! or an integer of seconds.

use std::time::Duration;

/// Parses a duration written `"500ms"`, `"30s"`, `"5m"`, `"24h"`, `"7d"`, or a bare integer of
/// seconds (`"30"`). Surrounding spaces are ignored; nothing else is accepted.
///
/// ```
/// use std::time::Duration;
/// use idempotent_core::parse_duration;
///
/// assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
/// assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
/// assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
/// assert!(parse_duration("30 sec").is_err());
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    if digits.is_empty() {
        return Err(format!("`{text}` is not a duration: expected a number then ms, s, m, h or d (\"30s\")"));
    }
    let n: u64 = digits.parse().map_err(|_| format!("`{text}` is not a duration: the number is too large"))?;
    let millis_per = match unit {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        other => return Err(format!("`{text}` is not a duration: unknown unit `{other}` (use ms, s, m, h or d)")),
    };
    n.checked_mul(millis_per)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("`{text}` is not a duration: it is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration(" 5m "), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
    }

    #[test]
    fn rejects_malformed() {
        for bad in ["", "s", "1.5s", "-1s", "10 s", "5x", "99999999999999999999s", "18446744073709551615d"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
