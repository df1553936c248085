//! llama.cpp's `llama-server`: what it serves and how it differs.

use super::{
    CountPath, Discovery, Engine, InputField, Load, Privacy, ReasoningItems, Runtime, Tokenize,
    MESSAGES_COUNT,
};

/// llama.cpp `llama-server`.
pub(crate) const LLAMACPP: Runtime = Runtime {
    name: "llamacpp",
    // Answers 503 while the model loads.
    health_path: "/health",
    // Its busy slots (`GET /slots`, those with `is_processing`); where `/slots` is off,
    // `llamacpp:requests_processing` + `requests_deferred` in `GET /metrics`.
    load: &[
        Load::Slots,
        Load::Metrics(&["llamacpp:requests_processing", "llamacpp:requests_deferred"]),
    ],
    // `/props` gives its window (`n_ctx`), its slots and its inputs.
    discovery: Discovery::Props,
    slots_unknown: None,
    window_unknown: None,
    // Reads `reasoning_content` and silently drops `reasoning`.
    reasoning_field: InputField::ReasoningContent,
    // It refuses a reasoning item without its text in `content`, which clients such as Codex
    // leave out.
    reasoning_items: ReasoningItems::ContentRequired,
    serves: &["chat", "messages", "responses"],
    count_paths: &[
        MESSAGES_COUNT,
        CountPath {
            api: "responses",
            path: "/v1/responses/input_tokens",
        },
    ],
    // `/apply-template` then `/tokenize`: the count its `usage.prompt_tokens` gives.
    tokenize: Some(Tokenize::Templated {
        template: "/apply-template",
        tokenize: "/tokenize",
    }),
    engine: Engine::Llamacpp,
    // `server_chat_convert_anthropic_to_oai` / `_responses_to_chatcmpl`.
    converts: Some(Engine::Llamacpp),
    errors_in_first_event: false,
    // `id_slot` in the request body; a slot's KV cache is its own. Its Messages converter
    // builds a new body of a few fields and drops `id_slot`.
    pins_slots: &["chat", "responses"],
    // Its Messages converter drops `id_slot` and `cache_prompt`: a Messages request is
    // translated to chat where clients are isolated.
    privacy: Privacy::Slots(&["chat", "responses"]),
};
