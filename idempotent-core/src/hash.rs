//! FNV-1a: a small, stable, non-cryptographic hash for spreading keys (over hash slots, pool
//! connections, cache shards). Stable across versions and processes; not for untrusted input
//! where collisions would matter.

/// FNV-1a, 32 bits.
pub(crate) fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(*b)).wrapping_mul(0x0100_0193))
}
