//! Shape: the body the alias's backend gets — its model name spliced in, the usage chunk asked
//! for on streams, the alias's defaults, stripped fields, output cap and accepted inputs
//! (`wire::shape`), reasoning in the history renamed to the field the backend reads.

use bytes::Bytes;

use super::Incoming;
use crate::config::{Alias, Backend};
use crate::error::ProxyError;
use crate::reasoning::{self, InputField};
use crate::wire::request::ParsedRequest;

/// The upstream body of `req` for `alias`; a part of a kind the alias does not take, or a bad
/// legacy `images` field, is the API's 400.
pub fn shape(req: &Incoming, view: &ParsedRequest, alias: &Alias) -> Result<Vec<u8>, ProxyError> {
    let adapter = req.adapter;
    let mut body = view.upstream_body(
        &req.body,
        &alias.upstream_model,
        adapter.takes_stream_usage(),
    );
    if let Some(b) = crate::wire::shape::shape(&body, &alias.shape, adapter.shaping())? {
        body = b;
    }
    if adapter.normalizes_reasoning() {
        let input = InputField::for_flavor(alias.backend.flavor);
        if let Some(b) = reasoning::rewrite_request_history(&body, input) {
            body = b;
        }
    }
    Ok(body)
}

/// `shaped` (the body shaped for the alias's first backend) as `backend` gets it: its history
/// rewritten again only for a replica whose runtime reads reasoning under another field.
pub fn for_backend(req: &Incoming, alias: &Alias, backend: &Backend, shaped: &Bytes) -> Bytes {
    let target = InputField::for_flavor(backend.flavor);
    if target == InputField::for_flavor(alias.backend.flavor) || !req.adapter.normalizes_reasoning()
    {
        return shaped.clone();
    }
    reasoning::rewrite_request_history(shaped, target).map_or_else(|| shaped.clone(), Bytes::from)
}
