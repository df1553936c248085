//! The answer of a counting endpoint (`POST /tokenize`, Anthropic's
//! `/v1/messages/count_tokens`, OpenAI's `/v1/responses/input_tokens`, … each API's own): the
//! prompt's count as the guard would make it exactly (media parts at their cost), of the
//! request's chat form as the alias's backend converts it before its template runs, in the
//! shape of the API's answer.

use serde_json::Value;

use super::api::Counted;
use super::count::{count, Use};
use super::GuardSpec;
use crate::error::ProxyError;
use crate::tokens::Fallback;

/// The count of `req` (a request of its adapter's API) as that API's counting endpoint
/// answers it, and the fallback the count took.
pub async fn count_response(
    spec: &GuardSpec,
    client: &dyn crate::tokens::backend::Transport,
    req: Counted<'_>,
) -> Result<(Value, Option<Fallback>), ProxyError> {
    let adapter = req.adapter;
    let chat = adapter.to_chat(req.body, req.converter)?;
    let c = count(
        spec,
        client,
        bytes::Bytes::from(chat.into_owned()),
        Use::Endpoint,
        req.who,
    )
    .await?;
    let value = adapter.count_answer(c.tokens, spec.window, c.method.as_str());
    Ok((value, c.fallback))
}
