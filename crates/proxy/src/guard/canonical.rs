//! Backend context-length errors recognised and rewritten to OpenAI's canonical 400.
//!
//! Harness clients trigger compaction on OpenAI's wording and `code:
//! "context_length_exceeded"`; llama.cpp, vLLM (every era) and SGLang say it differently, and
//! SGLang says it inside an HTTP 200 stream. These recognisers are pure: the proxy calls them
//! on error bodies and stream events and sends the returned error instead.

use serde_json::Value;

use crate::error::ProxyError;
use switchboard_json::scan as json_scan;

/// The numbers a context error carries.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Numbers {
    window: Option<u32>,
    prompt: Option<u32>,
    completion: Option<u32>,
}

/// An error response of a backend (`status` ≥ 400) that says the context was exceeded →
/// [`ProxyError::ContextLengthExceeded`] with the numbers it carries (the window from the
/// message when present, else `window`). `None` for every other response.
pub fn from_backend_error(status: u16, body: &[u8], window: u32) -> Option<ProxyError> {
    if status < 400 {
        return None;
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(v) => from_value(&v, window),
        Err(_) => recognise(&String::from_utf8_lossy(body)).map(|n| canonical(n, window)),
    }
}

/// The message of a backend's error body (`error.message`, `message` or `detail`), else the
/// body itself, cut to 512 bytes.
pub(crate) fn detail_of(body: &[u8]) -> String {
    let from_json = serde_json::from_slice::<Value>(body).ok().and_then(|v| {
        let err = v.get("error").filter(|e| e.is_object()).unwrap_or(&v);
        ["message", "detail"]
            .iter()
            .find_map(|k| err.get(*k).and_then(Value::as_str).map(String::from))
    });
    let mut text = from_json.unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    if text.len() > 512 {
        text.truncate(switchboard_json::utf8::floor_char_boundary(&text, 512));
    }
    text
}

/// A stream event's data (`{"error":{...}}`, with or without the `data:` prefix) that says
/// the context was exceeded, as SGLang sends it inside an HTTP 200 stream.
pub(crate) fn from_sse_event(data: &[u8], window: u32) -> Option<ProxyError> {
    let text = std::str::from_utf8(data).ok()?.trim();
    let text = text.strip_prefix("data:").unwrap_or(text).trim_start();
    // Only an event with an `error` key is parsed; a key written with escapes may hide from
    // the search, so such an event is parsed too.
    if !text.starts_with('{')
        || (!text.contains("\"error\"") && !json_scan::may_escape_word(text.as_bytes()))
    {
        return None;
    }
    let v: Value = serde_json::from_str(text).ok()?;
    v.get("error")?;
    from_value(&v, window)
}

fn from_value(v: &Value, window: u32) -> Option<ProxyError> {
    let err = v.get("error").filter(|e| e.is_object()).unwrap_or(v);
    // llama.cpp: typed error with the numbers as fields.
    if err.get("type").and_then(Value::as_str) == Some("exceed_context_size_error") {
        let field = |k: &str| {
            err.get(k)
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
        };
        let from_msg = message(err).and_then(|m| recognise(&m)).unwrap_or_default();
        let n = Numbers {
            window: field("n_ctx").or(from_msg.window),
            prompt: field("n_prompt_tokens").or(from_msg.prompt),
            completion: None,
        };
        return n.prompt.map(|_| canonical(n, window));
    }
    let msg = message(err).or_else(|| message(v))?;
    recognise(&msg).map(|n| canonical(n, window))
}

/// The human-readable message of an error object in any of the envelopes backends use.
fn message(v: &Value) -> Option<String> {
    for key in ["message", "detail", "error"] {
        match v.get(key) {
            Some(Value::String(s)) => return Some(s.clone()),
            Some(Value::Object(o)) => {
                if let Some(Value::String(s)) = o.get("message") {
                    return Some(s.clone());
                }
            }
            _ => {}
        }
    }
    None
}

fn canonical(n: Numbers, window: u32) -> ProxyError {
    ProxyError::ContextLengthExceeded {
        window: n.window.unwrap_or(window),
        prompt: n.prompt.unwrap_or(0),
        completion: n.completion.filter(|c| *c > 0),
        estimate: false,
    }
}

