//! Whole JSON bodies: a non-streaming chat.completion, and the history of a chat request.

use serde_json::{Map, Value};

use super::field::{normalize, InputField, OutputField, Pieces, CONTENT};
use super::scan::{self, TagStart};
use super::splitter::Splitter;
use super::tags::ThinkTags;
use switchboard_json::scan as json_scan;

/// Rewrites a non-streaming chat.completion body so every message's reasoning sits under
/// `output`, splitting inline tags out of `content` when `tags` is given (same machine as
/// the stream, so both give the same split). `None` = unchanged.
pub(crate) fn rewrite_response_body(
    body: &[u8],
    output: OutputField,
    tags: Option<&ThinkTags>,
) -> Option<Vec<u8>> {
    let tag_work = tags.is_some_and(|t| {
        scan::has_content_text(body) && (t.starts_open || TagStart::for_open(t).maybe_in(body))
    });
    // A key written with escapes hides from the byte searches: such a body is parsed.
    if !tag_work && !scan::needs_rename(body, output) && !json_scan::may_escape_word(body) {
        return None;
    }
    rewrite_parsed_response_body(body, output, tags)
}

/// [`rewrite_response_body`] by a parse of the body, without its byte searches.
pub(crate) fn rewrite_parsed_response_body(
    body: &[u8],
    output: OutputField,
    tags: Option<&ThinkTags>,
) -> Option<Vec<u8>> {
    let mut value: Value = serde_json::from_slice(body).ok()?;
    let choices = value.get_mut("choices")?.as_array_mut()?;
    let mut changed = false;
    for choice in choices {
        let Some(Value::Object(message)) = choice.get_mut("message") else {
            continue;
        };
        let split = tags.map(|t| match message.get(CONTENT) {
            Some(Value::String(text)) => Splitter::split_all(t, text),
            _ => Pieces::default(),
        });
        changed |= normalize(message, output, split, true);
    }
    changed.then(|| serde_json::to_vec(&value).ok()).flatten()
}

/// Renames reasoning in the request's assistant messages to the field the backend reads,
/// so interleaved thinking survives multi-turn conversations. `None` = unchanged.
///
/// When a message has text under both names, the one the backend reads wins (unless it is
/// empty) and the other is dropped.
pub(crate) fn rewrite_request_history(body: &[u8], input: InputField) -> Option<Vec<u8>> {
    if !scan::has_reasoning_named(body, input.other()) && !json_scan::may_escape_word(body) {
        return None;
    }
    rewrite_parsed_request_history(body, input)
}

/// [`rewrite_request_history`] by a parse of the body, without its byte search.
pub(crate) fn rewrite_parsed_request_history(body: &[u8], input: InputField) -> Option<Vec<u8>> {
    let mut value: Value = serde_json::from_slice(body).ok()?;
    let messages = value.get_mut("messages")?.as_array_mut()?;
    let mut changed = false;
    for message in messages {
        let Some(message) = message.as_object_mut() else {
            continue;
        };
        if message.get("role").and_then(Value::as_str) == Some("assistant") {
            changed |= rename_in_message(message, input);
        }
    }
    changed.then(|| serde_json::to_vec(&value).ok()).flatten()
}

