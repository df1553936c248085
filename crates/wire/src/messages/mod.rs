//! Anthropic Messages (`/v1/messages`, `/v1/messages/count_tokens`): Anthropic's error envelope
//! (whole and as the stream's `error` event, the context error in Anthropic's words), the
//! request in chat form per backend ([`to_chat`]) and its output limit `max_tokens`; streams
//! repaired to the specification, usage, inline think tags as `thinking` blocks, and the
//! answer of a chat-only backend translated back ([`from_chat`]).

pub(crate) mod answer;
pub(crate) mod from_chat;
pub(crate) mod stream;
pub mod to_chat;
pub mod usage;

use axum::body::Body;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::stream::{ApiEvents, StreamContext};
use super::usage::Usage;
use super::{Adapter, ApiSpec, CountRoute, Form, Routes};
use crate::error::ProxyError;
use crate::reasoning::{OutputField, ThinkTags};

/// The Messages adapter.
pub(crate) struct Messages;

/// How Messages requests are shaped: Anthropic's image blocks.
pub(crate) const SHAPING: Form = Form {
    conversation: Some("messages"),
    limits: &["max_tokens"],
    cap_sets: "max_tokens",
    own: &["max_tokens", "stop_sequences", "thinking", "system"],
    image_part,
    text_part: "text",
    typed_items: false,
};

/// An image block: by URL, or its base64 data.
fn image_part(url: &str, data: Option<(&str, &str)>) -> serde_json::Value {
    match data {
        None => serde_json::json!({"type": "image", "source": {"type": "url", "url": url}}),
        Some((media_type, data)) => serde_json::json!({"type": "image",
            "source": {"type": "base64", "media_type": media_type, "data": data}}),
    }
}

#[derive(Serialize)]
struct Envelope<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    error: Detail<'a>,
}

#[derive(Serialize)]
struct Detail<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    message: &'a str,
}

/// Anthropic's error `type` for a status.
pub(crate) fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

/// Anthropic's words for a request over the window, the ones harnesses compact on: the prompt
/// alone, or the prompt and `max_tokens` together.
pub(crate) fn context_message(e: &ProxyError) -> Option<String> {
    let ProxyError::ContextLengthExceeded {
        window,
        prompt,
        completion,
        estimate,
    } = *e
    else {
        return None;
    };
    let mut msg = match completion {
        Some(k) if prompt < window => format!(
            "input length and `max_tokens` exceed context limit: {prompt} + {k} > {window}, decrease input length or `max_tokens` and try again"
        ),
        _ => format!("prompt is too long: {prompt} tokens > {window} maximum"),
    };
    if estimate {
        msg.push_str(" (token count is an estimate)");
    }
    Some(msg)
}

/// `{"type":"error","error":{"type","message"}}` for `e`.
pub(crate) fn envelope_json(e: &ProxyError) -> Vec<u8> {
    let (status, ..) = e.parts();
    let message = context_message(e).unwrap_or_else(|| e.to_string());
    let env = Envelope {
        kind: "error",
        error: Detail {
            kind: error_type(status),
            message: &message,
        },
    };
    serde_json::to_vec(&env).unwrap_or_else(|_| {
        br#"{"type":"error","error":{"type":"api_error","message":"internal error"}}"#.to_vec()
    })
}

/// The Messages API's constants.
pub(crate) const SPEC: ApiSpec = ApiSpec {
    name: "messages",
    routes: Routes {
        label: "messages",
        paths: &["/v1/messages"],
        count: Some(CountRoute {
            label: "count_tokens",
            paths: &["/v1/messages/count_tokens"],
        }),
    },
    operation: "chat",
    config_name: Some("messages"),
    speaks_chat: false,
    anthropic_rate_limits: true,
    takes_stream_usage: false,
    normalizes_reasoning: false,
    shaping: Some(&SHAPING),
    choices: false,
    guarded: true,
    resent_by_default: true,
    rewrites_answers: true,
    chat_form: Some(to_chat::to_chat),
};

impl Adapter for Messages {
    fn spec(&self) -> &ApiSpec {
        &SPEC
    }

    /// The status and headers (`Retry-After` among them) are those of the OpenAI rendering; the
    /// body is Anthropic's.
    fn error_response(&self, e: ProxyError) -> Response {
        let body = envelope_json(&e);
        let (parts, _) = e.into_response().into_parts();
        Response::from_parts(parts, Body::from(body))
    }

    fn stream_error(&self, e: &ProxyError) -> Vec<u8> {
        let payload = envelope_json(e);
        let mut v = Vec::with_capacity(payload.len() + 24);
        v.extend_from_slice(b"event: error\ndata: ");
        v.extend_from_slice(&payload);
        v.extend_from_slice(b"\n\n");
        v
    }

    fn stream_events(&self, ctx: &StreamContext) -> Option<Box<dyn ApiEvents>> {
        Some(Box::new(stream::MessagesStream::new(ctx.tags.clone())))
    }

    fn rewrite_answer(
        &self,
        body: &[u8],
        _output: OutputField,
        tags: Option<&ThinkTags>,
    ) -> Option<Vec<u8>> {
        answer::split_think_tags(body, tags?)
    }

    fn usage_of_answer(&self, body: &[u8]) -> Option<Usage> {
        usage::of_answer(body)
    }

    fn answer_from_chat(
        &self,
        chat: &[u8],
        ctx: &StreamContext,
    ) -> Result<Option<Vec<u8>>, crate::translated::NotChat> {
        from_chat::answer(chat, ctx).map(Some)
    }

    fn stream_from_chat(&self, ctx: &StreamContext) -> Option<Box<dyn ApiEvents>> {
        Some(Box::new(from_chat::translation(ctx)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_come_in_anthropics_envelope_with_the_status_of_the_error() {
        let e = ProxyError::ModelNotFound {
            model: crate::error::Echo::new("x"),
            known: "a".into(),
        };
        let v: serde_json::Value = serde_json::from_slice(&envelope_json(&e)).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "not_found_error");
        assert!(v["error"]["message"].as_str().unwrap().contains("`x`"));
        let r = Messages.error_response(ProxyError::Overloaded {
            alias: "a".into(),
            slots: 1,
            retry_after: 1,
        });
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()["retry-after"], "1");
        let event = Messages.stream_error(&ProxyError::UpstreamConnect {
            backend: "b".into(),
        });
        assert!(event.starts_with(b"event: error\ndata: {\"type\":\"error\""));
        assert!(event.ends_with(b"\n\n"));
    }

    #[test]
    fn the_context_error_has_anthropics_words() {
        let over = |prompt, completion| ProxyError::ContextLengthExceeded {
            window: 64,
            prompt,
            completion,
            estimate: false,
        };
        let message = |e: &ProxyError| {
            let v: serde_json::Value = serde_json::from_slice(&envelope_json(e)).unwrap();
            assert_eq!(v["error"]["type"], "invalid_request_error");
            v["error"]["message"].as_str().unwrap().to_string()
        };
        assert_eq!(
            message(&over(309, Some(10))),
            "prompt is too long: 309 tokens > 64 maximum"
        );
        assert_eq!(
            message(&over(64, None)),
            "prompt is too long: 64 tokens > 64 maximum"
        );
        assert_eq!(
            message(&over(40, Some(30))),
            "input length and `max_tokens` exceed context limit: 40 + 30 > 64, decrease input length or `max_tokens` and try again"
        );
        let r = Messages.error_response(over(40, Some(30)));
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    }
}
