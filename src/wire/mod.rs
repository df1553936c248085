//! The wire APIs clients speak: one adapter per API owns what differs between them.
//!
//! The pipeline knows no API in particular: it asks the request's [`Adapter`] whether streams
//! take the usage option, whether reasoning is normalized, whether the prompt is guarded, what
//! the request is in chat form (what a backend templates and the guard counts, what a
//! chat-only backend is sent: [`chat_form`]) and where its output limit is, how an error is
//! rendered (whole and as a stream event), what a stream's events do (repair, usage, first
//! tokens, reasoning: [`stream`]), how answers are rewritten, where the usage of an answer is,
//! and how a chat answer becomes this API's when the backend speaks only chat. Adding an API
//! is adding an adapter here.

pub mod chat;
pub mod chat_form;
pub mod endpoint;
pub mod facts;
pub mod from_chat;
pub mod messages;
pub mod passthrough;
pub mod payload;
pub mod request;
pub mod responses;
pub mod shape;
pub mod stream;
pub mod usage;

use std::borrow::Cow;
use std::sync::Arc;

use axum::response::{IntoResponse, Response};

pub use endpoint::Endpoint;
pub use stream::{data_event, Action, ApiEvents, Seen, StreamContext};

use crate::error::ProxyError;
use crate::reasoning::{OutputField, ThinkTags};
pub use chat_form::Converter;
pub use shape::Api;
use usage::Usage;

/// Per-stream rewrite of chat `data:` payloads (reasoning normalization).
pub trait EventTransform: Send {
    /// Rewrite one event's `data:` payload (`Cow::Borrowed`: unchanged).
    fn rewrite<'a>(&mut self, data: &'a [u8]) -> Cow<'a, [u8]>;
    /// Payload to send before the final events (text still held back), if any.
    fn flush(&mut self) -> Option<Vec<u8>>;
    /// Whether `rewrite` leaves an event unchanged by its keys and the types of their values
    /// alone, never by the text of a string or by earlier events: then an event shaped as one
    /// it left unchanged (`pipeline::same_shape`) is left unchanged without a call.
    fn follows_keys(&self) -> bool {
        false
    }
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

    /// A model call with no effect beyond compute: one a backend dropped without a byte of
    /// answer goes on to another replica or fallback unless `server.resend_unanswered` is
    /// false (requests of other APIs: only where it is true).
    fn resent_by_default(&self) -> bool {
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

    /// The transform of this API's `data:` payloads, if they need one (chat's reasoning).
    fn stream_transform(
        &self,
        _output: OutputField,
        _tags: Option<Arc<ThinkTags>>,
    ) -> Option<Box<dyn EventTransform>> {
        None
    }

    /// Whole answers are read to be rewritten ([`Adapter::rewrite_answer`],
    /// [`Adapter::answer_from_chat`]): the APIs whose answers carry reasoning.
    fn rewrites_answers(&self) -> bool {
        matches!(
            self.api(),
            Api::ChatCompletions | Api::Responses | Api::Messages
        )
    }

    /// The handling of this API's whole stream events, when the API has its own (repair to the
    /// specification, usage, first tokens, reasoning); `None`: events are read as chat's.
    fn stream_events(&self, _ctx: &StreamContext) -> Option<Box<dyn ApiEvents>> {
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

    /// A chat completion answer (of a request translated to chat) as this API's answer:
    /// `Ok(None)` when this API is not served by translation, `Err` (what is wrong) when the
    /// answer is not a chat completion.
    fn answer_from_chat(
        &self,
        _chat: &[u8],
        _ctx: &StreamContext,
    ) -> Result<Option<Vec<u8>>, String> {
        Ok(None)
    }

    /// The transform that turns a chat completion stream (of a request translated to chat)
    /// into this API's stream; `None` when this API is not served by translation.
    fn stream_from_chat(&self, _ctx: &StreamContext) -> Option<Box<dyn ApiEvents>> {
        None
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
