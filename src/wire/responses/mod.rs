//! The Responses API (`/v1/responses`, `/v1/responses/input_tokens`): routed by `model`,
//! OpenAI's error envelope, the request in chat form per backend ([`to_chat`]) and its output
//! limit `max_output_tokens`; streams repaired to the specification, usage, inline think tags
//! as `reasoning` items, and the answer of a chat-only backend translated back
//! ([`from_chat`]).

pub mod answer;
pub mod events;
pub mod from_chat;
pub mod history;
pub mod stream;
pub mod to_chat;
pub mod usage;

use std::borrow::Cow;

use super::stream::{ApiEvents, StreamContext};
use super::usage::Usage;
use super::{Adapter, Api, Converter};
use crate::error::ProxyError;
use crate::reasoning::{OutputField, ThinkTags};
use crate::wire::chat_form;

/// The Responses adapter.
pub struct Responses;

impl Adapter for Responses {
    fn name(&self) -> &'static str {
        "responses"
    }

    fn api(&self) -> Api {
        Api::Responses
    }

    fn guarded(&self) -> bool {
        true
    }

    fn resent_by_default(&self) -> bool {
        true
    }

    fn to_chat<'a>(
        &self,
        body: &'a [u8],
        converter: Converter,
    ) -> Result<Cow<'a, [u8]>, ProxyError> {
        let req = chat_form::object(body)?;
        let chat = to_chat::to_chat(req, converter)?;
        Ok(Cow::Owned(chat_form::to_bytes(&chat)?))
    }

    fn output_limit(&self) -> &'static [&'static str] {
        &["max_output_tokens"]
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
    ) -> Result<Option<Vec<u8>>, String> {
        from_chat::answer(chat, ctx).map(Some)
    }

    fn stream_from_chat(&self, ctx: &StreamContext) -> Option<Box<dyn ApiEvents>> {
        Some(Box::new(from_chat::FromChat::new(ctx)))
    }
}