fn rename_in_message(message: &mut Map<String, Value>, input: InputField) -> bool {
    let (want, other) = (input.name(), input.other());
    if !message.get(other).is_some_and(Value::is_string) {
        return false;
    }
    let keeps_own = message
        .get(want)
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty());
    if keeps_own {
        message.shift_remove(other);
        return true;
    }
    let old = std::mem::take(message);
    for (key, value) in old {
        if key == want {
            continue;
        }
        if key == other {
            message.insert(want.to_owned(), value);
        } else {
            message.insert(key, value);
        }
    }
    true
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    /// llama.cpp `--reasoning-format none` body (capture none_08), timings shortened.
    const INLINE: &str = r#"{"choices":[{"finish_reason":"stop","index":0,"message":{"role":"assistant","content":"<think>\nLet me think about it.\n</think>\n\nHi there, tester!"}}],"created":1796026262,"model":"tiny-qwen3","system_fingerprint":"b0-unknown","object":"chat.completion","usage":{"completion_tokens":27,"prompt_tokens":23,"total_tokens":50},"id":"chatcmpl-efQx","timings":{"cache_n":22,"prompt_ms":26.2}}"#;
    /// llama.cpp `--reasoning-format deepseek` body (capture deepseek_08).
    const PARSED: &str = r#"{"choices":[{"finish_reason":"stop","index":0,"message":{"role":"assistant","content":"Hi there, tester!","reasoning_content":"Let me think about it.\n"}}],"created":1796026245,"model":"tiny-qwen3","object":"chat.completion","usage":{"completion_tokens":32},"id":"chatcmpl-ERUz","timings":{"cache_n":22}}"#;

    fn qwen(starts_open: bool) -> ThinkTags {
        ThinkTags {
            starts_open,
            ..ThinkTags::preset("qwen3").unwrap()
        }
    }

    fn parse(bytes: &[u8]) -> Value {
        serde_json::from_slice(bytes).unwrap()
    }

    #[test]
    fn inline_tags_split_in_a_body() {
        let out = parse(
            &rewrite_response_body(
                INLINE.as_bytes(),
                OutputField::ReasoningContent,
                Some(&qwen(false)),
            )
            .unwrap(),
        );
        let mut want = parse(INLINE.as_bytes());
        want["choices"][0]["message"] = json!({"role": "assistant",
            "reasoning_content": "\nLet me think about it.\n", "content": "\n\nHi there, tester!"});
        assert_eq!(out, want);
        // Without tags configured nothing is guessed.
        assert_eq!(
            rewrite_response_body(INLINE.as_bytes(), OutputField::Reasoning, None),
            None
        );
    }

    #[test]
    fn parsed_reasoning_renamed_only_when_needed() {
        assert_eq!(
            rewrite_response_body(PARSED.as_bytes(), OutputField::ReasoningContent, None),
            None
        );
        assert_eq!(
            rewrite_response_body(
                PARSED.as_bytes(),
                OutputField::ReasoningContent,
                Some(&qwen(false))
            ),
            None
        );
        let out = rewrite_response_body(PARSED.as_bytes(), OutputField::Reasoning, None).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            PARSED.replace("\"reasoning_content\"", "\"reasoning\"")
        );
    }

    #[test]
    fn forced_open_body() {
        let body = json!({"choices": [{"index": 0, "message": {"role": "assistant",
            "content": "plan</think>answer", "tool_calls": [{"id": "t"}]}}]})
        .to_string();
        let out = parse(
            &rewrite_response_body(body.as_bytes(), OutputField::Both, Some(&qwen(true))).unwrap(),
        );
        assert_eq!(
            out["choices"][0]["message"],
            json!({"role": "assistant", "reasoning_content": "plan",
            "reasoning": "plan", "content": "answer", "tool_calls": [{"id": "t"}]})
        );
        let tool_only = r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"","tool_calls":[]}}]}"#;
        assert_eq!(
            rewrite_response_body(tool_only.as_bytes(), OutputField::Both, Some(&qwen(true))),
            None
        );
    }

    #[test]
    fn history_renamed_to_what_the_backend_reads() {
        let request = r#"{"model":"m","messages":[{"role":"user","content":"q"},{"role":"assistant","reasoning":"why","content":"a","tool_calls":[]},{"role":"user","content":"reasoning"}],"stream":true}"#;
        let out =
            rewrite_request_history(request.as_bytes(), InputField::ReasoningContent).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            request.replace("\"reasoning\":", "\"reasoning_content\":")
        );
        assert_eq!(
            rewrite_request_history(request.as_bytes(), InputField::Reasoning),
            None
        );
        let plain = r#"{"messages":[{"role":"user","content":"no reasoning here"}]}"#;
        assert_eq!(
            rewrite_request_history(plain.as_bytes(), InputField::Reasoning),
            None
        );
    }

    #[test]
    fn history_with_both_names() {
        let request = json!({"messages": [
            {"role": "assistant", "reasoning_content": "", "content": "a", "reasoning": "kept"},
            {"role": "assistant", "reasoning_content": "own", "reasoning": "dropped"},
            {"role": "tool", "reasoning": "not an assistant", "content": "x"}]});
        let out =
            rewrite_request_history(request.to_string().as_bytes(), InputField::ReasoningContent);
        let out = parse(&out.unwrap());
        let want = json!([
            {"role": "assistant", "content": "a", "reasoning_content": "kept"},
            {"role": "assistant", "reasoning_content": "own"},
            {"role": "tool", "reasoning": "not an assistant", "content": "x"}]);
        assert_eq!(out["messages"], want);
        let first = out["messages"][0].as_object().unwrap();
        assert_eq!(
            first.keys().collect::<Vec<_>>(),
            ["role", "content", "reasoning_content"]
        );
    }
}
