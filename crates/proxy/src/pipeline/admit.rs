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

use super::call::Call;
use super::shape::{self, Shaped};
use crate::error::ProxyError;
use crate::fleet::work::Need;
use crate::guard::{self, Counted, Verdict};
use crate::live::alias::LiveAlias;
use crate::observe::metrics::{CountFallback, CountMethod};
use crate::observe::record::Learn;
use crate::tokens::{Counter, Fallback, Method};
use crate::wire::request::ParsedRequest;

/// What the guard made of a request shaped for an alias.
pub(crate) enum Guarded {
    /// The alias serves it, with this body (in the client's API).
    Admitted(Admitted),
    /// It does not fit the alias's window: on to the alias its `context_fallback` names
    /// (the record follows it already), shaped anew for that one.
    Over(Arc<LiveAlias>),
}

/// The alias that serves the request and the body its backend gets (in the client's API).
pub(crate) struct Admitted {
    pub(crate) alias: Arc<LiveAlias>,
    pub(crate) body: Shaped,
    /// The prompt's tokens as the guard counted them, where it counted (not where its byte
    /// bound alone let the request pass, nor where the alias has no guard).
    pub(crate) prompt: Option<u32>,
}

impl Admitted {
    /// What the request asks of a backend: the guard's count (else the body's bytes over
    /// four), its output limit (none where it sets none, or an invalid one, refused later) and
    /// choices, read from the body's view (`resolved`, where shaping left the body as it
    /// came), and its alias's window.
    pub(crate) fn need(
        &self,
        adapter: &dyn crate::wire::Adapter,
        resolved: &ParsedRequest,
    ) -> Need {
        let (body, spec) = (&self.body.body, adapter.spec());
        let view = self.body.view(resolved);
        Need {
            prompt: self.prompt.map_or(body.len() as u64 / 4, u64::from).max(1),
            output: view.output_limit(spec.output_limit()).ok().flatten(),
            choices: if spec.choices { view.choices() } else { 1 },
            window: self.alias.spec.context_window.map(|w| w.get()),
        }
    }
}

/// The request shaped for `alias` and guarded: admitted there, or on the alias its
/// `context_fallback` leads to (shaped and guarded anew), or the first error.
pub(crate) async fn admitted(
    call: &mut Call<'_>,
    alias: Arc<LiveAlias>,
) -> Result<Admitted, ProxyError> {
    let mut alias = alias;
    loop {
        let shaped = shape::shape(&call.req, &alias.spec)?;
        match admit(call, alias, shaped).await? {
            Guarded::Admitted(a) => return Ok(a),
            Guarded::Over(next) => alias = next,
        }
    }
}

/// Guard `body` (the request [`super::shape`]d for `alias`): admitted as it is or with its
/// output limit clamped, or over the window — on to the `context_fallback` alias, or, with
/// none, the API's context-length 400.
async fn admit(
    call: &mut Call<'_>,
    alias: Arc<LiveAlias>,
    body: Shaped,
) -> Result<Guarded, ProxyError> {
    let adapter = call.req.adapter;
    let spec = match alias.guard() {
        Some(spec) if adapter.spec().guarded => Arc::clone(spec),
        _ => {
            let admitted = Admitted {
                alias,
                body,
                prompt: None,
            };
            return Ok(Guarded::Admitted(learning(call, admitted)));
        }
    };
    let counted = Counted {
        adapter,
        body: &body.body,
        converter: alias.spec.backend.counting(adapter),
        who: call.req.caller.as_ref().map(|c| c.state.id),
    };
    let checked = guard::check_counted(&spec, &call.state.client, counted).await?;
    if let Some(reason) = checked.fallback {
        alias.metrics.count_fallback(reason.into());
    }
    let (verdict, prompt) = (checked.verdict, checked.prompt);
    if let Some(t) = call.rec.traced() {
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
            return over(call, &alias, method, verdict.into_error(spec.window));
        }
    };
    Ok(Guarded::Admitted(learning(call, admitted)))
}

/// A request over `alias`'s window (counted by `method`): on to the alias its
/// `context_fallback` names, when its client may use it; else `error` (the API's 400).
fn over(
    call: &mut Call<'_>,
    alias: &LiveAlias,
    method: crate::tokens::Method,
    error: Option<ProxyError>,
) -> Result<Guarded, ProxyError> {
    // One its client may not use is no fallback: the request is over, as without one.
    let caller = call.req.caller.as_ref();
    let next = alias
        .spec
        .context_fallback
        .as_deref()
        .and_then(|f| call.snap.alias(f))
        .filter(|f| caller.is_none_or(|c| c.may_use(f.name())))
        .cloned();
    let rec = &mut *call.rec;
    let Some(next) = next else {
        alias.metrics.rejection(method.into());
        if let Some(t) = rec.traced() {
            t.rejected();
        }
        return Err(
            error.unwrap_or_else(|| ProxyError::InvalidRequest("the request does not fit".into()))
        );
    };
    rec.route(&next.metrics, &next.spec.backend.name);
    if let Some(t) = rec.traced() {
        t.fallback(alias.name(), next.name(), "context_window");
        t.alias(next.name());
    }
    Ok(Guarded::Over(next))
}

/// An estimating counter learns bytes per token from the usage this request reports,
/// measured on the chat form the backend templates.
fn learning(call: &mut Call<'_>, admitted: Admitted) -> Admitted {
    let adapter = call.req.adapter;
    if let Some(spec) = admitted
        .alias
        .guard()
        .filter(|s| s.counter.kind() == Method::Estimate)
    {
        let body = &admitted.body.body;
        let converter = admitted.alias.spec.backend.counting(adapter);
        let bytes = match adapter.to_chat(body, converter) {
            Ok(chat) => crate::tokens::prompt_bytes(&chat),
            Err(_) => crate::tokens::prompt_bytes(body),
        };
        let counter: Arc<dyn Learn> = Arc::clone(&spec.counter) as _;
        call.rec.estimator = Some((counter, bytes));
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
