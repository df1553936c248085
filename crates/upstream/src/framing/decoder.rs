//! A response body's bytes into its data: by its length, its chunks (their sizes, extensions,
//! CRLFs and trailers checked, RFC 9112 §7) or the end of the connection.

use bytes::{Buf, Bytes, BytesMut};

use super::{syntax, Framing, FramingError, MAX_HEAD};

/// Longest chunk-size line (size, extensions and CRLF) accepted.
pub(super) const MAX_CHUNK_LINE: usize = 4 * 1024;
/// Largest trailer section (its last, empty line included) accepted.
pub(super) const MAX_TRAILERS: usize = MAX_HEAD;

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
fn line(buf: &[u8], what: &'static str) -> Result<Option<(usize, usize)>, FramingError> {
    match memchr::memchr(b'\n', buf) {
        None => Ok(None),
        Some(eol) if eol > 0 && buf[eol - 1] == b'\r' => Ok(Some((eol - 1, eol + 1))),
        Some(_) => Err(FramingError::NoCrlf(what)),
    }
}

/// The size of the chunk whose size line starts `buf`, the line removed; `None` while the line
/// is incomplete. The line is `1*HEXDIG [ chunk-ext ] CRLF` (RFC 9112 §7.1), the size within
/// u64, the extensions well-formed (and ignored).
fn chunk_size(buf: &mut BytesMut) -> Result<Option<u64>, FramingError> {
    let invalid = || FramingError::ChunkSize;
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
pub(crate) struct Decoder {
    state: State,
}

impl Decoder {
    pub(crate) fn new(framing: Framing) -> Decoder {
        let state = match framing {
            Framing::Empty | Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Length(n),
            Framing::Chunked => State::ChunkSize,
            Framing::Close => State::Close,
        };
        Decoder { state }
    }

    /// The whole body has been decoded.
    pub(crate) fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Take the body data `buf` holds, removing what it consumed (framing included); bytes
    /// after the body's end stay in `buf`. A length-delimited or close-delimited body comes out
    /// as a slice of `buf`; the data of every complete chunk in `buf` comes out in one piece.
    /// Malformed framing is an error once the data before it has come out, so the data a body
    /// yields does not depend on how its bytes were split into reads.
    pub(crate) fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Bytes>, FramingError> {
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
        let fail = |out: Option<BytesMut>, e: FramingError| match out {
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
                    Some(_) => return fail(out, FramingError::ChunkEnd),
                },
                State::Trailers(seen) => {
                    // Trailer fields are checked and dropped; an empty line ends the body.
                    let (content, len) = match line(buf, "trailer line") {
                        Ok(Some(l)) if seen + l.1 <= MAX_TRAILERS => l,
                        Ok(None) if seen + buf.len() < MAX_TRAILERS => break,
                        Ok(_) => return fail(out, FramingError::TrailersTooLarge),
                        Err(e) => return fail(out, e),
                    };
                    if content > 0 && !syntax::field_line(&buf[..content]) {
                        return fail(out, FramingError::Trailer);
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
    pub(crate) fn eof(&mut self) -> Result<(), FramingError> {
        match self.state {
            State::Done => Ok(()),
            State::Close => {
                self.state = State::Done;
                Ok(())
            }
            _ => Err(FramingError::Cut),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

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
                Err(e) => return (body, Some(e.to_string())),
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
