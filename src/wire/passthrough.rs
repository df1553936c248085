//! The APIs relayed as they are (completions, embeddings, anything else under `/v1/`): routed by
//! `model`, nothing rewritten but the model, OpenAI's error envelope.

use super::chat::stream::ChatStream;
use super::stream::{EventTransform, StreamContext};
use super::Adapter;

/// A pass-through API; `usage_option`: its streams take `stream_options.include_usage`.
pub struct Passthrough {
    name: &'static str,
    usage_option: bool,
}

/// Legacy completions: their streams carry a usage chunk when asked.
pub const COMPLETIONS: Passthrough = Passthrough {
    name: "completions",
    usage_option: true,
};

/// Every other routed API.
pub const OTHER: Passthrough = Passthrough {
    name: "passthrough",
    usage_option: false,
};

impl Adapter for Passthrough {
    fn name(&self) -> &'static str {
        self.name
    }

    fn takes_stream_usage(&self) -> bool {
        self.usage_option
    }

    /// `data:` events as chat's, without reasoning rewriting.
    fn stream_transform(&self, ctx: &StreamContext) -> Box<dyn EventTransform> {
        Box::new(ChatStream::new(None, ctx.hide_usage && self.usage_option))
    }
}
