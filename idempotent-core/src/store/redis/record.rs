//! The record format of `lua/lib.lua`, `s|n|o|f|t|w|r`, written and read in Rust: for the paths
//! that need no script (acquire is a plain `SET NX GET`), for the records a commit hands its
//! script ready-made, and for operators' reads. Nothing here reads the server's clock: the
//! server's time comes with the reply (`TIME`, `PTTL`).

use std::time::Duration;

use crate::store::{AcquireOutcome, RecordState, RecordView};

/// The IN_PROGRESS record every acquire writes (plain or script): `P|0|owner|fingerprint|||`. Its
/// fencing token is not in it (`0`): the server's `TIME`, read right after this record was
/// written, is. A commit's `SET ... IFEQ` compares the key with exactly this string (held by this
/// owner, unwatched), and the commit script builds the same string from the completed record
/// for its fast path (`lua/commit.lua`).
pub(crate) fn pending(owner: &str, fingerprint: Option<&str>) -> String {
    let mut out = Vec::with_capacity(owner.len() + fingerprint.map_or(0, str::len) + 8);
    push_pending(&mut out, owner, fingerprint);
    // Pieces of `&str` and ASCII: always UTF-8.
    String::from_utf8(out).unwrap_or_default()
}

/// [`pending`], written at the end of `out` (a buffer several of a command's arguments share,
/// see `args.rs`).
pub(crate) fn push_pending(out: &mut Vec<u8>, owner: &str, fingerprint: Option<&str>) {
    for part in ["P|0|", owner, "|", fingerprint.unwrap_or(""), "|||"] {
        out.extend_from_slice(part.as_bytes());
    }
}

/// The COMPLETED record: `C|fence|owner|fingerprint|stored_ms||result`. `fence` is `0` when the
/// body never read its token; `owner` is the attempt that completed it (a repeated commit by it
/// is `Done`, anyone else's `Lost`). How long it lives is the key's own expiry (`keep`), which
/// a reader asks the server for (`PTTL`); `stored_ms` is when it was stored by the committing
/// client's clock, for operators. An empty result means not replayable (a JSON result is never
/// empty).
pub(crate) fn completed(
    fence: u64,
    owner: &str,
    fingerprint: Option<&str>,
    stored_ms: u64,
    result: Option<&[u8]>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + owner.len() + result.map_or(0, <[u8]>::len));
    push_completed(&mut out, fence, owner, fingerprint, stored_ms, result);
    out
}

/// [`completed`], written at the end of `out`.
pub(crate) fn push_completed(
    out: &mut Vec<u8>,
    fence: u64,
    owner: &str,
    fingerprint: Option<&str>,
    stored_ms: u64,
    result: Option<&[u8]>,
) {
    let (mut fence_digits, mut ms_digits) = (itoa::Buffer::new(), itoa::Buffer::new());
    for part in [
        b"C|",
        fence_digits.format(fence).as_bytes(),
        b"|",
        owner.as_bytes(),
        b"|",
        fingerprint.unwrap_or("").as_bytes(),
        b"|",
        ms_digits.format(stored_ms).as_bytes(),
        b"||",
        result.unwrap_or_default(),
    ] {
        out.extend_from_slice(part);
    }
}

/// A record's fields, borrowed from its bytes ('' for empty ones).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Record<'a> {
    /// `P`, `C`, `R` or `F`.
    pub state: u8,
    pub fence: u64,
    pub owner: &'a [u8],
    pub fingerprint: &'a [u8],
    /// C, R, F: when it was stored (unix ms).
    pub stored_ms: Option<u64>,
    pub watched: bool,
    /// C: the result. R, F: the last error's text.
    pub result: &'a [u8],
    /// P: which attempt; R, F: how many failed.
    pub attempt: u32,
    /// P that keeps its lease's end: that end (unix ms, the server's clock).
    pub lease_end_ms: Option<u64>,
    /// P that keeps its lease's end: held (unknown, not free) once it has passed.
    pub hold: bool,
}

/// The reason given for a string that is not a record, as the scripts word it.
pub(crate) const NOT_A_RECORD: &str = "holds a string that is not an idempotency record";

