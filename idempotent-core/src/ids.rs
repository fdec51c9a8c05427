//! Identifiers: owner ids (unique per attempt) and tokens (unguessable, 128 random bits).

use std::sync::atomic::{AtomicU64, Ordering};

use once_cell::sync::Lazy;

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// 128 bits as 22 URL-safe characters.
fn encode(bits: u128) -> [u8; 22] {
    std::array::from_fn(|i| ALPHABET[((bits >> (i * 6)) & 63) as usize])
}

fn random_u128() -> Result<u128, getrandom::Error> {
    let mut buf = [0u8; 16];
    getrandom::getrandom(&mut buf)?;
    Ok(u128::from_le_bytes(buf))
}

/// This process's random half of every owner id; the other half counts attempts.
static PROCESS: Lazy<u64> = Lazy::new(|| match random_u128() {
    Ok(bits) => bits as u64,
    // No OS randomness: fall back to what tells processes apart.
    Err(_) => {
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        nanos ^ (u64::from(std::process::id()) << 32)
    }
});
static COUNTER: AtomicU64 = AtomicU64::new(0);

/// An owner id: 22 URL-safe characters, kept inline (no allocation per call).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct OwnerId([u8; 22]);

impl OwnerId {
    pub(crate) fn as_str(&self) -> &str {
        debug_assert!(self.0.is_ascii());
        // SAFETY: every byte comes from `ALPHABET` (see `encode`), which is ASCII. This is read
        // several times per call; checking 22 bytes each time was a measurable share of one.
        unsafe { std::str::from_utf8_unchecked(&self.0) }
    }
}

impl std::fmt::Debug for OwnerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

/// A new owner id: unique across processes and attempts (a process-random half and a counter),
/// cheap enough for every call. Owner ids need uniqueness, not secrecy.
pub(crate) fn owner_id() -> OwnerId {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    OwnerId(encode((u128::from(*PROCESS) << 64) | u128::from(n)))
}

/// A new token: 128 bits from the operating system's random source, so it cannot be guessed.
pub(crate) fn token() -> Result<String, getrandom::Error> {
    random_u128().map(|bits| encode(bits).iter().map(|&b| char::from(b)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn owner_ids_are_unique() {
        let ids: HashSet<String> = (0..10_000).map(|_| owner_id().as_str().to_owned()).collect();
        assert_eq!(ids.len(), 10_000);
    }

    #[test]
    fn tokens_are_22_url_safe_chars_and_differ() {
        let a = token().unwrap();
        let b = token().unwrap();
        assert_eq!(a.len(), 22);
        assert!(a.bytes().all(|c| ALPHABET.contains(&c)));
        assert_ne!(a, b);
    }
}
