//! Finding keys and values in JSON text without parsing it.
//!
//! A quote inside a JSON string is always escaped (`\"`), so a `"key"` that follows no
//! backslash and is followed by `:` is a real key, never text. These searches serve the
//! hot path: with the relay's event readings, the reasoning rewriter, the shaping gate and
//! the token bound's messages read by a parse instead, Switchboard's user-space CPU per
//! 200-event stream went from 37.7 to 79.5 µs and per whole answer from 8.8 to 13.3 µs
//! (`benches/load/run.sh`, that build as `BASELINE_BIN`; docs/PERFORMANCE.md, "Where the
//! time goes").
//!
//! A key can also be written with escapes (`"\u0075sage"` is `"usage"`), which no byte
//! search of the plain spelling finds. A key made of ASCII letters, digits and `_` can only
//! be written another way through a `\u00XX` escape of one of those characters, and
//! [`may_escape_word`] finds every such escape: where it says no, the plain spelling is the
//! only one, and a search for it answers what a full parse answers. Callers fall back to a
//! parse where it says yes (rare: backends write such characters plainly).
//!
//! [`token_limit`] reads one value more, a request's token limit, for the two readers of a
//! request's limits (`tokens::bound` for the guard, `wire::request` for the adapters).

use memchr::arch::all::packedpair::HeuristicFrequencyRank;
use memchr::memmem::{Finder, FinderBuilder};
use serde_json::value::RawValue;

/// The keys of a chat answer or event that more than one reader looks for, each with its
/// quotes, as [`finder`]s.
pub mod keys {
    use std::sync::LazyLock;

    use memchr::memmem::Finder;

    use super::finder;

    pub static CONTENT: LazyLock<Finder<'static>> = LazyLock::new(|| finder(br#""content""#));
    pub static REASONING: LazyLock<Finder<'static>> = LazyLock::new(|| finder(br#""reasoning""#));
    pub static REASONING_CONTENT: LazyLock<Finder<'static>> =
        LazyLock::new(|| finder(br#""reasoning_content""#));
    pub static TOOL_CALLS: LazyLock<Finder<'static>> = LazyLock::new(|| finder(br#""tool_calls""#));
}

/// How common a byte is in JSON text, for `memchr`'s choice of the two needle bytes it
/// scans for. Its default ranking, made for prose and code, takes `"` for one of the rarest
/// bytes of a key like `"usage"` and so stops at every quote of a JSON body; here the
/// structural bytes, digits and whitespace rank as the most common, letters by their
/// frequency in English (keys and text are mostly English words), and other bytes as rare.
struct JsonRank;

impl HeuristicFrequencyRank for JsonRank {
    fn rank(&self, byte: u8) -> u8 {
        const LETTERS: &[u8; 26] = b"etaoinsrhldcumfpgwybvkxjqz";
        match byte {
            b'"'
            | b':'
            | b','
            | b'{'
            | b'}'
            | b'['
            | b']'
            | b' '
            | b'\t'
            | b'\n'
            | b'\r'
            | b'0'..=b'9' => 255,
            b'_' => 240,
            b'a'..=b'z' => {
                let at = LETTERS.iter().position(|&l| l == byte).unwrap_or(25);
                230 - 3 * at as u8
            }
            b'A'..=b'Z' => 120,
            _ => 60,
        }
    }
}

/// A searcher for `needle` in JSON text (see [`JsonRank`]).
pub fn finder(needle: &[u8]) -> Finder<'static> {
    FinderBuilder::new()
        .build_forward_with_ranker(JsonRank, needle)
        .into_owned()
}

/// Where the value of each `"key":` occurrence in `data` starts (after any whitespace).
/// `key` is the key with its quotes.
pub fn values<'d>(data: &'d [u8], key: &'d Finder<'static>) -> impl Iterator<Item = &'d [u8]> + 'd {
    // Searched piece by piece as `find_iter` would (occurrences that do not overlap), without
    // the copy of the searcher `find_iter` makes.
    let len = key.needle().len();
    let mut from = 0;
    std::iter::from_fn(move || loop {
        let at = from + key.find(data.get(from..)?)?;
        from = at + len.max(1);
        if at > 0 && data[at - 1] == b'\\' {
            continue;
        }
        if let Some(value) = skip_ws(&data[at + len..]).strip_prefix(b":") {
            return Some(skip_ws(value));
        }
    })
}

