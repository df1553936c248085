//! Cuts long prompt fragments where the tokenizer's pre-tokenizer always cuts, for parallelism.
//!
//! For the GPT-4-style split regexes of Qwen2/3 and Llama 3 (applied before byte-level BPE),
//! a newline followed by an ASCII letter is always a pre-token boundary: no alternative of
//! the regex matches across `"\n"` into a letter (the letter-run alternative's optional
//! prefix excludes `\r\n`, the punctuation alternative stops at letters, the whitespace
//! alternatives end at non-space), the regex has no look-behind, and BPE runs per
//! pre-token. NFC cannot join the two either: an ASCII letter is a starter that composes
//! with nothing before it. So counting the pieces on each side separately gives the same
//! total, and a 100k-token tool output is counted on every core instead of one.

use memchr::memchr_iter;
use tokenizers::Tokenizer;

/// GPT-4-style split patterns whose boundaries are known (Qwen2/3, then Llama 3).
const KNOWN_PATTERNS: [&str; 2] = [
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];

/// Fragments longer than this are cut (at the first safe boundary past half of it).
pub const DEFAULT_MAX_BYTES: usize = 32 * 1024;

#[derive(Debug, Clone, Copy)]
pub struct Chunker {
    max: usize,
}

impl Chunker {
    /// A chunker for `tokenizer` when its normalizer and pre-tokenizer are ones whose
    /// boundaries are known, else `None` (fragments are then counted whole).
    pub fn for_tokenizer(tokenizer: &Tokenizer, max: usize) -> Option<Chunker> {
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

    /// Appends `text` to `out`, cut into pieces of at most about `max` bytes where a
    /// newline is followed by an ASCII letter (a piece is longer when no such place exists).
    pub fn split<'a>(&self, text: &'a str, out: &mut Vec<&'a str>) {
        let bytes = text.as_bytes();
        let mut start = 0;
        while bytes.len() - start > self.max {
            let from = start + self.max / 2;
            let cut = memchr_iter(b'\n', &bytes[from..])
                .map(|i| from + i + 1)
                .find(|&p| bytes.get(p).is_some_and(u8::is_ascii_alphabetic));
            match cut {
                Some(p) => {
                    out.push(&text[start..p]);
                    start = p;
                }
                None => break,
            }
        }
        out.push(&text[start..]);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn cuts_only_before_letters_after_newlines() {
        let c = Chunker { max: 8 };
        let mut out = Vec::new();
        c.split("abcdefgh\n  x\nyz\n1\nQrs tuv", &mut out);
        assert_eq!(out, ["abcdefgh\n  x\n", "yz\n1\n", "Qrs tuv"]);
        assert_eq!(out.concat(), "abcdefgh\n  x\nyz\n1\nQrs tuv");
        let mut whole = Vec::new();
        c.split("no newline anywhere in here", &mut whole);
        assert_eq!(whole, ["no newline anywhere in here"]);
    }
}
