//! HTTP/1.1 response framing for the upstream client: the head (parsed by `httparse`), then the
//! body by its length, its chunks or the end of the connection (RFC 9112 §6).
//!
//! Strict wherever leniency could change where a body ends: a head with both framings, a
//! transfer coding other than `chunked` alone, or differing lengths is refused; every
//! chunk-size line, chunk and trailer line must end in CRLF and follow its grammar.

#[cfg(test)]
mod fuzz;
mod syntax;

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use crate::upstream::hop;

/// Largest response head accepted.
pub const MAX_HEAD: usize = 64 * 1024;
/// Most header fields in a response head.
const MAX_HEADERS: usize = 128;
/// Longest chunk-size line (size, extensions and CRLF) accepted.
const MAX_CHUNK_LINE: usize = 4 * 1024;
/// Largest trailer section (its last, empty line included) accepted.
const MAX_TRAILERS: usize = MAX_HEAD;
/// Room in an answer's header map for the fields added to it before it goes to a client
/// (the served alias, the request id, and a stream's `X-Accel-Buffering` and
/// `Cache-Control`), so that adding them does not grow the map.
const ADDED_FIELDS: usize = 4;

/// How a response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body (204, 304).
    Empty,
    Length(u64),
    Chunked,
    /// Until the backend closes the connection.
    Close,
}

/// A parsed response head.
#[derive(Debug)]
pub struct Head {
    pub status: StatusCode,
    /// The fields but the hop-by-hop ones ([`hop::response`]: framing, connection options,
    /// and the like).
    /// `Connection` stays, for the proxy to drop it and the fields it names once it has read
    /// what it needs of them.
    pub headers: HeaderMap,
    pub framing: Framing,
    /// The connection may carry another request once this body has been read.
    pub keep_alive: bool,
}

