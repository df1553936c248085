//! Chat completions (`/v1/chat/completions`): usage option, guard, reasoning both ways.

pub mod stream;

use super::stream::{EventTransform, StreamContext};
use super::Adapter;
use crate::reasoning::{self, OutputField, StreamRewriter, ThinkTags};
use stream::ChatStream;

/// The chat completions adapter.
pub struct Chat;

impl Adapter for Chat {
    fn name(&self) -> &'static str {
        "chat"
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

    fn stream_transform(&self, ctx: &StreamContext) -> Box<dyn EventTransform> {
        let rewriter = StreamRewriter::new(ctx.output, ctx.tags.clone());
        Box::new(ChatStream::new(Some(rewriter), ctx.hide_usage))
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
