//! SGLang shapes: `reasoning_content`, null-filled deltas, the flat error envelope.

use bytes::Bytes;
use http::StatusCode;
use serde_json::{json, Value};

use super::frame::{push_json_str, Answer, Counts, Dialect, Failure, Field, Kind};

/// The end-of-sequence id SGLang reports as `matched_stop` when a generation stops.
const EOS: u32 = 151_645;

pub(crate) struct Sglang;

fn usage(c: &Counts) -> Value {
    let mut u = json!({
        "prompt_tokens": c.prompt,
        "total_tokens": c.prompt.saturating_add(c.completion),
        "completion_tokens": c.completion,
        "prompt_tokens_details": null,
        "reasoning_tokens": c.reasoning,
    });
    // GPU mode reports its prefix cache hits as `--enable-cache-report` does.
    if let Some(cached) = c.cached {
        u["prompt_tokens_details"] = json!({"cached_tokens": cached});
    }
    if c.reasoning > 0 {
        u["completion_tokens_details"] = json!({"reasoning_tokens": c.reasoning});
    }
    u
}

fn matched_stop(finish: &str) -> &'static str {
    if finish == "stop" {
        "151645"
    } else {
        "null"
    }
}

/// SGLang's flat envelope: `{"object":"error","message","type","param":null,"code"}`.
pub(crate) fn error_body(message: &str, status: StatusCode) -> Value {
    let kind = if status == StatusCode::BAD_REQUEST {
        "BadRequestError"
    } else {
        status.canonical_reason().unwrap_or("Error")
    };
    json!({"object": "error", "message": message, "type": kind, "param": null, "code": status.as_u16()})
}

fn message(failure: &Failure) -> String {
    match failure {
        Failure::Json { column, detail, .. } => format!(
            "[{{'type': 'json_invalid', 'loc': ('body', {column}), 'msg': 'JSON decode error', \
             'input': {{}}, 'ctx': {{'error': '{detail}'}}}}]"
        ),
        Failure::Missing(field) => {
            format!("[{{'type': 'missing', 'loc': ('body', '{field}'), 'msg': 'Field required'}}]")
        }
        Failure::Invalid(m) => m.clone(),
        Failure::Overflow { prompt, max_tokens, window } => match max_tokens {
            Some(m) if prompt < window => format!(
                "Requested token count exceeds the model's maximum context length of {window} tokens. \
                 You requested a total of {} tokens: {prompt} tokens from the input messages and {m} \
                 tokens for the completion. Please reduce the number of tokens in the input messages \
                 or the completion to fit within the limit.",
                prompt.saturating_add(*m)
            ),
            _ => format!(
                "The input ({prompt} tokens) is longer than the model's context length ({window} tokens)."
            ),
        },
    }
}

/// The events SGLang sends inside a 200 stream when the request fails: the error, then `[DONE]`.
pub(crate) fn stream_error(failure: &Failure) -> Bytes {
    let err = json!({"error": error_body(&message(failure), StatusCode::BAD_REQUEST)});
    Bytes::from(format!("data: {err}\n\ndata: [DONE]\n\n"))
}

impl Dialect for Sglang {
    fn head_tail(&self, kind: Kind, id: &str, created: u64, model_json: &str) -> (String, String) {
        let object = match kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Text => "text_completion",
        };
        let head = format!(
            "data: {{\"id\":\"{id}\",\"object\":\"{object}\",\"created\":{created},\"model\":{model_json},\"choices\":["
        );
        (head, "]".to_owned())
    }

    fn role_choice(&self) -> &'static str {
        r#"{"index":0,"delta":{"role":"assistant","content":"","reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}"#
    }

    fn token_choice(&self, kind: Kind, field: Field, text: &str, out: &mut String) {
        match (kind, field) {
            (Kind::Chat, Field::Content) => {
                out.push_str(r#"{"index":0,"delta":{"role":null,"content":"#);
                push_json_str(out, text);
                out.push_str(r#","reasoning_content":null,"tool_calls":null}"#);
            }
            (Kind::Chat, Field::Reasoning) => {
                out.push_str(
                    r#"{"index":0,"delta":{"role":null,"content":null,"reasoning_content":"#,
                );
                push_json_str(out, text);
                out.push_str(r#","tool_calls":null}"#);
            }
            (Kind::Text, _) => {
                out.push_str(r#"{"index":0,"text":"#);
                push_json_str(out, text);
            }
        }
        out.push_str(r#","logprobs":null,"finish_reason":null,"matched_stop":null}"#);
    }

    fn finish_choice(&self, kind: Kind, finish: &str, out: &mut String) {
        out.push_str(match kind {
            Kind::Chat => r#"{"index":0,"delta":{"role":null,"content":null,"reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":"#,
            Kind::Text => r#"{"index":0,"text":"","logprobs":null,"finish_reason":"#,
        });
        push_json_str(out, finish);
        out.push_str(r#","matched_stop":"#);
        out.push_str(matched_stop(finish));
        out.push('}');
    }

    fn chunk_extra(&self) -> &'static str {
        r#","usage":null"#
    }

    fn usage_extra(&self, counts: &Counts) -> String {
        format!(",\"usage\":{}", usage(counts))
    }

    fn overflows(&self, prompt: u32, max_tokens: Option<u32>, window: u32) -> bool {
        prompt >= window
            || max_tokens.is_some_and(|m| u64::from(prompt) + u64::from(m) >= u64::from(window))
    }

    fn body(&self, a: &Answer<'_>) -> Value {
        let stop = if a.finish == "stop" {
            Value::from(EOS)
        } else {
            Value::Null
        };
        let choice = match a.kind {
            Kind::Chat => json!({
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": (!a.content.is_empty()).then_some(a.content.as_str()),
                    "reasoning_content": a.reasoning,
                    "tool_calls": null,
                },
                "logprobs": null,
                "finish_reason": a.finish,
                "matched_stop": stop,
            }),
            Kind::Text => json!({
                "index": 0,
                "text": a.content,
                "logprobs": null,
                "finish_reason": a.finish,
                "matched_stop": stop,
            }),
        };
        json!({
            "id": a.id,
            "object": if a.kind == Kind::Chat { "chat.completion" } else { "text_completion" },
            "created": a.created,
            "model": a.model,
            "choices": [choice],
            "usage": usage(&a.counts),
            "metadata": {"weight_version": "default"},
        })
    }

    fn error(&self, failure: &Failure) -> (StatusCode, Value) {
        (
            StatusCode::BAD_REQUEST,
            error_body(&message(failure), StatusCode::BAD_REQUEST),
        )
    }

    fn not_found(&self, _method: &str, _path: &str) -> (StatusCode, Value) {
        (StatusCode::NOT_FOUND, json!({"detail": "Not Found"}))
    }
}
