//! The APIs relayed as they are (completions, embeddings, anything else under `/v1/`): routed by
//! `model`, nothing rewritten but the model, OpenAI's error envelope.

use super::shape::{self, Form};
use super::{Adapter, Routes};

/// A pass-through API; `usage_option`: its streams take `stream_options.include_usage`.
pub struct Passthrough {
    name: &'static str,
    routes: Routes,
    operation: &'static str,
    usage_option: bool,
    shaping: Option<&'static Form>,
}

/// How legacy completions are shaped: no conversation (a `prompt`), their own fields.
pub const COMPLETIONS_SHAPING: Form = Form {
    conversation: None,
    limits: &["max_tokens"],
    cap_sets: "max_tokens",
    own: &[
        "max_tokens",
        "frequency_penalty",
        "presence_penalty",
        "logit_bias",
        "logprobs",
        "n",
        "seed",
        "stop",
        "suffix",
        "echo",
        "best_of",
    ],
    image_part: shape::image_url_part,
    text_part: "text",
    typed_items: false,
};

/// Legacy completions: their streams carry a usage chunk when asked.
pub const COMPLETIONS: Passthrough = Passthrough {
    name: "completions",
    routes: Routes {
        label: "completions",
        paths: &["/v1/completions"],
        count: None,
    },
    operation: "text_completion",
    usage_option: true,
    shaping: Some(&COMPLETIONS_SHAPING),
};

/// Embeddings: not shaped.
pub const EMBEDDINGS: Passthrough = Passthrough {
    name: "passthrough",
    routes: Routes {
        label: "embeddings",
        paths: &["/v1/embeddings"],
        count: None,
    },
    operation: "embeddings",
    usage_option: false,
    shaping: None,
};

/// Every other routed API (not registered: what no registered path is).
pub const OTHER: Passthrough = Passthrough {
    name: "passthrough",
    routes: Routes {
        label: "other",
        paths: &[],
        count: None,
    },
    operation: "chat",
    usage_option: false,
    shaping: None,
};

impl Adapter for Passthrough {
    fn name(&self) -> &'static str {
        self.name
    }

    fn routes(&self) -> &Routes {
        &self.routes
    }

    fn operation(&self) -> &'static str {
        self.operation
    }

    fn takes_stream_usage(&self) -> bool {
        self.usage_option
    }

    fn shaping(&self) -> Option<&'static Form> {
        self.shaping
    }
}
