//! The think-tag splitter: a streaming state machine that moves tagged text out of content.
//!
//! Feeding a text in any number of pieces gives the same reasoning and content as feeding it
//! whole: at each position the machine decides only once the bytes there settle it. Text
//! that may still start a tag is held back, and released as soon as it cannot.

use super::field::Pieces;
use super::tags::ThinkTags;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Outside reasoning: looking for the open tag.
    Content,
    /// Inside a reasoning block: looking for the close tag.
    Reasoning,
    /// Reasoning forced open by the template: the close tag ends it, an open tag seen
    /// first is consumed.
    ForcedOpen,
}

#[derive(Debug, Clone, Copy)]
enum Tag {
    Open,
    Close,
}

/// The splitter state of one choice. The tags are passed to each call so that one shared
/// set serves every choice.
#[derive(Debug, Clone)]
pub(crate) struct Splitter {
    state: State,
    /// A proper prefix of a tag the state is looking for, at the end of the text so far.
    held: String,
}

impl Splitter {
    pub(crate) fn new(tags: &ThinkTags) -> Self {
        Splitter {
            state: if tags.starts_open {
                State::ForcedOpen
            } else {
                State::Content
            },
            held: String::new(),
        }
    }

    /// Splits a whole text (a non-streaming message).
    pub(crate) fn split_all(tags: &ThinkTags, text: &str) -> Pieces {
        let mut splitter = Splitter::new(tags);
        let mut out = Pieces::default();
        splitter.push(tags, text, &mut out);
        splitter.release(tags, &mut out);
        out
    }

    /// Whether text is held back waiting for more bytes.
    pub(crate) fn is_holding(&self) -> bool {
        !self.held.is_empty()
    }

    /// Whether the next content text would be reasoning.
    pub(crate) fn in_reasoning(&self) -> bool {
        self.state != State::Content
    }

    /// Feeds the next piece of text, appending what is settled to `out`.
    pub(crate) fn push(&mut self, tags: &ThinkTags, text: &str, out: &mut Pieces) {
        self.feed(tags, text, false, out);
    }

    /// Releases held text: what comes next cannot continue it (end of the text, or the
    /// stream moved on to a tool call or a finish). Tags inside it still count.
    pub(crate) fn release(&mut self, tags: &ThinkTags, out: &mut Pieces) {
        let held = std::mem::take(&mut self.held);
        self.feed(tags, &held, true, out);
    }

    /// The scan: `last` means no more text follows, so nothing is held.
    fn feed(&mut self, tags: &ThinkTags, text: &str, last: bool, out: &mut Pieces) {
        if text.is_empty() {
            return;
        }
        let joined;
        let s: &str = if self.held.is_empty() {
            text
        } else {
            let mut held = std::mem::take(&mut self.held);
            held.push_str(text);
            joined = held;
            &joined
        };
        let bytes = s.as_bytes();
        let mut start = 0;
        let mut at = 0;
        loop {
            let wanted = self.wanted(tags);
            let Some(pos) = next_candidate(bytes, at, &wanted) else {
                self.emit(&s[start..], out);
                return;
            };
            match decide(&s[pos..], &wanted, last) {
                Decision::Match(tag, len) => {
                    self.emit(&s[start..pos], out);
                    self.state = match tag {
                        Tag::Open => State::Reasoning,
                        Tag::Close => State::Content,
                    };
                    at = pos + len;
                    start = at;
                }
                Decision::Pending => {
                    self.emit(&s[start..pos], out);
                    self.held = s[pos..].to_owned();
                    return;
                }
                Decision::No => at = pos + 1,
            }
        }
    }

    fn emit(&self, text: &str, out: &mut Pieces) {
        match self.state {
            State::Content => out.content.push_str(text),
            State::Reasoning | State::ForcedOpen => out.reasoning.push_str(text),
        }
    }

    /// The tags looked for in the current state, in priority order.
    fn wanted<'t>(&self, tags: &'t ThinkTags) -> Wanted<'t> {
        match self.state {
            State::Content => Wanted::One((tags.open.as_bytes(), Tag::Open)),
            State::Reasoning => Wanted::One((tags.close.as_bytes(), Tag::Close)),
            State::ForcedOpen => Wanted::Two(
                (tags.close.as_bytes(), Tag::Close),
                (tags.open.as_bytes(), Tag::Open),
            ),
        }
    }
}

