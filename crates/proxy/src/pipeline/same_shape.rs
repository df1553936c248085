//! Events shaped as the one before: what the relay read in an event holds for the next when
//! only the text of one string differs.
//!
//! The events of a stream repeat one envelope (`{"id":…,"choices":[{"index":0,"delta":
//! {"content":"…"},…}]}`) around a delta's text. An event that is the last event's bytes
//! with only the inside of one string changed — no quote or backslash in the new text, so it
//! stays inside that string — has the same keys, the same value types and the same escapes
//! as the last one: every reading that depends only on those (an error member, a usage
//! object, a `\u00XX` escape of a word character, a key-driven transform's verdict) is the
//! same. Checking that costs two comparisons and one short search, where the readings cost
//! three searches of the whole event.

use memchr::memmem::Finder;

use switchboard_json::scan::{self as json_scan, keys};

/// Keys whose string value is the text that changes from one event to the next.
fn text_keys() -> [&'static Finder<'static>; 3] {
    [&keys::CONTENT, &keys::REASONING_CONTENT, &keys::REASONING]
}

/// The last event remembered as the bytes around its text: `head` up to and including the
/// text's opening quote, `tail` from its closing quote on.
#[derive(Default)]
pub(crate) struct LastShape {
    head: Vec<u8>,
    tail: Vec<u8>,
    /// The transform left the remembered event unchanged, and its verdict follows the keys.
    kept: bool,
    /// The remembered event with its text emptied has a token (another key's).
    token_besides: bool,
}

impl LastShape {
    /// Whether `data` is the remembered event with only its text changed; `Some(kept)` then,
    /// where `kept` says whether the transform left that event as it was.
    pub(crate) fn matches(&self, data: &[u8]) -> Option<bool> {
        if self.head.is_empty() {
            return None;
        }
        let text_len = data.len().checked_sub(self.head.len() + self.tail.len())?;
        if !data.starts_with(&self.head) || !data.ends_with(&self.tail) {
            return None;
        }
        let text = &data[self.head.len()..self.head.len() + text_len];
        memchr::memchr2(b'"', b'\\', text)
            .is_none()
            .then_some(self.kept)
    }

    /// Whether `data`, which [`LastShape::matches`] took, has a token: text in its text
    /// key's string, or a token the remembered event has besides.
    pub(crate) fn has_token(&self, data: &[u8]) -> bool {
        self.token_besides || data.len() > self.head.len() + self.tail.len()
    }

    /// Remember `data`, read in full and found to have no error, no usage and no escaped
    /// word character, by the string value of its first text key (none: forget). `token`
    /// says whether such data (`data` with its text emptied) has a token.
    pub(crate) fn remember(&mut self, data: &[u8], kept: bool, token: impl FnOnce(&[u8]) -> bool) {
        self.head.clear();
        self.tail.clear();
        let Some((start, end)) = text_span(data) else {
            return;
        };
        self.head.extend_from_slice(&data[..start]);
        self.tail.extend_from_slice(&data[end..]);
        self.kept = kept;
        self.token_besides = if start == end {
            token(data)
        } else {
            token(&[&self.head[..], &self.tail[..]].concat())
        };
    }

    pub(crate) fn forget(&mut self) {
        self.head.clear();
        self.tail.clear();
    }
}

/// The inside of the string value of the first text key found, when it holds no quote or
/// backslash: `(first byte, closing quote)`.
fn text_span(data: &[u8]) -> Option<(usize, usize)> {
    text_keys().into_iter().find_map(|key| {
        json_scan::values(data, key).find_map(|v| {
            let open = data.len() - v.len();
            (v.first() == Some(&b'"')).then_some(())?;
            let len = memchr::memchr2(b'"', b'\\', &v[1..])?;
            (v[1 + len] == b'"').then_some((open + 1, open + 1 + len))
        })
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn an_event_with_other_text_matches_and_one_with_other_keys_does_not() {
        let mut last = LastShape::default();
        let first =
            br#"{"id":"c","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}"#;
        assert_eq!(last.matches(first), None);
        last.remember(first, true, |_| false);
        assert_eq!(last.matches(first), Some(true));
        let other = br#"{"id":"c","choices":[{"index":0,"delta":{"content":" there, and more"},"finish_reason":null}]}"#;
        assert_eq!(last.matches(other), Some(true));
        let empty =
            br#"{"id":"c","choices":[{"index":0,"delta":{"content":""},"finish_reason":null}]}"#;
        assert_eq!(last.matches(empty), Some(true));
        // Text that leaves its string, or holds an escape, is not the same shape.
        let breaks_out = br#"{"id":"c","choices":[{"index":0,"delta":{"content":"","usage":{},"x":""},"finish_reason":null}]}"#;
        assert_eq!(last.matches(breaks_out), None);
        let escaped = br#"{"id":"c","choices":[{"index":0,"delta":{"content":"\u0041"},"finish_reason":null}]}"#;
        assert_eq!(last.matches(escaped), None);
        let ends = br#"{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#;
        assert_eq!(last.matches(ends), None);
    }

    #[test]
    fn an_event_without_plain_text_is_not_remembered() {
        let mut last = LastShape::default();
        last.remember(
            br#"{"choices":[{"delta":{"content":"a\"b"}}]}"#,
            true,
            |_| false,
        );
        assert_eq!(
            last.matches(br#"{"choices":[{"delta":{"content":"a\"b"}}]}"#),
            None
        );
        last.remember(
            br#"{"choices":[{"delta":{"role":"assistant"}}]}"#,
            true,
            |_| false,
        );
        assert_eq!(
            last.matches(br#"{"choices":[{"delta":{"role":"assistant"}}]}"#),
            None
        );
        // A key spelled inside a string is not a key.
        last.remember(br#"{"a":"\"content\":\"x\""}"#, true, |_| false);
        assert_eq!(last.matches(br#"{"a":"\"content\":\"y\""}"#), None);
    }
}
