//! The head of a request to a backend, as written on the connection: its request line, a
//! `Host`, the caller's fields but the hop-by-hop ones, and the body's own length.

use std::fmt::Write as _;

use bytes::{BufMut, Bytes, BytesMut};
use http::HeaderMap;

use super::hop;

/// The request head: `METHOD path HTTP/1.1`, the headers but the hop-by-hop ones (`Host` and
/// the length written anew), the body's length when there is a body.
pub(super) fn request_head(
    method: &[u8],
    authority: &str,
    path: &str,
    headers: &HeaderMap,
    body_len: Option<usize>,
) -> Bytes {
    let mut head = BytesMut::with_capacity(128 + path.len() + headers.len() * 48);
    head.put_slice(method);
    head.put_slice(path.as_bytes());
    head.put_slice(b" HTTP/1.1\r\nhost: ");
    head.put_slice(authority.as_bytes());
    head.put_slice(b"\r\n");
    for (name, value) in headers {
        if hop::request(name) {
            continue;
        }
        head.put_slice(name.as_str().as_bytes());
        head.put_slice(b": ");
        head.put_slice(value.as_bytes());
        head.put_slice(b"\r\n");
    }
    if let Some(len) = body_len {
        head.put_slice(b"content-length: ");
        let _ = write!(head, "{len}");
        head.put_slice(b"\r\n");
    }
    head.put_slice(b"\r\n");
    head.freeze()
}

#[cfg(test)]
mod tests {
    use http::{header, HeaderValue};

    use super::*;

    /// What the backend receives: the path, a host, the caller's headers but the hop-by-hop
    /// ones, and the body's real length.
    #[tokio::test]
    async fn the_request_head_is_well_formed() {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("999"));
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k"));
        h.insert(header::HOST, HeaderValue::from_static("proxy:1"));
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        h.insert(
            hop::PROXY_CONNECTION,
            HeaderValue::from_static("keep-alive"),
        );
        let head = request_head(b"POST ", "b:1", "/v1/chat/completions?x=1", &h, Some(42));
        let head = std::str::from_utf8(&head).unwrap();
        assert!(head.starts_with("POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: b:1\r\n"));
        assert!(head.contains("\r\nauthorization: Bearer k\r\n"));
        assert!(head.ends_with("\r\ncontent-length: 42\r\n\r\n"));
        assert!(!head.contains("999") && !head.contains("close"));
        assert!(!head.contains("proxy:1") && !head.contains("trailers"));
        assert!(!head.contains("keep-alive"));
    }

    /// A GET's head: no body, so no length.
    #[test]
    fn a_get_head_has_no_length() {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k"));
        let head = request_head(b"GET ", "b:1", "/health", &h, None);
        assert_eq!(
            std::str::from_utf8(&head).unwrap(),
            "GET /health HTTP/1.1\r\nhost: b:1\r\nauthorization: Bearer k\r\n\r\n"
        );
    }
}
