//! The stored response: what the runtime keeps for a key (status, selected headers, body) as a
//! serde struct, and the replay built from it.

use axum::body::Body;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{response, Response, StatusCode};
use serde::{Deserialize, Serialize};

/// A response as the runtime stores it, JSON-encoded like every result: readable with
/// `redis-cli` when the body is text.
///
/// ```text
/// {"status":201,"headers":[{"name":"content-type","text":"application/json"}],"body":{"text":"{\"id\":7}"}}
/// ```
///
/// Header values and the body are kept as text when they are UTF-8 (header values: visible
/// ASCII), as base64 otherwise, so every byte comes back as it was.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredResponse {
    status: u16,
    headers: Vec<StoredHeader>,
    body: StoredBytes,
}

/// One stored header line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredHeader {
    name: String,
    #[serde(flatten)]
    value: StoredBytes,
}

impl StoredHeader {
    /// A header line, its value as text when it is visible ASCII.
    pub(crate) fn new(name: &HeaderName, value: &HeaderValue) -> Self {
        StoredHeader {
            name: name.as_str().to_owned(),
            value: StoredBytes::new(value.as_bytes(), |b| {
                std::str::from_utf8(b).ok().filter(|s| s.bytes().all(|c| c == b'\t' || (0x20..0x7f).contains(&c)))
            }),
        }
    }

    /// The line back, or why it does not decode.
    pub(crate) fn decode(&self) -> Result<(HeaderName, HeaderValue), String> {
        let name = HeaderName::from_bytes(self.name.as_bytes())
            .map_err(|e| format!("stored header name {:?}: {e}", self.name))?;
        let value = HeaderValue::from_bytes(&self.value.bytes()?)
            .map_err(|e| format!("stored value of header {:?}: {e}", self.name))?;
        Ok((name, value))
    }
}

/// Bytes as text when they are text, else base64.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum StoredBytes {
    Text(String),
    Base64(String),
}

impl StoredBytes {
    pub(crate) fn new(bytes: &[u8], text: impl Fn(&[u8]) -> Option<&str>) -> Self {
        match text(bytes) {
            Some(s) => StoredBytes::Text(s.to_owned()),
            None => StoredBytes::Base64(BASE64.encode(bytes)),
        }
    }

    pub(crate) fn bytes(&self) -> Result<Vec<u8>, String> {
        match self {
            StoredBytes::Text(s) => Ok(s.as_bytes().to_vec()),
            StoredBytes::Base64(b) => BASE64.decode(b).map_err(|e| format!("bad base64: {e}")),
        }
    }
}

/// The headers that give a body its meaning (how it is encoded, what it is, how it may be cached
/// and under which request headers): stored with every response whatever else is, since a body
/// replayed without them means something else (gzip bytes without `Content-Encoding`).
pub const MEANING_HEADERS: [HeaderName; 7] = [
    http::header::CONTENT_TYPE,
    http::header::CONTENT_ENCODING,
    http::header::CONTENT_LANGUAGE,
    http::header::CONTENT_DISPOSITION,
    http::header::CONTENT_RANGE,
    http::header::VARY,
    http::header::CACHE_CONTROL,
];

impl StoredResponse {
    /// Captures a response: its status, the headers named in `keep` and the
    /// [`MEANING_HEADERS`] (every line of each), and its body.
    pub fn capture(parts: &response::Parts, body: &[u8], keep: &[HeaderName]) -> Self {
        let extra = MEANING_HEADERS.iter().filter(|name| !keep.contains(name));
        let headers = keep
            .iter()
            .chain(extra)
            .flat_map(|name| parts.headers.get_all(name).iter().map(move |v| (name, v)))
            .map(|(name, value)| StoredHeader::new(name, value))
            .collect();
        StoredResponse {
            status: parts.status.as_u16(),
            headers,
            body: StoredBytes::new(body, |b| std::str::from_utf8(b).ok()),
        }
    }

    /// The status code.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The body.
    pub fn body(&self) -> Result<Bytes, String> {
        self.body.bytes().map(Bytes::from)
    }

    /// The stored header lines, decoded.
    pub fn headers(&self) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
        self.headers.iter().map(StoredHeader::decode).collect()
    }

    /// The replay: the stored status, headers and body, plus the `marker` header.
    pub fn replay(&self, marker: &HeaderName) -> Result<Response<Body>, String> {
        let status =
            StatusCode::from_u16(self.status).map_err(|_| format!("stored status {} is not a status", self.status))?;
        let mut response = Response::new(Body::from(self.body()?));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        for (name, value) in self.headers()? {
            headers.append(name, value);
        }
        headers.insert(marker.clone(), HeaderValue::from_static("true"));
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::{CONTENT_TYPE, LOCATION, SET_COOKIE};

    fn parts(f: impl FnOnce(&mut response::Builder)) -> response::Parts {
        let mut b = Response::builder().status(201);
        f(&mut b);
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn round_trips_text_and_binary() {
        let p = parts(|b| {
            let h = b.headers_mut().unwrap();
            h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            h.append(LOCATION, HeaderValue::from_static("/orders/7"));
            h.insert(SET_COOKIE, HeaderValue::from_static("secret=1"));
            h.insert("x-bin", HeaderValue::from_bytes(b"caf\xe9").unwrap());
        });
        let keep = [CONTENT_TYPE, LOCATION, HeaderName::from_static("x-bin")];
        for body in [&b"{\"id\":7}"[..], b"\x00\xff\xfe", b""] {
            let stored = StoredResponse::capture(&p, body, &keep);
            let json = serde_json::to_string(&stored).unwrap();
            let back: StoredResponse = serde_json::from_str(&json).unwrap();
            assert_eq!(back, stored);
            let r = back.replay(&HeaderName::from_static("idempotent-replayed")).unwrap();
            assert_eq!(r.status(), 201);
            assert_eq!(r.headers()[CONTENT_TYPE], "application/json");
            assert_eq!(r.headers()["x-bin"].as_bytes(), b"caf\xe9");
            assert_eq!(r.headers()["idempotent-replayed"], "true");
            assert!(r.headers().get(SET_COOKIE).is_none(), "not in the kept set");
            assert_eq!(back.body().unwrap(), body);
        }
        let text = serde_json::to_string(&StoredResponse::capture(&p, b"{\"id\":7}", &keep)).unwrap();
        assert!(text.contains(r#""body":{"text":"{\"id\":7}"}"#), "{text}");
    }

    #[test]
    fn bad_stored_bytes_are_errors_not_panics() {
        let bad: StoredResponse =
            serde_json::from_str(r#"{"status":200,"headers":[{"name":"bad name","text":"x"}],"body":{"base64":"!!"}}"#)
                .unwrap();
        assert!(bad.body().is_err());
        assert!(bad.headers().is_err());
        let bad: StoredResponse = serde_json::from_str(r#"{"status":1000,"headers":[],"body":{"text":""}}"#).unwrap();
        assert!(bad.replay(&HeaderName::from_static("x")).is_err());
    }
}
