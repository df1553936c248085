//! The reference reader: the whole input at once, httparse for the head, RFC 9112's rules
//! written out plainly for the framing and the chunked body. Clarity, not speed.

use super::{by_name, End, Outcome};
use crate::framing::decoder::{MAX_CHUNK_LINE, MAX_TRAILERS};
use crate::framing::{Framing, MAX_HEAD};
use crate::hop;

fn tchar(b: u8) -> bool {
    matches!(b, b'0'..=b'9' | b'a'..=b'z' | b'A'..=b'Z')
        || "!#$%&'*+-.^_`|~".as_bytes().contains(&b)
}

fn vchar_or_obs(b: u8) -> bool {
    (0x21..=0x7e).contains(&b) || b >= 0x80
}

/// A cursor over one line's bytes.
struct Cur<'a> {
    s: &'a [u8],
    i: usize,
}

impl Cur<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }
    fn eat(&mut self, b: u8) -> bool {
        let hit = self.peek() == Some(b);
        self.i += usize::from(hit);
        hit
    }
    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.i += 1;
        }
    }
    fn token(&mut self) -> bool {
        let start = self.i;
        while self.peek().is_some_and(tchar) {
            self.i += 1;
        }
        self.i > start
    }
    fn quoted(&mut self) -> bool {
        if !self.eat(b'"') {
            return false;
        }
        loop {
            match self.peek() {
                None => return false,
                Some(b'"') => {
                    self.i += 1;
                    return true;
                }
                Some(b'\\') => {
                    self.i += 1;
                    match self.peek() {
                        Some(c) if c == b'\t' || c == b' ' || vchar_or_obs(c) => self.i += 1,
                        _ => return false,
                    }
                }
                Some(c) if c == b'\t' || c == b' ' || (vchar_or_obs(c) && c != b'\\') => {
                    self.i += 1
                }
                Some(_) => return false,
            }
        }
    }
    fn done(&self) -> bool {
        self.i == self.s.len()
    }
}

/// `chunk-size [ chunk-ext ]`, RFC 9112 §7.1, read the plain way.
fn ref_chunk_size(line: &[u8]) -> Option<u64> {
    let mut c = Cur { s: line, i: 0 };
    let mut size: u128 = 0;
    let mut digits = 0;
    while let Some(d) = c.peek().and_then(|b| (b as char).to_digit(16)) {
        size = size * 16 + u128::from(d);
        if size > u128::from(u64::MAX) {
            return None;
        }
        digits += 1;
        c.i += 1;
    }
    if digits == 0 {
        return None;
    }
    while !c.done() {
        c.ws();
        if !c.eat(b';') {
            return None;
        }
        c.ws();
        if !c.token() {
            return None;
        }
        let before = c.i;
        c.ws();
        if c.eat(b'=') {
            c.ws();
            if !(c.token() || c.quoted()) {
                return None;
            }
        } else {
            c.i = before;
        }
    }
    u64::try_from(size).ok()
}

fn ref_field_line(line: &[u8]) -> bool {
    let mut c = Cur { s: line, i: 0 };
    c.token()
        && c.eat(b':')
        && line[c.i..]
            .iter()
            .all(|&b| b == b' ' || b == b'\t' || vchar_or_obs(b))
}

/// The elements of a comma-separated list field, trimmed of OWS, empty ones dropped.
fn list<'a>(fields: &'a [httparse::Header<'a>], name: &'a str) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    for f in fields.iter().filter(|f| f.name.eq_ignore_ascii_case(name)) {
        for el in f.value.split(|&b| b == b',') {
            let mut el = el;
            while let [b' ' | b'\t', tail @ ..] = el {
                el = tail;
            }
            while let [head @ .., b' ' | b'\t'] = el {
                el = head;
            }
            out.push(el);
        }
    }
    out
}

