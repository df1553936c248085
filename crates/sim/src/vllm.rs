//! vLLM shapes (field `reasoning`, nested `BadRequestError`), and the plain OpenAI variant.

use http::StatusCode;
use serde_json::{json, Value};

use super::frame::{push_json_str, Answer, Counts, Dialect, Failure, Field, Kind};

/// vLLM's dialect; `openai` keeps its shapes but speaks OpenAI's own errors.
pub(crate) struct Vllm {
    pub(crate) openai: bool,
}

fn id(kind: Kind, id: &str) -> String {
    match kind {
        Kind::Chat => format!("chatcmpl-{id}"),
        Kind::Text => format!("cmpl-{id}"),
    }
}

fn usage(c: &Counts, stream: bool) -> Value {
    let mut u = json!({
        "prompt_tokens": c.prompt,
        "total_tokens": c.prompt.saturating_add(c.completion),
        "completion_tokens": c.completion,
    });
    // GPU mode reports its prefix cache hits as `--enable-prompt-tokens-details` does.
    if let Some(cached) = c.cached {
        u["prompt_tokens_details"] = json!({"cached_tokens": cached});
    } else if !stream {
        u["prompt_tokens_details"] = Value::Null;
    }
    if c.reasoning > 0 {
        u["completion_tokens_details"] = json!({"reasoning_tokens": c.reasoning});
    }
    u
}

/// vLLM's envelope: `{"error":{"message","type":"BadRequestError","param","code":400}}`.
pub(crate) fn bad_request(message: &str, param: Option<&str>) -> Value {
    json!({"error": {"message": message, "type": "BadRequestError", "param": param, "code": 400}})
}

