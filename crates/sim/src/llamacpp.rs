//! llama.cpp `llama-server` shapes: chunks, bodies with `timings`, and its error envelope.

use http::StatusCode;
use serde_json::{json, Value};

use super::frame::{per_second, push_json_str, Answer, Counts, Dialect, Failure, Field, Kind};

/// Reported as `system_fingerprint` (llama.cpp puts its build id there).
pub(crate) const FINGERPRINT: &str = "b0-sim";

pub(crate) struct LlamaCpp;

fn object(kind: Kind, chunk: bool) -> &'static str {
    match (kind, chunk) {
        (Kind::Chat, true) => "chat.completion.chunk",
        (Kind::Chat, false) => "chat.completion",
        (Kind::Text, _) => "text_completion",
    }
}

pub(crate) fn usage(c: &Counts) -> Value {
    json!({
        "completion_tokens": c.completion,
        "prompt_tokens": c.prompt,
        "total_tokens": c.prompt.saturating_add(c.completion),
        "prompt_tokens_details": {"cached_tokens": c.cached.unwrap_or(0)},
    })
}

/// llama.cpp's `timings` of an answer. Its clock counts whole microseconds, so each time is
/// a whole number of microseconds in milliseconds (`"prompt_ms":3.201`), as is each here.
pub(crate) fn timings(c: &Counts) -> Value {
    let per_token = |ms: f64, n: u32| if n == 0 { 0.0 } else { ms / f64::from(n) };
    let whole_us = |ms: f64| (ms * 1e3).round() / 1e3;
    let (prompt_ms, predicted_ms) = (whole_us(c.prompt_ms), whole_us(c.predicted_ms));
    let cached = c.cached.unwrap_or(0);
    let prompt_n = c.prompt.saturating_sub(cached);
    json!({
        "cache_n": cached,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": per_token(prompt_ms, prompt_n),
        "prompt_per_second": per_second(prompt_n, prompt_ms),
        "predicted_n": c.completion,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": per_token(predicted_ms, c.completion),
        "predicted_per_second": per_second(c.completion, predicted_ms),
    })
}

/// `{"error":{"code","message","type"}}`, llama.cpp's envelope.
pub(crate) fn error_body(code: u16, message: &str, kind: &str) -> Value {
    json!({"error": {"code": code, "message": message, "type": kind}})
}

/// The body llama.cpp sends with 503 while its model loads.
pub(crate) fn loading_body() -> Value {
    error_body(503, "Loading model", "unavailable_error")
}

impl Dialect for LlamaCpp {
    fn head_tail(&self, kind: Kind, id: &str, created: u64, model_json: &str) -> (String, String) {
        let tail = match kind {
            Kind::Chat => format!(
                "],\"created\":{created},\"id\":\"chatcmpl-{id}\",\"model\":{model_json},\
                 \"system_fingerprint\":\"{FINGERPRINT}\",\"object\":\"chat.completion.chunk\""
            ),
            Kind::Text => format!(
                "],\"created\":{created},\"model\":{model_json},\"system_fingerprint\":\"{FINGERPRINT}\",\
                 \"object\":\"text_completion\",\"id\":\"chatcmpl-{id}\""
            ),
        };
        ("data: {\"choices\":[".to_owned(), tail)
    }

    fn role_choice(&self) -> &'static str {
        r#"{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}"#
    }

    fn token_choice(&self, kind: Kind, field: Field, text: &str, out: &mut String) {
        match kind {
            Kind::Chat => {
                out.push_str(r#"{"finish_reason":null,"index":0,"delta":{""#);
                out.push_str(match field {
                    Field::Reasoning => "reasoning_content",
                    Field::Content => "content",
                });
                out.push_str("\":");
                push_json_str(out, text);
                out.push_str("}}");
            }
            Kind::Text => {
                out.push_str(r#"{"text":"#);
                push_json_str(out, text);
                out.push_str(r#","index":0,"logprobs":null,"finish_reason":null}"#);
            }
        }
    }

    fn finish_choice(&self, kind: Kind, finish: &str, out: &mut String) {
        match kind {
            Kind::Chat => {
                out.push_str(r#"{"finish_reason":"#);
                push_json_str(out, finish);
                out.push_str(r#","index":0,"delta":{}}"#);
            }
            Kind::Text => {
                out.push_str(r#"{"text":"","index":0,"logprobs":null,"finish_reason":"#);
                push_json_str(out, finish);
                out.push('}');
            }
        }
    }

    fn finish_extra(&self, usage_chunk: bool, counts: &Counts) -> String {
        if usage_chunk {
            String::new()
        } else {
            format!(",\"timings\":{}", timings(counts))
        }
    }

    fn usage_extra(&self, counts: &Counts) -> String {
        format!(
            ",\"usage\":{},\"timings\":{}",
            usage(counts),
            timings(counts)
        )
    }

    fn overflows(&self, prompt: u32, _max_tokens: Option<u32>, window: u32) -> bool {
        prompt >= window
    }

    fn body(&self, a: &Answer<'_>) -> Value {
        let choice = match a.kind {
            Kind::Chat => {
                let mut message = json!({"role": "assistant", "content": a.content});
                if let Some(r) = &a.reasoning {
                    message["reasoning_content"] = Value::from(r.as_str());
                }
                json!({"finish_reason": a.finish, "index": 0, "message": message})
            }
            Kind::Text => {
                json!({"text": a.content, "index": 0, "logprobs": null, "finish_reason": a.finish})
            }
        };
        json!({
            "choices": [choice],
            "created": a.created,
            "model": a.model,
            "system_fingerprint": FINGERPRINT,
            "object": object(a.kind, false),
            "usage": usage(&a.counts),
            "id": format!("chatcmpl-{}", a.id),
            "timings": timings(&a.counts),
        })
    }

    fn error(&self, failure: &Failure) -> (StatusCode, Value) {
        let message = match failure {
            Failure::Json {
                line,
                column,
                detail,
            } => format!(
                "[json.exception.parse_error.101] parse error at line {line}, column {column}: \
                 syntax error while parsing value - {detail}"
            ),
            Failure::Missing(field) => format!("'{field}' is required"),
            Failure::Invalid(m) => m.clone(),
            Failure::Overflow { prompt, window, .. } => {
                let body = json!({"error": {
                    "code": 400,
                    "message": format!("request ({prompt} tokens) exceeds the available context size ({window} tokens), try increasing it"),
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": prompt,
                    "n_ctx": window,
                }});
                return (StatusCode::BAD_REQUEST, body);
            }
        };
        (
            StatusCode::BAD_REQUEST,
            error_body(400, &message, "invalid_request_error"),
        )
    }

    fn not_found(&self, _method: &str, _path: &str) -> (StatusCode, Value) {
        let body =
            json!({"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}});
        (StatusCode::NOT_FOUND, body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timings_count_whole_microseconds_as_llama_server_does() {
        let counts = Counts {
            prompt: 17,
            completion: 16,
            prompt_ms: 0.000_16,
            predicted_ms: 16.0 * 3.125e-6 + 54.183_7,
            ..Counts::default()
        };
        let t = timings(&counts);
        assert_eq!(t["prompt_ms"], 0.0);
        assert_eq!(t["predicted_ms"], 54.184);
        assert_eq!(t["predicted_per_second"], 16.0 * 1000.0 / 54.184);
        assert_eq!(t["prompt_per_second"], 17.0 * 1000.0 / 0.001);
    }
}