/// Recognises a context-length message and reads its numbers; `None` when the message is
/// not about the context length or carries no prompt size.
fn recognise(msg: &str) -> Option<Numbers> {
    let m = msg.to_lowercase();
    let n = |pat: &str| num_after(&m, pat);
    let mut out = Numbers::default();
    if m.contains("exceeds the available context size") {
        // llama.cpp: "request (N tokens) exceeds the available context size (L tokens)"
        out.prompt = n("request (");
        out.window = n("available context size (");
    } else if m.contains("you passed") && m.contains("input tokens") {
        // vLLM now: "You passed N input tokens and requested M output tokens. However, the
        // model's context length is only L tokens, ..."
        out.prompt = n("you passed ");
        out.completion = n("and requested ");
        out.window = n("context length is only ");
    } else if m.contains("is longer than the model's context length") {
        // SGLang: "The input (N tokens) is longer than the model's context length (L tokens)."
        out.prompt = n("the input (");
        out.window = n("context length (");
    } else if m.contains("requested token count exceeds the model's maximum context length") {
        // SGLang: "... maximum context length of L tokens. You requested a total of T tokens:
        // N tokens from the input messages and M tokens for the completion. ..."
        out.window = n("maximum context length of ");
        out.prompt = num_after(&m, "tokens: ");
        out.completion = num_after(&m, "input messages and ");
    } else if m.contains("maximum context length is") {
        out.window = n("maximum context length is ");
        if m.contains(" in the messages, ") && m.contains("tokens (") {
            // OpenAI / vLLM ≤ 0.10: "you requested T tokens (P in the messages, C in the completion)"
            out.prompt = n("tokens (");
            out.completion = n("in the messages, ");
        } else if let Some(p) = n("your messages resulted in ") {
            out.prompt = Some(p);
        } else if let Some(p) = n("your request has ") {
            // vLLM 0.10–: "However, your request has N input tokens." and the
            // max_tokens check "... is too large: M. ... your request has N input tokens"
            out.prompt = Some(p);
            out.completion = n("is too large: ");
        } else if let Some(p) = n("your prompt contains at least ") {
            // vLLM: "you requested M output tokens and your prompt contains at least N input tokens"
            out.prompt = Some(p);
            out.completion = n("you requested ");
        } else {
            // vLLM ≤ 0.4: "However, you requested N tokens in the messages, ..."
            out.prompt = n("you requested ");
        }
    } else if m.contains("is longer than the maximum model length") {
        // vLLM engine: "The decoder prompt (length N) is longer than the maximum model length of L."
        out.prompt = n("(length ");
        out.window = n("maximum model length of ");
    } else if m.contains("is too long and exceeds limit of") {
        // vLLM (old): "Input prompt (N tokens) is too long and exceeds limit of L"
        out.prompt = n("prompt (");
        out.window = n("exceeds limit of ");
    } else {
        return None;
    }
    out.prompt.map(|_| out)
}