/// Reads a record, or says why the bytes are not one (the same test as `load` in lib.lua).
pub(crate) fn parse(bytes: &[u8]) -> Result<Record<'_>, &'static str> {
    let mut fields = bytes.splitn(7, |&b| b == b'|');
    let mut next = || fields.next().ok_or(NOT_A_RECORD);
    let (state, fence, owner, fingerprint, stored, watched) = (next()?, next()?, next()?, next()?, next()?, next()?);
    let tail = next()?;
    let state = match state {
        [s @ (b'P' | b'C' | b'R' | b'F')] => *s,
        _ => return Err(NOT_A_RECORD),
    };
    let fence = int(fence).ok_or(NOT_A_RECORD)?;
    let mut rec = Record {
        state,
        fence,
        owner,
        fingerprint,
        stored_ms: int(stored),
        watched: watched == b"1",
        result: tail,
        attempt: 1,
        lease_end_ms: None,
        hold: false,
    };
    match state {
        // A record that keeps its lease's end: `<attempt>:<keep ms>:<hold>` after it.
        b'P' if !stored.is_empty() => {
            let mut parts = tail.splitn(3, |&b| b == b':');
            let (attempt, keep, hold) = (parts.next(), parts.next(), parts.next());
            let attempt = attempt.and_then(int).and_then(|a| u32::try_from(a).ok()).ok_or(NOT_A_RECORD)?;
            keep.and_then(int).ok_or(NOT_A_RECORD)?;
            rec.hold = match hold {
                Some(b"1") => true,
                Some(b"0") => false,
                _ => return Err(NOT_A_RECORD),
            };
            rec.attempt = attempt;
            rec.lease_end_ms = Some(rec.stored_ms.ok_or(NOT_A_RECORD)?);
            rec.stored_ms = None;
            rec.result = b"";
        }
        // `<attempts>:<the last error>`.
        b'R' | b'F' => {
            let colon = tail.iter().position(|&b| b == b':').ok_or(NOT_A_RECORD)?;
            rec.attempt = int(&tail[..colon]).and_then(|a| u32::try_from(a).ok()).ok_or(NOT_A_RECORD)?;
            rec.result = &tail[colon + 1..];
        }
        _ => {}
    }
    Ok(rec)
}

/// A field of ASCII digits as a number (none for an empty field, another character, or a
/// number past `u64`), read digit by digit: on every replay's path, where `str::parse` cost
/// ten times as much.
fn int(digits: &[u8]) -> Option<u64> {
    // Up to 19 digits cannot pass `u64::MAX` (20 digits): no check per digit for them, which
    // cost 24 instructions a digit, 300 for a stored moment's 13, on every replay.
    const SAFE: usize = 19;
    if digits.is_empty() || digits.len() > SAFE + 1 {
        return None;
    }
    let (head, last) = digits.split_at(digits.len().min(SAFE));
    let mut n = 0u64;
    for &d in head {
        let digit = d.wrapping_sub(b'0');
        if digit > 9 {
            return None;
        }
        n = n * 10 + u64::from(digit);
    }
    match last {
        [] => Some(n),
        [d] if d.is_ascii_digit() => n.checked_mul(10)?.checked_add(u64::from(d - b'0')),
        _ => None,
    }
}

fn text(field: &[u8]) -> Option<String> {
    (!field.is_empty()).then(|| String::from_utf8_lossy(field).into_owned())
}

/// A `PTTL` reply as a duration (zero for no key, or no expiry: -2, -1).
pub(crate) fn ttl(pttl: Option<i64>) -> Duration {
    Duration::from_millis(pttl.unwrap_or(0).max(0) as u64)
}

