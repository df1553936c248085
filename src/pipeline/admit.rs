//! Guard: the shaped body counted against the alias's window (when its API is guarded), in the
//! chat form its backend templates; one that does not fit goes on to the alias its
//! `context_fallback` names (shaped anew for it) when its client may use that alias, and over
//! the window with nowhere to go is the API's own context-length 400, before any byte reaches
//! a backend.
//!
//! Here too the two ways a count reaches `observe`, which names no `tokens` type: its method
//! and fallback as metric label values, and an estimating counter as what the record feeds
//! the reported prompt tokens.

use std::sync::Arc;

use super::shape::Shaped;
use super::Incoming;
use crate::config::Alias;
use crate::error::ProxyError;
use crate::guard::{self, Counted, Verdict};
use crate::live::{AppState, Snapshot};
use crate::observe::metrics::{CountFallback, CountMethod};
use crate::observe::record::{Learn, Record};
use crate::tokens::{Counter, Fallback, Method};

/// What the guard made of a request shaped for an alias.
pub enum Guarded {
    /// The alias serves it, with this body (in the client's API).
    Admitted(Admitted),
    /// It does not fit the alias's window: on to the alias its `context_fallback` names
    /// (the record follows it already), shaped anew for that one.
    Over(Arc<Alias>),
}

/// The alias that serves the request and the body its backend gets (in the client's API).
pub struct Admitted {
    pub alias: Arc<Alias>,
    pub body: Shaped,
    /// The prompt's tokens as the guard counted them, where it counted (not where its byte
    /// bound alone let the request pass, nor where the alias has no guard).
    pub prompt: Option<u32>,
}

/// Guard `body` (the request [`super::shape`]d for `alias`): admitted as it is or with its
/// output limit clamped, or over the window — on to the `context_fallback` alias, or, with
/// none, the API's context-length 400.
pub async fn admit(
    state: &AppState,
    snap: &Snapshot,
    rec: &mut Record,
    req: &Incoming,
    alias: Arc<Alias>,
    body: Shaped,
) -> Result<Guarded, ProxyError> {
    let adapter = req.adapter;
    let spec = match snap.guard(&alias.name) {
        Some(spec) if adapter.spec().guarded => spec,
        _ => {
            return Ok(Guarded::Admitted(learning(
                snap,
                rec,
                req,
                Admitted {
                    alias,
                    body,
                    prompt: None,
                },
            )))
        }
    };
    let counted = Counted {
        adapter,
        body: &body.body,
        converter: alias.backend.counting(adapter),
        who: req.caller.as_ref().map(|c| c.state.id),
    };
    let checked = guard::check_counted(spec, &state.client, counted).await?;
    if let Some(reason) = checked.fallback {
        snap.metrics(Some(&alias.name))
            .count_fallback(reason.into());
    }
    let (verdict, prompt) = (checked.verdict, checked.prompt);
    if let Some(t) = rec.traced() {
        let counted = match &verdict {
            Verdict::Over { prompt, .. } => Some(*prompt),
            _ => prompt,
        };
        t.counted(verdict.method().as_str(), counted, spec.window);
    }
    let admitted = match verdict {
        Verdict::Pass { .. } => Admitted {
            alias,
            body,
            prompt,
        },
        Verdict::Clamp { max_tokens, .. } => {
            let clamped = guard::clamp_request(adapter, &body.body, max_tokens)?;
            Admitted {
                alias,
                body: Shaped::clamped(clamped)?,
                prompt,
            }
        }
        Verdict::Over { method, .. } => {
            // One its client may not use is no fallback: the request is over, as without one.
            let next = alias
                .context_fallback
                .as_deref()
                .and_then(|f| snap.routes.alias(f))
                .filter(|f| req.caller.as_ref().is_none_or(|c| c.may_use(&f.name)))
                .cloned();
            let Some(next) = next else {
                snap.metrics(Some(&alias.name)).rejection(method.into());
                if let Some(t) = rec.traced() {
                    t.rejected();
                }
                return Err(verdict.into_error(spec.window).unwrap_or_else(|| {
                    ProxyError::InvalidRequest("the request does not fit".into())
                }));
            };
            rec.route(snap.metrics(Some(&next.name)), &next.backend.name);
            if let Some(t) = rec.traced() {
                t.fallback(&alias.name, &next.name, "context_window");
                t.alias(&next.name);
            }
            return Ok(Guarded::Over(next));
        }
    };
    Ok(Guarded::Admitted(learning(snap, rec, req, admitted)))
}

/// An estimating counter learns bytes per token from the usage this request reports,
/// measured on the chat form the backend templates.
fn learning(snap: &Snapshot, rec: &mut Record, req: &Incoming, admitted: Admitted) -> Admitted {
    let adapter = req.adapter;
    if let Some(spec) = snap
        .guard(&admitted.alias.name)
        .filter(|s| s.counter.kind() == Method::Estimate)
    {
        let body = &admitted.body.body;
        let converter = admitted.alias.backend.counting(adapter);
        let bytes = match adapter.to_chat(body, converter) {
            Ok(chat) => crate::tokens::prompt_bytes(&chat),
            Err(_) => crate::tokens::prompt_bytes(body),
        };
        let counter: Arc<dyn Learn> = Arc::clone(&spec.counter) as _;
        rec.estimator = Some((counter, bytes));
    }
    admitted
}

impl From<Method> for CountMethod {
    fn from(method: Method) -> CountMethod {
        match method {
            Method::Bound => CountMethod::bound,
            Method::Local => CountMethod::local,
            Method::Backend => CountMethod::backend,
            Method::Estimate => CountMethod::estimate,
        }
    }
}

impl From<Fallback> for CountFallback {
    fn from(reason: Fallback) -> CountFallback {
        match reason {
            Fallback::Template => CountFallback::template,
            Fallback::TooLarge => CountFallback::too_large,
            Fallback::Busy => CountFallback::busy,
        }
    }
}

/// Only an estimating counter learns; the others take no notice.
impl Learn for Counter {
    fn learn(&self, prompt_bytes: usize, prompt_tokens: u32) {
        self.observe(prompt_bytes, prompt_tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_method_is_labelled_by_its_name() {
        for method in [
            Method::Bound,
            Method::Local,
            Method::Backend,
            Method::Estimate,
        ] {
            assert_eq!(format!("{:?}", CountMethod::from(method)), method.as_str());
        }
    }
}
