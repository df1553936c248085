//! The byte rules of a chunked body's framing lines (RFC 9112 §7.1, RFC 9110 §5.5, §5.6): a
//! chunk-size line with its extensions, and a trailer field line. Pure, no allocation.

/// `tchar` (RFC 9110 §5.6.2).
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// `s` without its leading spaces and tabs (`BWS`, `OWS`).
fn skip_ws(s: &[u8]) -> &[u8] {
    let n = s.iter().take_while(|&&b| b == b' ' || b == b'\t').count();
    &s[n..]
}

/// The length of the token that starts `s` (0 if none does).
fn token_len(s: &[u8]) -> usize {
    s.iter().take_while(|&&b| is_tchar(b)).count()
}

/// The length of the quoted-string that starts `s`, its quotes included (RFC 9110 §5.6.4).
fn quoted_len(s: &[u8]) -> Option<usize> {
    if s.first() != Some(&b'"') {
        return None;
    }
    let mut i = 1;
    loop {
        match *s.get(i)? {
            b'"' => return Some(i + 1),
            b'\\' => {
                let c = *s.get(i + 1)?;
                if !(c == b'\t' || c == b' ' || c.is_ascii_graphic() || c >= 0x80) {
                    return None;
                }
                i += 2;
            }
            c if c == b'\t'
                || c == b' '
                || c == 0x21
                || (0x23..=0x7e).contains(&c)
                || c >= 0x80 =>
            {
                i += 1;
            }
            _ => return None,
        }
    }
}

/// Whether `s` is a whole `chunk-ext`: `*( BWS ";" BWS name [ BWS "=" BWS value ] )`, the
/// name a token, the value a token or a quoted-string (RFC 9112 §7.1.1).
fn extensions(mut s: &[u8]) -> bool {
    while !s.is_empty() {
        let Some(rest) = skip_ws(s).strip_prefix(b";") else {
            return false;
        };
        s = skip_ws(rest);
        let name = token_len(s);
        if name == 0 {
            return false;
        }
        s = &s[name..];
        if let Some(rest) = skip_ws(s).strip_prefix(b"=") {
            s = skip_ws(rest);
            let value = match token_len(s) {
                0 => match quoted_len(s) {
                    Some(n) => n,
                    None => return false,
                },
                n => n,
            };
            s = &s[value..];
        }
    }
    true
}

/// The size a chunk-size line declares (`line` without its CRLF): `1*HEXDIG [ chunk-ext ]`.
/// `None` for any other line, or a size past `u64::MAX`.
pub(crate) fn chunk_size(line: &[u8]) -> Option<u64> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        return None;
    }
    let mut size = 0u64;
    for &b in &line[..digits] {
        let d = (b as char).to_digit(16)?;
        size = size.checked_mul(16)?.checked_add(u64::from(d))?;
    }
    extensions(&line[digits..]).then_some(size)
}

/// Whether `line` (without its CRLF) is a field line: `field-name ":" OWS field-value OWS`,
/// the value of visible characters, spaces and tabs (RFC 9112 §5, RFC 9110 §5.5). A line that
/// starts with whitespace (obsolete line folding) is not one.
pub(crate) fn field_line(line: &[u8]) -> bool {
    let name = token_len(line);
    name > 0
        && line.get(name) == Some(&b':')
        && line[name + 1..]
            .iter()
            .all(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_size_lines() {
        for (line, size) in [
            (&b"0"[..], 0),
            (b"000", 0),
            (b"1a", 26),
            (b"FFFFFFFFFFFFFFFF", u64::MAX),
            (b"0000000000000000000000001", 1),
            (b"5;name", 5),
            (b"5 ; name = value", 5),
            (b"5\t;\tname\t=\t\"quoted ; \\\" \\\\ value\"", 5),
            (b"5;a=1;b;c=\"\"", 5),
            (b"5;a=\"\xC3\xA9\"", 5),
        ] {
            assert_eq!(
                chunk_size(line),
                Some(size),
                "{:?}",
                String::from_utf8_lossy(line)
            );
        }
        for line in [
            &b""[..],
            b" 5",
            b"+5",
            b"0x5",
            b"5 ",
            b"5;",
            b"5;a ",
            b"5;a=",
            b"5;a b",
            b"5;=b",
            b"5;a=\"open",
            b"5;a=\"x\"y",
            b"5;a=\"\r\"",
            b"5;a\r",
            b"5;a\nb",
            b"5;a=b\x00",
            b"5x",
            b"10000000000000000",
            b"0000000000000000000000000000000000000000010000000000000000",
        ] {
            assert_eq!(
                chunk_size(line),
                None,
                "{:?}",
                String::from_utf8_lossy(line)
            );
        }
    }

    #[test]
    fn field_lines() {
        for ok in [
            &b"x-trailer: 1"[..],
            b"a:",
            b"Checksum:\tabc def ",
            b"a: \x80\xff",
        ] {
            assert!(field_line(ok), "{:?}", String::from_utf8_lossy(ok));
        }
        for bad in [
            &b""[..],
            b"\r",
            b"\r\r",
            b" x: 1",
            b"\tcontinued",
            b"x : 1",
            b"x",
            b": 1",
            b"x: a\rb",
            b"x: a\x00",
            b"x: \x7f",
            b"x\xff: 1",
        ] {
            assert!(!field_line(bad), "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
