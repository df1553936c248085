//! The APIs relayed as they are (completions, embeddings, anything else under `/v1/`): routed by
//! `model`, nothing rewritten but the model, OpenAI's error envelope.

use super::shape::{self, Form};
use super::{Adapter, ApiSpec, Routes};

/// A pass-through API: its constants are all it has.
pub(crate) struct Passthrough(pub(crate) ApiSpec);

/// How legacy completions are shaped: no conversation (a `prompt`), their own fields.
pub(crate) const COMPLETIONS_SHAPING: Form = Form {
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

/// Every other routed API (not registered: what no registered path is): nothing is done with
/// its requests but routing them.
pub(crate) const OTHER: Passthrough = Passthrough(ApiSpec {
    name: "passthrough",
    routes: Routes {
        label: "other",
        paths: &[],
        count: None,
    },
    operation: "chat",
    config_name: None,
    speaks_chat: false,
    anthropic_rate_limits: false,
    takes_stream_usage: false,
    normalizes_reasoning: false,
    shaping: None,
    choices: false,
    guarded: false,
    resent_by_default: false,
    rewrites_answers: false,
    chat_form: None,
});

/// Legacy completions: their streams carry a usage chunk when asked; shaped, `n` choices.
pub(crate) const COMPLETIONS: Passthrough = Passthrough(ApiSpec {
    name: "completions",
    routes: Routes {
        label: "completions",
        paths: &["/v1/completions"],
        count: None,
    },
    operation: "text_completion",
    takes_stream_usage: true,
    shaping: Some(&COMPLETIONS_SHAPING),
    choices: true,
    ..OTHER.0
});

/// Embeddings: not shaped.
pub(crate) const EMBEDDINGS: Passthrough = Passthrough(ApiSpec {
    routes: Routes {
        label: "embeddings",
        paths: &["/v1/embeddings"],
        count: None,
    },
    operation: "embeddings",
    ..OTHER.0
});

impl Adapter for Passthrough {
    fn spec(&self) -> &ApiSpec {
        &self.0
    }
}
