//! A [`ProxyError`] rendered once: OpenAI's envelope
//! `{"error":{"message","type","param","code"}}`, as JSON bytes (for a stream's error event)
//! and as the response, with its `Retry-After` and `Connection` fields.

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::error::ProxyError;

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

    /// The seconds a client is told to wait (`Retry-After`), for the errors that say so.
    fn retry_after(&self) -> Option<u64> {
        match self {
            ProxyError::UpstreamLoading { retry_after, .. }
            | ProxyError::Overloaded { retry_after, .. }
            | ProxyError::QueueTimeout { retry_after, .. }
            | ProxyError::WaitTooLong { retry_after, .. }
            | ProxyError::NoBackend { retry_after, .. } => Some(*retry_after),
            ProxyError::TooManyConnections { .. } | ProxyError::ProxyExhausted { .. } => Some(1),
            ProxyError::CountBusy { .. } | ProxyError::LedgerUnavailable { .. } => Some(1),
            ProxyError::RateLimited { retry_after, .. } => *retry_after,
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
        if matches!(self, ProxyError::BodyTimeout { .. }) {
            // The rest of the body may still come: the connection cannot carry another request.
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
