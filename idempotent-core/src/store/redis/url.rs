//! Reading a store URL before fred does: only Redis and Valkey schemes are taken, a TLS scheme
//! is TLS or an error (never plaintext), and the URL is shown in errors with its password
//! masked.

use fred::prelude::Config;

use crate::error::{StoreError, StoreErrorKind};

/// The schemes a store URL may have: standalone, Cluster and Sentinel, plaintext or TLS.
const SCHEMES: &[(&str, bool)] = &[
    ("redis", false),
    ("rediss", true),
    ("redis-cluster", false),
    ("rediss-cluster", true),
    ("redis-sentinel", false),
    ("rediss-sentinel", true),
    ("valkey", false),
    ("valkeys", true),
    ("valkey-cluster", false),
    ("valkeys-cluster", true),
    ("valkey-sentinel", false),
    ("valkeys-sentinel", true),
];

/// A store URL, read.
pub(crate) struct StoreUrl {
    /// fred's configuration for it (TLS not yet set up: the builder does that).
    pub(crate) config: Config,
    /// The scheme asks for TLS.
    pub(crate) tls: bool,
    /// The URL as errors show it.
    pub(crate) shown: String,
}

/// Reads `url`; an unknown scheme or a URL fred cannot read is a `Config` error naming the URL
/// (password masked).
pub(crate) fn parse(url: &str) -> Result<StoreUrl, StoreError> {
    let shown = masked(url);
    let scheme = url.split_once("://").map(|(scheme, _)| scheme.to_ascii_lowercase());
    let Some(&(_, tls)) = scheme.as_deref().and_then(|s| SCHEMES.iter().find(|(name, _)| *name == s)) else {
        let expected: Vec<String> = SCHEMES.iter().map(|(name, _)| format!("{name}://")).collect();
        return Err(StoreError::new(
            StoreErrorKind::Config,
            format!("{shown} is not a Redis URL: its scheme must be one of {}", expected.join(", ")),
        ));
    };
    // fred reads the plaintext form: TLS is set up by the store (with a crypto provider named
    // explicitly, so that fred never builds a default one), or refused without the feature.
    let plain = match (tls, url.split_once("://")) {
        (true, Some((scheme, rest))) => {
            format!("{}://{rest}", scheme.replacen("rediss", "redis", 1).replacen("valkeys", "valkey", 1))
        }
        _ => url.to_owned(),
    };
    let config = Config::from_url(&plain).map_err(|e| {
        StoreError::new(
            StoreErrorKind::Config,
            format!("{shown} is not a valid Redis URL: {}", scrub(e.details(), url)),
        )
    })?;
    Ok(StoreUrl { config, tls, shown })
}

/// `url` with the password in its user info (`scheme://user:password@host`) replaced by `***`,
/// and `sentinelPassword=...` too, whatever characters they hold (see `store::credentials`).
pub(crate) fn masked(url: &str) -> String {
    crate::store::credentials::masked(url, &["sentinelPassword"])
}

/// `message` with every password of `url` in it replaced by `***`.
pub(crate) fn scrub(message: &str, url: &str) -> String {
    crate::store::credentials::scrub(message, secrets(url))
}

/// The passwords a URL carries (user info, `sentinelPassword`), as written and decoded.
fn secrets(url: &str) -> Vec<String> {
    let mut found = crate::store::credentials::secrets(url, &["sentinelPassword"]);
    if let Ok(parsed) = url::Url::parse(url) {
        if let Some(password) = parsed.password() {
            found.push(password.to_owned());
            if let Ok(decoded) = urlencoding_decode(password) {
                found.push(decoded);
            }
        }
        for (name, value) in parsed.query_pairs() {
            if name == "sentinelPassword" {
                found.push(value.into_owned());
            }
        }
    }
    found
}

/// Percent-decodes `s`.
fn urlencoding_decode(s: &str) -> Result<String, std::string::FromUtf8Error> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1).copied().and_then(hex), bytes.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_masked() {
        assert_eq!(masked("redis://user:s3cret@host:6379/0"), "redis://user:***@host:6379/0");
        assert_eq!(masked("rediss://:s3cret@host"), "rediss://:***@host");
        assert_eq!(masked("redis://host:6379"), "redis://host:6379");
        assert_eq!(masked("redis://user@host"), "redis://user@host");
        assert_eq!(
            masked("redis-sentinel://a:pw1@h:26379?sentinelServiceName=m&sentinelPassword=pw2&node=h2:1"),
            "redis-sentinel://a:***@h:26379?sentinelServiceName=m&sentinelPassword=***&node=h2:1"
        );
        assert_eq!(masked("user:pw@host"), "<a URL with credentials>");
        // Passwords holding what would end a URL's authority, unencoded.
        for password in ["hun/ter2", "hun?ter2", "hun#ter2", "hun@ter2", "hun:ter2", "a/b?c#d@e:f"] {
            let url = format!("redis://default:{password}@127.0.0.1:48469/0");
            let shown = masked(&url);
            assert!(!shown.contains("ter2") && !shown.contains("hun"), "{password}: {shown}");
            assert!(shown.ends_with("@127.0.0.1:48469/0"), "{password}: {shown}");
            let e = parse(&url).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(!e.contains("ter2"), "{password}: {e}");
            assert!(!scrub(&format!("failed: {url}"), &url).contains("ter2"), "{password}");
        }
        assert_eq!(
            scrub("auth failed for s3cret and s%40cret", "redis://u:s%40cret@h"),
            "auth failed for s3cret and ***"
        );
    }

    #[test]
    fn only_redis_schemes_are_taken() {
        for bad in ["http://user:s3cret@host:6379", "host:6379", "unix:///tmp/redis.sock", ""] {
            let e = parse(bad).err().expect(bad);
            assert_eq!(e.kind(), StoreErrorKind::Config);
            assert!(!e.to_string().contains("s3cret"), "{e}");
            assert!(e.to_string().contains("is not a Redis URL"), "{e}");
        }
        assert!(parse("http://user:s3cret@host:6379").err().unwrap().to_string().contains("http://user:***@host:6379"));
        assert!(!parse("redis://127.0.0.1:6379").unwrap().tls);
        assert!(parse("rediss://127.0.0.1:6379").unwrap().tls);
        assert!(parse("rediss-cluster://127.0.0.1:7000?node=127.0.0.1:7001").unwrap().tls);
        assert!(parse("rediss-sentinel://127.0.0.1:26379?sentinelServiceName=m").unwrap().tls);
        assert!(parse("valkeys://127.0.0.1:6379").unwrap().tls);
    }
}
