//! Byte searches that decide, without a JSON parse, whether a payload may need rewriting.
//!
//! They look for `"key"` followed by `:` and a value (`switchboard_json::scan::values`: a quote
//! inside a JSON string is always escaped, so such a match is a real key; whitespace and key
//! order as they come). They may answer "maybe" for a payload that needs nothing (a parse then
//! finds nothing to do), never "no" for one that needs a rewrite. A key written with escapes
//! hides from them: callers take the parsing path for a payload where
//! `switchboard_json::scan::may_escape_word` says so.

use std::sync::LazyLock;

use memchr::memmem::Finder;

use super::field::OutputField;
use super::tags::ThinkTags;
use switchboard_json::scan::keys::{CONTENT, REASONING, REASONING_CONTENT, TOOL_CALLS};
use switchboard_json::scan::{finder, skip_ws, values};

static INDEX: LazyLock<Finder<'static>> = LazyLock::new(|| finder(b"\"index\""));
static UNICODE_ESCAPE: LazyLock<Finder<'static>> = LazyLock::new(|| finder(b"\\u"));

fn has_string(data: &[u8], key: &Finder<'static>) -> bool {
    values(data, key).any(|v| v.first() == Some(&b'"'))
}

/// Whether some reasoning text may sit under a name `output` does not write (or, for
/// `Both`, under either name, so the other one can be checked and filled in).
pub(crate) fn needs_rename(data: &[u8], output: OutputField) -> bool {
    match output {
        OutputField::ReasoningContent => has_string(data, &REASONING),
        OutputField::Reasoning => has_string(data, &REASONING_CONTENT),
        OutputField::Both => has_string(data, &REASONING) || has_string(data, &REASONING_CONTENT),
    }
}

/// The payload with its one reasoning key renamed to what `output` writes, byte for byte, when
/// that is the whole rewrite: exactly one `"reasoning"` (or `"reasoning_content"`) key with a
/// string value and no key of the target name anywhere. `None` when the event needs the
/// parsing path (both names, several choices, `Both`).
pub(crate) fn rename_key(data: &[u8], output: OutputField) -> Option<Vec<u8>> {
    let (from, to, target): (&Finder<'static>, &[u8], &Finder<'static>) = match output {
        OutputField::ReasoningContent => (&REASONING, b"\"reasoning_content\"", &REASONING_CONTENT),
        OutputField::Reasoning => (&REASONING_CONTENT, b"\"reasoning\"", &REASONING),
        OutputField::Both => return None,
    };
    if target.find(data).is_some() {
        return None;
    }
    let mut keys = from.find_iter(data);
    let at = keys.next()?;
    if keys.next().is_some() {
        return None;
    }
    let rest = skip_ws(data.get(at + from.needle().len()..)?);
    let value = skip_ws(rest.strip_prefix(b":")?);
    if value.first() != Some(&b'"') {
        return None;
    }
    let mut out = Vec::with_capacity(data.len() + to.len());
    out.extend_from_slice(&data[..at]);
    out.extend_from_slice(to);
    out.extend_from_slice(&data[at + from.needle().len()..]);
    Some(out)
}

/// Whether the payload has reasoning text under `name` (`reasoning` or `reasoning_content`).
pub(crate) fn has_reasoning_named(data: &[u8], name: &str) -> bool {
    if name == "reasoning" {
        has_string(data, &REASONING)
    } else {
        has_string(data, &REASONING_CONTENT)
    }
}

/// Whether some `content` key has a string value.
pub(crate) fn has_content_text(data: &[u8]) -> bool {
    has_string(data, &CONTENT)
}

/// Whether the payload has a `tool_calls` key.
pub(crate) fn has_tool_calls(data: &[u8]) -> bool {
    TOOL_CALLS.find(data).is_some()
}

/// The values of every `"index":` key, `None` where it is not a plain unsigned integer
/// (`1.0` and `1e0` are numbers a parse does not read as one).
pub(crate) fn indices(data: &[u8]) -> impl Iterator<Item = Option<u64>> + '_ {
    values(data, &INDEX).map(|v| {
        let digits = v.iter().take_while(|b| b.is_ascii_digit()).count();
        if matches!(v.get(digits), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        std::str::from_utf8(v.get(..digits)?).ok()?.parse().ok()
    })
}

