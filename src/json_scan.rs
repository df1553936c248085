//! Finding keys and values in JSON text without parsing it, and walking an object's members.
//!
//! A quote inside a JSON string is always escaped (`\"`), so a `"key"` that follows no
//! backslash and is followed by `:` is a real key, never text. These searches serve the
//! hot path, where a full parse of a body would cost more than the rest of the request.
//!
//! A key can also be written with escapes (`"\u0075sage"` is `"usage"`), which no byte
//! search of the plain spelling finds. A key made of ASCII letters, digits and `_` can only
//! be written another way through a `\u00XX` escape of one of those characters, and
//! [`may_escape_word`] finds every such escape: where it says no, the plain spelling is the
//! only one, and a search for it answers what a full parse answers. Callers fall back to a
//! parse where it says yes (rare: backends write such characters plainly).
//!
//! A [`Walk`] reads JSON text from the front, an object's members one by one: the members a
//! caller reads it reads (integers and numbers as serde_json reads them), the others it skips
//! by their brackets and quotes without looking inside (strings by a search for their
//! closing quote, eight bytes at a time). It reads only the plain spelling backends write;
//! anything else (a key written with an escape, an integer of more than 19 digits, nesting
//! past [`MAX_DEPTH`], text that is not JSON) it answers with [`Unsure`], and the caller
//! parses the text instead. Hand-written because serde_json, the crate the proxy parses with,
//! cost more than the rest of reading an answer's usage: its derived reader of the `usage`
//! object took 2,092 instructions per chat answer and its `f64` reads of llama.cpp's two
//! speeds 1,512 (callgrind, `benches/load/instructions.sh`); with the walk, reading a whole
//! answer's usage and speeds (`wire::usage::of_body`) went from 4,978 to 3,184.
//!
//! [`token_limit`] reads one value more, a request's token limit, for the two readers of a
//! request's limits (`tokens::bound` for the guard, `wire::request` for the adapters).

