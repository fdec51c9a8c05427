//! Entry points for fuzzing the parsers that read bytes from outside (feature `fuzzing`; not
//! part of the API). Each takes arbitrary bytes, must never panic, and checks what must hold of
//! any input: the `fuzz/` crate's targets call them under libFuzzer, and
//! `tests/fuzz_corpus.rs` runs every file of `fuzz/corpus/` through them as an ordinary test.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::token::TokenKeys;

/// A record as Redis holds it (`lua/lib.lua`'s format): read as an acquire and an operator
/// would read it.
#[cfg(feature = "redis")]
pub fn record(data: &[u8]) {
    use crate::store::redis::record;
    if let Ok(parsed) = record::parse(data) {
        assert!(matches!(parsed.state, b'P' | b'C' | b'R' | b'F'));
        // Only a record in progress keeps its lease's end; only one that keeps it may be held.
        assert!(parsed.lease_end_ms.is_none() || parsed.state == b'P');
        assert!(!parsed.hold || parsed.lease_end_ms.is_some());
    }
    let _ = record::found(data, "owner", 1, Some(1000));
    for now in [0, 1_700_000_000_000, u64::MAX] {
        let _ = record::view("key", data, Some(-2), now);
    }
}

/// A token, checked by keys that did not sign it (and by one that signed others): refused,
/// never a panic, never accepted.
pub fn token(data: &[u8]) {
    let keys = TokenKeys::new([7u8; 32]).expect("a 32-byte secret");
    let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (scope, token) = text.split_once('\n').unwrap_or(("token", text));
    if let Ok(verified) = keys.verify(scope, token, now) {
        // Only a token these keys issued verifies: made up by the fuzzer, it is a forgery.
        let again = keys.issue(scope, Duration::from_secs(60), SystemTime::now());
        panic!("a made-up token verified: {token:?} ({verified:?}; an issued one: {again:?})");
    }
}

/// A duration as the attribute, the environment and the CLI write them.
pub fn duration(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = crate::parse_duration(text);
    }
}

/// A store URL: read, and shown masked: whatever stands between `://` and the last `@` never
/// appears in clear when it holds a `:` (a password).
#[cfg(feature = "redis")]
pub fn store_url(data: &[u8]) {
    use crate::store::redis::url;
    let Ok(text) = std::str::from_utf8(data) else { return };
    let shown = url::masked(text);
    let _ = url::parse(text);
    if let Some((_, rest)) = text.split_once("://") {
        if let Some(at) = rest.rfind('@') {
            if let Some((_, password)) = rest[..at].split_once(':') {
                // Where the password stood in the shown URL: after the user name's `:`, before the
                // last `@` (the user name and the host are no secret, even when they happen to
                // spell the password).
                let userinfo = shown.split_once("://").map_or("", |(_, r)| r.rsplit_once('@').map_or("", |(u, _)| u));
                let masked_part = userinfo.split_once(':').map_or(userinfo, |(_, p)| p);
                if password.len() >= 4 && !password.contains("***") {
                    assert!(!masked_part.contains(password), "{text:?} shown as {shown:?}");
                }
            }
        }
    }
}

/// Keys built from two values: distinct pairs never make one key (the attribute's templates
/// build keys this way), and an empty value is refused.
pub fn key_values(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let parts: Vec<&str> = text.splitn(4, '\n').collect();
    let [a, b, c, d] = parts[..] else { return };
    let key =
        |x: &str, y: &str| crate::KeyBuilder::new("{x}:{y}", ":").value("x", &x).text(":").value("y", &y).finish();
    match (key(a, b), key(c, d)) {
        (Ok(k1), Ok(k2)) if (a, b) != (c, d) => assert_ne!(k1, k2, "{a:?}:{b:?} and {c:?}:{d:?} made one key"),
        (Ok(_), _) => assert!(!a.is_empty() && !b.is_empty()),
        _ => {}
    }
}

/// A full key as PostgreSQL keeps it: stored and read back as itself, and any stored text reads
/// without a panic.
#[cfg(feature = "postgres")]
pub fn pg_key(data: &[u8]) {
    use crate::store::postgres::{stored, unstored};
    let Ok(text) = std::str::from_utf8(data) else { return };
    assert_eq!(unstored(&stored(text)), text);
    let _ = unstored(text);
}
