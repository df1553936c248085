//! Shape: the body the alias's backend gets — its model name spliced in, the usage chunk asked
//! for on streams, the alias's defaults, stripped fields, output cap and accepted inputs
//! (`wire::shape`), reasoning in the history renamed to the field the backend reads.

use super::Incoming;
use crate::config::Alias;
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
