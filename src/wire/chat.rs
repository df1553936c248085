//! Chat completions (`/v1/chat/completions`): usage option, guard, reasoning both ways.

use std::borrow::Cow;
use std::sync::Arc;

use super::{Adapter, Api, EventTransform};
use crate::reasoning::{self, OutputField, StreamRewriter, ThinkTags};

/// The chat completions adapter.
pub struct Chat;

impl Adapter for Chat {
    fn name(&self) -> &'static str {
        "chat"
    }

    fn api(&self) -> Api {
        Api::ChatCompletions
    }

    fn takes_stream_usage(&self) -> bool {
        true
    }

    fn normalizes_reasoning(&self) -> bool {
        true
    }

    fn guarded(&self) -> bool {
        true
    }

    fn resent_by_default(&self) -> bool {
        true
    }

    fn stream_transform(
        &self,
        output: OutputField,
        tags: Option<Arc<ThinkTags>>,
    ) -> Option<Box<dyn EventTransform>> {
        Some(Box::new(StreamRewriter::new(output, tags)))
    }

    fn rewrite_answer(
        &self,
        body: &[u8],
        output: OutputField,
        tags: Option<&ThinkTags>,
    ) -> Option<Vec<u8>> {
        reasoning::rewrite_response_body(body, output, tags)
    }
}

impl EventTransform for StreamRewriter {
    fn rewrite<'a>(&mut self, data: &'a [u8]) -> Cow<'a, [u8]> {
        StreamRewriter::rewrite(self, data)
    }

    fn flush(&mut self) -> Option<Vec<u8>> {
        StreamRewriter::flush(self)
    }

    fn follows_keys(&self) -> bool {
        StreamRewriter::follows_keys(self)
    }
}
