//! The Responses API (`/v1/responses`, `/v1/responses/input_tokens`): routed by `model`,
//! OpenAI's error envelope, the request in chat form per backend ([`to_chat`]) and its output
//! limit `max_output_tokens`; streams repaired to the specification, usage, inline think tags
//! as `reasoning` items, and the answer of a chat-only backend translated back
//! ([`from_chat`]).

pub(crate) mod answer;
pub(crate) mod events;
pub(crate) mod from_chat;
pub(crate) mod history;
pub(crate) mod stream;
pub mod to_chat;
pub mod usage;

use super::stream::{ApiEvents, StreamContext};
use super::usage::Usage;
use super::{Adapter, ApiSpec, CountRoute, Form, Routes};
use crate::error::ProxyError;
use crate::flavor::Flavor;
use crate::reasoning::{OutputField, ThinkTags};

/// The Responses adapter.
pub(crate) struct Responses;

/// How Responses requests are shaped: `input` items (or one string), `input_image` parts.
pub(crate) const SHAPING: Form = Form {
    conversation: Some("input"),
    limits: &["max_output_tokens"],
    cap_sets: "max_output_tokens",
    own: &[
        "max_output_tokens",
        "top_logprobs",
        "reasoning",
        "instructions",
        "text",
        "truncation",
        "parallel_tool_calls",
    ],
    image_part,
    text_part: "input_text",
    typed_items: true,
};

/// An `input_image` part.
fn image_part(url: &str, _data: Option<(&str, &str)>) -> serde_json::Value {
    serde_json::json!({"type": "input_image", "image_url": url, "detail": "auto"})
}

/// The Responses API's constants.
pub(crate) const SPEC: ApiSpec = ApiSpec {
    name: "responses",
    routes: Routes {
        label: "responses",
        paths: &["/v1/responses"],
        count: Some(CountRoute {
            label: "input_tokens",
            paths: &["/v1/responses/input_tokens"],
        }),
    },
    operation: "chat",
    config_name: Some("responses"),
    speaks_chat: false,
    anthropic_rate_limits: false,
    takes_stream_usage: false,
    normalizes_reasoning: false,
    shaping: Some(&SHAPING),
    choices: false,
    guarded: true,
    resent_by_default: true,
    rewrites_answers: true,
    chat_form: Some(to_chat::to_chat),
};

impl Adapter for Responses {
    fn spec(&self) -> &ApiSpec {
        &SPEC
    }

    /// OpenAI's shape: `{input_tokens, object: "response.input_tokens"}`.
    fn count_answer(&self, tokens: u32, _window: u32, _method: &str) -> serde_json::Value {
        serde_json::json!({"input_tokens": tokens, "object": "response.input_tokens"})
    }

    /// Reasoning items in the form the runtime reads ([`history`]).
    fn history_for(&self, body: &[u8], flavor: Flavor) -> Result<Option<Vec<u8>>, ProxyError> {
        history::reasoning_items(body, flavor)
    }

    fn stream_events(&self, ctx: &StreamContext) -> Option<Box<dyn ApiEvents>> {
        Some(Box::new(stream::ResponsesStream::new(
            ctx.tags.clone(),
            &ctx.model,
        )))
    }

    fn rewrite_answer(
        &self,
        body: &[u8],
        _output: OutputField,
        tags: Option<&ThinkTags>,
    ) -> Option<Vec<u8>> {
        answer::rewrite(body, tags)
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
