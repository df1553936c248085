//! Shapes a request for its alias: defaults, stripped fields, the output cap, the inputs it takes.
//!
//! Pure functions of the body's bytes and the alias's [`ShapeSpec`]. The common case reads
//! the body with byte searches only and copies nothing; a body that needs a change is read
//! as its top-level members, and only the members that change are written anew.

mod body;
mod defaults;
mod images;
mod inputs;

use std::num::NonZeroU32;

use serde_json::{Map, Value};

use crate::error::ProxyError;

pub use defaults::{has_field, is_request_field};
pub use inputs::{Input, Kind};

/// What shaping knows of one API, its adapter's ([`crate::wire::ApiSpec::shaping`]): where its
/// conversation and output limits are, which fields it has, how it writes an image part.
#[derive(Debug)]
pub struct Form {
    /// The member holding the conversation (where content parts are).
    pub conversation: Option<&'static str>,
    /// The output limits it reads, in the order they take effect (the first sent wins).
    pub limits: &'static [&'static str],
    /// The one of `limits` a cap (`max_output_tokens`) sets when the request sends none.
    pub cap_sets: &'static str,
    /// The fields it has of those only some APIs have (every other field, sampling controls
    /// such as `temperature` and backend extensions such as `chat_template_kwargs`, every
    /// shaped API takes).
    pub own: &'static [&'static str],
    /// An image of the legacy `images` field as one of its content parts, from the image's URL
    /// (a `data:` URL for base64 data) and, for base64 data, its media type and data.
    pub image_part: fn(&str, Option<(&str, &str)>) -> Value,
    /// The `type` of its text parts.
    pub text_part: &'static str,
    /// Its conversation is a list of typed items or one string (Responses' `input`): images
    /// for a string make it a user message item, and a user item given parts is typed.
    pub typed_items: bool,
}

/// The chat completions way of writing an image part, which most APIs share.
pub fn image_url_part(url: &str, _data: Option<(&str, &str)>) -> Value {
    serde_json::json!({"type": "image_url", "image_url": {"url": url}})
}

/// One alias's shaping (config keys `defaults`, `strip_params`, `max_output_tokens`, `inputs`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShapeSpec {
    /// The alias, as refusals name it.
    pub alias: String,
    /// Input kinds besides text: a part of another kind is refused.
    pub inputs: Input,
    /// Members set when the client sent none (or `null`); an object default fills in the
    /// members the client's object lacks, at any depth.
    pub defaults: Map<String, Value>,
    /// Top-level members removed before forwarding.
    pub strip: Vec<String>,
    /// The most output tokens a request may ask for: a larger limit is lowered, a missing
    /// one is set.
    pub max_output_tokens: Option<NonZeroU32>,
}

impl ShapeSpec {
    /// Whether shaping may change a body or refuse it for reasons other than its inputs.
    fn edits(&self) -> bool {
        !self.defaults.is_empty() || !self.strip.is_empty() || self.max_output_tokens.is_some()
    }
}

/// The body as the alias's backend should get it: `None` when it needs no change (or its API
/// is not shaped, `api` is `None`), an error when it sends an input the alias does not take
/// (or a malformed legacy `images`).
pub fn shape(
    body: &[u8],
    spec: &ShapeSpec,
    api: Option<&Form>,
) -> Result<Option<Vec<u8>>, ProxyError> {
    let Some(api) = api else {
        return Ok(None);
    };
    let check_inputs = inputs::may_need_check(body, spec.inputs);
    if !spec.edits() && !check_inputs {
        return Ok(None);
    }
    let mut members = body::Members::parse(body)?;
    let mut changed = members.remove_all(&spec.strip);
    if check_inputs {
        if let Some(images) = members.take("images") {
            changed = true;
            images::attach(&mut members, images, spec, api)?;
        }
        if let Some(conversation) = api.conversation.and_then(|c| members.get(c)) {
            if let Some((kind, part)) = inputs::refused_part(conversation, spec.inputs)? {
                return Err(ProxyError::UnsupportedInput {
                    alias: spec.alias.clone(),
                    kind: kind.name(),
                    part,
                    param: api.conversation.unwrap_or("messages"),
                });
            }
        }
    }
    changed |= defaults::apply(&mut members, &spec.defaults, api)?;
    if let Some(cap) = spec.max_output_tokens {
        changed |= defaults::cap(&mut members, cap.get(), api.limits, api.cap_sets);
    }
    Ok(changed.then(|| members.write()))
}

#[cfg(test)]
mod tests;
