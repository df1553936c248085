//! Shape: the body the alias's backend gets — its model name spliced in, the usage chunk asked
//! for on streams, reasoning in the history in the form the backend reads — and where it goes:
//! a Messages or Responses request for a backend that serves only chat completions is
//! translated to a chat request for `/v1/chat/completions` (its answer is translated back).

use super::Incoming;
use crate::config::Alias;
use crate::error::ProxyError;
use crate::reasoning::{self, InputField};
use crate::wire::request::ParsedRequest;
use crate::wire::{chat_form, responses, Api};

/// Where the chat completions of a translated request go.
pub const CHAT_PATH: &str = "/v1/chat/completions";

/// The upstream request of one client request, for one alias.
pub struct Shaped {
    pub body: Vec<u8>,
    /// Path and query the backend gets: the client's, or [`CHAT_PATH`] when translated.
    pub path: String,
    /// The client's API when the request was translated to chat completions: the backend's
    /// answer is a chat answer, to be translated back into this API.
    pub translated: Option<Api>,
}

/// The upstream request of `req` for `alias`.
pub fn shape(req: &Incoming, view: &ParsedRequest, alias: &Alias) -> Result<Shaped, ProxyError> {
    let adapter = req.adapter;
    let api = adapter.api();
    if let Some(converter) = chat_form::translation(&alias.backend, api) {
        let body = view.upstream_body(&req.body, &alias.upstream_model, false);
        let chat = adapter.to_chat(&body, converter)?.into_owned();
        return Ok(Shaped {
            body: chat,
            path: CHAT_PATH.to_string(),
            translated: Some(api),
        });
    }
    let mut body = view.upstream_body(
        &req.body,
        &alias.upstream_model,
        adapter.takes_stream_usage(),
    );
    let flavor = alias.backend.flavor;
    match api {
        Api::Chat if adapter.normalizes_reasoning() => {
            let input = InputField::for_flavor(flavor);
            if let Some(b) = reasoning::rewrite_request_history(&body, input) {
                body = b;
            }
        }
        Api::Responses => {
            if let Some(b) = responses::history::reasoning_items(&body, flavor)? {
                body = b;
            }
        }
        _ => {}
    }
    Ok(Shaped {
        body,
        path: req.path.clone(),
        translated: None,
    })
}
