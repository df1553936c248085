//! HTTP/1.1 response framing for the upstream client: the head (parsed by `httparse`, here), then the
//! body by its length, its chunks or the end of the connection (RFC 9112 §6; [`decoder`]).
//!
//! Strict wherever leniency could change where a body ends: a head with both framings, a
//! transfer coding other than `chunked` alone, or differing lengths is refused; every
//! chunk-size line, chunk and trailer line must end in CRLF and follow its grammar.

mod decoder;
mod error;
#[cfg(test)]
mod fuzz;
mod syntax;

pub(crate) use decoder::Decoder;
pub use error::FramingError;

use bytes::{Buf, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use crate::hop;

/// Largest response head accepted.
pub(crate) const MAX_HEAD: usize = 64 * 1024;
/// Most header fields in a response head.
const MAX_HEADERS: usize = 128;
/// Room in an answer's header map for the fields added to it before it goes to a client
/// (the served alias, the request id, and a stream's `X-Accel-Buffering` and
/// `Cache-Control`), so that adding them does not grow the map.
const ADDED_FIELDS: usize = 4;

/// How a response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body (204, 304).
    Empty,
    Length(u64),
    Chunked,
    /// Until the backend closes the connection.
    Close,
}

/// A parsed response head.
#[derive(Debug)]
pub(crate) struct Head {
    pub(crate) status: StatusCode,
    /// The fields but the hop-by-hop ones ([`hop::response`]: framing, connection options,
    /// and the like).
    /// `Connection` stays, for the proxy to drop it and the fields it names once it has read
    /// what it needs of them.
    pub(crate) headers: HeaderMap,
    pub(crate) framing: Framing,
    /// The connection may carry another request once this body has been read.
    pub(crate) keep_alive: bool,
}

/// The final response head at the start of `buf`, skipping interim (1xx) responses; `None`
/// while it is incomplete. A complete head is split off `buf`, and header values are slices of
/// it (no copy).
pub(crate) fn parse_head(buf: &mut BytesMut) -> Result<Option<Head>, FramingError> {
    loop {
        // Left uninitialised: httparse writes the fields it finds (no 4 KiB of zeroes per
        // response).
        let mut fields =
            [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut []);
        let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut resp,
            buf,
            &mut fields,
        );
        let len = match parsed {
            // However the head arrived: at once or in pieces.
            Ok(httparse::Status::Complete(len)) if len > MAX_HEAD => {
                return Err(FramingError::HeadTooLarge)
            }
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
                return Err(FramingError::HeadTooLarge)
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => return Err(FramingError::Head(e)),
        };
        let code = resp.code.unwrap_or_default();
        let status = StatusCode::from_u16(code).map_err(|_| FramingError::Status(code))?;
        if status.is_informational() {
            if status == StatusCode::SWITCHING_PROTOCOLS {
                return Err(FramingError::SwitchedProtocols);
            }
            buf.advance(len);
            continue;
        }
        let version = resp.version;
        let fields = Fields(resp.headers);
        let framing = framing(status, version, &fields)?;
        let keep_alive = framing != Framing::Close && keeps_alive(version, &fields);
        // Where each field handed on has its name and value in `buf`, to slice them once it
        // is frozen.
        let base = buf.as_ptr() as usize;
        let at = |s: &[u8]| (s.as_ptr() as usize - base, s.len());
        let spans: Vec<_> = fields
            .0
            .iter()
            .filter(|f| !hop::response(f.name))
            .map(|f| (at(f.name.as_bytes()), at(f.value)))
            .collect();
        let raw = buf.split_to(len).freeze();
        let mut headers = HeaderMap::with_capacity(spans.len() + ADDED_FIELDS);
        for ((n, nl), (v, vl)) in spans {
            let name = HeaderName::from_bytes(&raw[n..n + nl]).map_err(|_| {
                FramingError::FieldName(String::from_utf8_lossy(&raw[n..n + nl]).into_owned())
            })?;
            let value = HeaderValue::from_maybe_shared(raw.slice(v..v + vl))
                .map_err(|_| FramingError::FieldValue(name.clone()))?;
            headers.append(name, value);
        }
        return Ok(Some(Head {
            status,
            headers,
            framing,
            keep_alive,
        }));
    }
}

/// The fields of a head as `httparse` found them.
struct Fields<'h, 'b>(&'h [httparse::Header<'b>]);

