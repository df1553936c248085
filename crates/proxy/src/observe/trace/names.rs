//! The names spans are written with: the OpenTelemetry GenAI semantic conventions (v1.41+;
//! kept here, as the conventions' crate marks its GenAI names as moved), the general HTTP and
//! server ones, and Switchboard's own `switchboard.*`.

use crate::wire::Endpoint;

pub const OPERATION: &str = "gen_ai.operation.name";
pub const PROVIDER: &str = "gen_ai.provider.name";
pub const REQUEST_MODEL: &str = "gen_ai.request.model";
pub const RESPONSE_MODEL: &str = "gen_ai.response.model";
pub const REQUEST_MAX_TOKENS: &str = "gen_ai.request.max_tokens";
pub const REQUEST_STREAM: &str = "gen_ai.request.stream";
pub const INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
pub const OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
pub const REASONING_TOKENS: &str = "gen_ai.usage.reasoning.output_tokens";
pub const CACHED_TOKENS: &str = "gen_ai.usage.cache_read.input_tokens";
pub const FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
pub const CONVERSATION: &str = "gen_ai.conversation.id";
pub const INPUT_MESSAGES: &str = "gen_ai.input.messages";
pub const OUTPUT_MESSAGES: &str = "gen_ai.output.messages";
pub const SERVER_ADDRESS: &str = "server.address";
pub const SERVER_PORT: &str = "server.port";
pub const ERROR_TYPE: &str = "error.type";
pub const HTTP_METHOD: &str = "http.request.method";
pub const HTTP_STATUS: &str = "http.response.status_code";
pub const URL_PATH: &str = "url.path";

pub const REQUEST_ID: &str = "switchboard.request_id";
pub const CLIENT: &str = "switchboard.client";
/// What kind of request its harness says it is (Codex CLI's `x-codex-turn-metadata`).
pub const REQUEST_KIND: &str = "switchboard.request_kind";
pub const ALIAS: &str = "switchboard.alias";
pub const BACKEND: &str = "switchboard.backend";
pub const QUEUE_WAIT: &str = "switchboard.queue_wait_ms";
pub const QUEUE_WAIT_PREDICTED: &str = "switchboard.queue_wait_predicted_ms";
pub const GPU_PREDICTED: &str = "switchboard.gpu.predicted_s";
pub const GPU_PREFILL: &str = "switchboard.gpu.prefill_s";
pub const GPU_DECODE: &str = "switchboard.gpu.decode_s";
pub const GPU_REPORTED: &str = "switchboard.gpu.reported";
pub const PREEMPTED: &str = "switchboard.preempted";
pub const COUNT_METHOD: &str = "switchboard.count.method";
pub const COUNT_PROMPT: &str = "switchboard.count.prompt_tokens";
pub const CONTEXT_WINDOW: &str = "switchboard.context.window";
pub const CONTEXT_REJECTED: &str = "switchboard.context.rejected";
pub const AFFINITY: &str = "switchboard.affinity";
pub const ATTEMPT: &str = "switchboard.attempt";
pub const RESENT: &str = "switchboard.resent";
pub const TRANSLATED: &str = "switchboard.translated_to";
pub const TTFT: &str = "switchboard.ttft_ms";
pub const CANCELLED: &str = "switchboard.cancelled";
/// Captured content was cut to `tracing.capture_max_bytes`.
pub const CONTENT_TRUNCATED: &str = "switchboard.content.truncated";

/// The event at a request's first generated token.
pub const FIRST_TOKEN: &str = "switchboard.first_token";
/// The event of a move to a fallback alias: `switchboard.fallback.from`, `.to`, `.reason`.
pub const FALLBACK: &str = "switchboard.fallback";
pub const FALLBACK_FROM: &str = "switchboard.fallback.from";
pub const FALLBACK_TO: &str = "switchboard.fallback.to";
pub const FALLBACK_REASON: &str = "switchboard.fallback.reason";

/// `gen_ai.operation.name` of an endpoint: chat for chat completions, Responses and Messages.
pub fn operation(endpoint: Endpoint) -> &'static str {
    endpoint.operation()
}

/// The path of an endpoint, as a span tells it (the others as one value, not the client's).
pub fn path(endpoint: Endpoint) -> &'static str {
    endpoint.span_path()
}
