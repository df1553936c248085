//! What the relay reads in one chat event's data: text, tokens, usage, an error, by key
//! searches where they answer what a parse would, else from one parse.

use std::sync::LazyLock;

use memchr::memmem::Finder;
use serde_json::Value;

use switchboard_json::scan::keys::{CONTENT, REASONING, REASONING_CONTENT, TOOL_CALLS};
use switchboard_json::scan::{self as json_scan, finder};

/// Searchers built once: building one per event costs more than the search.
static DELTA: LazyLock<Finder<'static>> = LazyLock::new(|| finder(br#""delta""#));
static TEXT: LazyLock<Finder<'static>> = LazyLock::new(|| finder(br#""text""#));
static USAGE: LazyLock<Finder<'static>> = LazyLock::new(|| finder(br#""usage""#));
static ERROR: LazyLock<Finder<'static>> = LazyLock::new(|| finder(br#""error""#));

/// One event's data as the relay reads it: by key searches (`switchboard_json::scan::values`,
/// whitespace and key order as they come), which answer what a parse answers unless a word
/// character is written as an escape; then from a parse, made once.
pub(crate) struct EventReadings<'a> {
    data: &'a [u8],
    /// The parse, when the key searches cannot be sure (`Null` for data that is no JSON).
    parsed: Option<Value>,
}

impl<'a> EventReadings<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        let parsed = json_scan::may_escape_word(data)
            .then(|| serde_json::from_slice(data).unwrap_or(Value::Null));
        EventReadings { data, parsed }
    }

    /// Some member named `name` (searched as `key`) anywhere has a value `bytes` or `value`
    /// accepts (`bytes` sees the value's JSON text from its first byte on).
    fn any(
        &self,
        key: &Finder<'static>,
        name: &str,
        bytes: fn(&[u8]) -> bool,
        value: fn(&Value) -> bool,
    ) -> bool {
        match &self.parsed {
            None => json_scan::values(self.data, key).any(bytes),
            Some(v) => any_member(v, name, value),
        }
    }

    /// A non-empty string is the value of some `name` member.
    fn has_text(&self, key: &Finder<'static>, name: &str) -> bool {
        self.any(
            key,
            name,
            |v| v.first() == Some(&b'"') && v.get(1).is_some_and(|b| *b != b'"'),
            |v| v.as_str().is_some_and(|s| !s.is_empty()),
        )
    }

    pub(crate) fn has_content(&self) -> bool {
        self.has_text(&CONTENT, "content")
    }

    pub(crate) fn has_token(&self) -> bool {
        self.has_content()
            || self.has_text(&REASONING_CONTENT, "reasoning_content")
            || self.has_text(&REASONING, "reasoning")
            || self.any(
                &TOOL_CALLS,
                "tool_calls",
                |v| v.first() == Some(&b'['),
                Value::is_array,
            )
    }

    /// Responses (`"delta":"…"`) and Messages (`"text":"…"`) carry text this way.
    pub(crate) fn has_tagged_text(&self) -> bool {
        self.has_text(&DELTA, "delta") || self.has_text(&TEXT, "text")
    }

    /// Whether [`crate::wire::usage::of_event`] may find usage: some `usage` member is an object.
    pub(crate) fn may_have_usage(&self) -> bool {
        self.any(
            &USAGE,
            "usage",
            |v| v.first() == Some(&b'{'),
            Value::is_object,
        )
    }

    /// The key searches answer for this data (no word character is written as an escape).
    pub(crate) fn searched(&self) -> bool {
        self.parsed.is_none()
    }

    /// An error event: the top-level object has an `error` that is not null.
    pub(crate) fn is_error(&self) -> bool {
        let top = |v: &Value| v.get("error").is_some_and(|e| !e.is_null());
        match &self.parsed {
            Some(v) => top(v),
            // No `error` key anywhere is the common case; one somewhere is parsed to see
            // whether it is the top level's.
            None => {
                json_scan::values(self.data, &ERROR).next().is_some()
                    && serde_json::from_slice::<Value>(self.data).is_ok_and(|v| top(&v))
            }
        }
    }
}