/// A record as operators see it: `key` is its full key, `pttl` its key's `PTTL`, `now_ms` the
/// server's clock when it was read (whether a lease's end kept in it has passed).
pub(crate) fn view(key: &str, bytes: &[u8], pttl: Option<i64>, now_ms: u64) -> Result<RecordView, &'static str> {
    let rec = parse(bytes)?;
    let lapsed = rec.lease_end_ms.is_some_and(|end| end <= now_ms);
    let state = match rec.state {
        b'P' if lapsed && rec.hold => RecordState::Unknown,
        b'P' if lapsed => RecordState::Released,
        b'P' => RecordState::InProgress,
        b'C' => RecordState::Completed,
        b'R' => RecordState::Released,
        _ => RecordState::Failed,
    };
    // A completed record's owner is there for a repeated commit to know itself; operators see
    // the owner of a record in progress (or unknown), as on every store.
    let owner = if rec.state == b'P' { text(rec.owner) } else { None };
    let counted = rec.state != b'P' || rec.lease_end_ms.is_some();
    let failed = matches!(rec.state, b'R' | b'F');
    Ok(RecordView {
        key: key.to_owned(),
        state,
        fence: (rec.fence != 0).then_some(rec.fence),
        started_ms: owner.as_deref().and_then(crate::ids::started_ms),
        owner,
        attempts: (counted && rec.state != b'C').then_some(rec.attempt),
        last_error: if failed {
            text(rec.result)
        } else {
            (lapsed && !rec.hold).then(|| crate::store::LAPSED.to_owned())
        },
        lease_end_ms: rec.lease_end_ms,
        holds: rec.hold,
        stored_ms: rec.stored_ms,
        ttl: pttl.filter(|t| *t >= 0).map(|t| Duration::from_millis(t as u64)),
        fingerprint: text(rec.fingerprint),
        watched: rec.watched,
        replayable: rec.state == b'C' && !rec.result.is_empty(),
        result: (rec.state == b'C' && !rec.result.is_empty()).then(|| rec.result.to_vec()),
    })
}

