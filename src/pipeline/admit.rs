//! Guard: the shaped body counted against the alias's window (when its API is guarded),
//! following `context_fallback` while it does not fit; over the window with nowhere to go is
//! the API's context-length 400, before any byte reaches a backend.

use std::sync::Arc;

use super::resolve::Routed;
use super::shape::shape;
use super::Incoming;
use crate::config::Alias;
use crate::error::ProxyError;
use crate::guard::{self, Verdict};
use crate::live::{AppState, Snapshot};
use crate::observe::record::Record;
use crate::tokens::Method;

/// The alias that serves the request and the body its backend gets.
pub struct Admitted {
    pub alias: Arc<Alias>,
    pub body: Vec<u8>,
}

/// Shape and guard `req` for `start` (its alias, or a fallback of it) or, when it does not
/// fit, the aliases its `context_fallback` chain names.
pub async fn admit(
    state: &AppState,
    snap: &Snapshot,
    rec: &mut Record,
    req: &Incoming,
    routed: &Routed,
    start: &Arc<Alias>,
) -> Result<Admitted, ProxyError> {
    let mut alias = Arc::clone(start);
    let admitted = loop {
        let body = shape(req, &routed.view, &alias)?;
        let spec = match snap.guard(&alias.name) {
            Some(spec) if req.adapter.guarded() => spec,
            _ => break Admitted { alias, body },
        };
        let verdict = guard::check(spec, &state.client, &body).await?;
        match verdict {
            Verdict::Pass { .. } => break Admitted { alias, body },
            Verdict::Clamp { max_tokens, .. } => {
                let body = guard::clamp_body(&body, max_tokens)?;
                break Admitted { alias, body };
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
    // An estimating counter learns bytes per token from the usage this request reports.
    if let Some(spec) = snap
        .guard(&admitted.alias.name)
        .filter(|s| s.counter.kind() == Method::Estimate)
    {
        rec.estimator = Some((
            Arc::clone(&spec.counter),
            crate::tokens::prompt_bytes(&admitted.body),
        ));
    }
    Ok(admitted)
}