/// Whether `data` may hold a `\u00XX` escape of an ASCII letter, digit or `_` (in a key or
/// a string: both spell the same text as the plain characters). `false` means every key
/// and string made of those characters is written plainly.
pub fn may_escape_word(data: &[u8]) -> bool {
    // Most payloads hold no backslash at all, and the rest few: a one-byte search finds them.
    memchr::memchr_iter(b'\\', data).any(|at| {
        let Some([b'u', b'0', b'0', hi, lo]) = data.get(at + 1..at + 6) else {
            return false;
        };
        let hex = |b: u8| char::from(b).to_digit(16);
        let code = hex(*hi).zip(hex(*lo)).map(|(h, l)| h * 16 + l);
        code.and_then(char::from_u32)
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// `bytes` without its leading JSON whitespace.
pub fn skip_ws(bytes: &[u8]) -> &[u8] {
    let n = bytes
        .iter()
        .take_while(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        .count();
    &bytes[n..]
}

/// A token limit's value (`max_tokens` and its kin): a non-negative integer (an integral
/// float is accepted; past `u32::MAX` it saturates), unset when missing or `null`. The error
/// is what is wrong with the value, for the refusal that names the parameter.
pub fn token_limit(raw: Option<&RawValue>) -> Result<Option<u32>, &'static str> {
    let Some(raw) = raw else { return Ok(None) };
    // Most limits are plain digits: read as the parse reads them, without its setup (some
    // 190 instructions a request under callgrind, `benches/load/instructions.sh`).
    let text = raw.get().as_bytes();
    match crate::number::u64_at(text, 0) {
        Some((n, end)) if end == text.len() => Ok(Some(u32::try_from(n).unwrap_or(u32::MAX))),
        _ => parsed_limit(raw.get()),
    }
}

/// [`token_limit`] of a value's text, as serde_json reads it.
fn parsed_limit(text: &str) -> Result<Option<u32>, &'static str> {
    let n: serde_json::Number = match serde_json::from_str::<Option<serde_json::Number>>(text) {
        Ok(Some(n)) => n,
        Ok(None) => return Ok(None),
        Err(_) => return Err("must be an integer"),
    };
    if let Some(u) = n.as_u64() {
        return Ok(Some(u32::try_from(u).unwrap_or(u32::MAX)));
    }
    match n.as_f64() {
        Some(f) if f >= 0.0 && f.fract() == 0.0 => Ok(Some(if f >= f64::from(u32::MAX) {
            u32::MAX
        } else {
            // in range and integral: exact
            f as u32
        })),
        Some(f) if f < 0.0 => Err("must be non-negative"),
        _ => Err("must be an integer"),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn finds_values_of_real_keys_only() {
        let key = finder(b"\"k\"");
        let data = br#"{"k" : 1, "text":"\"k\": 2", "x \"k": 3, "k":"v", "k"}"#;
        let found: Vec<&[u8]> = values(data, &key).collect();
        assert_eq!(found.len(), 2);
        assert!(found[0].starts_with(b"1,"));
        assert!(found[1].starts_with(b"\"v\""));
    }

    #[test]
    fn escapes_of_word_characters_are_found() {
        assert!(may_escape_word(br#"{"\u0075sage":1}"#));
        assert!(may_escape_word(br#"{"us\u0061ge":1}"#));
        assert!(may_escape_word(br#"{"a":"\u005F"}"#));
        assert!(may_escape_word(br#"{"a":"\u0041"}"#));
        assert!(!may_escape_word(
            br#"{"a":"caf\u00e9 \u003cthink> \n \" \\"}"#
        ));
        assert!(!may_escape_word(br#"{"a":"\u00"}"#));
        assert!(!may_escape_word(b"plain"));
    }

    /// A token limit's value, written any way JSON allows a number (and two that are none).
    fn limit_text() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            any::<u64>().prop_map(|n| n.to_string()),
            (0u32..100_000).prop_map(|n| n.to_string()),
            "(0|[1-9][0-9]{0,24})(\\.[0-9]{1,3})?([eE][+-]?[0-9]{1,2})?",
            "-[1-9][0-9]{0,3}",
            Just("null".to_string()),
            Just("\"16\"".to_string()),
        ]
    }

    proptest::proptest! {
        #[test]
        fn a_token_limit_reads_as_the_parse_reads_it(text in limit_text()) {
            let raw = RawValue::from_string(text.clone()).unwrap();
            proptest::prop_assert_eq!(token_limit(Some(&raw)), parsed_limit(&text), "{}", text);
        }
    }
}