/// The integer right after the first occurrence of `pat`.
fn num_after(s: &str, pat: &str) -> Option<u32> {
    let rest = &s[s.find(pat)? + pat.len()..];
    let digits: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == ',')
        .filter(char::is_ascii_digit)
        .collect();
    digits
        .parse::<u64>()
        .ok()
        .map(|v| u32::try_from(v).unwrap_or(u32::MAX))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn parts(e: Option<ProxyError>) -> (u32, u32, Option<u32>) {
        match e {
            Some(ProxyError::ContextLengthExceeded {
                window,
                prompt,
                completion,
                estimate: false,
            }) => (window, prompt, completion),
            other => panic!("not canonical: {other:?}"),
        }
    }

    #[test]
    fn llamacpp_typed_error() {
        let body = br#"{"error":{"code":400,"message":"request (13392 tokens) exceeds the available context size (8192 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":13392,"n_ctx":8192}}"#;
        assert_eq!(parts(from_backend_error(400, body, 1)), (8192, 13392, None));
        let stream = [b"data: ".as_slice(), body].concat();
        assert_eq!(parts(from_sse_event(&stream, 1)), (8192, 13392, None));
    }

    #[test]
    fn vllm_every_era() {
        let wrap = |m: &str| {
            serde_json::to_vec(&serde_json::json!({"error": {"message": m, "type": "BadRequestError", "param": "input_tokens", "code": 400}})).unwrap()
        };
        type Case = (&'static str, (u32, u32, Option<u32>));
        let cases: [Case; 7] = [
            ("This model's maximum context length is 8192 tokens. However, you requested 8554 tokens (7554 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.", (8192, 7554, Some(1000))),
            ("This model's maximum context length is 8192 tokens. However, your messages resulted in 8554 tokens. Please reduce the length of the messages.", (8192, 8554, None)),
            ("This model's maximum context length is 4096 tokens. However, your request has 5000 input tokens. Please reduce the length of the input messages.", (4096, 5000, None)),
            ("You passed 31745 input tokens and requested 1024 output tokens. However, the model's context length is only 32768 tokens, resulting in a maximum input length of 31744 tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=31745)", (32768, 31745, Some(1024))),
            ("This model's maximum context length is 32768 tokens. However, you requested 32000 output tokens and your prompt contains at least 769 input tokens, for a total of at least 32769 tokens. Please reduce the length of the input prompt or the number of requested output tokens. (parameter=input_tokens, value=769)", (32768, 769, Some(32000))),
            ("'max_tokens' or 'max_completion_tokens' is too large: 4000. This model's maximum context length is 4096 tokens and your request has 200 input tokens (4000 > 4096 - 200).", (4096, 200, Some(4000))),
            ("The decoder prompt (length 9000) is longer than the maximum model length of 8192. Make sure that `max_model_len` is no smaller than the number of text tokens.", (8192, 9000, None)),
        ];
        for (msg, want) in cases {
            assert_eq!(parts(from_backend_error(400, &wrap(msg), 1)), want, "{msg}");
        }
        let zero = wrap("You passed 8193 input tokens and requested 0 output tokens. However, the model's context length is only 8192 tokens, resulting in a maximum input length of 8192 tokens.");
        assert_eq!(parts(from_backend_error(400, &zero, 1)), (8192, 8193, None));
    }

    #[test]
    fn sglang_flat_and_in_stream() {
        let flat = br#"{"object":"error","message":"The input (9000 tokens) is longer than the model's context length (8192 tokens).","type":"BadRequestError","param":null,"code":400}"#;
        assert_eq!(parts(from_backend_error(400, flat, 1)), (8192, 9000, None));
        let total = br#"{"object":"error","message":"Requested token count exceeds the model's maximum context length of 64000 tokens. You requested a total of 71897 tokens: 7897 tokens from the input messages and 64000 tokens for the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit.","type":"BadRequestError","param":null,"code":400}"#;
        assert_eq!(
            parts(from_backend_error(400, total, 1)),
            (64000, 7897, Some(64000))
        );
        let event = br#"data: {"error": {"object": "error", "message": "The input (9000 tokens) is longer than the model's context length (8192 tokens).", "type": "BadRequestError", "param": null, "code": 400}}"#;
        assert_eq!(parts(from_sse_event(event, 1)), (8192, 9000, None));
    }

    #[test]
    fn other_errors_pass_through() {
        assert!(
            from_backend_error(400, br#"{"error":{"message":"bad temperature"}}"#, 1).is_none()
        );
        assert!(from_backend_error(200, br#"{"error":{"message":"The input (9 tokens) is longer than the model's context length (8 tokens)."}}"#, 1).is_none());
        assert!(from_sse_event(br#"data: {"choices":[]}"#, 1).is_none());
        assert!(from_sse_event(b"data: [DONE]", 1).is_none());
        assert!(from_backend_error(400, b"maximum context length is 5 tokens", 7).is_none());
    }

    #[test]
    fn escaped_error_key_in_a_stream_is_recognised() {
        let event = br#"data: {"\u0065rror": {"message": "The input (9000 tokens) is longer than the model's context length (8192 tokens).", "code": 400}}"#;
        assert_eq!(parts(from_sse_event(event, 1)), (8192, 9000, None));
    }

    proptest::proptest! {
        /// A context error reads the same in any spelling (whitespace, member
        /// order, escapes), in a stream event as in a body.
        #[test]
        fn context_errors_read_the_same_in_any_spelling(
            kind in 0u8..4,
            prompt in 1u32..1_000_000,
            window in 1u32..1_000_000,
            seed: u64,
        ) {
            use switchboard_json::respell::{respell, Style};
            use serde_json::json;
            let body = match kind {
                0 => json!({"error": {"code": 400, "message": format!("request ({prompt} tokens) exceeds the available context size ({window} tokens), try increasing it"),
                    "type": "exceed_context_size_error", "n_prompt_tokens": prompt, "n_ctx": window}}),
                1 => json!({"error": {"object": "error", "message": format!("The input ({prompt} tokens) is longer than the model's context length ({window} tokens)."),
                    "type": "BadRequestError", "param": null, "code": 400}}),
                2 => json!({"object": "error", "message": format!("The input ({prompt} tokens) is longer than the model's context length ({window} tokens)."),
                    "type": "BadRequestError", "param": null, "code": 400}),
                _ => json!({"error": {"message": "bad temperature", "type": "BadRequestError"}}),
            };
            let compact = from_backend_error(400, body.to_string().as_bytes(), 7).map(|e| e.to_string());
            let text = respell(&body, Style::line(seed));
            let read = from_backend_error(400, text.as_bytes(), 7).map(|e| e.to_string());
            proptest::prop_assert_eq!(&read, &compact);
            // In a stream only the `{"error": …}` envelope is an error event.
            let event = format!("data: {text}");
            let streamed = from_sse_event(event.as_bytes(), 7).map(|e| e.to_string());
            let want = if body.get("error").is_some() { compact } else { None };
            proptest::prop_assert_eq!(streamed, want, "{}", text);
        }
    }

    #[test]
    fn window_falls_back_to_the_configured_one() {
        let body = br#"{"detail":"However, you requested 9000 tokens in the messages. This model's maximum context length is unknown"}"#;
        assert_eq!(
            parts(from_backend_error(400, body, 4096)),
            (4096, 9000, None)
        );
    }
}