use memchr::arch::all::packedpair::HeuristicFrequencyRank;
use memchr::memmem::{Finder, FinderBuilder};
use serde::Deserialize;
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
pub(crate) fn may_escape_word(data: &[u8]) -> bool {
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
pub(crate) fn skip_ws(bytes: &[u8]) -> &[u8] {
    let n = bytes
        .iter()
        .take_while(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        .count();
    &bytes[n..]
}

/// What a [`Walk`] answers for text it does not read: not in the plain spelling it knows,
/// or not JSON. A full parse of the text decides instead.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Unsure;

/// The deepest nesting a [`Walk`] skips (serde_json follows 128 levels).
pub(crate) const MAX_DEPTH: u32 = 64;

/// A reader of JSON text from the front (see the module header).
pub(crate) struct Walk<'b> {
    bytes: &'b [u8],
    at: usize,
}

impl<'b> Walk<'b> {
    pub(crate) fn new(bytes: &'b [u8]) -> Walk<'b> {
        Walk { bytes, at: 0 }
    }

    /// The next byte past any whitespace.
    #[inline]
    pub(crate) fn peek(&mut self) -> Option<u8> {
        match self.bytes.get(self.at) {
            Some(&b) if b > b' ' => Some(b),
            _ => self.peek_past_ws(),
        }
    }

    fn peek_past_ws(&mut self) -> Option<u8> {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes.get(self.at) {
            self.at += 1;
        }
        self.bytes.get(self.at).copied()
    }

    #[inline]
    fn eat(&mut self, byte: u8) -> Result<(), Unsure> {
        if self.peek() != Some(byte) {
            return Err(Unsure);
        }
        self.at += 1;
        Ok(())
    }

    /// Whether nothing but whitespace is left.
    #[cfg(test)]
    pub(crate) fn at_end(&mut self) -> bool {
        self.peek().is_none()
    }

    /// The members of the object next in the text, in order: `member` gets each key as
    /// written and reads its value (with [`Walk::skip`], [`Walk::uint`], …).
    #[inline]
    pub(crate) fn object(
        &mut self,
        mut member: impl FnMut(&'b [u8], &mut Walk<'b>) -> Result<(), Unsure>,
    ) -> Result<(), Unsure> {
        self.eat(b'{')?;
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(());
        }
        loop {
            self.eat(b'"')?;
            let key = self.key()?;
            self.eat(b':')?;
            member(key, self)?;
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    return Ok(());
                }
                _ => return Err(Unsure),
            }
        }
    }

    /// A key after its opening quote, up to its closing one; one with an escape is not read.
    #[inline]
    fn key(&mut self) -> Result<&'b [u8], Unsure> {
        let rest = self.rest();
        let end = quote_or_backslash(rest).ok_or(Unsure)?;
        if rest[end] != b'"' {
            return Err(Unsure);
        }
        self.at += end + 1;
        Ok(&rest[..end])
    }

    #[inline]
    fn rest(&self) -> &'b [u8] {
        self.bytes.get(self.at..).unwrap_or_default()
    }

    /// Whether the value next is `null` (read if so).
    #[inline]
    pub(crate) fn null(&mut self) -> bool {
        let null = self.peek() == Some(b'n') && self.rest().starts_with(b"null");
        if null {
            self.at += 4;
        }
        null
    }

    /// Past the value next, whatever it is (a member's or an array item's: a number is
    /// followed by whitespace, `,`, `]` or `}`).
    #[inline(always)]
    pub(crate) fn skip(&mut self) -> Result<(), Unsure> {
        match self.peek().ok_or(Unsure)? {
            b'"' => {
                self.at += 1;
                self.string()
            }
            b'{' | b'[' => self.nested(),
            b'-' | b'0'..=b'9' => {
                self.number_token();
                Ok(())
            }
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => Err(Unsure),
        }
    }

    fn literal(&mut self, word: &[u8]) -> Result<(), Unsure> {
        if !self.rest().starts_with(word) {
            return Err(Unsure);
        }
        self.at += word.len();
        Ok(())
    }

    /// Past a string, from after its opening quote.
    #[inline]
    fn string(&mut self) -> Result<(), Unsure> {
        loop {
            let rest = self.rest();
            let at = quote_or_backslash(rest).ok_or(Unsure)?;
            if rest[at] == b'"' {
                self.at += at + 1;
                return Ok(());
            }
            // An escape: its next byte is never the closing quote.
            self.at += at + 2;
        }
    }

    /// Past an object or array, from its opening bracket.
    fn nested(&mut self) -> Result<(), Unsure> {
        let mut depth = 0u32;
        while let Some(&b) = self.bytes.get(self.at) {
            self.at += 1;
            match b {
                b'"' => self.string()?,
                b'{' | b'[' => {
                    depth += 1;
                    if depth > MAX_DEPTH {
                        return Err(Unsure);
                    }
                }
                b'}' | b']' => {
                    depth -= 1;
                    if depth == 0 {
                        return Ok(());
                    }
                }
                _ => {}
            }
        }
        Err(Unsure)
    }

    /// The number next: the bytes up to the first that ends one in JSON text (whitespace,
    /// `,`, `]`, `}`), read.
    #[inline]
    fn number_token(&mut self) -> &'b [u8] {
        let rest = self.rest();
        let n = number_end(rest);
        self.at += n;
        &rest[..n]
    }

    /// The value next as serde_json reads a `u64`: an integer of at most 19 digits (longer
    /// ones are left to serde_json), no fraction or exponent.
    #[inline]
    pub(crate) fn uint(&mut self) -> Result<u64, Unsure> {
        self.peek();
        let rest = self.rest();
        let (n, len) = digits(0, rest);
        if len == 0 || len > 19 || (len > 1 && rest[0] == b'0') || !ends_number(rest.get(len)) {
            return Err(Unsure);
        }
        self.at += len;
        Ok(n)
    }

    /// The value next as serde_json reads an `f64` at the front of the text (any number;
    /// `Unsure` for another value).
    ///
    /// A number in the plain form (digits, then perhaps `.` and more, at most 19 digits in
    /// all, no sign or exponent) is read as serde_json reads it without its `float_roundtrip`
    /// feature: all its digits as one integer, converted to `f64` and divided by the power
    /// of ten of the fraction's length. Any other is read by serde_json itself.
    #[inline]
    pub(crate) fn float(&mut self) -> Result<f64, Unsure> {
        self.peek();
        let rest = self.rest();
        let (int, int_len) = digits(0, rest);
        if (1..=19).contains(&int_len) && !(int_len > 1 && rest[0] == b'0') {
            let plain = match rest.get(int_len) {
                Some(b'.') => {
                    let (n, fraction) = digits(int, &rest[int_len + 1..]);
                    let len = int_len + 1 + fraction;
                    (fraction > 0 && int_len + fraction <= 19)
                        .then(|| (n as f64 / POW10[fraction], len))
                }
                _ => Some((int as f64, int_len)),
            };
            if let Some((value, len)) = plain.filter(|&(_, len)| ends_number(rest.get(len))) {
                self.at += len;
                return Ok(value);
            }
        }
        // Any other as serde_json reads the number at the front, whatever follows it.
        let value = f64::deserialize(&mut serde_json::Deserializer::from_slice(rest));
        self.number_token();
        value.map_err(|_| Unsure)
    }
}

