//! Store URLs shown without their secrets: in errors, `Debug` and logs, a URL's password is
//! `***`, whatever characters it holds. The user info runs from `://` to the *last* `@`, so a
//! password may hold `/`, `?`, `#`, `@` or `:` unencoded (base64 secrets have `/`); when it holds
//! any of the first three, the whole user info is masked, the user name too. Query parameters that
//! carry a secret (`sentinelPassword`, `password`) are masked as well.

/// `url` with its secrets replaced by `***`; `params` names the query parameters that carry one.
/// Anything with credentials that is not a URL is shown as `<a URL with credentials>`.
pub(crate) fn masked(url: &str, params: &[&str]) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return if url.contains('@') { "<a URL with credentials>".to_owned() } else { url.to_owned() };
    };
    let (userinfo, after) = match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let userinfo = match userinfo {
        None => String::new(),
        Some(info) if info.contains(['/', '?', '#']) => "***@".to_owned(),
        Some(info) => match info.split_once(':') {
            Some((user, _password)) => format!("{user}:***@"),
            None => format!("{info}@"),
        },
    };
    let mut tail = after.to_owned();
    for param in params {
        let name = format!("{param}=");
        if let Some(at) = tail.find(&name) {
            let value = at + name.len();
            let end = tail[value..].find('&').map_or(tail.len(), |e| value + e);
            tail.replace_range(value..end, "***");
        }
    }
    format!("{scheme}://{userinfo}{tail}")
}

/// The secrets of `url` as written: its password (from the first `:` after `://` to the last
/// `@`), the whole user info when it holds `/`, `?` or `#`, and the values of `params`.
pub(crate) fn secrets(url: &str, params: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    let Some((_, rest)) = url.split_once("://") else { return found };
    if let Some(at) = rest.rfind('@') {
        let info = &rest[..at];
        if let Some((_, password)) = info.split_once(':') {
            found.push(password.to_owned());
        }
        if info.contains(['/', '?', '#']) {
            found.push(info.to_owned());
        }
    }
    for param in params {
        let name = format!("{param}=");
        if let Some(at) = rest.find(&name) {
            let value = &rest[at + name.len()..];
            found.push(value.split('&').next().unwrap_or("").to_owned());
        }
    }
    found.retain(|s| !s.is_empty());
    found
}

/// `message` with every one of `secrets` in it replaced by `***` (the longest first, so that a
/// secret holding another is masked whole).
pub(crate) fn scrub(message: &str, mut secrets: Vec<String>) -> String {
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets.iter().filter(|s| !s.is_empty()).fold(message.to_owned(), |out, secret| out.replace(secret.as_str(), "***"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_masked_whatever_they_hold() {
        assert_eq!(masked("redis://user:s3cret@host:6379/0", &[]), "redis://user:***@host:6379/0");
        assert_eq!(masked("redis://user@host", &[]), "redis://user@host");
        assert_eq!(
            masked("pg://db/app?user=a&password=s3cret&x=1", &["password"]),
            "pg://db/app?user=a&password=***&x=1"
        );
        assert_eq!(masked("user:pw@host", &[]), "<a URL with credentials>");
        for password in ["hun/ter2", "hun?ter2", "hun#ter2", "hun@ter2", "hun:ter2"] {
            let url = format!("postgres://app:{password}@db:5432/app");
            let shown = masked(&url, &["password"]);
            assert!(!shown.contains("ter2") && shown.ends_with("@db:5432/app"), "{shown}");
            let scrubbed = scrub(&format!("cannot reach {url}"), secrets(&url, &["password"]));
            assert!(!scrubbed.contains("ter2"), "{scrubbed}");
        }
    }
}
