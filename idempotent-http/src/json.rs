//! The canonical form of a JSON body, for fingerprints that ignore what a client's serializer
//! is free to change on a retry: object key order and whitespace (see
//! [`IdempotencyLayer::json_fingerprint`](crate::IdempotencyLayer::json_fingerprint)).
//!
//! The form is RFC 8785's (JSON Canonicalization Scheme) in all but numbers: no whitespace;
//! object members sorted by their names' UTF-16 code units; strings with escapes decoded and
//! written back with the fewest (`\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t`, `\u00xx` for the other
//! control characters, everything else as itself). Numbers are kept as the client wrote them,
//! where RFC 8785 rewrites them through a 64-bit float: two decimal amounts that one float
//! cannot tell apart (`0.1` and `0.1000000000000000055511151231257827`, or integers past 2^53)
//! stay two requests, so `1.0` and `1` are two requests too. A body that is not strict JSON
//! (RFC 8259), names a member twice (`{"a":1,"a":2}`, `{"a":1,"\u0061":2}`: parsers disagree on
//! which one wins), holds a lone surrogate escape, or nests deeper than [`MAX_DEPTH`] has no
//! canonical form: its bytes are fingerprinted as they are.

/// The deepest nesting of arrays and objects given a canonical form (a deeper body is
/// fingerprinted as its bytes).
pub const MAX_DEPTH: usize = 64;

