//! Owner ids: unique per attempt, and telling when the attempt started.

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

/// Bits of an owner id: the attempt's start (unix ms), this process's random part, a counter.
const TIME_BITS: u32 = 44;
const PROCESS_BITS: u32 = 44;
const COUNTER_BITS: u32 = 40;

/// A new owner id: unique across processes and attempts (the time, a process-random part and a
/// counter), cheap enough for every call. Owner ids need uniqueness, not secrecy. Their top bits
/// are when the attempt started, by this machine's clock, so that an operator can tell how long
/// a key has been in progress ([`started_ms`]); nothing decides anything by it.
pub(crate) fn owner_id() -> OwnerId {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed) & ((1 << COUNTER_BITS) - 1);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let bits = (u128::from(now & ((1 << TIME_BITS) - 1)) << (PROCESS_BITS + COUNTER_BITS))
        | (u128::from(*PROCESS & ((1 << PROCESS_BITS) - 1)) << COUNTER_BITS)
        | u128::from(n);
    OwnerId(encode(bits))
}

/// When the attempt with owner id `owner` started (unix ms, by the clock of the process that made
/// it), if `owner` is one of the runtime's owner ids.
pub(crate) fn started_ms(owner: &str) -> Option<u64> {
    if owner.len() != 22 {
        return None;
    }
    let mut bits = 0u128;
    for (i, c) in owner.bytes().enumerate() {
        let digit = ALPHABET.iter().position(|&a| a == c)? as u128;
        bits |= digit << (i * 6);
    }
    Some((bits >> (PROCESS_BITS + COUNTER_BITS)) as u64 & ((1 << TIME_BITS) - 1))
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
    fn owner_ids_carry_their_start() {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
        let started = started_ms(owner_id().as_str()).unwrap();
        assert!(started.abs_diff(now) < 1000, "{started} vs {now}");
        assert_eq!(started_ms("not an owner id"), None);
    }
}
