//! One-time tokens for token mode, signed instead of stored: a token carries its own expiry and
//! is authenticated with HMAC-SHA-256 over its bytes and its scope, so issuing one writes
//! nothing, and a forged, tampered, expired or other-scope token is refused without asking the
//! store. Only a token's first use creates a record, kept until the token expires (see
//! `Idempotency::run`).

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::error::{Error, StoreError, StoreErrorKind};

type HmacSha256 = Hmac<Sha256>;

/// The format: version, key id, expiry (unix ms, big-endian), 16 random bytes, then 16 bytes of
/// the MAC.
const VERSION: u8 = 1;
const BODY: usize = 1 + 1 + 8 + 16;
const TAG: usize = 16;
/// A token's length in characters (42 bytes, URL-safe base64 without padding).
pub const TOKEN_CHARS: usize = 56;
/// The shortest secret a key takes, in bytes.
pub const MIN_SECRET_BYTES: usize = 32;

/// One signing key: its secret and an id (the first byte of a hash of it) that tells a verifier
/// which key signed a token.
#[derive(Clone)]
struct Key {
    id: u8,
    mac: HmacSha256,
}

impl Key {
    fn new(secret: &[u8]) -> Result<Key, Error> {
        if secret.len() < MIN_SECRET_BYTES {
            return Err(Error::InvalidCall {
                key: "token".into(),
                reason: format!("a token key needs at least {MIN_SECRET_BYTES} bytes of secret, got {}", secret.len()),
            });
        }
        let mac = HmacSha256::new_from_slice(secret).expect("HMAC takes a key of any length");
        Ok(Key { id: Sha256::digest(secret)[0], mac })
    }

    fn tag(&self, scope: &str, body: &[u8]) -> [u8; TAG] {
        let mut mac = self.mac.clone();
        mac.update(b"idempotency token\0");
        mac.update(&(scope.len() as u64).to_be_bytes());
        mac.update(scope.as_bytes());
        mac.update(body);
        let full = mac.finalize().into_bytes();
        let mut tag = [0; TAG];
        tag.copy_from_slice(&full[..TAG]);
        tag
    }
}

/// The keys that sign and verify tokens: a current one, which signs, and previous ones still
/// accepted, so that a key can be rotated without refusing the tokens already handed out.
///
/// Every instance that issues or takes tokens needs the same keys: configure them from a
/// secret (`IdempotencyBuilder::token_keys`). The default, [`TokenKeys::random`], is a fresh key
/// per runtime: fine for one process, and tokens issued by one instance are refused by another.
///
/// ```
/// use idempotency::TokenKeys;
///
/// let keys = TokenKeys::new(b"a secret of at least thirty-two bytes!!")?
///     .previous(b"the secret used until last week, also long enough")?;
/// # Ok::<(), idempotency::Error>(())
/// ```
#[derive(Clone)]
pub struct TokenKeys {
    current: Key,
    previous: Vec<Key>,
}

impl TokenKeys {
    /// Keys signing with `secret` (at least 32 bytes: a random value, base64 or hex decoded, from
    /// your secret store).
    pub fn new(secret: impl AsRef<[u8]>) -> Result<TokenKeys, Error> {
        Ok(TokenKeys { current: Key::new(secret.as_ref())?, previous: Vec::new() })
    }

    /// Keys from a store's shared secrets ([`Store::token_secrets`](crate::Store::token_secrets)):
    /// the first signs, the others are still accepted; `None` when there are none or the first
    /// is too short.
    pub(crate) fn shared(secrets: &[Vec<u8>]) -> Option<TokenKeys> {
        let (current, previous) = secrets.split_first()?;
        let keys = TokenKeys::new(current).ok()?;
        Some(previous.iter().fold(keys, |keys, p| keys.clone().previous(p).unwrap_or(keys)))
    }

    /// A new random secret, as a store keeps it (URL-safe base64 of 32 bytes).
    pub(crate) fn fresh_secret() -> String {
        let mut secret = [0u8; 32];
        if getrandom::getrandom(&mut secret).is_err() {
            tracing::error!("no OS randomness for the shared token secret; tokens are weakly protected");
        }
        B64.encode(secret)
    }

    /// A secret as a store keeps it, decoded; `None` if it is not one (too short, not base64).
    pub(crate) fn decode_secret(text: &str) -> Option<Vec<u8>> {
        B64.decode(text.trim()).ok().filter(|s| s.len() >= MIN_SECRET_BYTES)
    }

    /// A fresh random key of one process's own, for tests and a single instance. A runtime on a
    /// store that shares its secrets (Redis, PostgreSQL) uses those instead.
    pub fn random() -> TokenKeys {
        let mut secret = [0u8; 32];
        // Without OS randomness, a key from what tells processes apart: weak, but tokens still
        // need a matching MAC, and the failure is logged.
        if getrandom::getrandom(&mut secret).is_err() {
            tracing::error!("no OS randomness for the token key; tokens are weakly protected");
            let seed = format!("{:?}{}", SystemTime::now(), std::process::id());
            secret.copy_from_slice(&Sha256::digest(seed.as_bytes()));
        }
        TokenKeys::new(secret).expect("32 bytes")
    }

