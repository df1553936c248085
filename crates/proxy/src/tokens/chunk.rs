//! Cuts long prompt fragments where the tokenizer's pre-tokenizer always cuts, so a long
//! fragment is counted in pieces of bounded size (memory) on every core (time).
//!
//! For the GPT-4-style split regexes of Qwen2/3 and Llama 3 (applied before byte-level BPE,
//! leftmost-first, no look-behind), three places are always pre-token boundaries that no
//! match's look-ahead sees differently when the text ends there:
//! - a newline followed by an ASCII letter: no alternative matches across `"\n"` into a
//!   letter (the letter-run alternative's optional prefix excludes `\r\n`, the punctuation
//!   alternative stops at letters, the whitespace alternatives end at non-space), and a run
//!   of whitespace that ends in a newline is matched by `\s*[\r\n]+` up to it either way;
//! - a space followed by an ASCII letter: a space is inside a match only as the first byte
//!   of the letter-run or punctuation alternatives, or in a whitespace run, which `\s+(?!\S)`
//!   ends before its last space when a letter follows (as it does at the text's end), and
//!   which `\s*[\r\n]+` cannot end on;
//! - an ASCII digit after an ASCII letter or punctuation (not whitespace, not a digit): only
//!   `\p{N}` / `\p{N}{1,3}` match digits, and a run of them starts there.
//!
//! BPE runs per pre-token, so counting the pieces on each side separately gives the same
//! total. NFC cannot join the two sides either: a space, an ASCII letter or digit is a starter
//! that composes with nothing before it. A run of more than [`HARD_MAX_BYTES`] with none of
//! these places (one "word" of a quarter MiB) is cut at a character boundary there; only such
//! a run's count may differ from the tokenizer's count of the whole, by about a token a cut.

use memchr::memchr2_iter;
use tokenizers::Tokenizer;

/// GPT-4-style split patterns whose boundaries are known (Qwen2/3, then Llama 3).
const KNOWN_PATTERNS: [&str; 2] = [
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];

/// Fragments longer than this are cut (at the first safe boundary past half of it).
pub(crate) const DEFAULT_MAX_BYTES: usize = 32 * 1024;

/// Longest piece: a run with no safe boundary is cut here regardless (see the module doc).
pub(crate) const HARD_MAX_BYTES: usize = 256 * 1024;

#[derive(Debug, Clone, Copy)]
pub(crate) struct Chunker {
    max: usize,
}

impl Chunker {
    /// A chunker for `tokenizer` when its normalizer and pre-tokenizer are ones whose
    /// boundaries are known, else `None` (fragments are then counted whole).
    pub(crate) fn for_tokenizer(tokenizer: &Tokenizer, max: usize) -> Option<Chunker> {
        let normalizer = serde_json::to_value(tokenizer.get_normalizer()).ok()?;
        if !(normalizer.is_null() || normalizer == serde_json::json!({"type": "NFC"})) {
            return None;
        }
        let pre = serde_json::to_value(tokenizer.get_pre_tokenizer()).ok()?;
        let steps = pre.get("pretokenizers")?.as_array()?;
        let [split, bytelevel] = steps.as_slice() else {
            return None;
        };
        let pattern = split.get("pattern")?.get("Regex")?.as_str()?;
        let known = split.get("type")? == "Split"
            && split.get("behavior")? == "Isolated"
            && split.get("invert")? == false
            && KNOWN_PATTERNS.contains(&pattern)
            && bytelevel.get("type")? == "ByteLevel"
            && bytelevel.get("use_regex")? == false
            && bytelevel.get("add_prefix_space")? == false;
        known.then_some(Chunker { max: max.max(2) })
    }

    /// Appends `text` to `out`, cut into pieces of about `max` bytes at the safe boundaries
    /// of the module doc (a piece is longer when none is near, at most [`HARD_MAX_BYTES`]).
    pub(crate) fn split<'a>(&self, text: &'a str, out: &mut Vec<&'a str>) {
        let bytes = text.as_bytes();
        let hard = self.max.max(HARD_MAX_BYTES);
        let mut start = 0;
        while bytes.len() - start > self.max {
            let from = start + self.max / 2;
            let end = bytes.len().min(start + hard);
            let cut = safe_cut(bytes, from, end).unwrap_or_else(|| {
                if end == bytes.len() {
                    end
                } else {
                    // No safe cut: at the start of the character holding byte `end`.
                    switchboard_json::utf8::floor_char_boundary(text, end)
                }
            });
            if cut >= bytes.len() {
                break;
            }
            out.push(&text[start..cut]);
            start = cut;
        }
        out.push(&text[start..]);
    }
}

/// The first safe boundary `p` with `from <= p < end` (see the module doc), if any.
fn safe_cut(bytes: &[u8], from: usize, end: usize) -> Option<usize> {
    let newline_or_space = memchr2_iter(b'\n', b' ', &bytes[from..end])
        .map(|i| from + i)
        .find_map(|at| {
            let next = bytes.get(at + 1).is_some_and(u8::is_ascii_alphabetic);
            match bytes[at] {
                b'\n' if next => Some(at + 1),
                b' ' if next && at > 0 => Some(at),
                _ => None,
            }
        });
    let window = &bytes[from..newline_or_space.unwrap_or(end)];
    let digit = window.windows(2).position(|w| {
        w[1].is_ascii_digit() && (w[0].is_ascii_alphabetic() || w[0].is_ascii_punctuation())
    });
    digit.map(|i| from + i + 1).or(newline_or_space)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn cuts_only_at_the_safe_boundaries() {
        let c = Chunker { max: 8 };
        let mut out = Vec::new();
        c.split("abcdefgh\n  x\nyz\n1\nQrs tuv", &mut out);
        // Before the last space of a run that a letter follows; after a newline a letter
        // follows; never after a newline before a digit.
        assert_eq!(out, ["abcdefgh\n ", " x\nyz\n1\n", "Qrs tuv"]);
        let mut digits = Vec::new();
        c.split("abcdefgh12345678", &mut digits);
        assert_eq!(digits, ["abcdefgh", "12345678"]);
        let mut spaced = Vec::new();
        c.split("abcdefgh  12345678", &mut spaced);
        assert_eq!(
            spaced,
            ["abcdefgh  12345678"],
            "not before a digit after a space"
        );
        let mut whole = Vec::new();
        c.split("no_newline_anywhere_in_here", &mut whole);
        assert_eq!(whole, ["no_newline_anywhere_in_here"]);
    }

    #[test]
    fn a_run_without_boundaries_is_cut_at_the_hard_limit_on_a_character() {
        let c = Chunker {
            max: DEFAULT_MAX_BYTES,
        };
        let text = "€".repeat(100_000);
        let mut out = Vec::new();
        c.split(&text, &mut out);
        assert_eq!(out.concat(), text);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].len(), HARD_MAX_BYTES - 1);
    }
}
