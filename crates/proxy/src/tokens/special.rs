//! Splits a rendered prompt at added (special) tokens, as tokenizers do before anything else.

use memchr::memchr3;

/// The added tokens a tokenizer extracts from raw text, matched leftmost-longest like HF
/// `tokenizers` (an Aho-Corasick `LeftmostLongest` automaton over non-normalized tokens).
pub(crate) struct Specials {
    /// Tokens grouped by first byte, longest first within a group.
    by_first: Vec<(u8, Vec<Box<str>>)>,
    /// `Some` when at most three first bytes exist (then `memchr3` finds candidates).
    firsts3: Option<[u8; 3]>,
    table: [bool; 256],
}

/// A piece of the prompt: text between added tokens, or one added token.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Piece<'a> {
    Text(&'a str),
    Special,
}

impl Specials {
    pub(crate) fn new<I: IntoIterator<Item = String>>(tokens: I) -> Specials {
        let mut by_first: Vec<(u8, Vec<Box<str>>)> = Vec::new();
        let mut table = [false; 256];
        for t in tokens {
            let Some(&b) = t.as_bytes().first() else {
                continue;
            };
            table[usize::from(b)] = true;
            match by_first.iter_mut().find(|(f, _)| *f == b) {
                Some((_, list)) => list.push(t.into_boxed_str()),
                None => by_first.push((b, vec![t.into_boxed_str()])),
            }
        }
        for (_, list) in &mut by_first {
            list.sort_by_key(|t| std::cmp::Reverse(t.len()));
            list.dedup();
        }
        let firsts3 = match by_first.as_slice() {
            [] => Some([0, 0, 0]),
            [a] => Some([a.0, a.0, a.0]),
            [a, b] => Some([a.0, b.0, b.0]),
            [a, b, c] => Some([a.0, b.0, c.0]),
            _ => None,
        };
        Specials {
            by_first,
            firsts3,
            table,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_first.is_empty()
    }

    /// The longest added token starting at byte `i` of `text`.
    fn match_at(&self, text: &str, i: usize) -> Option<usize> {
        let rest = &text.as_bytes()[i..];
        let first = *rest.first()?;
        let (_, list) = self.by_first.iter().find(|(f, _)| *f == first)?;
        list.iter()
            .find(|t| rest.starts_with(t.as_bytes()))
            .map(|t| t.len())
    }

    /// The next byte at or after `from` where an added token may start.
    fn next_candidate(&self, bytes: &[u8], from: usize) -> Option<usize> {
        let rest = bytes.get(from..)?;
        let found = match self.firsts3 {
            Some([a, b, c]) => memchr3(a, b, c, rest),
            None => rest.iter().position(|b| self.table[usize::from(*b)]),
        };
        found.map(|i| from + i)
    }

    /// Calls `f` for each piece of `text` in order. Empty text pieces are skipped.
    pub(crate) fn split<'a>(&self, text: &'a str, mut f: impl FnMut(Piece<'a>)) {
        let bytes = text.as_bytes();
        let (mut start, mut pos) = (0, 0);
        if !self.is_empty() {
            while let Some(i) = self.next_candidate(bytes, pos) {
                match self.match_at(text, i) {
                    Some(len) => {
                        if i > start {
                            f(Piece::Text(&text[start..i]));
                        }
                        f(Piece::Special);
                        start = i + len;
                        pos = start;
                    }
                    None => pos = i + 1,
                }
            }
        }
        if start < text.len() {
            f(Piece::Text(&text[start..]));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn pieces(sp: &Specials, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        sp.split(text, |p| {
            out.push(match p {
                Piece::Text(t) => t.to_string(),
                Piece::Special => "#".to_string(),
            })
        });
        out
    }

    #[test]
    fn splits_leftmost_longest() {
        let sp = Specials::new(["<a>", "<a>b", "</a>", "x"].map(String::from));
        assert_eq!(
            pieces(&sp, "q<a>b<a>c</a></a>zx"),
            ["q", "#", "#", "c", "#", "#", "z", "#"]
        );
        assert_eq!(pieces(&sp, "no tokens"), ["no tokens"]);
        assert_eq!(pieces(&sp, ""), Vec::<String>::new());
    }

    #[test]
    fn many_first_bytes_use_the_table() {
        let sp = Specials::new(["<s>", "[INST]", "{x}", "|y|"].map(String::from));
        assert_eq!(
            pieces(&sp, "a<s>[INST]b{x}|y||"),
            ["a", "#", "#", "b", "#", "#", "|"]
        );
    }

    #[test]
    fn overlapping_candidates_are_skipped_inside_a_match() {
        let sp = Specials::new(["<|im_start|>", "|"].map(String::from));
        assert_eq!(pieces(&sp, "a<|im_start|>b|"), ["a", "#", "b", "#"]);
    }
}
