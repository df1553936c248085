//! The names spans are written with: the OpenTelemetry GenAI semantic conventions (v1.41+;
//! kept here, as the conventions' crate marks its GenAI names as moved), the general HTTP and
//! server ones, and Switchboard's own `switchboard.*`.

use crate::wire::Endpoint;

pub(crate) const OPERATION: &str = "gen_ai.operation.name";
pub(crate) const PROVIDER: &str = "gen_ai.provider.name";
pub(crate) const REQUEST_MODEL: &str = "gen_ai.request.model";
pub(crate) const RESPONSE_MODEL: &str = "gen_ai.response.model";
pub(crate) const REQUEST_MAX_TOKENS: &str = "gen_ai.request.max_tokens";
pub(crate) const REQUEST_STREAM: &str = "gen_ai.request.stream";
pub(crate) const INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
pub(crate) const OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
pub(crate) const REASONING_TOKENS: &str = "gen_ai.usage.reasoning.output_tokens";
pub(crate) const CACHED_TOKENS: &str = "gen_ai.usage.cache_read.input_tokens";
pub(crate) const FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
pub(crate) const CONVERSATION: &str = "gen_ai.conversation.id";
pub(crate) const INPUT_MESSAGES: &str = "gen_ai.input.messages";
pub(crate) const OUTPUT_MESSAGES: &str = "gen_ai.output.messages";
pub(crate) const SERVER_ADDRESS: &str = "server.address";
pub(crate) const SERVER_PORT: &str = "server.port";
pub(crate) const ERROR_TYPE: &str = "error.type";
pub(crate) const HTTP_METHOD: &str = "http.request.method";
pub(crate) const HTTP_STATUS: &str = "http.response.status_code";
pub(crate) const URL_PATH: &str = "url.path";

pub(crate) const REQUEST_ID: &str = "switchboard.request_id";
pub(crate) const CLIENT: &str = "switchboard.client";
/// What kind of request its harness says it is (Codex CLI's `x-codex-turn-metadata`).
pub(crate) const REQUEST_KIND: &str = "switchboard.request_kind";
pub(crate) const ALIAS: &str = "switchboard.alias";
pub(crate) const BACKEND: &str = "switchboard.backend";
pub(crate) const QUEUE_WAIT: &str = "switchboard.queue_wait_ms";
pub(crate) const QUEUE_WAIT_PREDICTED: &str = "switchboard.queue_wait_predicted_ms";
pub(crate) const GPU_PREDICTED: &str = "switchboard.gpu.predicted_s";
pub(crate) const GPU_PREFILL: &str = "switchboard.gpu.prefill_s";
pub(crate) const GPU_DECODE: &str = "switchboard.gpu.decode_s";
pub(crate) const GPU_REPORTED: &str = "switchboard.gpu.reported";
pub(crate) const PREEMPTED: &str = "switchboard.preempted";
pub(crate) const COUNT_METHOD: &str = "switchboard.count.method";
pub(crate) const COUNT_PROMPT: &str = "switchboard.count.prompt_tokens";
pub(crate) const CONTEXT_WINDOW: &str = "switchboard.context.window";
pub(crate) const CONTEXT_REJECTED: &str = "switchboard.context.rejected";
pub(crate) const AFFINITY: &str = "switchboard.affinity";
pub(crate) const ATTEMPT: &str = "switchboard.attempt";
pub(crate) const RESENT: &str = "switchboard.resent";
pub(crate) const TRANSLATED: &str = "switchboard.translated_to";
pub(crate) const TTFT: &str = "switchboard.ttft_ms";
pub(crate) const CANCELLED: &str = "switchboard.cancelled";
/// Captured content was cut to `tracing.capture_max_bytes`.
pub(crate) const CONTENT_TRUNCATED: &str = "switchboard.content.truncated";

/// The event at a request's first generated token.
pub(crate) const FIRST_TOKEN: &str = "switchboard.first_token";
/// The event of a move to a fallback alias: `switchboard.fallback.from`, `.to`, `.reason`.
pub(crate) const FALLBACK: &str = "switchboard.fallback";
pub(crate) const FALLBACK_FROM: &str = "switchboard.fallback.from";
pub(crate) const FALLBACK_TO: &str = "switchboard.fallback.to";
pub(crate) const FALLBACK_REASON: &str = "switchboard.fallback.reason";

/// `gen_ai.operation.name` of an endpoint: chat for chat completions, Responses and Messages.
pub(crate) fn operation(endpoint: Endpoint) -> &'static str {
    endpoint.operation()
}

/// The path of an endpoint, as a span tells it (the others as one value, not the client's).
pub(crate) fn path(endpoint: Endpoint) -> &'static str {
    endpoint.span_path()
}
