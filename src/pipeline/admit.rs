//! Guard: the shaped body counted against the alias's window (when its API is guarded), in the
//! chat form its backend templates, following `context_fallback` while it does not fit; over
//! the window with nowhere to go is the API's own context-length 400, before any byte reaches
//! a backend.

use std::sync::Arc;

use super::resolve::Routed;
use super::shape::{shape, Shaped};
use super::Incoming;
use crate::config::Alias;
use crate::error::ProxyError;
use crate::guard::{self, Counted, Verdict};
use crate::live::{AppState, Snapshot};
use crate::observe::record::Record;
use crate::tokens::Method;
use crate::wire::{self, Adapter, Endpoint};

/// The alias that serves the request and the request its backend gets.
pub struct Admitted {
    pub alias: Arc<Alias>,
    pub upstream: Shaped,
}

/// The adapter of what is sent: chat completions when the request was translated.
fn sent_as(req: &Incoming, shaped: &Shaped) -> &'static dyn Adapter {
    match shaped.translated {
        Some(_) => wire::adapter(Endpoint::chat_completions),
        None => req.adapter,
    }
}

/// Shape and guard `req` for its alias or, when it does not fit, the aliases its
/// `context_fallback` chain names.
pub async fn admit(
    state: &AppState,
    snap: &Snapshot,
    rec: &mut Record,
    req: &Incoming,
    routed: &Routed,
) -> Result<Admitted, ProxyError> {
    let mut alias = Arc::clone(&routed.route.alias);
    let admitted = loop {
        let mut upstream = shape(req, &routed.view, &alias)?;
        let spec = match snap.guard(&alias.name) {
            Some(spec) if req.adapter.guarded() => spec,
            _ => break Admitted { alias, upstream },
        };
        let adapter = sent_as(req, &upstream);
        let counted = Counted {
            adapter,
            body: &upstream.body,
            flavor: alias.backend.flavor,
        };
        let verdict = guard::check_request(spec, &state.client, counted).await?;
        match verdict {
            Verdict::Pass { .. } => break Admitted { alias, upstream },
            Verdict::Clamp { max_tokens, .. } => {
                upstream.body = guard::clamp_request(adapter, &upstream.body, max_tokens)?;
                break Admitted { alias, upstream };
            }
            Verdict::Over { method, .. } => {
                let next = alias
                    .context_fallback
                    .as_deref()
                    .and_then(|f| snap.routes.alias(f))
                    .cloned();
                let Some(next) = next else {
                    snap.metrics(Some(&alias.name)).rejection(method);
                    return Err(verdict.into_error(spec.window).unwrap_or_else(|| {
                        ProxyError::InvalidRequest("the request does not fit".into())
                    }));
                };
                rec.route(snap.metrics(Some(&next.name)), &next.backend.name);
                alias = next;
            }
        }
    };
    // An estimating counter learns bytes per token from the usage this request reports,
    // measured on the chat form the backend templates.
    if let Some(spec) = snap
        .guard(&admitted.alias.name)
        .filter(|s| s.counter.kind() == Method::Estimate)
    {
        let adapter = sent_as(req, &admitted.upstream);
        let body = &admitted.upstream.body;
        let bytes = match adapter.prompt_for_count(body, admitted.alias.backend.flavor) {
            Ok(chat) => crate::tokens::prompt_bytes(&chat),
            Err(_) => crate::tokens::prompt_bytes(body),
        };
        rec.estimator = Some((Arc::clone(&spec.counter), bytes));
    }
    Ok(admitted)
}
