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
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let hash = fnv1a(key.as_bytes());
    let mut out = String::with_capacity(prefix.len() + key.len() + 12);
    out.push_str(prefix);
    out.push_str(":{");
    out.extend((0..8).rev().map(|nibble| char::from(HEX[(hash >> (nibble * 4)) as usize & 0xf])));
    out.push_str("}:");
    out.push_str(key);
    out
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
    fn prefixes_with_braces_are_refused() {
        assert!(check_prefix("idem").is_ok());
        assert!(check_prefix("").is_err());
        assert!(check_prefix("a{b").is_err());
    }
}
