//! Bodies of the counting endpoints: `POST /tokenize`, Anthropic's `/v1/messages/count_tokens`
//! and OpenAI's `/v1/responses/input_tokens`.

use serde_json::{json, Value};

use super::{count_error, GuardSpec};
use crate::error::ProxyError;
use crate::wire::{Adapter, Converter};

/// `POST /tokenize` with `{model, messages, tools?}` → `{count, max_model_len, method}`:
/// the prompt's count as the guard would make it exactly (media parts at their cost).
pub async fn tokenize_response(
    spec: &GuardSpec,
    client: &dyn crate::tokens::backend::Transport,
    body: &[u8],
) -> Result<Value, ProxyError> {
    let count = spec
        .counter
        .count_prompt(client, body, &spec.media)
        .await
        .map_err(count_error)?;
    Ok(json!({
        "count": count,
        "max_model_len": spec.window,
        "method": spec.counter.kind().as_str(),
    }))
}

/// The prompt tokens of a Messages or Responses body, counted as the alias's backend converts
/// it (`converter`) before its template runs.
async fn count_in_api(
    spec: &GuardSpec,
    client: &dyn crate::tokens::backend::Transport,
    adapter: &dyn Adapter,
    body: &[u8],
    converter: Converter,
) -> Result<u32, ProxyError> {
    let chat = adapter.to_chat(body, converter)?;
    spec.counter
        .count_prompt(client, &chat, &spec.media)
        .await
        .map_err(count_error)
}

/// `POST /v1/messages/count_tokens` → `{input_tokens}`.
pub async fn count_tokens_response(
    spec: &GuardSpec,
    client: &dyn crate::tokens::backend::Transport,
    body: &[u8],
    converter: Converter,
) -> Result<Value, ProxyError> {
    let adapter = crate::wire::adapter(crate::wire::Endpoint::messages);
    let count = count_in_api(spec, client, adapter, body, converter).await?;
    Ok(json!({ "input_tokens": count }))
}

/// `POST /v1/responses/input_tokens` → `{input_tokens, object: "response.input_tokens"}`.
pub async fn input_tokens_response(
    spec: &GuardSpec,
    client: &dyn crate::tokens::backend::Transport,
    body: &[u8],
    converter: Converter,
) -> Result<Value, ProxyError> {
    let adapter = crate::wire::adapter(crate::wire::Endpoint::responses);
    let count = count_in_api(spec, client, adapter, body, converter).await?;
    Ok(json!({ "input_tokens": count, "object": "response.input_tokens" }))
}