/// The head and framing of `wire`, as RFC 9112 §6.3 reads them (refusing the doubtful ones).
pub(super) fn reference(wire: &[u8]) -> Outcome {
    let mut at = 0;
    loop {
        let mut fields = [httparse::EMPTY_HEADER; 128];
        let mut resp = httparse::Response::new(&mut fields);
        let n = match resp.parse(&wire[at..]) {
            Ok(httparse::Status::Complete(n)) if n <= MAX_HEAD => n,
            Ok(httparse::Status::Partial) if wire.len() - at <= MAX_HEAD => return Outcome::NoHead,
            _ => return Outcome::BadHead,
        };
        let status = resp.code.unwrap_or(0);
        if !(100..=999).contains(&status) || status == 101 {
            return Outcome::BadHead;
        }
        if status < 200 {
            at += n;
            continue;
        }
        let version = resp.version.unwrap_or(0);
        let fields = &*resp.headers;
        let has = |name: &str| fields.iter().any(|f| f.name.eq_ignore_ascii_case(name));
        let framing = if status == 204 || status == 304 {
            Framing::Empty
        } else if has("transfer-encoding") {
            let codings: Vec<_> = list(fields, "transfer-encoding")
                .into_iter()
                .filter(|c| !c.is_empty())
                .collect();
            if version != 1
                || has("content-length")
                || codings.len() != 1
                || !codings[0].eq_ignore_ascii_case(b"chunked")
            {
                return Outcome::BadHead;
            }
            Framing::Chunked
        } else if has("content-length") {
            let mut lengths = Vec::new();
            for el in list(fields, "content-length") {
                if el.is_empty() || !el.iter().all(u8::is_ascii_digit) {
                    return Outcome::BadHead;
                }
                match std::str::from_utf8(el)
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok())
                {
                    Some(n) => lengths.push(n),
                    None => return Outcome::BadHead,
                }
            }
            if lengths.iter().any(|&n| n != lengths[0]) {
                return Outcome::BadHead;
            }
            Framing::Length(lengths[0])
        } else {
            Framing::Close
        };
        let connection = list(fields, "connection");
        let token = |t: &str| {
            connection
                .iter()
                .any(|c| c.eq_ignore_ascii_case(t.as_bytes()))
        };
        let persistent = if version == 1 {
            !token("close")
        } else {
            token("keep-alive") && !token("close")
        };
        let mut headers = Vec::new();
        for f in fields.iter().filter(|f| !hop::response(f.name)) {
            let (Ok(name), Ok(_)) = (
                http::HeaderName::from_bytes(f.name.as_bytes()),
                http::HeaderValue::from_bytes(f.value),
            ) else {
                return Outcome::BadHead;
            };
            headers.push((name.as_str().to_string(), f.value.to_vec()));
        }
        let (body, end, rest) = ref_body(framing, &wire[at + n..]);
        return Outcome::Message {
            status,
            headers: by_name(headers),
            framing,
            keep_alive: framing != Framing::Close && persistent,
            body,
            end,
            rest,
        };
    }
}

/// A body by its framing: the data, how it ended, the bytes after it.
fn ref_body(framing: Framing, data: &[u8]) -> (Vec<u8>, End, Vec<u8>) {
    match framing {
        Framing::Empty => (Vec::new(), End::Complete, data.to_vec()),
        Framing::Close => (data.to_vec(), End::Complete, Vec::new()),
        Framing::Length(n) => match usize::try_from(n) {
            Ok(n) if n <= data.len() => (data[..n].to_vec(), End::Complete, data[n..].to_vec()),
            _ => (data.to_vec(), End::Truncated, Vec::new()),
        },
        Framing::Chunked => ref_chunked(data),
    }
}

/// The next line of `data` from `i`: `Ok(Some((content, next)))`, `Ok(None)` when no LF has
/// come, an error when a LF has no CR before it or the line is longer than `max`.
fn ref_line(data: &[u8], i: usize, max: usize) -> Result<Option<(&[u8], usize)>, ()> {
    match data[i..].iter().position(|&b| b == b'\n') {
        None if data.len() - i >= max => Err(()),
        None => Ok(None),
        Some(lf) if lf + 1 > max => Err(()),
        Some(lf) if lf == 0 || data[i + lf - 1] != b'\r' => Err(()),
        Some(lf) => Ok(Some((&data[i..i + lf - 1], i + lf + 1))),
    }
}

fn ref_chunked(data: &[u8]) -> (Vec<u8>, End, Vec<u8>) {
    let mut body = Vec::new();
    let mut i = 0;
    macro_rules! end {
        ($end:expr) => {
            return (body, $end, Vec::new())
        };
    }
    loop {
        let (line, next) = match ref_line(data, i, MAX_CHUNK_LINE) {
            Ok(Some(l)) => l,
            Ok(None) => end!(End::Truncated),
            Err(()) => end!(End::Malformed),
        };
        let Some(size) = ref_chunk_size(line) else {
            end!(End::Malformed)
        };
        i = next;
        if size == 0 {
            break;
        }
        let left = data.len() - i;
        if (left as u64) < size {
            body.extend_from_slice(&data[i..]);
            end!(End::Truncated);
        }
        let size = size as usize;
        body.extend_from_slice(&data[i..i + size]);
        i += size;
        match &data[i..] {
            [] | [b'\r'] => end!(End::Truncated),
            [b'\r', b'\n', ..] => i += 2,
            _ => end!(End::Malformed),
        }
    }
    let mut seen = 0;
    loop {
        let (line, next) = match ref_line(data, i, MAX_TRAILERS - seen) {
            Ok(Some(l)) => l,
            Ok(None) => end!(End::Truncated),
            Err(()) => end!(End::Malformed),
        };
        if line.is_empty() {
            return (body, End::Complete, data[next..].to_vec());
        }
        if !ref_field_line(line) {
            end!(End::Malformed);
        }
        seen += next - i;
        i = next;
    }
}