impl Fields<'_, '_> {
    /// The comma-separated elements of every field called `name` (ASCII case ignored), as
    /// bytes without the whitespace around them: a byte that is not ASCII never matches a
    /// token or a digit.
    fn elements<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.0
            .iter()
            .filter(move |f| f.name.eq_ignore_ascii_case(name))
            .flat_map(|f| f.value.split(|b| *b == b','))
            .map(<[u8]>::trim_ascii)
    }

    fn has(&self, name: &str) -> bool {
        self.0.iter().any(|f| f.name.eq_ignore_ascii_case(name))
    }
}

/// RFC 9112 §6.3, for the answer to a POST. Where the RFC lets a recipient read on through a
/// doubtful framing (both framings, TE in HTTP/1.0, a coding the proxy cannot remove) the
/// answer is refused: it is a backend's fault, and reading it one way or another could hand
/// the client a body cut elsewhere than the backend meant.
fn framing(
    status: StatusCode,
    version: Option<u8>,
    fields: &Fields<'_, '_>,
) -> Result<Framing, FramingError> {
    if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        return Ok(Framing::Empty);
    }
    if fields.has("transfer-encoding") {
        if version != Some(1) {
            return Err(FramingError::CodingInHttp10);
        }
        if fields.has("content-length") {
            return Err(FramingError::BothFramings);
        }
        // Chunked exactly once and last, with no coding under it: other codings would reach
        // the client undecoded and unlabelled (transfer-encoding is hop-by-hop).
        let mut codings = fields
            .elements("transfer-encoding")
            .filter(|c| !c.is_empty());
        return match (codings.next(), codings.next()) {
            (Some(c), None) if c.eq_ignore_ascii_case(b"chunked") => Ok(Framing::Chunked),
            _ => Err(FramingError::Coding),
        };
    }
    let mut length = None;
    for part in fields.elements("content-length") {
        let n: u64 = Some(part)
            .filter(|p| !p.is_empty() && p.iter().all(u8::is_ascii_digit))
            .and_then(|p| std::str::from_utf8(p).ok()?.parse().ok())
            .ok_or_else(|| FramingError::Length(String::from_utf8_lossy(part).into_owned()))?;
        if length.is_some_and(|l| l != n) {
            return Err(FramingError::Lengths);
        }
        length = Some(n);
    }
    Ok(length.map_or(Framing::Close, Framing::Length))
}

