//! vLLM's OpenAI-compatible server: what it serves and how it differs.

use super::{
    Discovery, Engine, InputField, Load, Privacy, ReasoningItems, Runtime, Tokenize, MESSAGES_COUNT,
};

/// vLLM's OpenAI-compatible server.
pub(crate) const VLLM: Runtime = Runtime {
    name: "vllm",
    // Accepts connections but answers no HTTP until loaded: a read timeout after a connect
    // is read as loading.
    health_path: "/health",
    // Its requests running and waiting.
    load: &[Load::Metrics(&[
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
    ])],
    // `/v1/models` gives `max_model_len`.
    discovery: Discovery::Models,
    slots_unknown: Some(
        "needs a number: vllm does not report its slot count (--max-num-seqs) over HTTP",
    ),
    window_unknown: None,
    reasoning_field: InputField::Reasoning,
    // It refuses any item with `encrypted_content`.
    reasoning_items: ReasoningItems::EncryptedDropped,
    serves: &["chat", "messages", "responses"],
    count_paths: &[MESSAGES_COUNT],
    // `/tokenize` in its messages form, asking for the generation prompt as a chat does.
    tokenize: Some(Tokenize::Messages {
        path: "/tokenize",
        generation_prompt: true,
    }),
    engine: Engine::Vllm,
    // `AnthropicServingMessages._convert_anthropic_to_openai_request` /
    // `responses.utils.construct_input_messages`.
    converts: Some(Engine::Vllm),
    errors_in_first_event: false,
    // Its prefix cache is shared by all its requests, whatever slot: nothing to pin.
    pins_slots: &[],
    // `cache_salt` in chat completions and Responses requests.
    privacy: Privacy::Salt(&["chat", "responses"]),
};