enum Wanted<'t> {
    One((&'t [u8], Tag)),
    Two((&'t [u8], Tag), (&'t [u8], Tag)),
}

enum Decision {
    Match(Tag, usize),
    Pending,
    No,
}

/// The first position at or after `from` whose byte can start a wanted tag.
fn next_candidate(bytes: &[u8], from: usize, wanted: &Wanted<'_>) -> Option<usize> {
    let rest = bytes.get(from..)?;
    let found = match wanted {
        Wanted::One((tag, _)) => memchr::memchr(*tag.first()?, rest),
        Wanted::Two((a, _), (b, _)) => memchr::memchr2(*a.first()?, *b.first()?, rest),
    };
    found.map(|i| from + i)
}

/// What the text at a candidate position is: the first wanted tag (in priority order) that
/// matches, or may still match unless this is the `last` text, decides.
fn decide(rest: &str, wanted: &Wanted<'_>, last: bool) -> Decision {
    let rest = rest.as_bytes();
    let check = |tag: &[u8], kind: Tag| {
        if rest.starts_with(tag) {
            Some(Decision::Match(kind, tag.len()))
        } else if !last && tag.starts_with(rest) {
            Some(Decision::Pending)
        } else {
            None
        }
    };
    match wanted {
        Wanted::One((tag, kind)) => check(tag, *kind),
        Wanted::Two((a, ka), (b, kb)) => check(a, *ka).or_else(|| check(b, *kb)),
    }
    .unwrap_or(Decision::No)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tags(open: &str, close: &str, starts_open: bool) -> ThinkTags {
        ThinkTags {
            open: open.into(),
            close: close.into(),
            starts_open,
        }
    }

    fn think(starts_open: bool) -> ThinkTags {
        tags("<think>", "</think>", starts_open)
    }

    /// The split of a whole text, written without the machine: leftmost tag first, the
    /// close tag winning a tie.
    fn reference(tags: &ThinkTags, text: &str) -> (String, String) {
        let (mut reasoning, mut content) = (String::new(), String::new());
        let mut state = if tags.starts_open {
            State::ForcedOpen
        } else {
            State::Content
        };
        let mut rest = text;
        loop {
            let close = rest
                .find(&tags.close)
                .map(|i| (i, tags.close.len(), State::Content));
            let open = rest
                .find(&tags.open)
                .map(|i| (i, tags.open.len(), State::Reasoning));
            let next = match state {
                State::Content => open,
                State::Reasoning => close,
                State::ForcedOpen => match (close, open) {
                    (Some(c), Some(o)) => Some(if o.0 < c.0 { o } else { c }),
                    (c, o) => c.or(o),
                },
            };
            let sink = if state == State::Content {
                &mut content
            } else {
                &mut reasoning
            };
            match next {
                Some((at, len, to)) => {
                    sink.push_str(&rest[..at]);
                    rest = &rest[at + len..];
                    state = to;
                }
                None => {
                    sink.push_str(rest);
                    return (reasoning, content);
                }
            }
        }
    }

    /// Feeds `pieces` one by one, checking that held text is always a proper tag prefix.
    fn streamed(tags: &ThinkTags, pieces: &[&str]) -> (String, String) {
        let mut splitter = Splitter::new(tags);
        let mut out = Pieces::default();
        for piece in pieces {
            splitter.push(tags, piece, &mut out);
            let held = splitter.held.as_str();
            assert!(
                held.is_empty()
                    || (tags.open.starts_with(held) && held != tags.open)
                    || (tags.close.starts_with(held) && held != tags.close),
                "held {held:?} is not a tag prefix"
            );
        }
        splitter.release(tags, &mut out);
        (out.reasoning, out.content)
    }

    fn split(tags: &ThinkTags, text: &str) -> (String, String) {
        let p = Splitter::split_all(tags, text);
        (p.reasoning, p.content)
    }

    fn pair(r: &str, c: &str) -> (String, String) {
        (r.to_owned(), c.to_owned())
    }

    #[test]
    fn whole_text() {
        let t = think(false);
        assert_eq!(
            split(&t, "<think>\nhm\n</think>\n\nHi"),
            pair("\nhm\n", "\n\nHi")
        );
        assert_eq!(split(&t, "no tags at all"), pair("", "no tags at all"));
        assert_eq!(
            split(&t, "a<think>b</think>c<think>d</think>e"),
            pair("bd", "ace")
        );
        assert_eq!(split(&t, "<think>unterminated"), pair("unterminated", ""));
        assert_eq!(
            split(&t, "stray</think>close"),
            pair("", "stray</think>close")
        );
        assert_eq!(split(&t, "ends with <thi"), pair("", "ends with <thi"));
    }

    #[test]
    fn forced_open() {
        let t = think(true);
        assert_eq!(split(&t, "hm\n</think>\n\nHi"), pair("hm\n", "\n\nHi"));
        assert_eq!(split(&t, "<think>\nhm</think>Hi"), pair("\nhm", "Hi"));
        assert_eq!(split(&t, "all reasoning"), pair("all reasoning", ""));
        assert_eq!(split(&t, "a</think>b<think>c</think>d"), pair("ac", "bd"));
    }

    #[test]
    fn tag_cut_across_chunks() {
        let t = think(false);
        let pieces = [
            "<t", "h", "ink", ">\nL", "et", ".\n", "</", "th", "in", "k>", "\n\nH", "i",
        ];
        assert_eq!(streamed(&t, &pieces), pair("\nLet.\n", "\n\nHi"));
        let mut s = Splitter::new(&t);
        let mut out = Pieces::default();
        s.push(&t, "<think>abc</th", &mut out);
        assert!(s.is_holding());
        assert_eq!(out.reasoning, "abc");
        s.push(&t, "ink>x", &mut out);
        assert_eq!(
            out,
            Pieces {
                reasoning: "abc".into(),
                content: "x".into()
            }
        );
    }

    #[test]
    fn held_text_released_once_it_cannot_be_a_tag() {
        let t = think(false);
        let mut s = Splitter::new(&t);
        let mut out = Pieces::default();
        s.push(&t, "a <", &mut out);
        assert_eq!(out.content, "a ");
        assert!(s.is_holding());
        s.push(&t, "= b", &mut out);
        assert_eq!(out.content, "a <= b");
        assert!(!s.is_holding());
        // `<<think>`: the first `<` is released, the tag still found.
        s.push(&t, "<", &mut out);
        s.push(&t, "<think>r", &mut out);
        assert_eq!(
            out,
            Pieces {
                reasoning: "r".into(),
                content: "a <= b<".into()
            }
        );
        assert!(s.in_reasoning());
    }

    #[test]
    fn presets_split() {
        let gemma = ThinkTags::preset("gemma4").unwrap();
        assert_eq!(
            split(&gemma, "<|channel>thought\nplan<channel|>Answer"),
            pair("\nplan", "Answer")
        );
        let oss = ThinkTags::preset("gpt-oss").unwrap();
        let text = "<|channel|>analysis<|message|>User greets.<|end|><|start|>assistant<|channel|>final<|message|>Hello!";
        assert_eq!(split(&oss, text), pair("User greets.", "Hello!"));
        let bytes: Vec<String> = text.chars().map(String::from).collect();
        let pieces: Vec<&str> = bytes.iter().map(String::as_str).collect();
        assert_eq!(streamed(&oss, &pieces), pair("User greets.", "Hello!"));
    }

    #[test]
    fn open_tag_prefix_of_close_at_the_end() {
        // Degenerate pair: the machine and the reference agree at the end of the text.
        let t = tags("<a", "<ab>", true);
        assert_eq!(streamed(&t, &["x<", "a"]), reference(&t, "x<a"));
        assert_eq!(split(&t, "x<ab>y<a"), reference(&t, "x<ab>y<a"));
    }

    /// Texts built from tag fragments, so partial and complete tags are frequent.
    fn text() -> impl Strategy<Value = String> {
        let parts = prop::sample::select(vec![
            "<think>",
            "</think>",
            "<",
            "</",
            "<t",
            "th",
            "ink",
            ">",
            "think>",
            "a",
            "b c",
            "\n",
            "é",
            "日本",
            "<|channel>thought",
            "<channel|>",
            "<|end|>",
            "<|start|>",
            "final",
            "<|channel|>analysis<|message|>",
            "<|message|>",
            "<|end|><|start|>assistant<|channel|>final<|message|>",
        ]);
        prop::collection::vec(parts, 0..24).prop_map(|v| v.concat())
    }

    fn any_tags() -> impl Strategy<Value = ThinkTags> {
        let names = prop::sample::select(vec!["qwen3", "gemma4", "gpt-oss", "custom"]);
        (names, any::<bool>()).prop_map(|(name, starts_open)| {
            let mut t = ThinkTags::preset(name).unwrap_or_else(|| tags("<", ">", false));
            t.starts_open = starts_open;
            t
        })
    }

    /// Cuts `text` at the char boundaries nearest to `cuts` (fractions of its length).
    fn cut<'a>(text: &'a str, cuts: &[f64]) -> Vec<&'a str> {
        let mut at: Vec<usize> = cuts
            .iter()
            .map(|f| (f * text.len() as f64) as usize)
            .map(|mut i| {
                while !text.is_char_boundary(i) {
                    i -= 1;
                }
                i
            })
            .collect();
        at.push(0);
        at.push(text.len());
        at.sort_unstable();
        at.dedup();
        at.windows(2).map(|w| &text[w[0]..w[1]]).collect()
    }

    proptest! {
        #[test]
        fn any_chunking_gives_the_whole_text_split(
            tags in any_tags(),
            text in text(),
            cuts in prop::collection::vec(0.0f64..1.0, 0..12),
        ) {
            let whole = reference(&tags, &text);
            prop_assert_eq!(&split(&tags, &text), &whole);
            prop_assert_eq!(&streamed(&tags, &cut(&text, &cuts)), &whole);
            let chars: Vec<String> = text.chars().map(String::from).collect();
            let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
            prop_assert_eq!(&streamed(&tags, &pieces), &whole);
        }
    }
}
