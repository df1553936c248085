//! The APIs relayed as they are (completions, embeddings, anything else under `/v1/`): routed by
//! `model`, nothing rewritten but the model, OpenAI's error envelope.

use super::shape::Api;
use super::Adapter;

/// A pass-through API; `usage_option`: its streams take `stream_options.include_usage`.
pub struct Passthrough {
    name: &'static str,
    label: &'static str,
    paths: &'static [&'static str],
    operation: &'static str,
    usage_option: bool,
    shaping: Api,
}

/// Legacy completions: their streams carry a usage chunk when asked.
pub const COMPLETIONS: Passthrough = Passthrough {
    name: "completions",
    label: "completions",
    paths: &["/v1/completions"],
    operation: "text_completion",
    usage_option: true,
    shaping: Api::Completions,
};

/// Embeddings: not shaped.
pub const EMBEDDINGS: Passthrough = Passthrough {
    name: "passthrough",
    label: "embeddings",
    paths: &["/v1/embeddings"],
    operation: "embeddings",
    usage_option: false,
    shaping: Api::Other,
};

/// Every other routed API (not registered: what no registered path is).
pub const OTHER: Passthrough = Passthrough {
    name: "passthrough",
    label: "other",
    paths: &[],
    operation: "chat",
    usage_option: false,
    shaping: Api::Other,
};

impl Adapter for Passthrough {
    fn name(&self) -> &'static str {
        self.name
    }

    fn label(&self) -> &'static str {
        self.label
    }

    fn paths(&self) -> &'static [&'static str] {
        self.paths
    }

    fn operation(&self) -> &'static str {
        self.operation
    }

    fn takes_stream_usage(&self) -> bool {
        self.usage_option
    }

    fn api(&self) -> Api {
        self.shaping
    }
}
