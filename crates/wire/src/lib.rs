//! The wire APIs clients speak: one adapter per API owns what differs between them.
//!
//! The pipeline knows no API in particular: it asks the request's [`Adapter`] whether streams
//! take the usage option, whether reasoning is normalized, whether the prompt is guarded, what
//! the request is in chat form (what a backend templates and the guard counts, what a
//! chat-only backend is sent: [`chat_form`]) and where its output limit is, how an error is
//! rendered (whole and as a stream event), what a stream's events do (repair, usage, first
//! tokens, reasoning: [`stream`]), how answers are rewritten, where the usage of an answer is,
//! and how a chat answer becomes this API's when the backend speaks only chat; where it is
//! served (its paths and its counting endpoint, [`endpoint`]), its name in a backend's `apis`
//! list and which flavours serve it themselves, and how the reasoning of its history is
//! written for a runtime. Adding an API is a folder here with its adapter, and its line in
//! [`APIS`] (`registry.rs`).
//!
//! Beside the adapters, what they and the proxy above share: the one error type, its
//! messages and envelopes (`error`, `envelope`, `echo`), backend flavours and their runtimes
//! as data (`flavor`, `runtime`), reasoning fields and think tags (`reasoning`), and `words`.

pub mod echo;
pub(crate) mod envelope;
pub mod error;
pub mod flavor;
pub mod reasoning;
pub mod runtime;
pub mod words;

pub mod chat;
pub mod chat_form;
pub mod endpoint;
pub mod facts;
pub(crate) mod from_chat;
pub mod messages;
pub mod passthrough;
pub mod payload;
pub mod registry;
pub mod request;
pub mod responses;
pub mod shape;
pub mod stream;
pub mod translated;
pub mod usage;

use std::borrow::Cow;
use std::sync::Arc;

use axum::response::{IntoResponse, Response};

pub use endpoint::Endpoint;
pub use registry::{adapter, by_config_name, APIS};
pub use stream::{data_event, Action, ApiEvents, Seen, StreamContext};

use crate::error::ProxyError;
use crate::flavor::Flavor;
use crate::reasoning::{OutputField, ThinkTags};
pub use chat_form::Converter;
pub use shape::Form;
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

/// Where an API is served, and the `endpoint` labels of its requests (unique among the
/// registered APIs).
#[derive(Debug)]
pub struct Routes {
    /// The label of its requests.
    pub label: &'static str,
    /// The paths it is served at, routed by the request's `model`.
    pub(crate) paths: &'static [&'static str],
    /// Its counting endpoint, if it has one.
    pub(crate) count: Option<CountRoute>,
}

/// An API's counting endpoint.
#[derive(Debug)]
pub(crate) struct CountRoute {
    /// The label of its requests.
    pub label: &'static str,
    /// The path served (the first), then other spellings that share its label (routed by
    /// model as they are, not counted).
    pub(crate) paths: &'static [&'static str],
}

impl Routes {
    /// The counting endpoint's paths (none without one).
    pub fn count_paths(&self) -> &'static [&'static str] {
        self.count.as_ref().map_or(&[], |c| c.paths)
    }
}

/// An API's constants: where it is served, its names, and what the pipeline does with its
/// requests. One value per API ([`Adapter::spec`]).
#[derive(Debug)]
pub struct ApiSpec {
    /// The API's name in logs.
    pub name: &'static str,
    /// Where it is served: its paths and its counting endpoint, with their labels.
    pub routes: Routes,
    /// `gen_ai.operation.name` of its requests.
    pub operation: &'static str,
    /// Its name in a backend's `apis` list: an API a backend may serve itself or be sent
    /// translated to chat completions. `None`: every backend is sent it as it is. Which
    /// runtimes serve it themselves is theirs to say ([`crate::runtime::Runtime::serves`]).
    pub config_name: Option<&'static str>,
    /// Its bodies are chat completions requests already: every backend serves it (it is
    /// what the others are translated to), and the guard counts the body as it is.
    pub speaks_chat: bool,
    /// Its rate-limit headers are Anthropic's (`anthropic-ratelimit-*`), not OpenAI's.
    pub anthropic_rate_limits: bool,
    /// Streams take `stream_options.include_usage`: the proxy asks for the usage chunk.
    pub takes_stream_usage: bool,
    /// Reasoning is normalized: in answers, in stream events and in the request's history.
    pub normalizes_reasoning: bool,
    /// What request shaping knows of this API (where its conversation and output limits
    /// are, its fields, its image parts); `None`: its requests are not shaped.
    pub shaping: Option<&'static Form>,
    /// A request may ask for several choices (`n`): its output limit is per choice.
    pub choices: bool,
    /// The prompt is counted against the alias's window before it is sent.
    pub guarded: bool,
    /// A model call with no effect beyond compute: one a backend dropped without a byte of
    /// answer goes on to another replica or fallback unless `server.resend_unanswered` is
    /// false (requests of other APIs: only where it is true).
    pub resent_by_default: bool,
    /// Whole answers are read to be rewritten ([`Adapter::rewrite_answer`],
    /// [`Adapter::answer_from_chat`]): the APIs whose answers carry reasoning.
    pub rewrites_answers: bool,
    /// How this API's body (a JSON object) becomes the chat-completions body a converter
    /// makes of it; `None`: its bodies are chat form already (or never converted).
    pub(crate) chat_form: Option<chat_form::Conversion>,
}