fn keeps_alive(version: Option<u8>, fields: &Fields<'_, '_>) -> bool {
    let has = |token: &str| {
        fields
            .elements("connection")
            .any(|t| t.eq_ignore_ascii_case(token.as_bytes()))
    };
    match version {
        Some(1) => !has("close"),
        _ => has("keep-alive") && !has("close"),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn head(text: &str) -> Head {
        let mut buf = BytesMut::from(text);
        let h = parse_head(&mut buf).unwrap().unwrap();
        assert!(buf.is_empty(), "{buf:?} left of {text}");
        h
    }

    #[test]
    fn heads_and_their_framing() {
        let h = head("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert_eq!(h.status, 200);
        assert_eq!(h.framing, Framing::Chunked);
        assert!(h.keep_alive);
        assert_eq!(h.headers["content-type"], "text/event-stream");

        let h = head("HTTP/1.1 400 Bad Request\r\ncontent-length: 12\r\nconnection: close\r\n\r\n");
        assert_eq!(
            (h.status.as_u16(), h.framing, h.keep_alive),
            (400, Framing::Length(12), false)
        );

        let h = head("HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\n");
        assert!(!h.keep_alive);
        let h = head("HTTP/1.0 200 OK\r\ncontent-length: 2\r\nConnection: Keep-Alive\r\n\r\n");
        assert!(h.keep_alive);

        let h = head("HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!((h.framing, h.keep_alive), (Framing::Close, false));
        let h = head("HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n");
        assert_eq!(h.framing, Framing::Empty);
        let h = head("HTTP/1.1 200 OK\r\ncontent-length: 3, 3\r\n\r\n");
        assert_eq!(h.framing, Framing::Length(3));
        let h = head("HTTP/1.1 200 OK\r\ncontent-length: 3\r\nContent-Length: 003\r\n\r\n");
        assert_eq!(h.framing, Framing::Length(3));
        let h =
            head("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntransfer-encoding: ,\r\n\r\n");
        assert_eq!(h.framing, Framing::Chunked);
    }

    /// Regression: framings the RFC lets a recipient read on through are refused.
    #[test]
    fn doubtful_framings_are_refused() {
        for bad in [
            // Chunked in HTTP/1.0, or chunked with a length too (RFC 9112 §6.1, §6.3).
            "HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n",
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n",
            // A coding the proxy cannot remove, before or instead of chunked; chunked twice.
            "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
            "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\ntransfer-encoding: identity\r\n\r\n",
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked;x=1\r\n\r\n",
            "HTTP/1.1 200 OK\r\ntransfer-encoding: \r\n\r\n",
            // Lengths that differ, or are not digits, or do not fit.
            "HTTP/1.1 200 OK\r\ncontent-length: 3, 4\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 3,\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: \r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 0x10\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 1 2\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 18446744073709551616\r\n\r\n",
        ] {
            assert!(parse_head(&mut BytesMut::from(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn interim_responses_are_skipped() {
        let h = head("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: x\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n");
        assert_eq!((h.status.as_u16(), h.framing), (200, Framing::Length(0)));
        assert!(!h.headers.contains_key("link"));
    }

    #[test]
    fn bad_heads_are_errors() {
        for bad in [
            "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: +5\r\n\r\n",
            "HTTP/1.1 101 Switching Protocols\r\n\r\n",
            "SSH-2.0-OpenSSH\r\n\r\n",
        ] {
            assert!(parse_head(&mut BytesMut::from(bad)).is_err(), "{bad}");
        }
        assert!(parse_head(&mut BytesMut::from(&vec![b'a'; MAX_HEAD + 1][..])).is_err());
    }

    #[test]
    fn a_head_arriving_in_pieces_is_incomplete_until_its_end() {
        let text = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        for cut in 0..text.len() - 2 {
            let mut part = BytesMut::from(&text[..cut]);
            assert!(parse_head(&mut part).unwrap().is_none(), "{cut}");
            assert_eq!(part.len(), cut, "an incomplete head stays in the buffer");
        }
        let mut buf = BytesMut::from(&text[..]);
        let h = parse_head(&mut buf).unwrap().unwrap();
        assert_eq!((h.status.as_u16(), &buf[..]), (200, &b"ok"[..]));
        assert!(!h.headers.contains_key("content-length"));
    }

    #[test]
    fn hop_by_hop_fields_are_consumed() {
        // A real llama-server's head (../shared/realworld capture).
        let h = head("HTTP/1.1 200 OK\r\nServer: llama.cpp\r\nAccess-Control-Allow-Origin: \r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: 693\r\nKeep-Alive: timeout=5, max=100\r\n\r\n");
        let names: Vec<&str> = h.headers.keys().map(|n| n.as_str()).collect();
        assert_eq!(names, ["server", "content-type"]);
        assert_eq!((h.framing, h.keep_alive), (Framing::Length(693), true));

        // `Connection` and the fields it names stay, for the proxy to read and then drop.
        let h = head("HTTP/1.1 200 OK\r\nConnection: X-Trace, keep-alive\r\nx-trace: 1\r\nTE: trailers\r\nTrailer: x\r\nUpgrade: h2c\r\nProxy-Connection: keep-alive\r\nX-Kept: yes\r\ntransfer-encoding: chunked\r\n\r\n");
        let names: Vec<&str> = h.headers.keys().map(|n| n.as_str()).collect();
        assert_eq!(names, ["connection", "x-trace", "x-kept"]);
        assert_eq!((h.framing, h.keep_alive), (Framing::Chunked, true));
    }

    #[test]
    fn the_map_has_room_for_the_fields_the_proxy_adds() {
        // The simulator's head: three fields handed on.
        let h = head("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nserver: sim\r\ndate: x\r\ncontent-length: 2\r\n\r\n");
        assert_eq!(h.headers.len(), 3);
        assert!(h.headers.capacity() >= 3 + ADDED_FIELDS);
    }

    #[test]
    fn framing_values_are_ascii_tokens_and_digits() {
        let parse = |wire: &[u8]| parse_head(&mut BytesMut::from(wire)).map(|h| h.unwrap());
        // A space that is not ASCII is not whitespace around a length or a coding.
        assert!(parse(b"HTTP/1.1 200 OK\r\ncontent-length: 2\xC2\xA0\r\n\r\n").is_err());
        assert!(parse(b"HTTP/1.1 200 OK\r\ncontent-length: \xE3\x80\x802\r\n\r\n").is_err());
        assert!(parse(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\xC2\x85\r\n\r\n").is_err());
        assert!(parse(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntransfer-encoding: gzip\xFF\r\n\r\n",
        )
        .is_err());
        // Tabs and spaces around elements, empty elements, any ASCII case.
        let h = parse(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: ,\t CHUNKED\t,\r\nconnection: ,Close\r\n\r\n",
        )
        .unwrap();
        assert_eq!((h.framing, h.keep_alive), (Framing::Chunked, false));
    }
}
