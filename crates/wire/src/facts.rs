//! What an answer or a stream event says besides its usage: the model that answered, why it
//! stopped, and its text — in chat completions, Responses and Messages alike (their fields do
//! not collide). Read for traces only, so a full parse of what is read.

use std::sync::LazyLock;

use memchr::memmem::Finder;
use serde_json::Value;

use switchboard_json::scan::finder;

/// The facts of one answer or event.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Facts {
    pub model: Option<String>,
    pub finish: Option<String>,
    /// Answer text it carries (a stream's delta, or a whole answer's text).
    pub text: Option<String>,
}

/// Whether an event may name a finish reason (a key for one with a string value, or a
/// Responses stream's last event): the events worth a full parse once the model is known.
/// Two searches, each for what the keys or event types share.
pub fn may_finish(data: &[u8]) -> bool {
    REASON.find_iter(data).any(|at| {
        let key = &data[..at];
        (key.ends_with(b"\"finish") || key.ends_with(b"\"stop"))
            && string_follows(&data[at + REASON.needle().len()..])
    }) || RESPONSE.find_iter(data).any(|at| {
        let rest = &data[at + RESPONSE.needle().len()..];
        [&b"completed\""[..], b"incomplete\"", b"failed\""]
            .iter()
            .any(|end| rest.starts_with(end))
    })
}

/// The end of `"finish_reason"` and `"stop_reason"`.
static REASON: LazyLock<Finder<'static>> = LazyLock::new(|| finder(b"_reason\""));
/// The start of a Responses event type's value.
static RESPONSE: LazyLock<Finder<'static>> = LazyLock::new(|| finder(b"\"response."));

/// `rest`, after a key, is `:` and a string (not `null`).
fn string_follows(rest: &[u8]) -> bool {
    rest.trim_ascii_start()
        .strip_prefix(b":")
        .is_some_and(|r| r.trim_ascii_start().first() == Some(&b'"'))
}

/// The facts of a JSON answer or event `data`; nothing for what does not parse.
pub fn read(data: &[u8]) -> Facts {
    match serde_json::from_slice::<Value>(data) {
        Ok(v) => of_value(&v),
        Err(_) => Facts::default(),
    }
}

fn of_value(v: &Value) -> Facts {
    let str_at = |path: &[&str]| {
        let mut at = v;
        for k in path {
            at = at.get(k)?;
        }
        at.as_str().map(str::to_string)
    };
    let model = str_at(&["model"])
        .or_else(|| str_at(&["message", "model"]))
        .or_else(|| str_at(&["response", "model"]));
    let choice = v.get("choices").and_then(|c| c.get(0));
    let finish = choice
        .and_then(|c| c.get("finish_reason"))
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| str_at(&["stop_reason"]))
        .or_else(|| str_at(&["delta", "stop_reason"]))
        .or_else(|| responses_finish(v));
    Facts {
        model,
        finish,
        text: text_of(v, choice),
    }
}

/// A Responses answer's (or final event's) status, its reason where it is incomplete.
fn responses_finish(v: &Value) -> Option<String> {
    let response = match v.get("type").and_then(Value::as_str) {
        Some("response.completed" | "response.incomplete" | "response.failed") => {
            v.get("response")?
        }
        _ if v.get("object").and_then(Value::as_str) == Some("response") => v,
        _ => return None,
    };
    let reason = response
        .get("incomplete_details")
        .and_then(|d| d.get("reason"))
        .and_then(Value::as_str);
    reason
        .or_else(|| response.get("status").and_then(Value::as_str))
        .map(str::to_string)
}

