//! The `Idempotency-Key` header: parsing its value, a Structured Field string (RFC 8941), into
//! the key, and writing a key as such a value.

use std::fmt;

use http::header::{GetAll, HeaderValue};
use http::HeaderName;

/// The header's name, `Idempotency-Key`.
pub static IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The longest key accepted by default, in bytes (after unescaping).
pub const DEFAULT_MAX_KEY_BYTES: usize = 255;

/// Why an `Idempotency-Key` header was refused.
///
/// ```
/// use idempotent_http::header::KeyError;
///
/// let e = KeyError::TooLong { len: 300, max: 255 };
/// assert_eq!(e.to_string(), "the Idempotency-Key is 300 bytes long, over the 255-byte limit");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The header is absent.
    Missing,
    /// The header appears more than once.
    Repeated,
    /// The value is not a Structured Field string: unquoted, a bad escape, a character outside
    /// printable ASCII, or text after the closing quote.
    Malformed(String),
    /// The key is the empty string.
    Empty,
    /// The key is longer than the limit.
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::Missing => f.write_str("the Idempotency-Key header is missing"),
            KeyError::Repeated => f.write_str("the Idempotency-Key header appears more than once"),
            KeyError::Malformed(why) => {
                write!(f, "the Idempotency-Key header is not a structured-field string (\"...\"): {why}")
            }
            KeyError::Empty => f.write_str("the Idempotency-Key is empty"),
            KeyError::TooLong { len, max } => {
                write!(f, "the Idempotency-Key is {len} bytes long, over the {max}-byte limit")
            }
        }
    }
}

impl std::error::Error for KeyError {}

/// Reads the key from a request's `Idempotency-Key` header lines.
///
/// The value must be one Structured Field string: `"` + printable ASCII with `\"` and `\\`
/// escapes + `"`, optionally followed by parameters (`;name=value`), which are checked and
/// ignored. Returns the unescaped key.
///
/// ```
/// use http::HeaderMap;
/// use idempotent_http::header::{parse_key, KeyError, IDEMPOTENCY_KEY};
///
/// let mut headers = HeaderMap::new();
/// headers.insert(&IDEMPOTENCY_KEY, r#""8e03978e-40d5-43e8-bc93-6894a57f9324""#.parse().unwrap());
/// assert_eq!(parse_key(headers.get_all(&IDEMPOTENCY_KEY), 255).unwrap(), "8e03978e-40d5-43e8-bc93-6894a57f9324");
///
/// headers.insert(&IDEMPOTENCY_KEY, "unquoted".parse().unwrap());
/// assert!(matches!(parse_key(headers.get_all(&IDEMPOTENCY_KEY), 255), Err(KeyError::Malformed(_))));
/// ```
pub fn parse_key(values: GetAll<'_, HeaderValue>, max_bytes: usize) -> Result<String, KeyError> {
    parse_key_with(values, max_bytes, false)
}

/// Like [`parse_key`]; with `lenient`, a value that is not quoted is taken as the key itself
/// when it is a bare token (printable ASCII without spaces, quotes, commas, semicolons or
/// backslashes), as many clients send a UUID.
///
/// ```
/// use http::HeaderMap;
/// use idempotent_http::header::{parse_key_with, IDEMPOTENCY_KEY};
///
/// let mut headers = HeaderMap::new();
/// headers.insert(&IDEMPOTENCY_KEY, "8e03978e-40d5-43e8-bc93-6894a57f9324".parse().unwrap());
/// assert_eq!(parse_key_with(headers.get_all(&IDEMPOTENCY_KEY), 255, true).unwrap(), "8e03978e-40d5-43e8-bc93-6894a57f9324");
/// assert!(parse_key_with(headers.get_all(&IDEMPOTENCY_KEY), 255, false).is_err());
/// ```
pub fn parse_key_with(values: GetAll<'_, HeaderValue>, max_bytes: usize, lenient: bool) -> Result<String, KeyError> {
    let mut iter = values.iter();
    let Some(value) = iter.next() else { return Err(KeyError::Missing) };
    if iter.next().is_some() {
        return Err(KeyError::Repeated);
    }
    let raw = value.as_bytes();
    // A value far longer than any key it could hold is refused before it is read.
    if raw.len() > max_bytes.saturating_mul(2).saturating_add(64) {
        return Err(KeyError::TooLong { len: raw.len(), max: max_bytes });
    }
    let bare = |b: &[u8]| !b.is_empty() && b.iter().all(|&c| c.is_ascii_graphic() && !b"\",;\\".contains(&c));
    let key = match std::str::from_utf8(raw) {
        Ok(text) if lenient && !text.trim_start().starts_with('"') && bare(text.trim().as_bytes()) => {
            text.trim().to_owned()
        }
        _ => parse_sf_string_item(raw).map_err(KeyError::Malformed)?,
    };
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if key.len() > max_bytes {
        return Err(KeyError::TooLong { len: key.len(), max: max_bytes });
    }
    Ok(key)
}

