//! Reasoning normalization: field mapping both ways and inline think-tag splitting.
//!
//! Backends write reasoning as `reasoning` (vLLM ≥ 0.16), `reasoning_content` (llama.cpp,
//! SGLang), both (vLLM 0.11–0.15), or leave it inline in `content` between tags when they
//! run without a reasoning parser. Clients get it under one configured field
//! ([`OutputField`]); history sent back is renamed to what the backend reads ([`InputField`]).
//!
//! - [`StreamRewriter`] rewrites SSE events one by one; an event with nothing to rewrite is
//!   passed on as the same bytes after a byte search, without a JSON parse.
//! - [`rewrite_response_body`] does the same for a non-streaming `chat.completion`.
//! - [`rewrite_request_history`] renames reasoning in the request's assistant messages.
//! - [`TextSplitter`] splits one plain text stream (the other APIs' text blocks).
//!
//! Inline tags are opt-in per alias ([`ThinkTags`]): the splitter gives the same split for a
//! text whether it arrives whole or in any pieces.

mod body;
mod field;
mod rewriter;
mod scan;
mod split_text;
mod splitter;
mod tags;

pub use body::{rewrite_request_history, rewrite_response_body};
pub use field::{InputField, OutputField, UnknownOutputField};
pub use rewriter::StreamRewriter;
pub use split_text::{Split, TextSplitter};
pub use tags::{ThinkTags, ThinkTagsSpec, PRESETS};

#[cfg(test)]
mod tests;