impl ApiSpec {
    /// The keys of the output limit, in the order they take effect (the guard clamps them):
    /// its [`Form`]'s; none for an API that is not shaped.
    pub fn output_limit(&self) -> &'static [&'static str] {
        self.shaping.map_or(&[], |form| form.limits)
    }

    /// A backend of `flavor` serves it itself unless its `apis` list says otherwise: an API
    /// with no name in `apis` always, the others where its runtime says so.
    pub fn served_by_default(&self, flavor: Flavor) -> bool {
        self.config_name
            .is_none_or(|name| flavor.runtime().serves.contains(&name))
    }

    /// The backend's own counting endpoint, where a `flavor` backend serving this API has one.
    pub fn native_count_path(&self, flavor: Flavor) -> Option<&'static str> {
        self.config_name
            .and_then(|name| flavor.runtime().count_path(name))
    }
}

/// What differs between the APIs, for one API: its constants ([`ApiSpec`]) and what it does.
pub trait Adapter: Sync {
    /// The API's constants.
    fn spec(&self) -> &ApiSpec;

    /// The counting endpoint's answer: `tokens` of the prompt, of an alias whose window is
    /// `window`, counted by `method`.
    fn count_answer(&self, tokens: u32, _window: u32, _method: &str) -> serde_json::Value {
        serde_json::json!({ "input_tokens": tokens })
    }

    /// `body` with the reasoning in its history in the form a `flavor` runtime reads; `None`
    /// when it is in that form already (or the API carries no reasoning in its history).
    fn history_for(&self, _body: &[u8], _flavor: Flavor) -> Result<Option<Vec<u8>>, ProxyError> {
        Ok(None)
    }

    /// The chat-completions body `converter` makes of this API's `body`: what a backend
    /// templates (and so what the counter counts), or what a chat-only backend is sent.
    /// Chat bodies are chat form already.
    fn to_chat<'a>(
        &self,
        body: &'a [u8],
        converter: Converter,
    ) -> Result<Cow<'a, [u8]>, ProxyError> {
        match self.spec().chat_form {
            None => Ok(Cow::Borrowed(body)),
            Some(convert) => chat_form::convert(body, converter, convert, None).map(Cow::Owned),
        }
    }

    /// The chat request a chat-only backend is sent for `body`: [`Adapter::to_chat`] with the
    /// backend's `model`.
    fn translate(
        &self,
        body: &[u8],
        converter: Converter,
        model: &str,
    ) -> Result<Vec<u8>, ProxyError> {
        match self.spec().chat_form {
            None => Ok(body.to_vec()),
            Some(convert) => chat_form::convert(body, converter, convert, Some(model)),
        }
    }

    /// The output the request asks room for: the first of [`ApiSpec::output_limit`] set.
    fn requested_output(&self, body: &[u8]) -> Result<Option<u32>, ProxyError> {
        request::output_limit(body, self.spec().output_limit())
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
    ) -> Result<Option<Vec<u8>>, translated::NotChat> {
        Ok(None)
    }

    /// The transform that turns a chat completion stream (of a request translated to chat)
    /// into this API's stream; `None` when this API is not served by translation.
    fn stream_from_chat(&self, _ctx: &StreamContext) -> Option<Box<dyn ApiEvents>> {
        None
    }
}

#[cfg(test)]
mod tests;