/// Writes `key` as an `Idempotency-Key` header value (a quoted, escaped Structured Field
/// string), for clients and tests. `None` if the key has a character outside printable ASCII,
/// which a Structured Field string cannot carry.
///
/// ```
/// use idempotent_http::header::key_value;
///
/// assert_eq!(key_value("order-17").unwrap(), r#""order-17""#);
/// assert_eq!(key_value(r#"a"b\c"#).unwrap(), r#""a\"b\\c""#);
/// assert!(key_value("naïve").is_none());
/// ```
pub fn key_value(key: &str) -> Option<HeaderValue> {
    let mut out = String::with_capacity(key.len() + 2);
    out.push('"');
    for c in key.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => return None,
        }
    }
    out.push('"');
    HeaderValue::from_str(&out).ok()
}

/// Parses an Item whose bare item is a String (RFC 8941 §4.2.3 with §4.2.5), returning the
/// string. Parameters are parsed (so that malformed ones are refused) and dropped.
fn parse_sf_string_item(input: &[u8]) -> Result<String, String> {
    let mut p = Parser { input, pos: 0 };
    p.skip_sp();
    let key = p.string()?;
    p.parameters()?;
    p.skip_sp();
    if p.pos < p.input.len() {
        return Err(format!("unexpected {} after the closing quote", p.shown_here()));
    }
    Ok(key)
}

struct Parser<'a> {
    input: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.input.get(self.pos).copied()
    }

    fn skip_sp(&mut self) {
        while self.peek() == Some(b' ') {
            self.pos += 1;
        }
    }

    fn shown_here(&self) -> String {
        match self.peek() {
            Some(c) if c.is_ascii_graphic() || c == b' ' => format!("'{}' (byte {})", c as char, self.pos),
            Some(c) => format!("byte 0x{c:02x} (at {})", self.pos),
            None => "end of value".into(),
        }
    }

    /// §4.2.5: `"` chars `"`.
    fn string(&mut self) -> Result<String, String> {
        if self.peek() != Some(b'"') {
            return Err(format!("expected '\"' but found {}", self.shown_here()));
        }
        self.pos += 1;
        let mut out = String::new();
        loop {
            let Some(c) = self.peek() else { return Err("the closing quote is missing".into()) };
            match c {
                b'\\' => {
                    self.pos += 1;
                    match self.peek() {
                        Some(e @ (b'"' | b'\\')) => out.push(e as char),
                        _ => {
                            return Err(format!("a backslash may only escape '\"' or '\\', not {}", self.shown_here()))
                        }
                    }
                }
                b'"' => {
                    self.pos += 1;
                    return Ok(out);
                }
                0x20..=0x7e => out.push(c as char),
                _ => return Err(format!("{} is not printable ASCII", self.shown_here())),
            }
            self.pos += 1;
        }
    }

    /// §4.2.3.2: `*( ";" *SP key [ "=" bare-item ] )`.
    fn parameters(&mut self) -> Result<(), String> {
        while self.peek() == Some(b';') {
            self.pos += 1;
            self.skip_sp();
            self.param_key()?;
            if self.peek() == Some(b'=') {
                self.pos += 1;
                self.bare_item()?;
            }
        }
        Ok(())
    }

    fn param_key(&mut self) -> Result<(), String> {
        match self.peek() {
            Some(b'a'..=b'z' | b'*') => self.pos += 1,
            _ => return Err(format!("a parameter name must start with a-z or '*', not {}", self.shown_here())),
        }
        while matches!(self.peek(), Some(b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' | b'*')) {
            self.pos += 1;
        }
        Ok(())
    }

    /// §4.2.3.1: integer, decimal, string, token, byte sequence or boolean.
    fn bare_item(&mut self) -> Result<(), String> {
        match self.peek() {
            Some(b'"') => self.string().map(drop),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b':') => self.byte_sequence(),
            Some(b'?') => {
                self.pos += 1;
                match self.peek() {
                    Some(b'0' | b'1') => {
                        self.pos += 1;
                        Ok(())
                    }
                    _ => Err(format!("a boolean is ?0 or ?1, not {}", self.shown_here())),
                }
            }
            Some(b'A'..=b'Z' | b'a'..=b'z' | b'*') => {
                self.pos += 1;
                while matches!(self.peek(), Some(c) if is_tchar(c) || c == b':' || c == b'/') {
                    self.pos += 1;
                }
                Ok(())
            }
            _ => Err(format!("expected a parameter value but found {}", self.shown_here())),
        }
    }

    fn number(&mut self) -> Result<(), String> {
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        let start = self.pos;
        let mut dot: Option<usize> = None;
        while let Some(c) = self.peek() {
            match c {
                b'0'..=b'9' => self.pos += 1,
                b'.' if dot.is_none() && self.pos > start => {
                    dot = Some(self.pos);
                    self.pos += 1;
                }
                _ => break,
            }
        }
        let digits = self.pos - start;
        let ok = match dot {
            None => (1..=15).contains(&digits),
            Some(d) => {
                let (int, frac) = (d - start, self.pos - d - 1);
                int <= 12 && (1..=3).contains(&frac)
            }
        };
        if ok {
            Ok(())
        } else {
            Err(format!("malformed number in a parameter, before {}", self.shown_here()))
        }
    }

    fn byte_sequence(&mut self) -> Result<(), String> {
        self.pos += 1;
        while matches!(self.peek(), Some(c) if c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'=')) {
            self.pos += 1;
        }
        if self.peek() == Some(b':') {
            self.pos += 1;
            Ok(())
        } else {
            Err(format!("a byte sequence must end with ':', not {}", self.shown_here()))
        }
    }
}

