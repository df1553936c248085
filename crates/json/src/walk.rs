//! Walking JSON text a parse has already checked: an array's elements and an object's
//! members, as text, without building values.
//!
//! Hand-written for the hot path, where every request's conversation is read from its
//! messages (`fleet::conversation`). Under callgrind (`benches/load/instructions.sh`) the
//! conversation cost about 5,800 instructions a chat with serde_json reading its items, 4,800
//! walked item by item, 3,000 read in one walk with their members
//! ([`Elements::next_object`]), and 2,500 with a string's first bytes searched a word at a
//! time rather than one by one (a chat of two messages). (llama.cpp's flat `timings` object
//! is walked apart, by `wire::usage`.) The text must be valid JSON (a
//! [`serde_json::value::RawValue`] is): on other text the answers are unspecified but
//! nothing panics. Property tests hold every answer to a full parse's.

use std::borrow::Cow;

use memchr::memchr2;

/// Bytes of a string looked at a word at a time before the rest is searched (most strings
/// here are keys, roles and short texts, shorter than a search's start costs).
const SHORT: usize = 32;

/// Each byte of a word set to `b`.
const fn splat(b: u8) -> u64 {
    u64::from_ne_bytes([b; 8])
}

/// Where the first `"` or `\` of `b` is, read eight bytes at a time (see [`scan_words`]).
pub fn quote_or_escape(b: &[u8]) -> Option<usize> {
    scan_words(b, 0, usize::MAX).ok()
}

/// Looks for the first `"` or `\` of `b` from `from` on, eight bytes at a time (a byte is one
/// of them where the word XORed with it has a zero byte; the lowest flag is exact), the last
/// few bytes one by one, over at most `words` words: `Ok` where it is, else `Err` where the
/// look stopped (`b.len()` at the end of `b`).
#[inline]
fn scan_words(b: &[u8], from: usize, words: usize) -> Result<usize, usize> {
    const LOW: u64 = splat(0x01);
    const HIGH: u64 = splat(0x80);
    let zero = |w: u64| w.wrapping_sub(LOW) & !w & HIGH;
    let mut i = from;
    for _ in 0..words {
        let Some(word) = b.get(i..).and_then(<[u8]>::first_chunk::<8>) else {
            let rest = b.get(i..).unwrap_or_default();
            return match rest.iter().position(|&c| c == b'"' || c == b'\\') {
                Some(at) => Ok(i + at),
                None => Err(b.len()),
            };
        };
        let w = u64::from_le_bytes(*word);
        let found = zero(w ^ splat(b'"')) | zero(w ^ splat(b'\\'));
        if found != 0 {
            return Ok(i + (found.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    Err(i)
}

/// The index just past the string that opens at `b[at]` (a `"`); `b.len()` when it does not
/// close. Inlined for the common case, a string of a few words with no escape; the rest is
/// [`long_string_end`]'s, from where this first look stopped.
#[inline]
pub fn string_end(b: &[u8], at: usize) -> usize {
    match scan_words(b, at + 1, SHORT / 8) {
        Ok(j) if b[j] == b'"' => j + 1,
        first => long_string_end(b, first),
    }
}

/// [`string_end`] of a string that is long or holds an escape, given what [`scan_words`]
/// found of it so far: a quote or backslash, or where it stopped looking.
#[inline(never)]
fn long_string_end(b: &[u8], mut found: Result<usize, usize>) -> usize {
    loop {
        let at = match found {
            Ok(j) => j,
            Err(stop) if stop < b.len() => match memchr2(b'"', b'\\', &b[stop..]) {
                Some(j) => stop + j,
                None => return b.len(),
            },
            Err(_) => return b.len(),
        };
        if b[at] != b'\\' {
            return at + 1;
        }
        found = scan_words(b, at + 2, SHORT / 8);
    }
}

/// The bytes that end a number or a literal: what may follow a value.
static ENDS_SCALAR: [bool; 256] = {
    let mut ends = [false; 256];
    let mut i = 0;
    let bytes = *b",}] \t\n\r";
    while i < bytes.len() {
        ends[bytes[i] as usize] = true;
        i += 1;
    }
    ends
};

/// The index just past the value that starts at `b[at]` (not whitespace).
#[inline]
pub fn value_end(b: &[u8], at: usize) -> usize {
    match b.get(at) {
        Some(b'"') => string_end(b, at),
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            let mut i = at;
            while let Some(&c) = b.get(i) {
                match c {
                    b'"' => {
                        i = string_end(b, i);
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return i + 1;
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            b.len()
        }
        _ => {
            let rest = b.get(at..).unwrap_or_default();
            let len = rest
                .iter()
                .position(|&c| ENDS_SCALAR[usize::from(c)])
                .unwrap_or(rest.len());
            // At least one byte, so a walk of text that is not JSON still moves on.
            (at + len.max(1)).min(b.len())
        }
    }
}

#[inline]
pub fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// Where the next element or member starts after `at` (just past the opening bracket or the
/// last one read): whitespace and a separating comma skipped.
fn next_start(b: &[u8], at: usize) -> usize {
    let i = skip_ws(b, at);
    match b.get(i) {
        Some(b',') => skip_ws(b, i + 1),
        _ => i,
    }
}

/// The text of each element of the array `text`, in order; `None` when `text` is no array.
pub fn elements(text: &[u8]) -> Option<Elements<'_>> {
    let at = skip_ws(text, 0);
    (text.get(at) == Some(&b'[')).then_some(Elements { text, at: at + 1 })
}

/// The elements of an array, as [`elements`] finds them.
pub struct Elements<'a> {
    text: &'a [u8],
    /// Just past the `[` or the last element read.
    at: usize,
}

impl<'a> Iterator for Elements<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let b = self.text;
        let i = next_start(b, self.at);
        match b.get(i) {
            None | Some(b']') => {
                self.at = b.len();
                None
            }
            Some(_) => {
                let end = value_end(b, i);
                self.at = end;
                b.get(i..end)
            }
        }
    }
}

impl<'a> Elements<'a> {
    /// The array's text from its next element on (whitespace and a separating comma skipped),
    /// for a reader of its own layout; [`Elements::read`] then moves past what it read.
    pub fn rest(&mut self) -> &'a [u8] {
        self.at = next_start(self.text, self.at);
        self.text.get(self.at..).unwrap_or_default()
    }

    /// The next `len` bytes of [`Elements::rest`], an element read there, and past them.
    pub fn read(&mut self, len: usize) -> &'a [u8] {
        let start = self.at;
        self.at = (start + len).min(self.text.len());
        &self.text[start..self.at]
    }

    /// The next element's text, and each of its members (key and value, as [`members`] gives
    /// them) given to `member` when it is an object, read in one walk; `None` at the end.
    pub fn next_object(&mut self, mut member: impl FnMut(&'a [u8], &'a [u8])) -> Option<&'a [u8]> {
        let b = self.text;
        let i = next_start(b, self.at);
        if b.get(i) != Some(&b'{') {
            return self.next();
        }
        let mut members = Members { text: b, at: i + 1 };
        for (key, value) in members.by_ref() {
            member(key, value);
        }
        self.at = members.at;
        b.get(i..members.at)
    }
}

