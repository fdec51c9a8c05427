//! Keys built from templates: literal text and values, each value escaped so that two distinct
//! lists of values can never produce the same key, and an empty value refused unless allowed.

use std::fmt::{self, Display, Write as _};

use crate::error::Error;

/// The character that starts an escape (`%` and two hex digits per byte).
const ESCAPE: char = '%';

/// Builds a key from a template's literal text and its values, as the `#[idempotent]`
/// attribute does for `key = "pay:{cb.provider}:{cb.txn_id}"`.
///
/// Each value is written with `Display`, and every character of it that is `%` or one of
/// `reserved` is escaped as `%` and the two hex digits of each of its UTF-8 bytes. `reserved`
/// holds the first character of the literal text after each value that another value follows
/// (`:` for `pay:{cb.provider}:{cb.txn_id}`): a reader finds where each value ends at the first
/// such character that is not escaped, so the key reads back one way only. The literal parts
/// stay readable in `redis-cli` and ordinary values are written as they are: provider
/// `stripe:x` with transaction `y` gives `pay:stripe%3Ax:y`, provider `stripe` with
/// transaction `x:y` gives `pay:stripe:x%3Ay`. (This needs literal text between any two values,
/// not starting with `%`; the attribute checks both at compile time.)
///
/// A value that writes nothing is refused with [`Error::InvalidKey`] naming its placeholder
/// (every call with an empty transaction id would otherwise share one key), unless it is added
/// with [`value_may_be_empty`](Self::value_may_be_empty) (`{name?}` in a template).
///
/// ```
/// use idempotency::{Error, KeyBuilder};
///
/// let key = |provider: &str, txn: &str| {
///     KeyBuilder::new("pay:{provider}:{txn}", ":")
///         .text("pay:")
///         .value("provider", &provider)
///         .text(":")
///         .value("txn", &txn)
///         .finish()
/// };
/// assert_eq!(key("stripe", "txn_1").unwrap(), "pay:stripe:txn_1");
/// assert_ne!(key("stripe:x", "y").unwrap(), key("stripe", "x:y").unwrap());
/// assert!(matches!(key("stripe", ""), Err(Error::InvalidKey { .. })));
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct KeyBuilder {
    template: &'static str,
    reserved: &'static str,
    key: String,
    empty: Option<&'static str>,
}

impl KeyBuilder {
    /// A key for `template` (kept for error messages), whose literal text uses the characters
    /// of `reserved` (`%` is always escaped).
    pub fn new(template: &'static str, reserved: &'static str) -> Self {
        KeyBuilder { template, reserved, key: String::with_capacity(template.len() + 16), empty: None }
    }

    /// Literal text, written as it is.
    pub fn text(mut self, text: &str) -> Self {
        self.key.push_str(text);
        self
    }

    /// The value of placeholder `name`, escaped; an empty value makes [`finish`](Self::finish)
    /// fail.
    pub fn value(mut self, name: &'static str, value: &dyn Display) -> Self {
        if !self.write(value) && self.empty.is_none() {
            self.empty = Some(name);
        }
        self
    }

    /// The value of a placeholder that may be empty (`{name?}`), escaped.
    pub fn value_may_be_empty(mut self, value: &dyn Display) -> Self {
        self.write(value);
        self
    }

    /// The key, or [`Error::InvalidKey`] naming the first placeholder whose value was empty.
    pub fn finish(self) -> Result<String, Error> {
        self.build().map_err(|(key, reason)| Error::InvalidKey { key, reason })
    }

    /// The key, or the template and why it could not be built.
    pub(crate) fn build(self) -> Result<String, (String, String)> {
        match self.empty {
            None => Ok(self.key),
            Some(name) => Err((
                self.template.to_owned(),
                format!(
                    "the value of `{{{name}}}` is empty, so every such call would share one key \
                     (write `{{{name}?}}` in the template if an empty value is meant)"
                ),
            )),
        }
    }

    /// Writes `value` escaped; whether it wrote anything.
    fn write(&mut self, value: &dyn Display) -> bool {
        let before = self.key.len();
        let mut out = Escaper { key: &mut self.key, reserved: self.reserved };
        // Writing into a String does not fail; a `Display` impl that fails leaves what it wrote.
        let _ = write!(out, "{value}");
        self.key.len() > before
    }
}

/// Escapes what is written into it.
struct Escaper<'a> {
    key: &'a mut String,
    reserved: &'a str,
}

impl Escaper<'_> {
    fn reserved(&self, c: char) -> bool {
        c == ESCAPE || self.reserved.contains(c)
    }
}

impl fmt::Write for Escaper<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if !s.chars().any(|c| self.reserved(c)) {
            self.key.push_str(s);
            return Ok(());
        }
        const HEX: &[u8; 16] = b"0123456789ABCDEF";
        for c in s.chars() {
            if self.reserved(c) {
                for &b in c.encode_utf8(&mut [0; 4]).as_bytes() {
                    self.key.push(ESCAPE);
                    self.key.push(char::from(HEX[usize::from(b >> 4)]));
                    self.key.push(char::from(HEX[usize::from(b & 15)]));
                }
            } else {
                self.key.push(c);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pay(provider: &str, txn: &str) -> Result<String, Error> {
        KeyBuilder::new("pay:{p}:{t}", ":").text("pay:").value("p", &provider).text(":").value("t", &txn).finish()
    }

    #[test]
    fn separators_in_values_are_escaped() {
        assert_eq!(pay("stripe", "txn_1").unwrap(), "pay:stripe:txn_1");
        assert_eq!(pay("stripe:x", "y").unwrap(), "pay:stripe%3Ax:y");
        assert_eq!(pay("stripe", "x:y").unwrap(), "pay:stripe:x%3Ay");
        assert_eq!(pay("100%", "é:").unwrap(), "pay:100%25:é%3A");
        // A reserved character outside ASCII is escaped byte by byte.
        let k = KeyBuilder::new("{a}→{b}", "→").value("a", &"x→").text("→").value("b", &"y").finish();
        assert_eq!(k.unwrap(), "x%E2%86%92→y");
    }

    #[test]
    fn empty_values_are_refused_unless_allowed() {
        let e = pay("stripe", "").unwrap_err();
        assert!(
            matches!(&e, Error::InvalidKey { key, reason } if key == "pay:{p}:{t}" && reason.contains("`{t}`")),
            "{e}"
        );
        let k = KeyBuilder::new("a:{n?}", ":").text("a:").value_may_be_empty(&"").finish();
        assert_eq!(k.unwrap(), "a:");
    }
}