/// RFC 9110 `tchar`.
fn is_tchar(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c)
}

/// Fuzzing entry point (not part of the API): `data` as one `Idempotency-Key` value, parsed
/// strictly and leniently; a key either parser returns is never empty nor over the limit.
#[doc(hidden)]
pub fn fuzz(data: &[u8]) {
    let Ok(value) = HeaderValue::from_bytes(data) else { return };
    let mut headers = http::HeaderMap::new();
    headers.insert(IDEMPOTENCY_KEY.clone(), value);
    for lenient in [false, true] {
        if let Ok(key) = parse_key_with(headers.get_all(&IDEMPOTENCY_KEY), 255, lenient) {
            assert!(!key.is_empty() && key.len() <= 255, "{key:?} from {data:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;

    fn parse(raw: &[u8]) -> Result<String, KeyError> {
        let mut headers = HeaderMap::new();
        headers.insert(&IDEMPOTENCY_KEY, HeaderValue::from_bytes(raw).unwrap());
        parse_key(headers.get_all(&IDEMPOTENCY_KEY), 16)
    }

    #[test]
    fn strings_and_escapes() {
        assert_eq!(parse(br#""abc""#).unwrap(), "abc");
        assert_eq!(parse(br#"  "a b""#).unwrap(), "a b");
        assert_eq!(parse(br#""a\"b\\c""#).unwrap(), r#"a"b\c"#);
        assert_eq!(parse(br#""k";a=1;b;c="x";d=?1;e=:AQ==:;f=tok/1;g=-1.5"#).unwrap(), "k");
    }

    #[test]
    fn malformed_values() {
        for raw in [
            &b"abc"[..],
            br#""abc"#,
            br#""a\b""#,
            br#""abc" x"#,
            br#""abc","def""#,
            br#""abc";A=1"#,
            br#""abc";a=?2"#,
            br#""abc";a=1.2345"#,
            br#""abc";a=:AQ=="#,
            b"\"caf\xc3\xa9\"",
            b"\"tab\there\"",
            b"",
        ] {
            assert!(matches!(parse(raw), Err(KeyError::Malformed(_))), "{:?}", String::from_utf8_lossy(raw));
        }
    }

    #[test]
    fn empty_long_missing_repeated() {
        assert_eq!(parse(br#""""#), Err(KeyError::Empty));
        assert_eq!(parse(br#""0123456789abcdefg""#), Err(KeyError::TooLong { len: 17, max: 16 }));
        assert_eq!(parse(br#""0123456789abcdef""#).unwrap().len(), 16);
        let mut headers = HeaderMap::new();
        assert_eq!(parse_key(headers.get_all(&IDEMPOTENCY_KEY), 16), Err(KeyError::Missing));
        headers.append(&IDEMPOTENCY_KEY, HeaderValue::from_static("\"a\""));
        headers.append(&IDEMPOTENCY_KEY, HeaderValue::from_static("\"a\""));
        assert_eq!(parse_key(headers.get_all(&IDEMPOTENCY_KEY), 16), Err(KeyError::Repeated));
    }

    #[test]
    fn lenient_takes_bare_tokens_only() {
        let lenient = |raw: &[u8]| {
            let mut headers = HeaderMap::new();
            headers.insert(&IDEMPOTENCY_KEY, HeaderValue::from_bytes(raw).unwrap());
            parse_key_with(headers.get_all(&IDEMPOTENCY_KEY), 64, true)
        };
        assert_eq!(lenient(b"8e03978e-40d5-43e8-bc93-6894a57f9324").unwrap(), "8e03978e-40d5-43e8-bc93-6894a57f9324");
        assert_eq!(lenient(br#""quoted""#).unwrap(), "quoted");
        for bad in [&b"two words"[..], b"a,b", b"a;b", br"a\b", br#"unterminated""#] {
            assert!(matches!(lenient(bad), Err(KeyError::Malformed(_))), "{:?}", String::from_utf8_lossy(bad));
        }
        assert!(
            matches!(parse(&[b'x'; 200]), Err(KeyError::TooLong { .. })),
            "an over-long raw value is refused unread"
        );
    }

    #[test]
    fn key_value_round_trips() {
        for key in ["x", r#"a"b"#, r"back\slash", "spaces and ~!"] {
            let v = key_value(key).unwrap();
            assert_eq!(parse(v.as_bytes()).unwrap(), key);
        }
    }
}
