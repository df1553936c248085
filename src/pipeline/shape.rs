//! Shape: the body the alias's backend gets — its model name spliced in, the usage chunk asked
//! for on streams, reasoning in the history renamed to the field the backend reads.

use super::Incoming;
use crate::config::Alias;
use crate::reasoning::{self, InputField};
use crate::wire::request::ParsedRequest;

/// The upstream body of `req` for `alias`.
pub fn shape(req: &Incoming, view: &ParsedRequest, alias: &Alias) -> Vec<u8> {
    let adapter = req.adapter;
    let mut body = view.upstream_body(
        &req.body,
        &alias.upstream_model,
        adapter.takes_stream_usage(),
    );
    if adapter.normalizes_reasoning() {
        let input = InputField::for_flavor(alias.backend.flavor);
        if let Some(b) = reasoning::rewrite_request_history(&body, input) {
            body = b;
        }
    }
    body
}
