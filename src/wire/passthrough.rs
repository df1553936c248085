//! The APIs relayed as they are (completions, embeddings, anything else under `/v1/`): routed by
//! `model`, nothing rewritten but the model, OpenAI's error envelope.

use super::shape::Api;
use super::Adapter;

/// A pass-through API; `usage_option`: its streams take `stream_options.include_usage`.
pub struct Passthrough {
    name: &'static str,
    usage_option: bool,
    shaping: Api,
}

/// Legacy completions: their streams carry a usage chunk when asked.
pub const COMPLETIONS: Passthrough = Passthrough {
    name: "completions",
    usage_option: true,
    shaping: Api::Completions,
};

/// Every other routed API.
pub const OTHER: Passthrough = Passthrough {
    name: "passthrough",
    usage_option: false,
    shaping: Api::Other,
};

impl Adapter for Passthrough {
    fn name(&self) -> &'static str {
        self.name
    }

    fn takes_stream_usage(&self) -> bool {
        self.usage_option
    }

    fn api(&self) -> Api {
        self.shaping
    }
}