/// Each member of the object `text` as its key's text (with its quotes, as written) and its
/// value's text, in order; `None` when `text` is no object.
pub fn members(text: &[u8]) -> Option<Members<'_>> {
    let at = skip_ws(text, 0);
    (text.get(at) == Some(&b'{')).then_some(Members { text, at: at + 1 })
}

/// The members of an object, as [`members`] finds them.
pub struct Members<'a> {
    text: &'a [u8],
    at: usize,
}

impl<'a> Iterator for Members<'a> {
    type Item = (&'a [u8], &'a [u8]);

    fn next(&mut self) -> Option<(&'a [u8], &'a [u8])> {
        let b = self.text;
        let i = next_start(b, self.at);
        match b.get(i) {
            Some(b'"') => {}
            // Just past the object's closing brace: where it ends.
            Some(b'}') => {
                self.at = i + 1;
                return None;
            }
            _ => {
                self.at = b.len();
                return None;
            }
        }
        let key_end = string_end(b, i);
        let key = b.get(i..key_end)?;
        let mut v = skip_ws(b, key_end);
        if b.get(v) == Some(&b':') {
            v = skip_ws(b, v + 1);
        }
        let end = value_end(b, v);
        self.at = end;
        Some((key, b.get(v..end)?))
    }
}

/// The bytes of the string the JSON string literal `raw` holds (`None` when `raw` is no
/// string): its text between the quotes where it escapes nothing.
pub fn string(raw: &[u8]) -> Option<Cow<'_, [u8]>> {
    let inner = raw.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    if inner.contains(&b'\\') {
        let unescaped = serde_json::from_slice::<String>(raw).ok()?;
        Some(Cow::Owned(unescaped.into_bytes()))
    } else {
        Some(Cow::Borrowed(inner))
    }
}

