//! Results and fingerprints as bytes: JSON with serde, so `redis-cli` shows them.

use serde::de::DeserializeOwned;
use serde::Serialize;
use sha1::{Digest, Sha1};

/// A result encoded for the store: JSON bytes, or `None` when it cannot be replayed.
pub(crate) enum Encoded {
    Replayable(Vec<u8>),
    /// Larger than the limit, or it did not serialize; the reason goes to the log.
    NotReplayable(String),
}

pub(crate) fn encode<T: Serialize>(value: &T, max_bytes: usize) -> Encoded {
    match serde_json::to_vec(value) {
        Ok(bytes) if bytes.len() <= max_bytes => Encoded::Replayable(bytes),
        Ok(bytes) => {
            Encoded::NotReplayable(format!("the result is {} bytes, over the {max_bytes}-byte limit", bytes.len()))
        }
        Err(e) => Encoded::NotReplayable(format!("the result does not serialize: {e}")),
    }
}

pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    // Checking the UTF-8 once, up front, spares serde_json checking it string by string; bytes
    // that are not UTF-8 go the slow way, for serde_json's own error.
    let decoded = match std::str::from_utf8(bytes) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_slice(bytes),
    };
    decoded.map_err(|e| {
        format!(
            "the stored result does not decode as {}: {e} (did the result type change?)",
            std::any::type_name::<T>()
        )
    })
}

/// The fingerprint of a payload: 128 bits of SHA-1 over its canonical JSON (object keys sorted,
/// so two equal maps give one fingerprint whatever their iteration order), as 32 hex digits.
pub(crate) fn fingerprint<T: Serialize + ?Sized>(payload: &T) -> Result<String, String> {
    let canonical = serde_json::to_value(payload)
        .and_then(|v| serde_json::to_vec(&v))
        .map_err(|e| format!("the fingerprint payload does not serialize: {e}"))?;
    Ok(hex128(Sha1::new_with_prefix(b"json\0").chain_update(&canonical)))
}

/// The fingerprint of raw byte parts (an HTTP method, target and body, say), hashed as they are:
/// each part's length, then its bytes, so that no two different lists of parts collide by
/// concatenation. A `bytes` tag keeps it apart from the serde form.
pub(crate) fn fingerprint_parts<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> String {
    let mut hash = Sha1::new_with_prefix(b"bytes\0");
    for part in parts {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part);
    }
    hex128(hash)
}

/// The first 128 bits of a digest, as 32 hex digits.
fn hex128(hash: Sha1) -> String {
    hash.finalize()[..16].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn falsy_values_round_trip() {
        fn round<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(v: T) {
            let Encoded::Replayable(bytes) = encode(&v, 1 << 20) else { panic!("not replayable") };
            assert_eq!(decode::<T>(&bytes).unwrap(), v);
        }
        round(());
        round(0u8);
        round(false);
        round(String::new());
        round(None::<u32>);
        round(Vec::<u32>::new());
    }

    #[test]
    fn over_the_limit_is_not_replayable() {
        assert!(matches!(encode(&"x".repeat(100), 50), Encoded::NotReplayable(_)));
    }

    #[test]
    fn fingerprint_ignores_map_order() {
        let a: HashMap<String, u32> = (0..50).map(|i| (format!("k{i}"), i)).collect();
        let mut b: HashMap<String, u32> = HashMap::new();
        for i in (0..50).rev() {
            b.insert(format!("k{i}"), i);
        }
        assert_eq!(fingerprint(&a).unwrap(), fingerprint(&b).unwrap());
        assert_ne!(fingerprint(&1).unwrap(), fingerprint(&2).unwrap());
    }

    #[test]
    fn byte_parts_do_not_collide_by_concatenation() {
        let a = fingerprint_parts([&b"POST"[..], b"/a", b"bc"]);
        assert_eq!(a, fingerprint_parts([&b"POST"[..], b"/a", b"bc"]));
        assert_ne!(a, fingerprint_parts([&b"POST"[..], b"/ab", b"c"]));
        assert_ne!(a, fingerprint_parts([&b"POST"[..], b"/a", b"bd"]));
    }
}
