//! Finding keys and values in JSON text without parsing it.
//!
//! A quote inside a JSON string is always escaped (`\"`), so a `"key"` that follows no
//! backslash and is followed by `:` is a real key, never text. These searches serve the
//! hot path, where a full parse of a body would cost more than the rest of the request.

use memchr::arch::all::packedpair::HeuristicFrequencyRank;
use memchr::memmem::{Finder, FinderBuilder};

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
pub(crate) fn finder(needle: &[u8]) -> Finder<'static> {
    FinderBuilder::new()
        .build_forward_with_ranker(JsonRank, needle)
        .into_owned()
}

/// Where the value of each `"key":` occurrence in `data` starts (after any whitespace).
/// `key` is the key with its quotes.
pub(crate) fn values<'d>(
    data: &'d [u8],
    key: &'d Finder<'static>,
) -> impl Iterator<Item = &'d [u8]> + 'd {
    key.find_iter(data)
        .filter(move |&at| at == 0 || data[at - 1] != b'\\')
        .filter_map(move |at| {
            let rest = skip_ws(&data[at + key.needle().len()..]);
            Some(skip_ws(rest.strip_prefix(b":")?))
        })
}

/// `bytes` without its leading JSON whitespace.
pub(crate) fn skip_ws(bytes: &[u8]) -> &[u8] {
    let n = bytes
        .iter()
        .take_while(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        .count();
    &bytes[n..]
}

#[cfg(test)]
mod tests {
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
}
