//! The Responses API (`/v1/responses`): routed by `model`, OpenAI's error envelope; streams
//! repaired to the specification, usage, inline think tags as `reasoning` items, and the
//! answer of a chat-only backend translated.

pub mod answer;
pub mod events;
pub mod from_chat;
pub mod stream;
pub mod usage;

use super::stream::{EventTransform, StreamContext};
use super::usage::Usage;
use super::Adapter;
use crate::reasoning::{OutputField, ThinkTags};

/// The Responses adapter.
pub struct Responses;

impl Adapter for Responses {
    fn name(&self) -> &'static str {
        "responses"
    }

    fn stream_transform(&self, ctx: &StreamContext) -> Box<dyn EventTransform> {
        Box::new(stream::ResponsesStream::new(ctx.tags.clone(), &ctx.model))
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

    fn answer_from_chat(&self, chat: &[u8], ctx: &StreamContext) -> Option<Vec<u8>> {
        from_chat::answer(chat, ctx)
    }

    fn stream_from_chat(&self, ctx: &StreamContext) -> Option<Box<dyn EventTransform>> {
        Some(Box::new(from_chat::FromChat::new(ctx)))
    }
}
