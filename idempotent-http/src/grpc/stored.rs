//! A gRPC response as the runtime stores it: its initial metadata, its message bytes as framed
//! on the wire, and its trailers (status, message, trailing metadata); and the body that plays
//! them back.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{HeaderMap, CONTENT_LENGTH};
use http::{response, Response, StatusCode};
use http_body::{Body as HttpBody, Frame, SizeHint};
use serde::{Deserialize, Serialize};

use crate::stored::{StoredBytes, StoredHeader};

/// A unary call's response as stored: JSON like every result.
///
/// ```text
/// {"headers":[{"name":"content-type","text":"application/grpc"}],"body":{"base64":"AAAAAAIIBw=="},"trailers":[{"name":"grpc-status","text":"0"}]}
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredCall {
    headers: Vec<StoredHeader>,
    body: StoredBytes,
    trailers: Vec<StoredHeader>,
}

impl StoredCall {
    /// Captures a response: every header but the framing ones, its body, its trailers.
    pub(crate) fn capture(parts: &response::Parts, body: &[u8], trailers: Option<&HeaderMap>) -> Self {
        let lines = |map: &HeaderMap| -> Vec<StoredHeader> {
            map.iter().filter(|(name, _)| *name != CONTENT_LENGTH).map(|(n, v)| StoredHeader::new(n, v)).collect()
        };
        StoredCall {
            headers: lines(&parts.headers),
            body: StoredBytes::new(body, |_| None),
            trailers: trailers.map(lines).unwrap_or_default(),
        }
    }

    /// The response played back: its headers plus `marker: true`, its body and trailers.
    pub(crate) fn replay(&self, marker: &'static str) -> Result<Response<Frames>, String> {
        let decode = |lines: &[StoredHeader]| -> Result<HeaderMap, String> {
            let mut map = HeaderMap::new();
            for line in lines {
                let (name, value) = line.decode()?;
                map.append(name, value);
            }
            Ok(map)
        };
        // A trailers-only response (a status without a message) has its status in its headers
        // and no trailers: played back the same way.
        let trailers = decode(&self.trailers)?;
        let trailers = (!trailers.is_empty()).then_some(trailers);
        let mut response = Response::new(Frames::new(Bytes::from(self.body.bytes()?), trailers));
        *response.status_mut() = StatusCode::OK;
        *response.headers_mut() = decode(&self.headers)?;
        response.headers_mut().insert(marker, http::HeaderValue::from_static("true"));
        Ok(response)
    }
}

/// A body of one data frame and its trailers: a collected response, or a replayed one.
#[derive(Debug)]
pub struct Frames {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl Frames {
    pub(crate) fn new(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        Frames { data: (!data.is_empty()).then_some(data), trailers }
    }
}

impl HttpBody for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}
