//! Whether a request path is canonical: the only form the proxy routes, guards and labels.
//!
//! Backends decode a path before they match it to a handler (llama.cpp's server and uvicorn
//! decode every `%XX`; uvicorn and nginx-fronted servers also differ on `//` and a trailing
//! `/`), so a path the proxy reads as "some other endpoint" can reach a chat handler unguarded.
//! A path is canonical when it has one spelling only: no percent-encoded unreserved character
//! (RFC 3986 §2.3, §6.2.2.2: `%61` is `a`), no encoded `/` or `\`, no malformed escape, no
//! `.` or `..` segment and no empty segment. Non-canonical paths are refused, not rewritten:
//! the backend then sees exactly the path that was classified.

/// Why a path is not canonical.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NonCanonical {
    /// `%XX` of a letter, digit, `-`, `.`, `_` or `~`: the same path spelled another way.
    EncodedUnreserved,
    /// `%2F` or `%5C`: a segment boundary some servers see and others do not.
    EncodedSeparator,
    /// `%` not followed by two hex digits.
    BadEscape,
    /// A `.` or `..` segment.
    DotSegment,
    /// `//`, or a `/` at the end (other than the path `/`).
    EmptySegment,
}

/// Check that `path` (a URI's path, without its query) is canonical.
pub(crate) fn check(path: &str) -> Result<(), NonCanonical> {
    let b = path.as_bytes();
    // One pass for nearly every path: no escape, no dot, so only empty segments to find.
    let mut prev = 0u8;
    let mut rare = false;
    for &c in b {
        if c == b'/' && prev == b'/' {
            return Err(NonCanonical::EmptySegment);
        }
        rare |= c == b'%' || c == b'.';
        prev = c;
    }
    if b.len() > 1 && prev == b'/' {
        return Err(NonCanonical::EmptySegment);
    }
    if !rare {
        return Ok(());
    }
    let mut i = 0;
    while let Some(at) = memchr::memchr(b'%', &b[i..]) {
        let at = i + at;
        let byte = match (b.get(at + 1).and_then(hex), b.get(at + 2).and_then(hex)) {
            (Some(hi), Some(lo)) => hi << 4 | lo,
            _ => return Err(NonCanonical::BadEscape),
        };
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            return Err(NonCanonical::EncodedUnreserved);
        }
        if byte == b'/' || byte == b'\\' {
            return Err(NonCanonical::EncodedSeparator);
        }
        i = at + 3;
    }
    if path.split('/').any(|seg| seg == "." || seg == "..") {
        return Err(NonCanonical::DotSegment);
    }
    Ok(())
}

fn hex(c: &u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_paths_are_canonical() {
        for ok in [
            "/",
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/responses",
            "/v1/messages",
            "/v1/messages/count_tokens",
            "/v1/models/qwen3.5-27b",
            "/v1/a..b",
            "/v1/.well",
            // Escapes of characters that are not unreserved stay as they are.
            "/v1/files/a%20b",
            "/v1/x%3Ay%25z",
        ] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn other_spellings_of_a_path_are_not() {
        use NonCanonical::*;
        for (path, why) in [
            ("/v1/ch%61t/completions", EncodedUnreserved),
            ("/v1/%63hat/completions", EncodedUnreserved),
            ("/v1/chat/completion%73", EncodedUnreserved),
            ("/v1/re%73ponses", EncodedUnreserved),
            ("/v1/me%73sages", EncodedUnreserved),
            ("/v1/messages/count%5Ftokens", EncodedUnreserved),
            ("/v1/messages/count%5ftokens", EncodedUnreserved),
            ("/v1/%7e", EncodedUnreserved),
            ("/v1/%2D", EncodedUnreserved),
            ("/v1/%2e%2e/slots", EncodedUnreserved),
            ("/v1/.%2e/slots", EncodedUnreserved),
            ("/v1/chat%2fcompletions", EncodedSeparator),
            ("/v1/x%2F..%2Fslots", EncodedSeparator),
            ("/v1/chat%5Ccompletions", EncodedSeparator),
            ("/v1/chat%", BadEscape),
            ("/v1/chat%6", BadEscape),
            ("/v1/chat%zz/completions", BadEscape),
            ("/v1/../slots", DotSegment),
            ("/v1/./chat/completions", DotSegment),
            ("/v1/..", DotSegment),
            ("/v1//chat/completions", EmptySegment),
            ("//v1/chat/completions", EmptySegment),
            ("/v1/chat/completions/", EmptySegment),
        ] {
            assert_eq!(check(path), Err(why), "{path}");
        }
    }
}
