//! Shape: the body the alias's backend gets — the alias's defaults, stripped fields, output cap
//! and accepted inputs (`wire::shape`), reasoning in the history in the form the backend reads,
//! then per replica its model name spliced in and the usage chunk asked for on streams — and
//! where it goes: a Messages or Responses request for a backend that serves only chat
//! completions is translated to a chat request for `/v1/chat/completions` (its answer is
//! translated back). The body sent shares the client's bytes but for what is spliced in.

use bytes::Bytes;

use super::Incoming;
use crate::config::{Alias, Backend};
use crate::error::ProxyError;
use crate::flavor::Flavor;
use crate::reasoning::{self, InputField};
use crate::wire::payload::Payload;
use crate::wire::request::ParsedRequest;
use crate::wire::{responses, Api};

/// Where the chat completions of a translated request go.
pub const CHAT_PATH: &str = "/v1/chat/completions";

/// The body of `req` shaped for `alias`, still in the client's API and with the client's
/// `model` (the guard counts it and clamps its limits there; [`for_backend`] splices the
/// model in last): the client's own bytes when nothing changes. A part of a kind the alias
/// does not take, or a bad legacy `images` field, is the API's 400.
pub fn shape(req: &Incoming, alias: &Alias) -> Result<Bytes, ProxyError> {
    let adapter = req.adapter;
    let api = adapter.api();
    let translated = alias.backend.translation(api).is_some();
    let mut body = req.body.clone();
    if let Some(b) = crate::wire::shape::shape(&body, &alias.shape, api)? {
        body = Bytes::from(b);
    }
    if translated {
        return Ok(body);
    }
    if let Some(b) = history_in(req, &body, alias.backend.flavor)? {
        body = Bytes::from(b);
    }
    Ok(body)
}

/// One attempt's request: the body and path `backend` gets.
pub struct Outgoing {
    pub body: Payload,
    /// The chat completions path when the request was translated, else the client's own.
    pub path: Option<&'static str>,
    /// The client's API when the request was translated to chat completions: the backend's
    /// answer is a chat answer, to be translated back into this API.
    pub translated: Option<Api>,
}

/// `shaped` (the body [`shape`]d for the alias's first backend, perhaps clamped by the guard)
/// as `backend` gets it: translated to chat for a backend that serves only chat completions;
/// its history rewritten again only for a replica whose runtime reads reasoning in another
/// form; then the alias's upstream model and, for streams, the usage option spliced in.
pub fn for_backend(
    req: &Incoming,
    view: &ParsedRequest,
    alias: &Alias,
    backend: &Backend,
    shaped: &Bytes,
) -> Result<Outgoing, ProxyError> {
    let adapter = req.adapter;
    let api = adapter.api();
    if let Some(converter) = backend.translation(api) {
        let chat = Bytes::from(adapter.to_chat(shaped, converter)?.into_owned());
        // The translation asks for a stream's usage itself.
        let body =
            ParsedRequest::parse(&chat)?.upstream_payload(&chat, &alias.upstream_model, false);
        return Ok(Outgoing {
            body,
            path: Some(CHAT_PATH),
            translated: Some(api),
        });
    }
    let body = history_for(req, alias, backend, shaped)?;
    let reparsed;
    let view = if body.as_ptr() == req.body.as_ptr() && body.len() == req.body.len() {
        view
    } else {
        // Shaped anew: where its model and stream options sit now.
        reparsed = ParsedRequest::parse(&body)?;
        &reparsed
    };
    Ok(Outgoing {
        body: view.upstream_payload(&body, &alias.upstream_model, adapter.takes_stream_usage()),
        path: None,
        translated: None,
    })
}

/// `shaped` with its history in the form `backend` reads (it is in the form of the alias's
/// first backend, or the client's when that one was translated).
fn history_for(
    req: &Incoming,
    alias: &Alias,
    backend: &Backend,
    shaped: &Bytes,
) -> Result<Bytes, ProxyError> {
    let adapter = req.adapter;
    let (from, to) = (alias.backend.flavor, backend.flavor);
    let again = if adapter.normalizes_reasoning() {
        InputField::for_flavor(to) != InputField::for_flavor(from)
    } else {
        from != to || alias.backend.translation(adapter.api()).is_some()
    };
    if !again {
        return Ok(shaped.clone());
    }
    Ok(history_in(req, shaped, to)?.map_or_else(|| shaped.clone(), Bytes::from))
}

/// `body` with the reasoning in its history in the form a `flavor` runtime reads; `None` when
/// it is in that form already.
fn history_in(req: &Incoming, body: &[u8], flavor: Flavor) -> Result<Option<Vec<u8>>, ProxyError> {
    let adapter = req.adapter;
    if adapter.normalizes_reasoning() {
        Ok(reasoning::rewrite_request_history(
            body,
            InputField::for_flavor(flavor),
        ))
    } else if adapter.api() == Api::Responses {
        responses::history::reasoning_items(body, flavor)
    } else {
        Ok(None)
    }
}
