//! Think-tag splitting of one plain text stream (an Anthropic text block, a Responses output
//! text): the chat splitter's state machine behind a small public face.

use std::sync::Arc;

use super::field::Pieces;
use super::splitter::Splitter;
use super::tags::ThinkTags;

/// Splits one text, fed in pieces, into reasoning and answer: the same split whatever the
/// pieces (text that may still start a tag is held back until it cannot).
#[derive(Debug, Clone)]
pub struct TextSplitter {
    tags: Arc<ThinkTags>,
    splitter: Splitter,
}

/// What one piece of text settled: reasoning first, then answer text (either may be empty).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Split {
    pub(crate) reasoning: String,
    pub(crate) answer: String,
}

impl Split {}

impl From<Pieces> for Split {
    fn from(p: Pieces) -> Self {
        Split {
            reasoning: p.reasoning,
            answer: p.content,
        }
    }
}

impl TextSplitter {
    pub(crate) fn new(tags: Arc<ThinkTags>) -> Self {
        let splitter = Splitter::new(&tags);
        TextSplitter { tags, splitter }
    }

    /// The next piece of text.
    pub(crate) fn push(&mut self, text: &str) -> Split {
        let mut out = Pieces::default();
        self.splitter.push(&self.tags, text, &mut out);
        out.into()
    }

    /// The end of the text: what was held back.
    pub(crate) fn finish(&mut self) -> Split {
        let mut out = Pieces::default();
        self.splitter.release(&self.tags, &mut out);
        out.into()
    }

    /// A whole text split at once.
    pub(crate) fn split_all(tags: &ThinkTags, text: &str) -> Split {
        Splitter::split_all(tags, text).into()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn pieces_split_as_the_whole_does() {
        let tags = Arc::new(ThinkTags::preset("qwen3").unwrap());
        let text = "<think>plan it</think>the answer";
        let whole = TextSplitter::split_all(&tags, text);
        assert_eq!(whole.reasoning, "plan it");
        assert_eq!(whole.answer, "the answer");
        for cut in 1..text.len() {
            let mut s = TextSplitter::new(Arc::clone(&tags));
            let (a, b) = text.split_at(cut);
            let mut got = s.push(a);
            let more = s.push(b);
            got.reasoning.push_str(&more.reasoning);
            got.answer.push_str(&more.answer);
            let end = s.finish();
            got.reasoning.push_str(&end.reasoning);
            got.answer.push_str(&end.answer);
            assert_eq!(got, whole, "cut at {cut}");
        }
    }
}
