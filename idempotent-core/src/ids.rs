//! Identifiers: owner ids (unique per attempt) and tokens (unguessable, 128 random bits).

use std::sync::atomic::{AtomicU64, Ordering};

use once_cell::sync::Lazy;

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// 128 bits as 22 URL-safe characters.
fn encode(bits: u128) -> String {
    (0..22).map(|i| ALPHABET[((bits >> (i * 6)) & 63) as usize] as char).collect()
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

/// A new owner id: unique across processes and attempts (a process-random half and a counter),
/// cheap enough for every call. Owner ids need uniqueness, not secrecy.
pub(crate) fn owner_id() -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    encode((u128::from(*PROCESS) << 64) | u128::from(n))
}

/// A new token: 128 bits from the operating system's random source, so it cannot be guessed.
pub(crate) fn token() -> Result<String, getrandom::Error> {
    random_u128().map(encode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn owner_ids_are_unique() {
        let ids: HashSet<String> = (0..10_000).map(|_| owner_id()).collect();
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
