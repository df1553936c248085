//! One error type for everything a client can be told, rendered once as OpenAI's envelope.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// Everything that can go wrong while serving a request.
///
/// Each variant maps to exactly one status, `type` and `code` in [`ProxyError::parts`];
/// [`IntoResponse`] renders the OpenAI envelope `{"error":{"message","type","param","code"}}`.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error(
        "The model `{model}` does not exist or you do not have access to it. Known models: {known}"
    )]
    ModelNotFound { model: String, known: String },
    #[error("you must provide a model parameter")]
    MissingModel,
    #[error("invalid JSON body: {0}")]
    InvalidJson(String),
    #[error("{0}")]
    InvalidRequest(String),
    #[error("invalid value for {param}: {message}")]
    InvalidParam {
        param: &'static str,
        message: String,
    },
    #[error("unsupported content type {0:?}: send application/json")]
    UnsupportedContentType(String),
    #[error("request body is larger than the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("{}", context_message(*.window, *.prompt, *.completion, *.estimate))]
    ContextLengthExceeded {
        window: u32,
        prompt: u32,
        completion: Option<u32>,
        estimate: bool,
    },
    #[error("no route for {method} {path}")]
    NotFound { method: String, path: String },
    #[error("upstream {backend} is unreachable")]
    UpstreamConnect { backend: String },
    #[error("upstream {backend} did not answer within {elapsed:?}")]
    UpstreamTimeout { backend: String, elapsed: Duration },
    #[error("upstream {backend} is loading, retry later")]
    UpstreamLoading { backend: String, retry_after: u64 },
    #[error("upstream {backend} failed: {detail}")]
    UpstreamProtocol { backend: String, detail: String },
    #[error("all {slots} slots of {alias} are busy and its queue is full")]
    Overloaded {
        alias: String,
        slots: u32,
        retry_after: u64,
    },
    #[error("no slot of {alias} came free within the queue timeout of {waited:?}")]
    QueueTimeout {
        alias: String,
        waited: Duration,
        retry_after: u64,
    },
    #[error("no backend of {alias} can take requests now ({why})")]
    NoBackend {
        alias: String,
        why: &'static str,
        retry_after: u64,
    },
    #[error("invalid or missing API key")]
    Unauthorized,
}

/// OpenAI's exact context-length wording, with an estimate marker where the count is one.
fn context_message(window: u32, prompt: u32, completion: Option<u32>, estimate: bool) -> String {
    let mut msg = match completion {
        Some(out) => format!(
            "This model's maximum context length is {window} tokens. However, you requested {} tokens ({prompt} in the messages, {out} in the completion). Please reduce the length of the messages or completion.",
            u64::from(prompt) + u64::from(out)
        ),
        None => format!(
            "This model's maximum context length is {window} tokens. However, your messages resulted in {prompt} tokens. Please reduce the length of the messages."
        ),
    };
    if estimate {
        msg.push_str(" (token count is an estimate)");
    }
    msg
}

/// The envelope clients parse.
#[derive(Serialize)]
struct Envelope<'a> {
    error: Body<'a>,
}

#[derive(Serialize)]
struct Body<'a> {
    message: String,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    n_prompt_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    n_ctx: Option<u32>,
}

