//! SGLang's OpenAI-compatible server: what it serves and how it differs.

use super::{
    Discovery, Engine, InputField, Load, Privacy, ReasoningItems, Runtime, Tokenize, MESSAGES_COUNT,
};

/// SGLang's OpenAI-compatible server.
pub(crate) const SGLANG: Runtime = Runtime {
    name: "sglang",
    // Sends an empty 503 while starting.
    health_path: "/health",
    // Its requests running and queued.
    load: &[Load::Metrics(&[
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
    ])],
    // `/v1/models`, then `/server_info` (slots) and `/model_info`.
    discovery: Discovery::ServerInfo,
    slots_unknown: None,
    window_unknown: None,
    // Reads `reasoning_content` and silently drops `reasoning`.
    reasoning_field: InputField::ReasoningContent,
    reasoning_items: ReasoningItems::EncryptedDropped,
    serves: &["chat", "messages", "responses"],
    count_paths: &[MESSAGES_COUNT],
    // `/v1/tokenize` in its messages form.
    tokenize: Some(Tokenize::Messages {
        path: "/v1/tokenize",
        generation_prompt: false,
    }),
    engine: Engine::Sglang,
    // `AnthropicServing._convert_to_chat_completion_request` (Messages); its Responses
    // requests follow vLLM's construction.
    converts: Some(Engine::Sglang),
    // It puts a context error inside a 200 stream.
    errors_in_first_event: true,
    // Its prefix cache is shared by all its requests, whatever slot: nothing to pin.
    pins_slots: &[],
    // `cache_salt` in chat completions requests (its `extra_key` with it).
    privacy: Privacy::Salt(&["chat"]),
};