/// Some member named `name` at any depth of `v` has a value `accept` takes.
fn any_member(v: &Value, name: &str, accept: fn(&Value) -> bool) -> bool {
    match v {
        Value::Object(map) => map
            .iter()
            .any(|(k, v)| (k == name && accept(v)) || any_member(v, name, accept)),
        Value::Array(items) => items.iter().any(|v| any_member(v, name, accept)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_tokens_and_content() {
        let has_token = |d: &[u8]| EventReadings::new(d).has_token();
        let has_content = |d: &[u8]| EventReadings::new(d).has_content();
        assert!(!has_token(
            br#"{"choices":[{"delta":{"role":"assistant","content":null}}]}"#
        ));
        assert!(!has_token(br#"{"choices":[{"delta":{"content":""}}]}"#));
        assert!(has_token(
            br#"{"choices":[{"delta":{"reasoning_content":"L"}}]}"#
        ));
        assert!(!has_content(
            br#"{"choices":[{"delta":{"reasoning_content":"L"}}]}"#
        ));
        assert!(has_content(br#"{"choices":[{"delta":{"content":"Hi"}}]}"#));
        assert!(has_content(
            br#"{"choices": [{"delta": {"content": "Hi"}}]}"#
        ));
        assert!(has_content(
            br#"{"choices":[{"delta":{"c\u006fntent":"Hi"}}]}"#
        ));
        assert!(has_token(
            br#"{"choices":[{"delta":{"tool_calls":[{"index":0}]}}]}"#
        ));
        assert!(has_token(
            br#"{"choices":[{"delta":{"tool_calls" : [{"index":0}]}}]}"#
        ));
    }

    /// The relay's readings of an event against what its full parse says.
    mod agrees_with_the_parse {
        use super::*;
        use proptest::prelude::*;
        use serde_json::json;
        use switchboard_json::respell::{respell, Style};

        fn text() -> impl Strategy<Value = String> {
            prop_oneof![
                Just(String::new()),
                "[a-z \"\\\\<>/:,{}\\[\\]\u{e9}\u{1F600}]{0,12}",
                Just("\"usage\": {\"prompt_tokens\": 9}".to_owned()),
                Just("\"error\": {}".to_owned()),
            ]
        }

        /// Events of every kind a chat stream carries, and the other APIs' data.
        fn event() -> impl Strategy<Value = Value> {
            let field = prop::sample::select(vec!["content", "reasoning_content", "reasoning"]);
            prop_oneof![
                (field, text()).prop_map(|(field, t)| json!({"id": "c", "object": "chat.completion.chunk",
                    "created": 1, "model": "m", "choices": [{"index": 0, "delta": {field: t}, "finish_reason": null}]})),
                Just(json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": null}}]})),
                text().prop_map(|t| json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0,
                    "function": {"arguments": t}}]}}]})),
                (0u64..1000, 0u64..1000, any::<bool>(), any::<bool>()).prop_map(|(p, c, only, timings)| {
                    let mut v = json!({"id": "c", "choices": if only { json!([]) } else {
                        json!([{"index": 0, "delta": {}, "finish_reason": "stop"}]) },
                        "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}});
                    if timings {
                        v["timings"] = json!({"prompt_per_second": 12.5, "predicted_per_second": 3.25});
                    }
                    v
                }),
                Just(json!({"choices": [{"index": 0, "delta": {}}], "usage": null})),
                text().prop_map(|m| json!({"error": {"message": m, "type": "BadRequestError", "code": 400}})),
                Just(json!({"error": null, "choices": []})),
                text().prop_map(|t| json!({"type": "response.output_text.delta", "delta": t})),
                text().prop_map(|t| json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "text_delta", "text": t}})),
                text().prop_map(|t| json!({"type": "response.created", "response": {"error": null, "text": t}})),
            ]
        }

        proptest! {
            #[test]
            fn readings_match(event in event(), seed: u64) {
                let data = respell(&event, Style::line(seed));
                let data = data.as_bytes();
                let p = EventReadings::new(data);
                let parsed: Value = serde_json::from_slice(data).unwrap();
                let text = |name| any_member(&parsed, name, |v| v.as_str().is_some_and(|s| !s.is_empty()));
                prop_assert_eq!(p.has_content(), text("content"));
                prop_assert_eq!(
                    p.has_token(),
                    text("content") || text("reasoning_content") || text("reasoning")
                        || any_member(&parsed, "tool_calls", Value::is_array)
                );
                prop_assert_eq!(p.has_tagged_text(), text("delta") || text("text"));
                prop_assert_eq!(p.is_error(), parsed.get("error").is_some_and(|e| !e.is_null()));
                // The relay reads usage only where the gate lets it: never misses any.
                let read = if p.may_have_usage() { crate::wire::usage::of_event(data) } else { None };
                prop_assert_eq!(read, crate::wire::usage::of_event(data));
            }
        }
    }
}
