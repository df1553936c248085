//! HTTP/1.1 response framing for the upstream client: the head (parsed by `httparse`), then the
//! body by its length, its chunks or the end of the connection (RFC 9112 §6).

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use crate::upstream::hop;

/// Largest response head accepted.
pub const MAX_HEAD: usize = 64 * 1024;
/// Most header fields in a response head.
const MAX_HEADERS: usize = 128;
/// Longest chunk-size line (size and extensions) accepted.
const MAX_CHUNK_LINE: usize = 4 * 1024;
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
        let framing = framing(status, &fields)?;
        // A message framed by Transfer-Encoding in HTTP/1.0, or carrying both framings, is
        // read by its chunks and the connection is not reused (RFC 9112 §6.1, §6.3).
        let te = fields.has("transfer-encoding");
        let ambiguous = te && (version != Some(1) || fields.has("content-length"));
        let keep_alive = framing != Framing::Close && !ambiguous && keeps_alive(version, &fields);
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

/// RFC 9112 §6.3, for the answer to a POST.
fn framing(status: StatusCode, fields: &Fields<'_, '_>) -> Result<Framing, String> {
    if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        return Ok(Framing::Empty);
    }
    if fields.has("transfer-encoding") {
        let last = fields
            .elements("transfer-encoding")
            .filter(|c| !c.is_empty())
            .last();
        return Ok(match last {
            Some(c) if c.eq_ignore_ascii_case(b"chunked") => Framing::Chunked,
            _ => Framing::Close,
        });
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
    /// The line break after a chunk's data.
    ChunkEnd,
    Trailers,
    Close,
    Done,
}

/// The size of the chunk whose size line starts `buf`, the line removed; `None` while the line
/// is incomplete. The line must start with a hex digit and end in CRLF where `httparse` says
/// it ends; extensions are skipped.
fn chunk_size(buf: &mut BytesMut) -> Result<Option<u64>, String> {
    let invalid = || "invalid chunk size line".to_string();
    let Some(eol) = memchr::memchr(b'\n', buf) else {
        if buf.len() > MAX_CHUNK_LINE {
            return Err(invalid());
        }
        return Ok(None);
    };
    if eol >= MAX_CHUNK_LINE || !buf[0].is_ascii_hexdigit() {
        return Err(invalid());
    }
    match httparse::parse_chunk_size(&buf[..=eol]) {
        Ok(httparse::Status::Complete((len, size))) if len == eol + 1 => {
            buf.advance(len);
            Ok(Some(size))
        }
        _ => Err(invalid()),
    }
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
        loop {
            match self.state {
                State::ChunkSize => {
                    let Some(size) = chunk_size(buf)? else {
                        break;
                    };
                    self.state = if size == 0 {
                        State::Trailers
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
                    Some(b'\n') => {
                        buf.advance(1);
                        self.state = State::ChunkSize;
                    }
                    Some(b'\r') if buf.len() < 2 => break,
                    Some(b'\r') if buf[1] == b'\n' => {
                        buf.advance(2);
                        self.state = State::ChunkSize;
                    }
                    Some(_) => return Err("chunk data longer than its size".into()),
                },
                State::Trailers => {
                    // Trailer fields are read and dropped; an empty line ends the body.
                    let Some(eol) = memchr::memchr(b'\n', buf) else {
                        if buf.len() > MAX_HEAD {
                            return Err("trailers too large".into());
                        }
                        break;
                    };
                    let empty = buf[..eol].iter().all(|&b| b == b'\r');
                    buf.advance(eol + 1);
                    if empty {
                        self.state = State::Done;
                        break;
                    }
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
        let h = head("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n");
        assert_eq!(h.framing, Framing::Close);
        let h = head("HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n");
        assert_eq!(h.framing, Framing::Empty);
        let h = head("HTTP/1.1 200 OK\r\ncontent-length: 3, 3\r\n\r\n");
        assert_eq!(h.framing, Framing::Length(3));

        // Chunked in HTTP/1.0, or chunked with a length too: read by chunks, not reused.
        let h =
            head("HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n");
        assert_eq!((h.framing, h.keep_alive), (Framing::Chunked, false));
        let h = head("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n");
        assert_eq!((h.framing, h.keep_alive), (Framing::Chunked, false));
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
        let h = parse(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\xC2\x85\r\n\r\n").unwrap();
        assert_eq!((h.framing, h.keep_alive), (Framing::Close, false));
        // The last coding decides, whatever bytes it holds.
        let h = parse(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntransfer-encoding: gzip\xFF\r\n\r\n",
        )
        .unwrap();
        assert_eq!((h.framing, h.keep_alive), (Framing::Close, false));
        // Tabs and spaces around elements, empty elements, any ASCII case.
        let h = parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip ,\t CHUNKED\t,\r\nconnection: ,Close\r\n\r\n").unwrap();
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
