//! Shape, and its per-replica part.
//!
//! [`shape`]: the body the alias's backends get, once per alias — the alias's defaults,
//! stripped fields, output cap and accepted inputs (`wire::shape`) and the reasoning in its
//! history in the form the alias's first backend reads (the adapter's
//! [`crate::wire::Adapter::history_for`]) — still in the client's API and with the client's
//! `model` (the guard counts it and clamps its limits there), with its view: the resolve's
//! when nothing changed, else read once here.
//!
//! [`for_replica`]: what one attempt sends the chosen replica — the shaped body translated to
//! a chat request for `/v1/chat/completions` for a replica that does not serve the API itself
//! (its answer is translated back); its history rewritten only for a replica whose runtime
//! reads reasoning in another form than the first backend's; then the alias's upstream model
//! and, for streams, the usage option spliced in. The body sent shares the client's bytes but
//! for what is spliced in.

use bytes::Bytes;

use super::call::{Call, Incoming};
use crate::config::{Alias, Backend};
use crate::error::ProxyError;
use crate::wire::payload::Payload;
use crate::wire::request::ParsedRequest;
use crate::wire::Adapter;

/// Where the chat completions of a translated request go.
pub(crate) const CHAT_PATH: &str = "/v1/chat/completions";

/// A body shaped for an alias, and where its model and stream options sit in it.
pub(crate) struct Shaped {
    pub(crate) body: Bytes,
    /// Boxed: most bodies are not changed, and the view is large.
    view: Option<Box<ParsedRequest>>,
}

impl Shaped {
    /// The body's view: its own when shaping (or the guard) changed it, else the resolve's.
    pub(crate) fn view<'a>(&'a self, resolved: &'a ParsedRequest) -> &'a ParsedRequest {
        self.view.as_deref().unwrap_or(resolved)
    }

    /// The body with its output limit lowered by the guard: read anew.
    pub(crate) fn clamped(body: Vec<u8>) -> Result<Shaped, ProxyError> {
        Shaped::changed(Bytes::from(body))
    }

    fn changed(body: Bytes) -> Result<Shaped, ProxyError> {
        let view = Some(Box::new(ParsedRequest::parse(&body)?));
        Ok(Shaped { body, view })
    }
}

/// The body of `req` shaped for `alias`: the client's own bytes when nothing changes. A part
/// of a kind the alias does not take, or a bad legacy `images` field, is the API's 400.
pub(crate) fn shape(req: &Incoming, alias: &Alias) -> Result<Shaped, ProxyError> {
    let adapter = req.adapter;
    let mut body = None;
    if let Some(b) = crate::wire::shape::shape(&req.body, &alias.shape, adapter.spec().shaping)? {
        body = Some(b);
    }
    // A first backend the request is translated for reads the client's form: the translation
    // writes the history itself.
    if alias.backend.translation(adapter).is_none() {
        let now = body.as_deref().unwrap_or(&req.body);
        if let Some(b) = adapter.history_for(now, alias.backend.flavor)? {
            body = Some(b);
        }
    }
    match body {
        None => Ok(Shaped {
            body: req.body.clone(),
            view: None,
        }),
        Some(b) => Shaped::changed(Bytes::from(b)),
    }
}

/// One attempt's request: the body and path `backend` gets.
pub(crate) struct Outgoing {
    pub(crate) body: Payload,
    /// The chat completions path when the request was translated, else the client's own.
    pub(crate) path: Option<&'static str>,
    /// The client's API when the request was translated to chat completions: the backend's
    /// answer is a chat answer, to be translated back into this API.
    pub(crate) translated: Option<&'static dyn Adapter>,
}

/// `shaped` (the request [`shape`]d for `alias`, perhaps clamped by the guard) as `backend`
/// (the replica chosen for this attempt) gets it.
pub(crate) fn for_replica(
    call: &Call<'_>,
    alias: &Alias,
    shaped: &Shaped,
    backend: &Backend,
) -> Result<Outgoing, ProxyError> {
    let (req, resolved) = (&call.req, &call.routed.view);
    let adapter = req.adapter;
    if let Some(converter) = backend.translation(adapter) {
        // The translation asks for a stream's usage itself.
        let chat = adapter.translate(&shaped.body, converter, &alias.upstream_model)?;
        return Ok(Outgoing {
            body: Payload::from(chat),
            path: Some(CHAT_PATH),
            translated: Some(adapter),
        });
    }
    let usage = adapter.spec().takes_stream_usage;
    let body = match history_differs_on(req, alias, backend) {
        Some(b) => adapter.history_for(&shaped.body, b.flavor)?,
        None => None,
    };
    let body = match body {
        // Rewritten for this replica: a body of its own, read for its splice.
        Some(b) => {
            let b = Bytes::from(b);
            ParsedRequest::parse(&b)?.upstream_payload(&b, &alias.upstream_model, usage)
        }
        None => shaped
            .view(resolved)
            .upstream_payload(&shaped.body, &alias.upstream_model, usage),
    };
    Ok(Outgoing {
        body,
        path: None,
        translated: None,
    })
}

/// `backend` when its runtime reads the history in another form than the shaped body has
/// (that of the alias's first backend, or the client's when that one was translated).
fn history_differs_on<'b>(
    req: &Incoming,
    alias: &Alias,
    backend: &'b Backend,
) -> Option<&'b Backend> {
    let adapter = req.adapter;
    let (from, to) = (alias.backend.flavor, backend.flavor);
    let differs = if adapter.spec().normalizes_reasoning {
        to.runtime().reasoning_field != from.runtime().reasoning_field
    } else {
        from != to || alias.backend.translation(adapter).is_some()
    };
    differs.then_some(backend)
}
