//! Any other OpenAI-compatible server: chat completions only, nothing reported.

use super::{Discovery, Engine, InputField, Privacy, ReasoningItems, Runtime};

/// Any other OpenAI-compatible server.
pub(crate) const OPENAI: Runtime = Runtime {
    name: "openai",
    // It may have no `/health`; `/v1/models` is the one endpoint every such server has.
    health_path: "/v1/models",
    // A plain OpenAI-compatible server reports no load.
    load: &[],
    discovery: Discovery::Models,
    slots_unknown: Some("needs a number: an openai backend reports no slot count"),
    window_unknown: Some("needs a number: an openai backend reports no context window"),
    // OpenAI-style servers read `reasoning`.
    reasoning_field: InputField::Reasoning,
    reasoning_items: ReasoningItems::EncryptedDropped,
    // Chat only: Messages and Responses are translated to it.
    serves: &["chat"],
    count_paths: &[],
    // No tokenize endpoint.
    tokenize: None,
    // Counted locally as vLLM prepares a chat (Hugging Face templates).
    engine: Engine::Vllm,
    converts: None,
    errors_in_first_event: false,
    pins_slots: &[],
    // Nothing is known of a generic server's cache.
    privacy: Privacy::Shared,
};