/// What a parameter-mode acquire that did not take the key found there, as `acquire.lua`
/// would report it, or `None` when only the script can say (a record of failed attempts, which
/// the script takes as the next attempt, or another holder's record that keeps its lease's end,
/// which has passed or not by the server's clock). `now_us` is the server's `TIME` read right
/// after the acquire (the fencing token when the record is this owner's own: a re-sent
/// acquire), or `0` when it was left unread; `pttl` the key's `PTTL` when it was asked for.
pub(crate) fn found(bytes: &[u8], owner: &str, now_us: u64, pttl: Option<i64>) -> Option<AcquireOutcome> {
    let rec = match parse(bytes) {
        Ok(rec) => rec,
        Err(reason) => return Some(AcquireOutcome::Corrupt { reason: reason.to_owned() }),
    };
    Some(match rec.state {
        b'P' if rec.owner == owner.as_bytes() => {
            AcquireOutcome::Acquired { fence: if rec.fence == 0 { now_us } else { rec.fence }, attempt: rec.attempt }
        }
        b'P' if rec.lease_end_ms.is_some() => return None,
        b'P' => AcquireOutcome::InProgress { fingerprint: text(rec.fingerprint), lease_left: ttl(pttl) },
        b'R' => return None,
        b'F' => AcquireOutcome::GaveUp {
            fingerprint: text(rec.fingerprint),
            attempts: rec.attempt,
            last_error: String::from_utf8_lossy(rec.result).into_owned(),
        },
        _ => AcquireOutcome::Completed {
            fingerprint: text(rec.fingerprint),
            result: (!rec.result.is_empty()).then(|| rec.result.to_vec()),
            kept_for: ttl(pttl),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_records_read_back() {
        let p = pending("own", Some("ab12"));
        assert_eq!(p, "P|0|own|ab12|||");
        // A re-sent acquire finds its own record: the fence is the server's TIME read after it,
        // or left unread.
        assert_eq!(found(p.as_bytes(), "own", 77, None), Some(AcquireOutcome::Acquired { fence: 77, attempt: 1 }));
        assert_eq!(found(p.as_bytes(), "own", 0, None), Some(AcquireOutcome::Acquired { fence: 0, attempt: 1 }));
        assert_eq!(
            found(p.as_bytes(), "other", 0, Some(900)),
            Some(AcquireOutcome::InProgress {
                fingerprint: Some("ab12".into()),
                lease_left: Duration::from_millis(900)
            })
        );
        let c = completed(17, "own", None, 1_700_000_000_123, Some(b"{\"a\":\"x|y\"}"));
        assert_eq!(c, b"C|17|own||1700000000123||{\"a\":\"x|y\"}");
        // Operators see no owner on a completed record, as on every store.
        assert_eq!(view("k", &c, None, 0).unwrap().owner, None);
        // A fence the body never read is stored as 0 and shown as none.
        assert_eq!(view("k", &completed(0, "own", None, 1, None), None, 0).unwrap().fence, None);
        assert_eq!(parse(&c).unwrap().stored_ms, Some(1_700_000_000_123));
        // How long it is kept is what the server says (PTTL), whatever any clock says.
        assert_eq!(
            found(&c, "own", 1_000_000, Some(4_000)),
            Some(AcquireOutcome::Completed {
                fingerprint: None,
                result: Some(b"{\"a\":\"x|y\"}".to_vec()),
                kept_for: Duration::from_secs(4)
            })
        );
        let unreplayable = completed(3, "own", Some("f"), 1, None);
        assert_eq!(
            found(&unreplayable, "own", 20_000, None),
            Some(AcquireOutcome::Completed { fingerprint: Some("f".into()), result: None, kept_for: Duration::ZERO })
        );
    }

    #[test]
    fn records_written_by_the_scripts_read_the_same() {
        // As lib.lua's encode writes them: a waited-on record taken by a script.
        let scripted = b"P|1764505474123456|own|||1|";
        assert_eq!(
            found(scripted, "own", 0, None),
            Some(AcquireOutcome::Acquired { fence: 1764505474123456, attempt: 1 })
        );
        assert!(parse(scripted).unwrap().watched);
    }

    /// The records acquire.lua and fail.lua write where attempts are counted: read here as the
    /// scripts read them, and left to the script where only the server's clock can decide.
    #[test]
    fn records_that_count_attempts_read_as_the_scripts_write_them() {
        // Attempt 3 of a held key, its lease ending at 1_700_000_030_000, kept a day past it.
        let held = b"P|0|own|fp|1700000030000||3:86400000:1";
        let rec = parse(held).unwrap();
        assert_eq!((rec.attempt, rec.lease_end_ms, rec.hold, rec.stored_ms), (3, Some(1_700_000_030_000), true, None));
        assert_eq!(found(held, "own", 5, None), Some(AcquireOutcome::Acquired { fence: 5, attempt: 3 }));
        assert_eq!(found(held, "other", 5, None), None, "whether its lease's end has passed is the server's to say");
        let before = view("k", held, Some(1_000), 1_700_000_029_999).unwrap();
        assert_eq!((before.state, before.attempts, before.holds), (RecordState::InProgress, Some(3), true));
        let after = view("k", held, Some(1_000), 1_700_000_030_000).unwrap();
        assert_eq!((after.state, after.owner.as_deref()), (RecordState::Unknown, Some("own")));
        let counted = b"P|0|own||1700000030000||2:1000:0";
        assert_eq!(view("k", counted, None, 1_700_000_030_001).unwrap().state, RecordState::Released);
        // Failed attempts, and a key given up: the error's text may hold ':' and '|'.
        let released = b"R|0|own||1700000000000||2:timeout: a|b";
        assert_eq!(found(released, "other", 0, None), None, "the script takes it as attempt 3");
        let v = view("k", released, Some(5), 0).unwrap();
        assert_eq!(
            (v.state, v.attempts, v.last_error.as_deref()),
            (RecordState::Released, Some(2), Some("timeout: a|b"))
        );
        let failed = b"F|0|own|fp|1700000000000||5:poison";
        assert_eq!(
            found(failed, "other", 0, None),
            Some(AcquireOutcome::GaveUp { fingerprint: Some("fp".into()), attempts: 5, last_error: "poison".into() })
        );
        for bad in [&b"P|0|own||17||x:1:0"[..], b"P|0|own||17||1:1:2", b"P|0|own||17||1:1", b"R|0|own||1||noattempts"] {
            assert_eq!(parse(bad), Err(NOT_A_RECORD), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn numeric_fields_read_exactly_or_not_at_all() {
        assert_eq!(int(b"0"), Some(0));
        assert_eq!(int(b"1764505474123456"), Some(1_764_505_474_123_456));
        assert_eq!(int(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(int(b"9999999999999999999"), Some(9_999_999_999_999_999_999));
        assert_eq!(int(b"00000000000000000001"), Some(1));
        for bad in [
            &b""[..],
            b"18446744073709551616",
            b"99999999999999999999",
            b"1844674407370955161a",
            b"184467440737095516150",
            b"-1",
            b"+1",
            b"1 ",
            b"1a",
            b"\xff",
        ] {
            assert_eq!(int(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn foreign_strings_are_not_records() {
        for bad in [&b""[..], b"hello", b"C|12", b"X|1|||||", b"C|x|||||r", b"C||||||r", b"P|-1|||||", b"I|0|||||"] {
            assert_eq!(parse(bad), Err(NOT_A_RECORD), "{:?}", String::from_utf8_lossy(bad));
            assert_eq!(found(bad, "own", 0, None), Some(AcquireOutcome::Corrupt { reason: NOT_A_RECORD.into() }));
        }
    }
}