impl ProxyError {
    /// Status, OpenAI `type`, `param` and `code` of this error: the one table of them.
    pub fn parts(
        &self,
    ) -> (
        StatusCode,
        &'static str,
        Option<&'static str>,
        Option<&'static str>,
    ) {
        use ProxyError::*;
        const BAD: StatusCode = StatusCode::BAD_REQUEST;
        match self {
            ModelNotFound { .. } => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("model"),
                Some("model_not_found"),
            ),
            MissingModel => (
                BAD,
                "invalid_request_error",
                Some("model"),
                Some("missing_model"),
            ),
            InvalidJson(_) => (BAD, "invalid_request_error", None, Some("invalid_json")),
            InvalidRequest(_) => (BAD, "invalid_request_error", None, Some("invalid_request")),
            InvalidParam { param, .. } => (
                BAD,
                "invalid_request_error",
                Some(param),
                Some("invalid_value"),
            ),
            UnsupportedContentType(_) => (
                BAD,
                "invalid_request_error",
                None,
                Some("unsupported_content_type"),
            ),
            PayloadTooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                None,
                Some("request_too_large"),
            ),
            ContextLengthExceeded { .. } => (
                BAD,
                "invalid_request_error",
                Some("messages"),
                Some("context_length_exceeded"),
            ),
            NotFound { .. } => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                None,
                Some("unknown_url"),
            ),
            UpstreamConnect { .. } => (
                StatusCode::BAD_GATEWAY,
                "server_error",
                None,
                Some("bad_gateway"),
            ),
            UpstreamProtocol { .. } => (
                StatusCode::BAD_GATEWAY,
                "server_error",
                None,
                Some("bad_gateway"),
            ),
            UpstreamTimeout { .. } => (
                StatusCode::GATEWAY_TIMEOUT,
                "server_error",
                None,
                Some("upstream_timeout"),
            ),
            UpstreamLoading { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                None,
                Some("model_loading"),
            ),
            Overloaded { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                None,
                Some("overloaded"),
            ),
            QueueTimeout { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                None,
                Some("queue_timeout"),
            ),
            NoBackend { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                None,
                Some("no_backend"),
            ),
            Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                None,
                Some("invalid_api_key"),
            ),
        }
    }

    /// The envelope as JSON bytes, for contexts that are not an HTTP response (SSE error events).
    pub fn envelope_json(&self) -> Vec<u8> {
        let (_, kind, param, code) = self.parts();
        let (n_prompt_tokens, n_ctx) = match self {
            ProxyError::ContextLengthExceeded {
                window,
                prompt,
                completion,
                ..
            } => (
                Some(prompt.saturating_add(completion.unwrap_or(0))),
                Some(*window),
            ),
            _ => (None, None),
        };
        let env = Envelope {
            error: Body {
                message: self.to_string(),
                kind,
                param,
                code,
                n_prompt_tokens,
                n_ctx,
            },
        };
        serde_json::to_vec(&env).unwrap_or_else(|_| b"{\"error\":{\"message\":\"internal error\",\"type\":\"server_error\",\"param\":null,\"code\":null}}".to_vec())
    }

    fn retry_after(&self) -> Option<u64> {
        match self {
            ProxyError::UpstreamLoading { retry_after, .. }
            | ProxyError::Overloaded { retry_after, .. }
            | ProxyError::QueueTimeout { retry_after, .. }
            | ProxyError::NoBackend { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }
}

impl IntoResponse for ProxyError {
    fn into_response(self) -> Response {
        let (status, ..) = self.parts();
        let mut resp = (status, self.envelope_json()).into_response();
        let headers = resp.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(secs) = self.retry_after() {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_message_matches_openai_wording() {
        let e = ProxyError::ContextLengthExceeded {
            window: 8192,
            prompt: 7554,
            completion: Some(1000),
            estimate: false,
        };
        assert_eq!(e.to_string(), "This model's maximum context length is 8192 tokens. However, you requested 8554 tokens (7554 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.");
        let e = ProxyError::ContextLengthExceeded {
            window: 8192,
            prompt: 8554,
            completion: None,
            estimate: false,
        };
        assert_eq!(e.to_string(), "This model's maximum context length is 8192 tokens. However, your messages resulted in 8554 tokens. Please reduce the length of the messages.");
    }

    #[test]
    fn envelope_has_all_four_fields() {
        let v: serde_json::Value =
            serde_json::from_slice(&ProxyError::MissingModel.envelope_json()).unwrap();
        let e = &v["error"];
        assert_eq!(e["type"], "invalid_request_error");
        assert_eq!(e["param"], "model");
        assert_eq!(e["code"], "missing_model");
        assert!(e["message"].is_string());
    }
}