/// The final response head at the start of `buf`, skipping interim (1xx) responses; `None`
/// while it is incomplete. A complete head is split off `buf`, and header values are slices of
/// it (no copy).
pub fn parse_head(buf: &mut BytesMut) -> Result<Option<Head>, String> {
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
                return Err(format!("response head larger than {MAX_HEAD} bytes"))
            }
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
                return Err(format!("response head larger than {MAX_HEAD} bytes"))
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => return Err(format!("invalid response head: {e}")),
        };
        let code = resp.code.unwrap_or_default();
        let status =
            StatusCode::from_u16(code).map_err(|_| format!("invalid response status {code}"))?;
        if status.is_informational() {
            if status == StatusCode::SWITCHING_PROTOCOLS {
                return Err("backend switched protocols".into());
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
                format!(
                    "invalid header name {:?}",
                    String::from_utf8_lossy(&raw[n..n + nl])
                )
            })?;
            let value = HeaderValue::from_maybe_shared(raw.slice(v..v + vl))
                .map_err(|_| format!("invalid value of header {name}"))?;
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
) -> Result<Framing, String> {
    if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        return Ok(Framing::Empty);
    }
    if fields.has("transfer-encoding") {
        if version != Some(1) {
            return Err("transfer-encoding in an HTTP/1.0 response".into());
        }
        if fields.has("content-length") {
            return Err("both transfer-encoding and content-length".into());
        }
        // Chunked exactly once and last, with no coding under it: other codings would reach
        // the client undecoded and unlabelled (transfer-encoding is hop-by-hop).
        let mut codings = fields
            .elements("transfer-encoding")
            .filter(|c| !c.is_empty());
        return match (codings.next(), codings.next()) {
            (Some(c), None) if c.eq_ignore_ascii_case(b"chunked") => Ok(Framing::Chunked),
            _ => Err("transfer-encoding other than chunked alone".into()),
        };
    }
    let mut length = None;
    for part in fields.elements("content-length") {
        let n: u64 = Some(part)
            .filter(|p| !p.is_empty() && p.iter().all(u8::is_ascii_digit))
            .and_then(|p| std::str::from_utf8(p).ok()?.parse().ok())
            .ok_or_else(|| format!("invalid content-length {:?}", String::from_utf8_lossy(part)))?;
        if length.is_some_and(|l| l != n) {
            return Err("conflicting content-length values".into());
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Length(u64),
    ChunkSize,
    ChunkData(u64),
    /// The CRLF after a chunk's data.
    ChunkEnd,
    /// The trailer section, with how many of its bytes were read.
    Trailers(usize),
    Close,
    Done,
}

/// The line at the start of `buf` without its CRLF, and its length with it; `None` while no
/// LF has come. A LF without a CR before it ends no line: that is an error.
fn line(buf: &[u8], what: &str) -> Result<Option<(usize, usize)>, String> {
    match memchr::memchr(b'\n', buf) {
        None => Ok(None),
        Some(eol) if eol > 0 && buf[eol - 1] == b'\r' => Ok(Some((eol - 1, eol + 1))),
        Some(_) => Err(format!("{what} not ended by CRLF")),
    }
}

/// The size of the chunk whose size line starts `buf`, the line removed; `None` while the line
/// is incomplete. The line is `1*HEXDIG [ chunk-ext ] CRLF` (RFC 9112 §7.1), the size within
/// u64, the extensions well-formed (and ignored).
fn chunk_size(buf: &mut BytesMut) -> Result<Option<u64>, String> {
    let invalid = || "invalid chunk size line".to_string();
    let Some((content, len)) = line(buf, "chunk size line")? else {
        if buf.len() >= MAX_CHUNK_LINE {
            return Err(invalid());
        }
        return Ok(None);
    };
    if len > MAX_CHUNK_LINE {
        return Err(invalid());
    }
    let size = syntax::chunk_size(&buf[..content]).ok_or_else(invalid)?;
    buf.advance(len);
    Ok(Some(size))
}

/// Turns the bytes read after the head into body data.
#[derive(Debug)]
pub struct Decoder {
    state: State,
}

impl Decoder {
    pub fn new(framing: Framing) -> Decoder {
        let state = match framing {
            Framing::Empty | Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Length(n),
            Framing::Chunked => State::ChunkSize,
            Framing::Close => State::Close,
        };
        Decoder { state }
    }

    /// The whole body has been decoded.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Take the body data `buf` holds, removing what it consumed (framing included); bytes
    /// after the body's end stay in `buf`. A length-delimited or close-delimited body comes out
    /// as a slice of `buf`; the data of every complete chunk in `buf` comes out in one piece.
    /// Malformed framing is an error once the data before it has come out, so the data a body
    /// yields does not depend on how its bytes were split into reads.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Bytes>, String> {
        match self.state {
            State::Done => return Ok(None),
            State::Length(n) => {
                let take = usize::try_from(n).unwrap_or(usize::MAX).min(buf.len());
                if take == 0 {
                    return Ok(None);
                }
                let left = n - take as u64;
                self.state = if left == 0 {
                    State::Done
                } else {
                    State::Length(left)
                };
                return Ok(Some(buf.split_to(take).freeze()));
            }
            State::Close => {
                return Ok((!buf.is_empty()).then(|| buf.split().freeze()));
            }
            _ => {}
        }
        let mut out: Option<BytesMut> = None;
        // Data decoded before an error goes out first; the error (which consumed nothing)
        // comes again on the next call.
        let fail = |out: Option<BytesMut>, e: String| match out {
            Some(data) => Ok(Some(data.freeze())),
            None => Err(e),
        };
        loop {
            match self.state {
                State::ChunkSize => {
                    let size = match chunk_size(buf) {
                        Ok(Some(size)) => size,
                        Ok(None) => break,
                        Err(e) => return fail(out, e),
                    };
                    self.state = if size == 0 {
                        State::Trailers(0)
                    } else {
                        State::ChunkData(size)
                    };
                }
                State::ChunkData(n) => {
                    let take = usize::try_from(n).unwrap_or(usize::MAX).min(buf.len());
                    if take == 0 {
                        break;
                    }
                    out.get_or_insert_with(|| BytesMut::with_capacity(buf.len()))
                        .extend_from_slice(&buf[..take]);
                    buf.advance(take);
                    let left = n - take as u64;
                    self.state = if left == 0 {
                        State::ChunkEnd
                    } else {
                        State::ChunkData(left)
                    };
                }
                State::ChunkEnd => match buf.first() {
                    None => break,
                    Some(b'\r') if buf.len() < 2 => break,
                    Some(b'\r') if buf[1] == b'\n' => {
                        buf.advance(2);
                        self.state = State::ChunkSize;
                    }
                    Some(_) => return fail(out, "chunk data not followed by CRLF".into()),
                },
                State::Trailers(seen) => {
                    // Trailer fields are checked and dropped; an empty line ends the body.
                    let (content, len) = match line(buf, "trailer line") {
                        Ok(Some(l)) if seen + l.1 <= MAX_TRAILERS => l,
                        Ok(None) if seen + buf.len() < MAX_TRAILERS => break,
                        Ok(_) => return fail(out, "trailers too large".into()),
                        Err(e) => return fail(out, e),
                    };
                    if content > 0 && !syntax::field_line(&buf[..content]) {
                        return fail(out, "invalid trailer field".into());
                    }
                    buf.advance(len);
                    if content == 0 {
                        self.state = State::Done;
                        break;
                    }
                    self.state = State::Trailers(seen + len);
                }
                State::Length(_) | State::Close | State::Done => break,
            }
        }
        Ok(out.map(BytesMut::freeze))
    }

    /// The connection ended: fine for a close-delimited body (which is then complete), an
    /// error for any other body not yet complete.
    pub fn eof(&mut self) -> Result<(), String> {
        match self.state {
            State::Done => Ok(()),
            State::Close => {
                self.state = State::Done;
                Ok(())
            }
            _ => Err("connection closed before the body was complete".into()),
        }
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

    /// Feed `wire` to a decoder in pieces of `step` bytes; the body and what was left over.
    fn decode_in_steps(framing: Framing, wire: &[u8], step: usize) -> (Vec<u8>, Vec<u8>, bool) {
        let mut d = Decoder::new(framing);
        let mut buf = BytesMut::new();
        let mut body = Vec::new();
        for piece in wire.chunks(step) {
            buf.extend_from_slice(piece);
            while let Some(data) = d.decode(&mut buf).unwrap() {
                body.extend_from_slice(&data);
            }
        }
        (body, buf.to_vec(), d.is_done())
    }

    #[test]
    fn chunked_bodies_decode_whatever_the_read_boundaries() {
        let wire = b"7\r\ndata: 1\r\n10;ext=\"a b\"\r\n\n\ndata: 22222222\r\n2\r\n\n\n\r\n0\r\nx-trailer: 1\r\n\r\nNEXT";
        let want = b"data: 1\n\ndata: 22222222\n\n";
        for step in 1..=wire.len() {
            let (body, rest, done) = decode_in_steps(Framing::Chunked, wire, step);
            assert_eq!(body, want, "step {step}");
            assert_eq!(rest, b"NEXT", "step {step}");
            assert!(done);
        }
    }

    /// Decode all of `wire` given at once: the data before the first error, and the error.
    fn decode_until_error(wire: &[u8]) -> (Vec<u8>, Option<String>) {
        let mut d = Decoder::new(Framing::Chunked);
        let mut buf = BytesMut::from(wire);
        let mut body = Vec::new();
        loop {
            match d.decode(&mut buf) {
                Ok(Some(data)) => body.extend_from_slice(&data),
                Ok(None) => return (body, None),
                Err(e) => return (body, Some(e)),
            }
        }
    }

    /// Regression: a bare LF after chunk data was taken for CRLF, and a trailer
    /// line of only CRs ended the body.
    #[test]
    fn chunked_framing_is_strict() {
        for (wire, error) in [
            (
                &b"5\r\nhello\n0\r\n\r\n"[..],
                "chunk data not followed by CRLF",
            ),
            (b"5\r\nhello\r0\r\n\r\n", "chunk data not followed by CRLF"),
            (
                b"5\nhello\r\n0\r\n\r\n",
                "chunk size line not ended by CRLF",
            ),
            (
                b"5\r\nhello\r\n0\n\r\n",
                "chunk size line not ended by CRLF",
            ),
            (b"5\r\r\nhello\r\n", "invalid chunk size line"),
            (b"5 \r\nhello\r\n", "invalid chunk size line"),
            (b"5;a=\"b\r\nhello\r\n", "invalid chunk size line"),
            (b"5;=x\r\nhello\r\n", "invalid chunk size line"),
            (b"10000000000000000\r\n", "invalid chunk size line"),
            (b"5\r\nhello\r\n0\r\n\r\r\n", "invalid trailer field"),
            (b"5\r\nhello\r\n0\r\n\r\r\r\n", "invalid trailer field"),
            (b"5\r\nhello\r\n0\r\n\n", "trailer line not ended by CRLF"),
            (
                b"5\r\nhello\r\n0\r\nx: 1\n\r\n",
                "trailer line not ended by CRLF",
            ),
            (
                b"5\r\nhello\r\n0\r\n folded\r\n\r\n",
                "invalid trailer field",
            ),
            (
                b"5\r\nhello\r\n0\r\nno colon\r\n\r\n",
                "invalid trailer field",
            ),
        ] {
            let (body, e) = decode_until_error(wire);
            assert_eq!(
                e.as_deref(),
                Some(error),
                "{:?}",
                String::from_utf8_lossy(wire)
            );
            // What came before the error went out, once.
            let want: &[u8] = if wire.starts_with(b"5\r\nhello") {
                b"hello"
            } else {
                b""
            };
            assert_eq!(body, want, "{:?}", String::from_utf8_lossy(wire));
        }
        // What the RFC allows: leading zeros, extensions with quoted values, trailers.
        let (body, e) = decode_until_error(
            b"005 ; a = \"q; \\\" x\" ;b\r\nhello\r\n000;z=1\r\nx-sum: abc\r\ny:\r\n\r\n",
        );
        assert_eq!((body.as_slice(), e), (&b"hello"[..], None));
    }

    /// The trailer section is bounded like a head, over all its lines.
    #[test]
    fn trailers_are_bounded() {
        let mut wire = b"0\r\n".to_vec();
        while wire.len() < MAX_TRAILERS + 100 {
            wire.extend_from_slice(b"x-pad: 0123456789\r\n");
        }
        let (_, e) = decode_until_error(&wire);
        assert_eq!(e.as_deref(), Some("trailers too large"));
        let mut d = Decoder::new(Framing::Chunked);
        let mut buf = BytesMut::from(&b"0\r\nx: "[..]);
        buf.extend_from_slice(&vec![b'a'; MAX_TRAILERS]);
        assert!(d.decode(&mut buf).is_err());
    }

    #[test]
    fn every_complete_chunk_in_the_buffer_comes_out_in_one_piece() {
        let mut d = Decoder::new(Framing::Chunked);
        let mut buf = BytesMut::from(&b"3\r\nabc\r\n3\r\ndef\r\n3\r\ngh"[..]);
        assert_eq!(d.decode(&mut buf).unwrap().unwrap(), "abcdefgh");
        assert!(buf.is_empty());
        assert_eq!(d.decode(&mut buf).unwrap(), None);
        assert!(d.eof().is_err());
    }

    #[test]
    fn length_and_close_bodies() {
        for step in 1..8 {
            let (body, rest, done) = decode_in_steps(Framing::Length(5), b"hello!!", step);
            assert_eq!(
                (body.as_slice(), rest.as_slice(), done),
                (&b"hello"[..], &b"!!"[..], true)
            );
        }
        let (body, _, done) = decode_in_steps(Framing::Close, b"until the end", 3);
        assert_eq!((body.as_slice(), done), (&b"until the end"[..], false));
        let mut d = Decoder::new(Framing::Close);
        assert!(d.eof().is_ok() && d.is_done());
        assert!(Decoder::new(Framing::Empty).is_done());
        assert!(Decoder::new(Framing::Length(0)).is_done());
        assert!(Decoder::new(Framing::Length(3)).eof().is_err());
    }

    #[test]
    fn bad_chunks_are_errors() {
        for bad in [
            &b"zz\r\n"[..],
            b"3\r\nabcd\r\n",
            b"3\r\nabcX",
            // a size line without digits is not a last chunk
            b"3\r\nabc\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            b"3\r\nabc\r\n;x\r\n",
            // a bare LF inside the extensions does not end the line somewhere later
            b"5;a\nhello\r\n0\r\n\r\n",
        ] {
            let mut d = Decoder::new(Framing::Chunked);
            let mut buf = BytesMut::from(bad);
            let mut r = d.decode(&mut buf);
            if r.is_ok() {
                r = d.decode(&mut buf);
            }
            assert!(r.is_err(), "{bad:?}");
        }
        // A size line that never ends is refused once it is longer than any real one.
        let mut d = Decoder::new(Framing::Chunked);
        let mut buf = BytesMut::from(&b"5;"[..]);
        buf.extend_from_slice(&vec![b'x'; MAX_CHUNK_LINE]);
        assert!(d.decode(&mut buf).is_err());
    }
}
