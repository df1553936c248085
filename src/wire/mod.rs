//! The wire APIs clients speak: one adapter per API owns what differs between them.
//!
//! The pipeline knows no API in particular: it asks the request's [`Adapter`] whether streams
//! take the usage option, whether reasoning is normalized, whether the prompt is guarded, how
//! an error is rendered (whole and as a stream event), how events and answers are rewritten
//! and where the usage of an answer is. Adding an API is adding an adapter here.

pub mod chat;
pub mod chat_form;
pub mod endpoint;
pub mod messages;
pub mod passthrough;
pub mod request;
pub mod responses;
pub mod shape;
pub mod usage;

use std::borrow::Cow;
use std::sync::Arc;

use axum::response::{IntoResponse, Response};

pub use endpoint::Endpoint;

use crate::error::ProxyError;
use crate::reasoning::{OutputField, ThinkTags};
pub use chat_form::Converter;
pub use shape::Api;
use usage::Usage;

/// Per-stream event transform (reasoning normalization).
pub trait EventTransform: Send {
    /// Rewrite one event's `data:` payload (`Cow::Borrowed`: unchanged).
    fn rewrite<'a>(&mut self, data: &'a [u8]) -> Cow<'a, [u8]>;
    /// Payload to send before the final events (text still held back), if any.
    fn flush(&mut self) -> Option<Vec<u8>>;
}

/// What differs between the APIs, for one API.
pub trait Adapter: Sync {
    /// The API's name in logs.
    fn name(&self) -> &'static str;

    /// Streams take `stream_options.include_usage`: the proxy asks for the usage chunk.
    fn takes_stream_usage(&self) -> bool {
        false
    }

    /// Reasoning is normalized: in answers, in stream events and in the request's history.
    fn normalizes_reasoning(&self) -> bool {
        false
    }

    /// The API this adapter speaks (for request shaping: where its conversation and output
    /// limits are).
    fn api(&self) -> Api {
        Api::Other
    }

    /// The prompt is counted against the alias's window before it is sent.
    fn guarded(&self) -> bool {
        false
    }

    /// The chat-completions body `converter` makes of this API's `body`: what a backend
    /// templates (and so what the counter counts), or what a chat-only backend is sent.
    /// Chat bodies are chat form already.
    fn to_chat<'a>(
        &self,
        body: &'a [u8],
        _converter: Converter,
    ) -> Result<Cow<'a, [u8]>, ProxyError> {
        Ok(Cow::Borrowed(body))
    }

    /// The keys of the output limit, in the order they take effect (the guard clamps them).
    fn output_limit(&self) -> &'static [&'static str] {
        &["max_completion_tokens", "max_tokens"]
    }

    /// The output the request asks room for: the first of [`Adapter::output_limit`] set.
    fn requested_output(&self, body: &[u8]) -> Result<Option<u32>, ProxyError> {
        request::output_limit(body, self.output_limit())
    }

    /// An error as this API's HTTP answer.
    fn error_response(&self, e: ProxyError) -> Response {
        e.into_response()
    }

    /// An error as this API's last stream event (the stream then ends without its end marker).
    fn stream_error(&self, e: &ProxyError) -> Vec<u8> {
        data_event(&e.envelope_json())
    }

    /// The transform of this API's stream events, if they need one.
    fn stream_transform(
        &self,
        _output: OutputField,
        _tags: Option<Arc<ThinkTags>>,
    ) -> Option<Box<dyn EventTransform>> {
        None
    }

    /// A whole answer rewritten, or `None` when it passes as it is.
    fn rewrite_answer(
        &self,
        _body: &[u8],
        _output: OutputField,
        _tags: Option<&ThinkTags>,
    ) -> Option<Vec<u8>> {
        None
    }

    /// The token usage a whole answer reports.
    fn usage_of_answer(&self, body: &[u8]) -> Option<Usage> {
        usage::of_body(body)
    }
}

/// The adapter of an endpoint.
pub fn adapter(endpoint: Endpoint) -> &'static dyn Adapter {
    match endpoint {
        Endpoint::chat_completions => &chat::Chat,
        Endpoint::completions => &passthrough::COMPLETIONS,
        Endpoint::responses | Endpoint::input_tokens => &responses::Responses,
        Endpoint::messages | Endpoint::count_tokens => &messages::Messages,
        Endpoint::embeddings | Endpoint::tokenize | Endpoint::models | Endpoint::other => {
            &passthrough::OTHER
        }
    }
}

/// `payload` as one SSE `data:` event.
pub fn data_event(payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(payload.len() + 8);
    v.extend_from_slice(b"data: ");
    v.extend_from_slice(payload);
    v.extend_from_slice(b"\n\n");
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_endpoint_has_the_adapter_of_its_api() {
        assert_eq!(adapter(Endpoint::chat_completions).name(), "chat");
        assert_eq!(adapter(Endpoint::responses).name(), "responses");
        assert_eq!(adapter(Endpoint::messages).name(), "messages");
        assert_eq!(adapter(Endpoint::count_tokens).name(), "messages");
        assert_eq!(adapter(Endpoint::completions).name(), "completions");
        assert_eq!(adapter(Endpoint::embeddings).name(), "passthrough");
        assert!(adapter(Endpoint::chat_completions).guarded());
        assert!(!adapter(Endpoint::embeddings).takes_stream_usage());
        assert!(adapter(Endpoint::completions).takes_stream_usage());
    }
}