/// The value of the last member `name` of the object `text` (as a full parse keeps the last
/// of a name given twice); `None` when it has none or is no object.
pub fn member<'a>(text: &'a [u8], name: &str) -> Option<&'a [u8]> {
    members(text)?
        .filter(|(key, _)| string(key).is_some_and(|k| *k == *name.as_bytes()))
        .last()
        .map(|(_, value)| value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::value::RawValue;
    use serde_json::Value;

    /// Any JSON value, written with any whitespace and escapes.
    fn json() -> impl Strategy<Value = String> {
        let ws = prop::sample::select(vec!["", " ", "\n  ", "\t", "\r\n"]);
        let text = prop::sample::select(vec![
            r#""role""#,
            r#""type""#,
            r#""r\u006fle""#,
            r#""a\"b""#,
            r#""x\\""#,
            r#""é{[""#,
            r#""tool_result""#,
            r#""user""#,
            r#""""#,
        ]);
        let scalar = prop::sample::select(vec![
            "0", "-1.5e3", "17", "true", "false", "null", "1E+2", "-0",
        ]);
        let leaf = prop_oneof![
            text.clone().prop_map(String::from),
            scalar.prop_map(String::from)
        ];
        leaf.prop_recursive(4, 40, 6, move |inner| {
            let ws = ws.clone();
            let member = (text.clone(), ws.clone(), inner.clone(), ws.clone())
                .prop_map(|(k, w1, v, w2)| format!("{w1}{k}{w2}:{w1}{v}{w2}"));
            prop_oneof![
                (prop::collection::vec(inner, 0..5), ws.clone())
                    .prop_map(|(items, w)| format!("[{w}{}{w}]", items.join(&format!("{w},")))),
                (prop::collection::vec(member, 0..5), ws)
                    .prop_map(|(ms, w)| format!("{{{w}{}{w}}}", ms.join(","))),
            ]
        })
    }

    proptest! {
        /// The word-at-a-time search finds the first quote or backslash a byte-by-byte one
        /// finds, wherever it is and whatever bytes (any of them high) come before and after.
        #[test]
        fn a_quote_or_escape_is_found_where_a_byte_search_finds_it(
            b in prop::collection::vec(
                prop_oneof![Just(b'"'), Just(b'\\'), Just(0x80u8), Just(0xA2u8), Just(0xDCu8), any::<u8>()],
                0..40,
            ),
        ) {
            let naive = b.iter().position(|&c| c == b'"' || c == b'\\');
            prop_assert_eq!(quote_or_escape(&b), naive);
        }
    }

    proptest! {
        /// A string's end is where a byte-by-byte walk finds it (its first quote no backslash
        /// escapes), however long the string and wherever its escapes, an unclosed one too.
        #[test]
        fn a_strings_end_is_found_where_a_byte_walk_finds_it(
            rest in prop::collection::vec(
                prop_oneof![4 => Just(b'a'), 1 => Just(b'"'), 1 => Just(b'\\'), 1 => any::<u8>()],
                0..120,
            ),
        ) {
            let b: Vec<u8> = std::iter::once(b'"').chain(rest).collect();
            let mut i = 1;
            let naive = loop {
                match b.get(i) {
                    None => break b.len(),
                    Some(b'\\') => i += 2,
                    Some(b'"') => break i + 1,
                    Some(_) => i += 1,
                }
            };
            prop_assert_eq!(string_end(&b, 0), naive.min(b.len()));
        }
    }

    proptest! {
        #[test]
        fn elements_are_those_of_a_full_parse(text in json()) {
            let parsed: Option<Vec<&RawValue>> = serde_json::from_str(&text).ok();
            let walked: Option<Vec<&[u8]>> = elements(text.as_bytes()).map(Iterator::collect);
            let parsed: Option<Vec<&[u8]>> =
                parsed.map(|v| v.iter().map(|r| r.get().as_bytes()).collect());
            prop_assert_eq!(walked, parsed);
        }

        #[test]
        fn members_are_those_of_a_full_parse(text in json()) {
            let parsed: Value = serde_json::from_str(&text).unwrap();
            match parsed.as_object() {
                None => prop_assert!(members(text.as_bytes()).is_none()),
                Some(map) => {
                    for key in map.keys().map(String::as_str).chain(["role", "absent"]) {
                        let walked = member(text.as_bytes(), key)
                            .map(|v| serde_json::from_slice::<Value>(v).unwrap());
                        prop_assert_eq!(walked.as_ref(), map.get(key), "{}", key);
                    }
                }
            }
        }

        #[test]
        fn a_string_reads_as_a_full_parse_reads_it(text in json()) {
            let parsed: Value = serde_json::from_str(&text).unwrap();
            let read = string(text.as_bytes());
            prop_assert_eq!(read.as_deref(), parsed.as_str().map(str::as_bytes));
        }
    }

    proptest! {
        /// An array's elements read with their members are those of a full parse, and so are
        /// the members of each object among them.
        #[test]
        fn elements_read_with_their_members_are_those_of_a_full_parse(text in json()) {
            let parsed: Option<Vec<&RawValue>> = serde_json::from_str(&text).ok();
            let Some(parsed) = parsed else {
                prop_assert!(elements(text.as_bytes()).is_none());
                return Ok(());
            };
            let mut walked = elements(text.as_bytes()).unwrap();
            for element in parsed {
                let mut seen = Vec::new();
                let text = walked.next_object(|k, v| seen.push((k, v)));
                let element = element.get().as_bytes();
                prop_assert_eq!(text, Some(element));
                let whole: Vec<(&[u8], &[u8])> = members(element).into_iter().flatten().collect();
                prop_assert_eq!(seen, whole);
            }
            prop_assert_eq!(walked.next_object(|_, _| {}), None);
        }
    }

    #[test]
    fn text_that_is_not_json_gives_an_answer_without_a_panic() {
        for text in [
            "",
            "[",
            "{\"a\"",
            "[\"\\",
            "{\"a\":[}",
            "]",
            "[1,",
            "{,}",
            "[}",
            "[:]",
        ] {
            let text = text.as_bytes();
            let _ = elements(text).map(|e| e.count());
            let _ = elements(text).map(|mut e| while e.next_object(|_, _| {}).is_some() {});
            let _ = member(text, "a");
            let _ = string(text);
        }
    }
}
