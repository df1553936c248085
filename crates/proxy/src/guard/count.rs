//! One count of a chat body, for the guard or a counting endpoint: a turn at the gate, the
//! byte limit, and the other ways to count when the alias's own cannot.
//!
//! - The local template engine fails where the backend's may not (an undefined value of a
//!   request with no user message): the backend's own count where its flavour has one,
//!   else the estimate. Both uses; a template's own `raise_exception` stays the client's 400.
//! - More text to tokenize than `server.count_limit_bytes`, or no turn within
//!   `server.count_queue_timeout_ms`: the guard takes the estimate (the request is not
//!   refused for it); a counting endpoint answers 413 or 503.

use bytes::Bytes;

use super::{count_error, GuardSpec};
use crate::error::ProxyError;
use crate::tokens::{CountError, Fallback, Method};

/// Who asks for the count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Use {
    Guard,
    Endpoint,
}

/// A prompt's count and how it was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Count {
    pub(crate) tokens: u32,
    pub(crate) method: Method,
    /// Why it was made another way than the alias's own, if it was.
    pub(crate) fallback: Option<Fallback>,
}

/// The prompt tokens of `chat` (a chat body, `model` rewritten) as `spec` counts them, in a
/// turn of the gate within the part of client `who` (if any).
pub(crate) async fn count(
    spec: &GuardSpec,
    client: &dyn crate::tokens::backend::Transport,
    chat: Bytes,
    used: Use,
    who: Option<u64>,
) -> Result<Count, ProxyError> {
    let counter = &spec.counter;
    let failed = match spec.gate.turn_of(who).await {
        Ok(turn) => {
            let limit = spec.gate.config().limit_bytes;
            let got = counter
                .count_within(client, chat.clone(), &spec.media, limit)
                .await;
            drop(turn);
            match got {
                Ok(tokens) => {
                    return Ok(Count {
                        tokens,
                        method: counter.kind(),
                        fallback: None,
                    })
                }
                Err(e) => e,
            }
        }
        Err(busy) => busy,
    };
    let reason = match (&failed, used) {
        (CountError::Template(_), _) => Fallback::Template,
        (CountError::TooLarge { .. }, Use::Guard) => Fallback::TooLarge,
        (CountError::Busy { .. }, Use::Guard) => Fallback::Busy,
        _ => return Err(count_error(failed)),
    };
    if reason == Fallback::Template {
        if let Some(Ok(tokens)) = counter.count_spare(client, &chat, &spec.media).await {
            return Ok(Count {
                tokens,
                method: Method::Backend,
                fallback: Some(reason),
            });
        }
    }
    let tokens = counter.estimate(&chat, &spec.media).map_err(count_error)?;
    Ok(Count {
        tokens,
        method: Method::Estimate,
        fallback: Some(reason),
    })
}
