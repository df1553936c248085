//! Shape: the body the alias's backend gets — its model name spliced in, the usage chunk asked
//! for on streams, the alias's defaults, stripped fields, output cap and accepted inputs
//! (`wire::shape`), reasoning in the history in the form the backend reads — and where it
//! goes: a Messages or Responses request for a backend that serves only chat completions is
//! translated to a chat request for `/v1/chat/completions` (its answer is translated back).

use bytes::Bytes;

use super::Incoming;
use crate::config::{Alias, Backend};
use crate::error::ProxyError;
use crate::reasoning::{self, InputField};
use crate::wire::request::ParsedRequest;
use crate::wire::{responses, Api};

/// Where the chat completions of a translated request go.
pub const CHAT_PATH: &str = "/v1/chat/completions";

/// The upstream body of `req` for `alias`, still in the client's API (the guard counts it and
/// clamps its limits there); a part of a kind the alias does not take, or a bad legacy
/// `images` field, is the API's 400.
pub fn shape(req: &Incoming, view: &ParsedRequest, alias: &Alias) -> Result<Vec<u8>, ProxyError> {
    let adapter = req.adapter;
    let api = adapter.api();
    let translated = alias.backend.translation(api).is_some();
    let mut body = view.upstream_body(
        &req.body,
        &alias.upstream_model,
        adapter.takes_stream_usage(),
    );
    if let Some(b) = crate::wire::shape::shape(&body, &alias.shape, api)? {
        body = b;
    }
    if translated {
        return Ok(body);
    }
    let flavor = alias.backend.flavor;
    if adapter.normalizes_reasoning() {
        if let Some(b) = reasoning::rewrite_request_history(&body, InputField::for_flavor(flavor)) {
            body = b;
        }
    } else if api == Api::Responses {
        if let Some(b) = responses::history::reasoning_items(&body, flavor)? {
            body = b;
        }
    }
    Ok(body)
}

/// One attempt's request: the body and path `backend` gets.
pub struct Outgoing {
    pub body: Bytes,
    /// The chat completions path when the request was translated, else the client's own.
    pub path: Option<&'static str>,
    /// The client's API when the request was translated to chat completions: the backend's
    /// answer is a chat answer, to be translated back into this API.
    pub translated: Option<Api>,
}

impl Outgoing {
    fn as_is(body: Bytes) -> Outgoing {
        Outgoing {
            body,
            path: None,
            translated: None,
        }
    }
}

/// `shaped` (the body shaped for the alias's first backend) as `backend` gets it: translated to
/// chat for a backend that serves only chat completions; its history rewritten again only for
/// a replica whose runtime reads reasoning in another form.
pub fn for_backend(
    req: &Incoming,
    alias: &Alias,
    backend: &Backend,
    shaped: &Bytes,
) -> Result<Outgoing, ProxyError> {
    let adapter = req.adapter;
    let api = adapter.api();
    if let Some(converter) = backend.translation(api) {
        let chat = adapter.to_chat(shaped, converter)?.into_owned();
        return Ok(Outgoing {
            body: Bytes::from(chat),
            path: Some(CHAT_PATH),
            translated: Some(api),
        });
    }
    let (from, to) = (alias.backend.flavor, backend.flavor);
    let first_translated = alias.backend.translation(api).is_some();
    if adapter.normalizes_reasoning() {
        let target = InputField::for_flavor(to);
        if target == InputField::for_flavor(from) {
            return Ok(Outgoing::as_is(shaped.clone()));
        }
        let body = reasoning::rewrite_request_history(shaped, target)
            .map_or_else(|| shaped.clone(), Bytes::from);
        return Ok(Outgoing::as_is(body));
    }
    if api == Api::Responses && (from != to || first_translated) {
        if let Some(b) = responses::history::reasoning_items(shaped, to)? {
            return Ok(Outgoing::as_is(Bytes::from(b)));
        }
    }
    Ok(Outgoing::as_is(shaped.clone()))
}