/// A parsed value, borrowing numbers from the body.
enum Json<'a> {
    Literal(&'static str),
    Number(&'a str),
    String(String),
    Array(Vec<Json<'a>>),
    Object(Vec<(String, Json<'a>)>),
}

/// The canonical form of `body`, or `None` when it has none (not strict JSON, a member named
/// twice, a lone surrogate, nested deeper than [`MAX_DEPTH`]).
///
/// ```
/// use idempotent_http::json::canonical;
///
/// let sent = r#"{ "amount": 1250, "currency": "EUR", "note": "caf\u00e9" }"#;
/// let retried = r#"{"note":"café","currency":"EUR","amount":1250}"#;
/// assert_eq!(canonical(sent.as_bytes()), canonical(retried.as_bytes()));
/// let form = canonical(sent.as_bytes()).unwrap();
/// assert_eq!(form, r#"{"amount":1250,"currency":"EUR","note":"café"}"#.as_bytes());
/// assert_ne!(canonical(br#"{"amount":1250.0}"#), canonical(br#"{"amount":1250}"#));
/// assert_eq!(canonical(br#"{"a":1,"a":2}"#), None);
/// ```
pub fn canonical(body: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(body).ok()?;
    let mut parser = Parser { text, at: 0 };
    parser.skip_whitespace();
    let value = parser.value(0)?;
    parser.skip_whitespace();
    if parser.at != text.len() {
        return None;
    }
    let mut out = Vec::with_capacity(body.len());
    write(&value, &mut out);
    Some(out)
}

/// Whether a request's `Content-Type` is JSON: `application/json` or `application/<x>+json`,
/// parameters aside, in any case. Two `Content-Type` fields are not: which one the handler
/// reads is its own business.
pub(crate) fn is_json(headers: &http::HeaderMap) -> bool {
    let mut types = headers.get_all(http::header::CONTENT_TYPE).iter();
    let (Some(only), None) = (types.next(), types.next()) else { return false };
    let Ok(text) = only.to_str() else { return false };
    let essence = text.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    match essence.strip_prefix("application/") {
        Some(subtype) => subtype == "json" || (subtype.len() > 5 && subtype.ends_with("+json")),
        None => false,
    }
}

struct Parser<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn value(&mut self, depth: usize) -> Option<Json<'a>> {
        match self.peek()? {
            b'{' => self.object(depth + 1),
            b'[' => self.array(depth + 1),
            b'"' => self.string().map(Json::String),
            b'-' | b'0'..=b'9' => self.number().map(Json::Number),
            _ => {
                let literal = ["true", "false", "null"].into_iter().find(|l| self.text[self.at..].starts_with(l))?;
                self.at += literal.len();
                Some(Json::Literal(literal))
            }
        }
    }

    fn object(&mut self, depth: usize) -> Option<Json<'a>> {
        let mut members = self.sequence(b'{', b'}', depth, |p| {
            let name = p.string()?;
            p.skip_whitespace();
            p.eat(b':')?;
            p.skip_whitespace();
            Some((name, p.value(depth)?))
        })?;
        members.sort_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
        if members.windows(2).any(|pair| pair[0].0 == pair[1].0) {
            return None;
        }
        Some(Json::Object(members))
    }

    fn array(&mut self, depth: usize) -> Option<Json<'a>> {
        self.sequence(b'[', b']', depth, |p| p.value(depth)).map(Json::Array)
    }

    /// `open`, items read by `item` and separated by commas, `close`: an object's members or an
    /// array's items, at `depth` (none past [`MAX_DEPTH`]).
    fn sequence<T>(
        &mut self,
        open: u8,
        close: u8,
        depth: usize,
        mut item: impl FnMut(&mut Self) -> Option<T>,
    ) -> Option<Vec<T>> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.eat(open)?;
        let mut items = Vec::new();
        self.skip_whitespace();
        if self.eat(close).is_some() {
            return Some(items);
        }
        loop {
            self.skip_whitespace();
            items.push(item(self)?);
            self.skip_whitespace();
            if self.eat(b',').is_none() {
                self.eat(close)?;
                return Some(items);
            }
        }
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`, as written.
    fn number(&mut self) -> Option<&'a str> {
        let start = self.at;
        let _ = self.eat(b'-');
        match self.peek()? {
            b'0' => self.at += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.eat(b'.').is_some() {
            self.some_digits()?;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.at += 1;
            }
            self.some_digits()?;
        }
        Some(&self.text[start..self.at])
    }

    fn digits(&mut self) {
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.at += 1;
        }
    }

    fn some_digits(&mut self) -> Option<()> {
        let start = self.at;
        self.digits();
        (self.at > start).then_some(())
    }

    /// A string, its escapes decoded.
    fn string(&mut self) -> Option<String> {
        self.eat(b'"')?;
        let mut out = String::new();
        loop {
            let rest = &self.text[self.at..];
            // Up to the next quote, backslash or control character, as it is.
            let plain = rest.find(|c: char| c == '"' || c == '\\' || c < ' ').unwrap_or(rest.len());
            out.push_str(&rest[..plain]);
            self.at += plain;
            match self.peek()? {
                b'"' => {
                    self.at += 1;
                    return Some(out);
                }
                b'\\' => {
                    self.at += 1;
                    let escaped = self.peek()?;
                    self.at += 1;
                    out.push(match escaped {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => self.unicode_escape()?,
                        _ => return None,
                    });
                }
                // A control character must be escaped.
                _ => return None,
            }
        }
    }

    /// After `\u`: four hex digits, and a second escape for a surrogate pair.
    fn unicode_escape(&mut self) -> Option<char> {
        let high = self.hex4()?;
        if !(0xD800..0xE000).contains(&high) {
            return char::from_u32(high);
        }
        // A high surrogate must be followed by an escaped low one.
        if high >= 0xDC00 || !self.text[self.at..].starts_with("\\u") {
            return None;
        }
        self.at += 2;
        let low = self.hex4()?;
        if !(0xDC00..0xE000).contains(&low) {
            return None;
        }
        char::from_u32(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))
    }

    fn hex4(&mut self) -> Option<u32> {
        let digits = self.text.get(self.at..self.at + 4)?;
        if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        self.at += 4;
        u32::from_str_radix(digits, 16).ok()
    }
}

fn write(value: &Json<'_>, out: &mut Vec<u8>) {
    match value {
        Json::Literal(text) | Json::Number(text) => out.extend_from_slice(text.as_bytes()),
        Json::String(text) => write_string(text, out),
        Json::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(item, out);
            }
            out.push(b']');
        }
        Json::Object(members) => {
            out.push(b'{');
            for (i, (name, value)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(name, out);
                out.push(b':');
                write(value, out);
            }
            out.push(b'}');
        }
    }
}

fn write_string(text: &str, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    for &b in text.as_bytes() {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0..=0x1f => {
                out.extend_from_slice(&[b'\\', b'u', b'0', b'0', HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]])
            }
            _ => out.push(b),
        }
    }
    out.push(b'"');
}

/// Fuzzing entry point (not part of the API): a canonical form is its own canonical form, and
/// means what the body meant (the same value to `serde_json`, numbers compared as parsed, where
/// `serde_json` reads the body at all: it refuses numbers past a float's range).
#[doc(hidden)]
pub fn fuzz(data: &[u8]) {
    let Some(form) = canonical(data) else { return };
    assert_eq!(canonical(&form).as_deref(), Some(&form[..]), "not stable: {:?}", String::from_utf8_lossy(data));
    if let Ok(meant) = serde_json::from_slice::<serde_json::Value>(data) {
        let means: serde_json::Value = serde_json::from_slice(&form).expect("a canonical form reads as JSON");
        assert_eq!(meant, means, "{:?} became {:?}", String::from_utf8_lossy(data), String::from_utf8_lossy(&form));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(body: &str) -> Option<String> {
        canonical(body.as_bytes()).map(|f| String::from_utf8(f).unwrap())
    }

    #[test]
    fn order_and_whitespace_are_left_out() {
        let a = form("{\n  \"b\": [1, 2, {\"y\": null, \"x\": true}],\n  \"a\": \"s\"\n}\n").unwrap();
        assert_eq!(a, r#"{"a":"s","b":[1,2,{"x":true,"y":null}]}"#);
        assert_eq!(form(r#"{"a":"s","b":[1,2,{"x":true,"y":null}]}"#).unwrap(), a);
        // Arrays keep their order: it is meaning.
        assert_ne!(form("[1,2]"), form("[2,1]"));
        assert_eq!(form(" 17 ").unwrap(), "17");
        assert_eq!(form("{}").unwrap(), "{}");
        assert_eq!(form("[ ]").unwrap(), "[]");
    }

    #[test]
    fn strings_are_written_with_the_fewest_escapes() {
        assert_eq!(
            form(r#""caf\u00e9 \/ \" \\ \t \u0001 \ud83d\ude00""#).unwrap(),
            "\"café / \\\" \\\\ \\t \\u0001 😀\""
        );
        assert_eq!(form("\"\u{7f}\u{e9}\"").unwrap(), "\"\u{7f}\u{e9}\"");
    }

    #[test]
    fn members_sort_by_utf16_code_units_as_rfc_8785_says() {
        // U+1F600 sorts after U+E000 in UTF-8 byte order (F0.. against EE..) but before it in
        // UTF-16 (its surrogate pair starts at 0xD83D): RFC 8785's order is UTF-16's.
        assert_eq!(form("{\"\u{E000}\":2,\"\u{1F600}\":1}").unwrap(), "{\"\u{1F600}\":1,\"\u{E000}\":2}");
        // RFC 8785's own example of member order (section 3.2.3).
        let sorted = form(concat!(
            r#"{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With Dagesh","1":"One","#,
            r#""\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis"}"#
        ))
        .unwrap();
        let order = [
            "Carriage Return",
            "One",
            "Control",
            "Latin Small Letter O With Diaeresis",
            "Euro Sign",
            "Emoji: Grinning Face",
            "Hebrew Letter Dalet With Dagesh",
        ];
        let positions: Vec<usize> = order.iter().map(|name| sorted.find(name).unwrap()).collect();
        assert!(positions.windows(2).all(|w| w[0] < w[1]), "{sorted}");
    }

    #[test]
    fn numbers_stay_as_written() {
        assert_eq!(
            form("[1.0, 1, 1e2, -0, 0.1000000000000000055511151231257827]").unwrap(),
            "[1.0,1,1e2,-0,0.1000000000000000055511151231257827]"
        );
        assert_ne!(form("12345678901234567890123"), form("12345678901234567890124"));
    }

    #[test]
    fn what_is_not_strict_json_or_is_ambiguous_has_no_form() {
        for bad in [
            "",
            " ",
            "{",
            "[1,]",
            "{\"a\":1,}",
            "{a:1}",
            "'a'",
            "01",
            "1.",
            ".5",
            "-",
            "1e",
            "+1",
            "NaN",
            "nul",
            "truex",
            "\"\\x\"",
            "\"a\nb\"",
            "\"\\ud800\"",
            "\"\\udc00\"",
            "\"\\ud800\\u0041\"",
            "\"\\u12\"",
            "1 2",
            "{\"a\":1}x",
            "{\"a\":1,\"a\":2}",
            "{\"a\":1,\"\\u0061\":2}",
            "[1]\u{0}",
        ] {
            assert_eq!(form(bad), None, "{bad:?}");
        }
        assert_eq!(canonical(b"\"\xff\""), None);
        let deep = |n: usize| "[".repeat(n) + &"]".repeat(n);
        assert!(form(&deep(MAX_DEPTH)).is_some());
        assert_eq!(form(&deep(MAX_DEPTH + 1)), None);
        assert_eq!(form(&deep(100_000)), None);
    }

    #[test]
    fn json_media_types_are_told_apart() {
        let with = |values: &[&str]| {
            let mut headers = http::HeaderMap::new();
            for v in values {
                headers.append(http::header::CONTENT_TYPE, v.parse().unwrap());
            }
            is_json(&headers)
        };
        for yes in [
            "application/json",
            "Application/JSON; charset=utf-8",
            "application/merge-patch+json",
            " application/json ",
        ] {
            assert!(with(&[yes]), "{yes}");
        }
        for no in ["text/plain", "application/jsonx", "application/+json", "text/json", "multipart/form-data", ""] {
            assert!(!with(&[no]), "{no}");
        }
        assert!(!with(&[]));
        assert!(!with(&["application/json", "text/plain"]));
    }

    #[test]
    fn the_fuzz_property_holds_on_a_few_bodies() {
        for body in
            [r#"{"b":{"d":[1,{"f":"\u0000"}],"c":-1.5e-3},"a":[]}"#, "[\"\\u2028\", \"\\ud834\\udd1e\"]", "true"]
        {
            fuzz(body.as_bytes());
        }
    }
}