fn openai_error(message: &str, param: Option<&str>, code: Option<&str>) -> Value {
    json!({"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}})
}

impl Vllm {
    fn vllm_error(failure: &Failure) -> Value {
        match failure {
            Failure::Json { column, detail, .. } => bad_request(
                &format!(
                    "[{{'type': 'json_invalid', 'loc': ('body', {column}), 'msg': 'JSON decode error', \
                     'input': {{}}, 'ctx': {{'error': '{detail}'}}}}]"
                ),
                None,
            ),
            Failure::Missing(field) => bad_request(
                &format!("[{{'type': 'missing', 'loc': ('body', '{field}'), 'msg': 'Field required'}}]"),
                None,
            ),
            Failure::Invalid(m) => bad_request(m, None),
            Failure::Overflow { prompt, max_tokens: Some(m), window } => bad_request(
                &format!(
                    "You passed {prompt} input tokens and requested {m} output tokens. However, the \
                     model's context length is only {window} tokens, resulting in a maximum input \
                     length of {} tokens. Please reduce the length of the input prompt.",
                    window.saturating_sub(*m)
                ),
                Some("input_tokens"),
            ),
            Failure::Overflow { prompt, window, .. } => bad_request(
                &format!(
                    "This model's maximum context length is {window} tokens. However, your request \
                     has {prompt} input tokens. Please reduce the length of the input messages."
                ),
                Some("input_tokens"),
            ),
        }
    }

    fn openai_error(failure: &Failure) -> Value {
        match failure {
            Failure::Json { .. } => openai_error(
                "We could not parse the JSON body of your request. (HINT: This likely means you \
                 aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, \
                 but what was sent was not valid JSON. If you have trouble figuring out how to fix \
                 this, please contact us through our help center at help.openai.com.)",
                None,
                None,
            ),
            Failure::Missing(field) => openai_error(
                &format!("Missing required parameter: '{field}'."),
                Some(field),
                Some("missing_required_parameter"),
            ),
            Failure::Invalid(m) => openai_error(m, None, None),
            Failure::Overflow { prompt, max_tokens: Some(m), window } => openai_error(
                &format!(
                    "This model's maximum context length is {window} tokens. However, you requested \
                     {} tokens ({prompt} in the messages, {m} in the completion). Please reduce the \
                     length of the messages or completion.",
                    prompt.saturating_add(*m)
                ),
                Some("messages"),
                Some("context_length_exceeded"),
            ),
            Failure::Overflow { prompt, window, .. } => openai_error(
                &format!(
                    "This model's maximum context length is {window} tokens. However, your messages \
                     resulted in {prompt} tokens. Please reduce the length of the messages."
                ),
                Some("messages"),
                Some("context_length_exceeded"),
            ),
        }
    }
}

impl Dialect for Vllm {
    fn head_tail(&self, kind: Kind, rid: &str, created: u64, model_json: &str) -> (String, String) {
        let object = match kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Text => "text_completion",
        };
        let head = format!(
            "data: {{\"id\":\"{}\",\"object\":\"{object}\",\"created\":{created},\"model\":{model_json},\"choices\":[",
            id(kind, rid)
        );
        (head, "]".to_owned())
    }

    fn role_choice(&self) -> &'static str {
        r#"{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}"#
    }

    fn token_choice(&self, kind: Kind, field: Field, text: &str, out: &mut String) {
        match kind {
            Kind::Chat => {
                out.push_str(r#"{"index":0,"delta":{""#);
                out.push_str(match field {
                    Field::Reasoning => "reasoning",
                    Field::Content => "content",
                });
                out.push_str("\":");
                push_json_str(out, text);
                out.push_str(r#"},"logprobs":null,"finish_reason":null}"#);
            }
            Kind::Text => {
                out.push_str(r#"{"index":0,"text":"#);
                push_json_str(out, text);
                out.push_str(r#","logprobs":null,"finish_reason":null,"stop_reason":null}"#);
            }
        }
    }

    fn finish_choice(&self, kind: Kind, finish: &str, out: &mut String) {
        out.push_str(match kind {
            Kind::Chat => r#"{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"#,
            Kind::Text => r#"{"index":0,"text":"","logprobs":null,"finish_reason":"#,
        });
        push_json_str(out, finish);
        out.push_str(r#","stop_reason":null}"#);
    }

    fn usage_extra(&self, counts: &Counts) -> String {
        format!(",\"usage\":{}", usage(counts, true))
    }

    fn include_usage(&self, stream_options: Option<&Value>) -> bool {
        let asked = stream_options
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool);
        if self.openai {
            asked.unwrap_or(false)
        } else {
            // vLLM defaults `include_usage` to true once `stream_options` is present.
            stream_options.is_some_and(Value::is_object) && asked.unwrap_or(true)
        }
    }

    fn overflows(&self, prompt: u32, max_tokens: Option<u32>, window: u32) -> bool {
        match max_tokens {
            Some(m) => u64::from(prompt) + u64::from(m) > u64::from(window),
            None => prompt >= window,
        }
    }

    fn body(&self, a: &Answer<'_>) -> Value {
        let content = (!a.content.is_empty()).then_some(a.content.as_str());
        let choice = match a.kind {
            Kind::Chat => json!({
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": content,
                    "refusal": null,
                    "annotations": null,
                    "audio": null,
                    "function_call": null,
                    "tool_calls": [],
                    "reasoning": a.reasoning,
                },
                "logprobs": null,
                "finish_reason": a.finish,
                "stop_reason": null,
                "token_ids": null,
            }),
            Kind::Text => json!({
                "index": 0,
                "text": a.content,
                "logprobs": null,
                "finish_reason": a.finish,
                "stop_reason": null,
                "token_ids": null,
                "prompt_logprobs": null,
                "prompt_token_ids": null,
            }),
        };
        json!({
            "id": id(a.kind, a.id),
            "object": if a.kind == Kind::Chat { "chat.completion" } else { "text_completion" },
            "created": a.created,
            "model": a.model,
            "choices": [choice],
            "service_tier": null,
            "system_fingerprint": null,
            "usage": usage(&a.counts, false),
            "prompt_logprobs": null,
            "prompt_token_ids": null,
            "kv_transfer_params": null,
        })
    }

    fn error(&self, failure: &Failure) -> (StatusCode, Value) {
        let body = if self.openai {
            Self::openai_error(failure)
        } else {
            Self::vllm_error(failure)
        };
        (StatusCode::BAD_REQUEST, body)
    }

    fn not_found(&self, method: &str, path: &str) -> (StatusCode, Value) {
        let body = if self.openai {
            openai_error(&format!("Invalid URL ({method} {path})"), None, None)
        } else {
            json!({"detail": "Not Found"})
        };
        (StatusCode::NOT_FOUND, body)
    }
}
