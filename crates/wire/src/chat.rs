//! Chat completions (`/v1/chat/completions`): usage option, guard, reasoning both ways.

use std::borrow::Cow;
use std::sync::Arc;

use super::shape::{self, Form};
use super::{Adapter, ApiSpec, CountRoute, EventTransform, Routes};
use crate::error::ProxyError;
use crate::flavor::Flavor;
use crate::reasoning::{self, OutputField, StreamRewriter, ThinkTags};

/// The chat completions adapter.
pub(crate) struct Chat;

/// How chat requests are shaped.
pub const SHAPING: Form = Form {
    conversation: Some("messages"),
    limits: &["max_completion_tokens", "max_tokens"],
    cap_sets: "max_tokens",
    own: &[
        "max_tokens",
        "max_completion_tokens",
        "frequency_penalty",
        "presence_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "n",
        "seed",
        "stop",
        "response_format",
        "reasoning_effort",
        "parallel_tool_calls",
    ],
    image_part: shape::image_url_part,
    text_part: "text",
    typed_items: false,
};

/// Chat completions' constants.
pub(crate) const SPEC: ApiSpec = ApiSpec {
    name: "chat",
    // Counted at vLLM's `/tokenize`; SGLang's spelling `/v1/tokenize` is routed as it is.
    routes: Routes {
        label: "chat_completions",
        paths: &["/v1/chat/completions"],
        count: Some(CountRoute {
            label: "tokenize",
            paths: &["/tokenize", "/v1/tokenize"],
        }),
    },
    operation: "chat",
    config_name: Some("chat"),
    speaks_chat: true,
    anthropic_rate_limits: false,
    takes_stream_usage: true,
    normalizes_reasoning: true,
    shaping: Some(&SHAPING),
    choices: true,
    guarded: true,
    resent_by_default: true,
    rewrites_answers: true,
    chat_form: None,
};

impl Adapter for Chat {
    fn spec(&self) -> &ApiSpec {
        &SPEC
    }

    /// vLLM's shape: `{count, max_model_len, method}`.
    fn count_answer(&self, tokens: u32, window: u32, method: &str) -> serde_json::Value {
        serde_json::json!({"count": tokens, "max_model_len": window, "method": method})
    }

    fn history_for(&self, body: &[u8], flavor: Flavor) -> Result<Option<Vec<u8>>, ProxyError> {
        Ok(reasoning::rewrite_request_history(
            body,
            flavor.runtime().reasoning_field,
        ))
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
