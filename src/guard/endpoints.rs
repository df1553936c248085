//! Bodies of the counting endpoints: `POST /tokenize`, Anthropic's `/v1/messages/count_tokens`
//! and OpenAI's `/v1/responses/input_tokens`.

use serde_json::{json, Value};

use super::count::{count, Use};
use super::GuardSpec;
use crate::error::ProxyError;
use crate::tokens::Fallback;
use crate::wire::{Adapter, Converter};

/// `POST /tokenize` with `{model, messages, tools?}` → `{count, max_model_len, method}`:
/// the prompt's count as the guard would make it exactly (media parts at their cost).
pub async fn tokenize_response(
    spec: &GuardSpec,
    client: &dyn crate::tokens::backend::Transport,
    body: &[u8],
) -> Result<(Value, Option<Fallback>), ProxyError> {
    let c = count(spec, client, body.to_vec().into(), Use::Endpoint).await?;
    let value = json!({
        "count": c.tokens,
        "max_model_len": spec.window,
        "method": c.method.as_str(),
    });
    Ok((value, c.fallback))
}

/// The prompt tokens of a Messages or Responses body, counted as the alias's backend converts
/// it (`converter`) before its template runs.
async fn count_in_api(
    spec: &GuardSpec,
    client: &dyn crate::tokens::backend::Transport,
    adapter: &dyn Adapter,
    body: &[u8],
    converter: Converter,
) -> Result<(u32, Option<Fallback>), ProxyError> {
    let chat = adapter.to_chat(body, converter)?;
    let c = count(
        spec,
        client,
        bytes::Bytes::from(chat.into_owned()),
        Use::Endpoint,
    )
    .await?;
    Ok((c.tokens, c.fallback))
}

/// `POST /v1/messages/count_tokens` → `{input_tokens}`.
pub async fn count_tokens_response(
    spec: &GuardSpec,
    client: &dyn crate::tokens::backend::Transport,
    body: &[u8],
    converter: Converter,
) -> Result<(Value, Option<Fallback>), ProxyError> {
    let adapter = crate::wire::adapter(crate::wire::Endpoint::messages);
    let (n, fallback) = count_in_api(spec, client, adapter, body, converter).await?;
    Ok((json!({ "input_tokens": n }), fallback))
}

/// `POST /v1/responses/input_tokens` → `{input_tokens, object: "response.input_tokens"}`.
pub async fn input_tokens_response(
    spec: &GuardSpec,
    client: &dyn crate::tokens::backend::Transport,
    body: &[u8],
    converter: Converter,
) -> Result<(Value, Option<Fallback>), ProxyError> {
    let adapter = crate::wire::adapter(crate::wire::Endpoint::responses);
    let (n, fallback) = count_in_api(spec, client, adapter, body, converter).await?;
    Ok((
        json!({ "input_tokens": n, "object": "response.input_tokens" }),
        fallback,
    ))
}