/// `n` followed by the leading digits of `bytes` as one integer (wrapping past `u64`: callers
/// take at most 19 digits), and how many digits there were.
#[inline]
fn digits(mut n: u64, bytes: &[u8]) -> (u64, usize) {
    let mut len = 0;
    while let Some(&b) = bytes.get(len) {
        let digit = b.wrapping_sub(b'0');
        if digit >= 10 {
            break;
        }
        n = n.wrapping_mul(10).wrapping_add(u64::from(digit));
        len += 1;
    }
    (n, len)
}

/// Whether a number may end before `next`: no byte a number holds.
#[inline]
fn ends_number(next: Option<&u8>) -> bool {
    !matches!(next, Some(b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-'))
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The high bit of each byte of `word` (eight bytes, the first lowest) below `n` (at most
/// 128), and of some bytes above such a byte: the lowest bit set marks the first match.
#[inline]
fn below(word: u64, n: u8) -> u64 {
    word.wrapping_sub(ONES * u64::from(n)) & !word & HIGHS
}

/// The same for the bytes equal to `byte`.
#[inline]
fn equal(word: u64, byte: u8) -> u64 {
    below(word ^ (ONES * u64::from(byte)), 1)
}

/// The eight bytes of `bytes` from `at`, if there are eight.
#[inline]
fn word(bytes: &[u8], at: usize) -> Option<u64> {
    let word = bytes.get(at..)?.first_chunk::<8>()?;
    Some(u64::from_le_bytes(*word))
}

/// Where the first `"` or `\` of `bytes` is: eight bytes at a time for the first few words
/// (keys and most strings end there, where a call to `memchr` would cost more than the
/// search), by `memchr` past them.
#[inline(always)]
fn quote_or_backslash(bytes: &[u8]) -> Option<usize> {
    let mut at = 0;
    while at < 32 {
        let Some(w) = word(bytes, at) else {
            let tail = bytes.get(at..)?;
            let i = tail.iter().position(|&b| b == b'"' || b == b'\\')?;
            return Some(at + i);
        };
        let found = equal(w, b'"') | equal(w, b'\\');
        if found != 0 {
            return Some(at + (found.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    memchr::memchr2(b'"', b'\\', bytes.get(at..)?).map(|i| at + i)
}

/// How many bytes of `bytes` come before the first that ends a number in JSON text: a
/// control byte or space (whitespace among them), `,`, `]`, `}` or none (the bytes a number
/// holds are `+`, `-`, `.`, digits, `e` and `E`, all above those).
#[inline(always)]
fn number_end(bytes: &[u8]) -> usize {
    let mut at = 0;
    while let Some(w) = word(bytes, at) {
        // `]` is `}` but for the bit 0x20, which no other byte but those lacks to be `}`.
        let found = below(w, b' ' + 1) | equal(w, b',') | equal(w | (ONES * 0x20), b'}');
        if found != 0 {
            return at + (found.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    let tail = bytes.get(at..).unwrap_or_default();
    let ends = |&b: &u8| b <= b' ' || b == b',' || b == b']' || b == b'}';
    at + tail.iter().position(ends).unwrap_or(tail.len())
}

/// `10^k` for the fractions [`Walk::float`] reads: exact in an `f64`, the entries of
/// serde_json's own table.
const POW10: [f64; 20] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19,
];

/// A token limit's value (`max_tokens` and its kin): a non-negative integer (an integral
/// float is accepted; past `u32::MAX` it saturates), unset when missing or `null`. The error
/// is what is wrong with the value, for the refusal that names the parameter.
pub(crate) fn token_limit(raw: Option<&RawValue>) -> Result<Option<u32>, &'static str> {
    let Some(raw) = raw else { return Ok(None) };
    let n: serde_json::Number = match serde_json::from_str::<Option<serde_json::Number>>(raw.get())
    {
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

    #[test]
    fn a_walk_reads_the_members_asked_and_skips_the_rest() {
        let text = br#" { "a" : [1, {"b": "x\"}]"}, "z"], "n":null,"u": 42 ,"f":0.5, "t":true, "s":"\\"} "#;
        let mut walk = Walk::new(text);
        let mut seen = Vec::new();
        walk.object(|key, w| {
            seen.push(String::from_utf8_lossy(key).into_owned());
            match key {
                b"u" => assert_eq!(w.uint(), Ok(42)),
                b"f" => assert_eq!(w.float(), Ok(0.5)),
                b"n" => assert!(w.null()),
                _ => w.skip()?,
            }
            Ok(())
        })
        .unwrap();
        assert!(walk.at_end());
        assert_eq!(seen, ["a", "n", "u", "f", "t", "s"]);
        // An escaped key, a truncated text, nesting past the limit: not read.
        let unsure = |text: &[u8]| Walk::new(text).object(|_, w| w.skip());
        assert_eq!(unsure(br#"{"\u0061":1}"#), Err(Unsure));
        assert_eq!(unsure(br#"{"a":[1,"#), Err(Unsure));
        assert_eq!(unsure(br#"{"a":"x}"#), Err(Unsure));
        let deep = format!("{{\"a\":{}{}}}", "[".repeat(65), "]".repeat(65));
        assert_eq!(unsure(deep.as_bytes()), Err(Unsure));
        let deep = format!("{{\"a\":{}{}}}", "[".repeat(64), "]".repeat(64));
        assert_eq!(unsure(deep.as_bytes()), Ok(()));
        assert_eq!(Walk::new(b"01").uint(), Err(Unsure));
        assert_eq!(Walk::new(b"1.0").uint(), Err(Unsure));
        assert_eq!(Walk::new(b"-1").uint(), Err(Unsure));
        assert_eq!(
            Walk::new(b"9999999999999999999").uint(),
            Ok(9_999_999_999_999_999_999)
        );
        // Twenty digits are left to serde_json (within a `u64` or not).
        assert_eq!(Walk::new(b"18446744073709551615").uint(), Err(Unsure));
        assert_eq!(Walk::new(b"\"1\"").float(), Err(Unsure));
    }

    #[test]
    fn a_float_reads_as_serde_json_reads_it_not_as_correctly_rounded() {
        // serde_json without `float_roundtrip` reads this one an ulp above the nearest
        // double; a speed must read the same in a whole answer as in a stream's event.
        let text = "1966.3223151467574";
        let serde: f64 = serde_json::from_str(text).unwrap();
        assert_ne!(Ok(serde), text.parse::<f64>());
        assert_eq!(Walk::new(text.as_bytes()).float(), Ok(serde));
    }

    /// Number tokens in every spelling: serializers' (ryu, `{}`, `{:e}`), any digits with or
    /// without a fraction and exponent, integers, and bytes that are no number.
    pub(crate) fn number_token() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let finite = any::<f64>().prop_filter("finite", |f| f.is_finite());
        prop_oneof![
            finite
                .clone()
                .prop_map(|f| serde_json::to_string(&f).unwrap_or_default()),
            finite.clone().prop_map(|f| format!("{f}")),
            finite.prop_map(|f| format!("{f:e}")),
            "-?(0|[1-9][0-9]{0,24})(\\.[0-9]{0,26})?([eE][+-]?[0-9]{1,3})?",
            "[0-9]{1,4}\\.[0-9]{10,22}",
            any::<u64>().prop_map(|n| n.to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
            "[0-9.eE+-]{0,8}",
        ]
    }

    proptest::proptest! {
        /// A number reads as serde_json reads it, to the bit; what serde_json refuses is not
        /// read.
        #[test]
        fn numbers_read_as_serde_json_reads_them(token in number_token()) {
            let at_front = f64::deserialize(&mut serde_json::Deserializer::from_str(&token));
            let serde = at_front.ok().map(f64::to_bits);
            let walked = Walk::new(token.as_bytes()).float().ok().map(f64::to_bits);
            proptest::prop_assert_eq!(walked, serde, "{}", token);
            let serde = serde_json::from_str::<u64>(&token).ok();
            let mut walk = Walk::new(token.as_bytes());
            let walked = walk.uint().ok().filter(|_| walk.at_end());
            // Past 19 digits the walk is unsure.
            let long = token.len() > 19 && walked.is_none();
            proptest::prop_assert!(walked == serde || long, "{} {:?} {:?}", token, walked, serde);
        }

        /// The word-at-a-time searches find what a byte-by-byte one finds, wherever it is.
        #[test]
        fn word_searches_find_the_first_byte(
            bytes in proptest::collection::vec(proptest::prop_oneof![
                8 => 0x21u8..0x7f, 1 => proptest::sample::select(b"\"\\ \t\n,]}\x80\xff".to_vec())], 0..80),
        ) {
            let naive = bytes.iter().position(|&b| b == b'"' || b == b'\\');
            proptest::prop_assert_eq!(quote_or_backslash(&bytes), naive);
            let naive = bytes.iter().position(|&b| b <= b' ' || b",]}".contains(&b));
            proptest::prop_assert_eq!(number_end(&bytes), naive.unwrap_or(bytes.len()));
        }

        /// A walk skips exactly one value, however it is spelled.
        #[test]
        fn a_value_is_skipped_whole(v in respell::json_value(), seed: u64) {
            let text = respell::respell(&v, respell::Style::body(seed));
            let mut walk = Walk::new(text.as_bytes());
            proptest::prop_assert_eq!(walk.skip(), Ok(()));
            proptest::prop_assert!(walk.at_end(), "{}", text);
            let two = format!("[{text},{text}]");
            let mut walk = Walk::new(two.as_bytes());
            walk.at += 1;
            proptest::prop_assert_eq!(walk.skip(), Ok(()));
            proptest::prop_assert_eq!(walk.peek(), Some(b','));
        }
    }
}

/// Test support: the same JSON document written in other valid ways.
#[cfg(test)]
pub(crate) mod respell {
    use serde_json::Value;

    /// How a document may be re-spelled.
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct Style {
        /// Drives every choice (whitespace, order, escapes).
        pub seed: u64,
        /// Whitespace may include line breaks (not for an SSE `data:` line).
        pub newlines: bool,
        /// Object members in a shuffled order.
        pub reorder: bool,
        /// Characters of keys and strings written as `\u` escapes now and then.
        pub escapes: bool,
    }

    impl Style {
        /// Spaces and tabs, any order, escapes or none (the seed's lowest bits pick):
        /// what fits on one SSE line.
        pub(crate) fn line(seed: u64) -> Style {
            Style {
                seed,
                newlines: false,
                reorder: seed & 1 == 0,
                escapes: seed & 2 == 0,
            }
        }

        /// Like [`Style::line`], and line breaks too.
        pub(crate) fn body(seed: u64) -> Style {
            Style {
                newlines: true,
                ..Style::line(seed)
            }
        }
    }

    /// Any JSON value a few levels deep.
    pub(crate) fn json_value() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        use serde_json::Value;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i32>().prop_map(Value::from),
            (-1e9f64..1e9).prop_map(Value::from),
            "[ -~]{0,8}".prop_map(Value::from),
            "\\PC{0,4}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::vec(("[a-z\"\\\\ ]{0,6}", inner), 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    struct Rng(u64);

    impl Rng {
        /// splitmix64.
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// `v` written with the whitespace, member order and escapes `style` picks.
    pub(crate) fn respell(v: &Value, style: Style) -> String {
        let mut out = String::new();
        let mut rng = Rng(style.seed);
        ws(&mut out, &mut rng, style);
        value(&mut out, v, &mut rng, style);
        ws(&mut out, &mut rng, style);
        out
    }

    fn ws(out: &mut String, rng: &mut Rng, style: Style) {
        let kinds: &[char] = if style.newlines {
            &[' ', '\t', '\n', '\r']
        } else {
            &[' ', '\t']
        };
        if rng.below(2) == 0 {
            return;
        }
        for _ in 0..=rng.below(3) {
            out.push(kinds[rng.below(kinds.len() as u64) as usize]);
        }
    }

    fn value(out: &mut String, v: &Value, rng: &mut Rng, style: Style) {
        match v {
            Value::Object(map) => {
                let mut members: Vec<(&String, &Value)> = map.iter().collect();
                if style.reorder {
                    for i in (1..members.len()).rev() {
                        members.swap(i, rng.below(i as u64 + 1) as usize);
                    }
                }
                out.push('{');
                ws(out, rng, style);
                for (i, (k, v)) in members.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                        ws(out, rng, style);
                    }
                    string(out, k, rng, style);
                    ws(out, rng, style);
                    out.push(':');
                    ws(out, rng, style);
                    value(out, v, rng, style);
                    ws(out, rng, style);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                ws(out, rng, style);
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                        ws(out, rng, style);
                    }
                    value(out, v, rng, style);
                    ws(out, rng, style);
                }
                out.push(']');
            }
            Value::String(s) => string(out, s, rng, style),
            other => out.push_str(&other.to_string()),
        }
    }

    fn string(out: &mut String, s: &str, rng: &mut Rng, style: Style) {
        out.push('"');
        for c in s.chars() {
            let short = match c {
                '"' => Some("\\\""),
                '\\' => Some("\\\\"),
                '\n' => Some("\\n"),
                '\r' => Some("\\r"),
                '\t' => Some("\\t"),
                '\u{8}' => Some("\\b"),
                '\u{c}' => Some("\\f"),
                '/' if style.escapes && rng.below(2) == 0 => Some("\\/"),
                _ => None,
            };
            let must = c < ' ' || c == '"' || c == '\\';
            if (must || style.escapes) && rng.below(4) == 0 || (must && short.is_none()) {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    if rng.below(2) == 0 {
                        out.push_str(&format!("\\u{unit:04x}"));
                    } else {
                        out.push_str(&format!("\\u{unit:04X}"));
                    }
                }
            } else if let Some(escape) = short {
                out.push_str(escape);
            } else {
                out.push(c);
            }
        }
        out.push('"');
    }

    #[test]
    fn respelled_documents_parse_to_the_same_value() {
        let v = serde_json::json!({"usage": {"prompt_tokens": 3}, "a\"b": ["x/\\y\n\u{1}", 1.5, null, true],
            "e": "caf\u{e9} \u{1F600}", "n": -2});
        for seed in 0..200 {
            for style in [Style::line(seed), Style::body(seed)] {
                let text = respell(&v, style);
                let back: Value =
                    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
                assert_eq!(back, v, "{text}");
                if !style.newlines {
                    assert!(!text.contains('\n') && !text.contains('\r'), "{text}");
                }
            }
        }
    }
}
