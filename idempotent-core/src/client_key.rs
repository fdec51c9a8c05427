//! The keys the HTTP layer keeps per client, built here so that the operator's tools build the
//! same ones: a client named by a credential is a hash of it (never the secret itself), and a
//! client's record key is `<scope>:<kind>:<length of the client id>:<client id>:<key>`.

use sha1::{Digest, Sha1};

/// The client id of whoever presents `credential` (an `Authorization` value, an API key): 128
/// bits of a SHA-1 of it, as 32 hex digits; `None` for an empty or blank value (everyone who
/// sends the header empty would otherwise be one client).
///
/// ```
/// use idempotency::client_key::client_of_credential;
///
/// let alice = client_of_credential(b"Bearer alice-secret").unwrap();
/// assert_eq!(alice.len(), 32);
/// assert!(!alice.contains("alice"));
/// assert_eq!(client_of_credential(b"  "), None);
/// ```
pub fn client_of_credential(credential: &[u8]) -> Option<String> {
    if credential.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    let digest = Sha1::new_with_prefix(b"client\0").chain_update(credential).finalize();
    Some(digest[..16].iter().map(|b| format!("{b:02x}")).collect())
}

/// The scope of `client`'s keys of `kind` (`key` for `Idempotency-Key` values, `token` for form
/// tokens) under the layer's `scope` (`http` unless set). The client id is length-prefixed, so
/// that no client id and key can be cut differently into another's.
///
/// ```
/// use idempotency::client_key::client_scope;
///
/// assert_eq!(client_scope("http", "key", "alice"), "http:key:5:alice");
/// ```
pub fn client_scope(scope: &str, kind: &str, client: &str) -> String {
    format!("{scope}:{kind}:{}:{client}", client.len())
}