/// Answer text in `v`: a chat delta or message, a Messages text delta or content, a Responses
/// text delta or output.
fn text_of(v: &Value, choice: Option<&Value>) -> Option<String> {
    if let Some(c) = choice {
        let content = c
            .get("delta")
            .or_else(|| c.get("message"))
            .and_then(|m| m.get("content"));
        return content.and_then(Value::as_str).map(str::to_string);
    }
    match v.get("type").and_then(Value::as_str) {
        Some("content_block_delta") => {
            return v
                .get("delta")
                .and_then(|d| d.get("text"))
                .and_then(Value::as_str)
                .map(str::to_string)
        }
        Some("response.output_text.delta") => {
            return v.get("delta").and_then(Value::as_str).map(str::to_string)
        }
        _ => {}
    }
    // Whole answers: Messages `content`, Responses `output[].content[]`.
    let parts = v.get("content").and_then(Value::as_array).or_else(|| {
        v.get("output")
            .and_then(Value::as_array)
            .and_then(|o| o.iter().find_map(|item| item.get("content")?.as_array()))
    })?;
    let text: String = parts
        .iter()
        .filter_map(|p| p.get("text").and_then(Value::as_str))
        .collect();
    (!text.is_empty()).then_some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(json: &str) -> (Option<String>, Option<String>, Option<String>) {
        let f = read(json.as_bytes());
        (f.model, f.finish, f.text)
    }

    fn some(s: &str) -> Option<String> {
        Some(s.to_string())
    }

    #[test]
    fn chat_answers_and_chunks_name_their_model_finish_and_text() {
        let whole =
            r#"{"model":"qwen","choices":[{"finish_reason":"length","message":{"content":"Hi"}}]}"#;
        assert_eq!(facts(whole), (some("qwen"), some("length"), some("Hi")));
        let chunk =
            r#"{"model":"qwen","choices":[{"delta":{"content":"a"},"finish_reason":null}]}"#;
        assert_eq!(facts(chunk), (some("qwen"), None, some("a")));
        assert!(!may_finish(chunk.as_bytes()));
        let last = r#"{"choices":[{"delta":{},"finish_reason" : "stop"}]}"#;
        assert!(may_finish(last.as_bytes()));
        assert_eq!(facts(last).1, some("stop"));
    }

    #[test]
    fn messages_answers_and_events_name_their_model_finish_and_text() {
        let whole = r#"{"type":"message","model":"m","stop_reason":"end_turn","content":[{"type":"text","text":"Hi"}]}"#;
        assert_eq!(facts(whole), (some("m"), some("end_turn"), some("Hi")));
        let start = r#"{"type":"message_start","message":{"model":"m","stop_reason":null}}"#;
        assert_eq!(facts(start).0, some("m"));
        assert!(!may_finish(start.as_bytes()));
        let delta = r#"{"type":"message_delta","delta":{"stop_reason":"max_tokens"}}"#;
        assert!(may_finish(delta.as_bytes()));
        assert_eq!(facts(delta).1, some("max_tokens"));
        let text = r#"{"type":"content_block_delta","delta":{"type":"text_delta","text":"x"}}"#;
        assert_eq!(facts(text).2, some("x"));
    }

    #[test]
    fn responses_answers_and_events_name_their_model_finish_and_text() {
        let whole = r#"{"object":"response","model":"r","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"Hi"}]}]}"#;
        assert_eq!(facts(whole), (some("r"), some("completed"), some("Hi")));
        let done = r#"{"type":"response.incomplete","response":{"model":"r","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"}}}"#;
        assert!(may_finish(done.as_bytes()));
        assert_eq!(facts(done).1, some("max_output_tokens"));
        let delta = r#"{"type":"response.output_text.delta","delta":"y"}"#;
        assert_eq!(facts(delta).2, some("y"));
        let created =
            r#"{"type":"response.created","response":{"model":"r","status":"in_progress"}}"#;
        assert_eq!(facts(created), (some("r"), None, None));
    }

    #[test]
    fn only_a_finish_or_stop_reason_with_a_string_or_a_last_responses_event_may_finish() {
        for (data, may) in [
            (r#"{"finish_reason":"length"}"#, true),
            (r#"{"finish_reason" :  "stop"}"#, true),
            (r#"{"finish_reason":null,"x":"finish_reason"}"#, false),
            (r#"{"delta":{"stop_reason" : "end_turn"}}"#, true),
            (r#"{"stop_reason":null}"#, false),
            (r#"{"other_reason":"x","reason":"y"}"#, false),
            (r#"{"type":"response.completed","response":{}}"#, true),
            (r#"{"type":"response.incomplete"}"#, true),
            (r#"{"type":"response.failed"}"#, true),
            (r#"{"type":"response.created"}"#, false),
            (
                r#"{"type":"response.output_text.delta","delta":"response.completedX"}"#,
                false,
            ),
        ] {
            assert_eq!(may_finish(data.as_bytes()), may, "{data}");
        }
    }

    #[test]
    fn what_does_not_parse_has_no_facts() {
        assert_eq!(read(b"[DONE]"), Facts::default());
    }
}