    /// Also accepts tokens signed with `secret` (a key being rotated out); it signs nothing.
    pub fn previous(mut self, secret: impl AsRef<[u8]>) -> Result<TokenKeys, Error> {
        self.previous.push(Key::new(secret.as_ref())?);
        Ok(self)
    }

    /// A new token for `scope`, valid until `now + ttl`.
    pub(crate) fn issue(&self, scope: &str, ttl: Duration, now: SystemTime) -> Result<String, Error> {
        let expires = unix_ms(now).saturating_add(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
        let mut nonce = [0u8; 16];
        getrandom::getrandom(&mut nonce).map_err(|e| Error::Store {
            key: scope.to_owned(),
            source: StoreError::new(StoreErrorKind::Backend, format!("no randomness for a token: {e}")),
        })?;
        let mut bytes = [0u8; BODY + TAG];
        bytes[0] = VERSION;
        bytes[1] = self.current.id;
        bytes[2..10].copy_from_slice(&expires.to_be_bytes());
        bytes[10..BODY].copy_from_slice(&nonce);
        let tag = self.current.tag(scope, &bytes[..BODY]);
        bytes[BODY..].copy_from_slice(&tag);
        Ok(B64.encode(bytes))
    }

    /// Checks `token` for `scope` at `now`: its form, its MAC (any of the keys) and its expiry.
    /// What it is about: the part that names its record, and when it expires.
    pub(crate) fn verify(&self, scope: &str, token: &str, now: SystemTime) -> Result<Verified, Refused> {
        if token.len() != TOKEN_CHARS {
            return Err(Refused::Malformed);
        }
        let mut bytes = [0u8; BODY + TAG];
        match B64.decode_slice(token, &mut bytes) {
            Ok(n) if n == bytes.len() => {}
            _ => return Err(Refused::Malformed),
        }
        if bytes[0] != VERSION {
            return Err(Refused::Malformed);
        }
        let (body, tag) = bytes.split_at(BODY);
        let signed = std::iter::once(&self.current).chain(&self.previous).filter(|k| k.id == body[1]).any(|k| {
            // The MAC crate compares in constant time.
            let mut mac = k.mac.clone();
            mac.update(b"idempotency token\0");
            mac.update(&(scope.len() as u64).to_be_bytes());
            mac.update(scope.as_bytes());
            mac.update(body);
            mac.verify_truncated_left(tag).is_ok()
        });
        if !signed {
            return Err(Refused::Forged);
        }
        let expires_ms = u64::from_be_bytes(body[2..10].try_into().expect("8 bytes"));
        let expires = UNIX_EPOCH + Duration::from_millis(expires_ms);
        if expires <= now {
            return Err(Refused::Expired);
        }
        Ok(Verified { id: B64.encode(&body[10..BODY]), expires })
    }
}

impl fmt::Debug for TokenKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the secrets.
        f.debug_struct("TokenKeys")
            .field("current", &format_args!("key {:02x}", self.current.id))
            .field("previous", &self.previous.len())
            .finish()
    }
}

/// A token that checked out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Verified {
    /// Its random part, which names its record (22 characters).
    pub(crate) id: String,
    /// When it stops being valid.
    pub(crate) expires: SystemTime,
}

/// Why a token was refused (all `Error::InvalidToken` to the caller).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Not a token of this format.
    Malformed,
    /// No key signed it for this scope: forged, tampered with, another scope, or a key no
    /// longer accepted.
    Forged,
    /// Past its expiry.
    Expired,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refused::Malformed => "not a token",
            Refused::Forged => "not signed by a known key for this scope",
            Refused::Expired => "expired",
        })
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    u64::try_from(t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_verify_for_their_scope_until_they_expire() {
        let keys = TokenKeys::new([7u8; 32]).unwrap();
        let now = SystemTime::now();
        let t = keys.issue("orders", Duration::from_secs(60), now).unwrap();
        assert_eq!(t.len(), TOKEN_CHARS);
        let v = keys.verify("orders", &t, now).unwrap();
        assert_eq!(v.id.len(), 22);
        assert_eq!(keys.verify("orders", &t, now + Duration::from_secs(61)), Err(Refused::Expired));
        assert_eq!(keys.verify("other", &t, now), Err(Refused::Forged));
        let other = TokenKeys::new([8u8; 32]).unwrap();
        assert_eq!(other.verify("orders", &t, now), Err(Refused::Forged));
        assert_eq!(keys.verify("orders", &t[..55], now), Err(Refused::Malformed));
        // Every single flipped character is refused.
        for i in 0..t.len() {
            let mut bytes = t.clone().into_bytes();
            bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
            let tampered = String::from_utf8(bytes).unwrap();
            assert!(keys.verify("orders", &tampered, now).is_err(), "a token changed at {i} verified");
        }
    }

    #[test]
    fn a_rotated_key_still_verifies_and_secrets_stay_out_of_debug() {
        let old = TokenKeys::new(b"the old secret, thirty-two bytes long").unwrap();
        let now = SystemTime::now();
        let t = old.issue("s", Duration::from_secs(60), now).unwrap();
        let rotated = TokenKeys::new(b"the new secret, thirty-two bytes long")
            .unwrap()
            .previous(b"the old secret, thirty-two bytes long")
            .unwrap();
        assert!(rotated.verify("s", &t, now).is_ok());
        assert!(!format!("{rotated:?}").contains("secret"));
        assert!(TokenKeys::new(b"short").is_err());
    }
}