/// Finds whether a payload may contain the first character of a tag in some string,
/// written plainly or as a JSON `\u` escape.
#[derive(Debug, Clone)]
pub(crate) struct TagStart {
    byte: u8,
    /// `\u00xx` in lower and upper case hex, for an ASCII first character.
    escapes: Option<[Finder<'static>; 2]>,
}

impl TagStart {
    pub(crate) fn new(tag: &str) -> Self {
        let first = tag.chars().next().unwrap_or('\0');
        let escapes = first.is_ascii().then(|| {
            let code = u32::from(first);
            [
                finder(format!("\\u{code:04x}").as_bytes()),
                finder(format!("\\u{code:04X}").as_bytes()),
            ]
        });
        TagStart {
            byte: tag.as_bytes().first().copied().unwrap_or(0),
            escapes,
        }
    }

    pub(crate) fn for_open(tags: &ThinkTags) -> Self {
        Self::new(&tags.open)
    }

    pub(crate) fn maybe_in(&self, data: &[u8]) -> bool {
        if memchr::memchr(self.byte, data).is_some() {
            return true;
        }
        match &self.escapes {
            Some(escapes) => escapes.iter().any(|f| f.find(data).is_some()),
            // A non-ASCII first character may be escaped in many ways: any escape counts.
            None => UNICODE_ESCAPE.find(data).is_some(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn rename_needed_only_for_text_under_the_other_name() {
        let rc = br#"{"delta":{"reasoning_content":"x"}}"#;
        let r = br#"{"delta":{"reasoning" : "x"}}"#;
        let null = br#"{"delta":{"reasoning":null,"content":"hi"}}"#;
        let value = br#"{"type":"reasoning","content":"say \"reasoning\": no"}"#;
        assert!(!needs_rename(rc, OutputField::ReasoningContent));
        assert!(needs_rename(rc, OutputField::Reasoning));
        assert!(needs_rename(rc, OutputField::Both));
        assert!(needs_rename(r, OutputField::ReasoningContent));
        assert!(!needs_rename(r, OutputField::Reasoning));
        assert!(!needs_rename(null, OutputField::ReasoningContent));
        assert!(!needs_rename(value, OutputField::ReasoningContent));
        assert!(has_content_text(null));
        assert!(!has_content_text(
            br#"{"delta":{"content":null,"reasoning_content":"a"}}"#
        ));
    }

    #[test]
    fn indices_read_plain_numbers() {
        let data = br#"{"choices":[{"index":0,"delta":{}},{"index": 12},{"index":"x"}]}"#;
        assert_eq!(
            indices(data).collect::<Vec<_>>(),
            vec![Some(0), Some(12), None]
        );
        let floats = br#"{"choices":[{"index":1.0},{"index":1e0},{"index":2 }]}"#;
        assert_eq!(
            indices(floats).collect::<Vec<_>>(),
            vec![None, None, Some(2)]
        );
    }

    #[test]
    fn tag_start_sees_escapes() {
        let start = TagStart::new("<think>");
        assert!(start.maybe_in(b"a<b"));
        assert!(start.maybe_in(br#""\u003cthink>""#));
        assert!(start.maybe_in(br#""\u003Cthink>""#));
        assert!(!start.maybe_in(br#""plain \u00e9 text""#));
        let wide = TagStart::new("«r»");
        assert!(wide.maybe_in(br#""\u00abr""#));
        assert!(!wide.maybe_in(b"plain"));
    }
}

#[cfg(test)]
mod rename_tests {
    use super::*;

    #[test]
    fn renames_one_string_key_in_place() {
        let data = br#"{"id":"x","choices":[{"index":0,"delta":{"reasoning":"a \"reasoning\": b"},"finish_reason":null}]}"#;
        let out = rename_key(data, OutputField::ReasoningContent).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"id":"x","choices":[{"index":0,"delta":{"reasoning_content":"a \"reasoning\": b"},"finish_reason":null}]}"#
        );
        let back = br#"{"delta":{"reasoning_content" : "t"}}"#;
        let out = rename_key(back, OutputField::Reasoning).unwrap();
        assert_eq!(out, br#"{"delta":{"reasoning" : "t"}}"#.to_vec());
    }

    #[test]
    fn leaves_the_parsing_path_for_anything_else() {
        let both = br#"{"delta":{"reasoning":"a","reasoning_content":"a"}}"#;
        assert!(rename_key(both, OutputField::ReasoningContent).is_none());
        let two = br#"{"choices":[{"delta":{"reasoning":"a"}},{"delta":{"reasoning":"b"}}]}"#;
        assert!(rename_key(two, OutputField::ReasoningContent).is_none());
        let null = br#"{"delta":{"reasoning":null,"content":"x"}}"#;
        assert!(rename_key(null, OutputField::ReasoningContent).is_none());
        let one = br#"{"delta":{"reasoning":"a"}}"#;
        assert!(rename_key(one, OutputField::Both).is_none());
    }
}
