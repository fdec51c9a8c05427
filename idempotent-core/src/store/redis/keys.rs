//! Where a key's record lives in Redis: `{prefix}:{HHHHHHHH}:{key}`.
//!
//! The braces hold a hash tag of our own, eight hex digits of a hash of the key, so a record
//! lands in a slot chosen by the whole key whatever characters the key contains (braces
//! included), and keys spread evenly over a cluster's slots. The key itself follows in clear so
//! that `redis-cli --scan --pattern 'idem:*:orders:*'` finds an operator's records.

use crate::hash::fnv1a;

/// The Redis key of the record for `key` under `prefix` (built by hand: it is on every call's
/// path, twice).
pub(crate) fn record_key(prefix: &str, key: &str) -> String {
    let mut out = Vec::with_capacity(prefix.len() + key.len() + 12);
    push_record_key(&mut out, prefix, key);
    // Pieces of `&str` and ASCII hex digits: always UTF-8.
    String::from_utf8(out).unwrap_or_default()
}

/// [`record_key`], written at the end of `out` (a buffer several of a command's arguments share,
/// see `args.rs`).
pub(crate) fn push_record_key(out: &mut Vec<u8>, prefix: &str, key: &str) {
    for part in [prefix.as_bytes(), b":{", &tag(key), b"}:", key.as_bytes()] {
        out.extend_from_slice(part);
    }
}

/// The hash tag of `key`: eight lowercase hex digits of its hash.
fn tag(key: &str) -> [u8; 8] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let hash = fnv1a(key.as_bytes());
    let mut tag = [0u8; 8];
    for (nibble, digit) in tag.iter_mut().rev().enumerate() {
        *digit = HEX[(hash >> (nibble * 4)) as usize & 0xf];
    }
    tag
}

/// The full key of the record at `record_key` under `prefix`, if it is one of the store's keys.
pub(crate) fn full_key_of<'a>(prefix: &str, record_key: &'a str) -> Option<&'a str> {
    let rest = record_key.strip_prefix(prefix)?.strip_prefix(":{")?;
    let tag = rest.get(..8)?;
    if !tag.bytes().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    rest.get(8..)?.strip_prefix("}:")
}

/// The `SCAN MATCH` pattern of the records under `prefix` whose full keys start with
/// `key_prefix` (glob characters in either are escaped).
pub(crate) fn scan_pattern(prefix: &str, key_prefix: &str) -> String {
    format!("{}:{{*}}:{}*", glob_escaped(prefix), glob_escaped(key_prefix))
}

fn glob_escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The channel that carries purges (keys forgotten) to every process's replay cache. Not a
/// record key: those have a hash tag after the prefix.
pub(crate) fn purge_channel(prefix: &str) -> String {
    format!("{prefix}:purged")
}

/// The key of the secret every runtime on the store signs tokens with (and, with `:previous`, the
/// one it replaced, still accepted). Not a record key: those have a hash tag after the prefix.
pub(crate) fn token_secret(prefix: &str) -> String {
    format!("{prefix}:token-secret")
}

/// Why `prefix` cannot be a key prefix, if it cannot.
pub(crate) fn check_prefix(prefix: &str) -> Result<(), String> {
    if prefix.is_empty() {
        return Err("the key prefix is empty".into());
    }
    if prefix.contains(['{', '}']) {
        return Err(format!("the key prefix {prefix:?} contains a brace; braces would change the hash slot"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_keeps_our_tag_first() {
        let k = record_key("idem", "pay:{user}:}{");
        assert!(k.starts_with("idem:{"), "{k}");
        let tag = &k[k.find('{').unwrap() + 1..k.find('}').unwrap()];
        assert_eq!(tag.len(), 8);
        assert!(tag.bytes().all(|c| c.is_ascii_hexdigit()));
        assert!(k.ends_with(":pay:{user}:}{"));
        assert_eq!(record_key("p", "k"), format!("p:{{{:08x}}}:k", fnv1a(b"k")));
    }

    #[test]
    fn record_keys_read_back_and_scan_patterns_escape() {
        let rk = record_key("idem", "orders:{7}:*");
        let mut pushed = b"before".to_vec();
        push_record_key(&mut pushed, "idem", "orders:{7}:*");
        assert_eq!(pushed, [b"before", rk.as_bytes()].concat());
        assert_eq!(full_key_of("idem", &rk), Some("orders:{7}:*"));
        assert_eq!(full_key_of("idem", "idem:purged"), None);
        assert_eq!(full_key_of("other", &rk), None);
        assert_eq!(scan_pattern("idem", "a*b?"), "idem:{*}:a\\*b\\?*");
    }

    #[test]
    fn prefixes_with_braces_are_refused() {
        assert!(check_prefix("idem").is_ok());
        assert!(check_prefix("").is_err());
        assert!(check_prefix("a{b").is_err());
    }
}
