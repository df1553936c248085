//! What each backend does to a chat request before its template runs, reproduced per flavour.
//!
//! The count a backend reports depends on these steps as much as on the template: content
//! part lists are flattened (joined with `"\n"` by llama.cpp and vLLM, with `" "` by SGLang),
//! tool-call `arguments` strings are parsed into objects (so `tojson` prints `{"a": 1}`),
//! tool schemas are rebuilt with the backend's own field order and defaults, and media parts
//! leave the text (their cost is configured per alias instead).

mod hf;
mod llamacpp;

use std::sync::Arc;

use super::json::{JMap, J};
use super::template::ChatTemplate;
use super::CountError;
use crate::config::MediaCosts;
use crate::runtime::Engine;

/// A request ready for the template: its globals and what happens around the rendering.
#[derive(Debug, Default)]
pub(crate) struct Prepared {
    /// Template globals: `messages`, `tools`, `add_generation_prompt`, special tokens, kwargs.
    pub(crate) vars: JMap,
    /// Whether the `tool_use` variant of the template applies.
    pub(crate) tool_use: bool,
    /// What happens to the rendering afterwards.
    pub(crate) post: Post,
    /// Media parts taken out of the text.
    pub(crate) media: Media,
}

/// A step after rendering, for requests that continue a final assistant message.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) enum Post {
    #[default]
    None,
    /// HF `continue_final_message` (vLLM): the rendering ends right after this text.
    TruncateAfter(Arc<str>),
    /// SGLang `continue_final_message`: this text is appended to the rendering.
    Append(String),
    /// llama.cpp `--prefill-assistant`: the last assistant message (left out of `messages`)
    /// continues after the generation prompt, inside the template's thinking tags.
    Prefill { reasoning: String, content: String },
}

/// Media parts found in the messages.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Media {
    pub(crate) images: u32,
    pub(crate) audio: u32,
}

impl Media {
    /// Tokens for these parts, each costed as `costs` says.
    pub(crate) fn cost(self, costs: &MediaCosts) -> u64 {
        u64::from(self.images) * u64::from(costs.image)
            + u64::from(self.audio) * u64::from(costs.audio)
    }
}

/// Prepares a parsed chat body as `engine` would before rendering `tmpl`.
pub(crate) fn prepare(
    body: &J,
    engine: Engine,
    tmpl: &ChatTemplate,
) -> Result<Prepared, CountError> {
    let req = body
        .as_obj()
        .ok_or_else(|| invalid("the body is not a JSON object"))?;
    let messages = req
        .get("messages")
        .and_then(J::as_arr)
        .ok_or_else(|| invalid("messages must be an array"))?;
    match engine {
        Engine::Llamacpp => llamacpp::prepare(req, messages, tmpl),
        Engine::Vllm => hf::prepare_vllm(req, messages, tmpl),
        Engine::Sglang => hf::prepare_sglang(req, messages, tmpl),
    }
}

/// A message as an object, and its role.
pub(super) fn message_role(m: &J) -> Result<(&JMap, &str), CountError> {
    let m = m
        .as_obj()
        .ok_or_else(|| invalid("each message must be an object"))?;
    let role = m
        .get("role")
        .and_then(J::as_str)
        .ok_or_else(|| invalid("every message needs a string role"))?;
    Ok((m, role))
}

pub(super) fn invalid(msg: impl Into<String>) -> CountError {
    CountError::Invalid(msg.into())
}

/// One content part, as the backends classify it.
enum Part<'a> {
    Text(&'a str),
    Image,
    Audio,
    /// A text-typed part without text, or a part type the flavour ignores.
    Skip,
}

/// Part types every backend reads text from; `extra` adds the flavour's own text types.
fn classify<'a>(part: &'a J, extra_text: &[&str]) -> Part<'a> {
    let Some(p) = part.as_obj() else {
        return match part {
            J::Str(s) => Part::Text(s),
            _ => Part::Skip,
        };
    };
    let kind = p.get("type").and_then(J::as_str).unwrap_or("");
    match kind {
        "image_url" | "input_image" | "image" | "image_pil" | "image_embeds" | "video_url" => {
            Part::Image
        }
        "input_audio" | "audio_url" | "audio_embeds" => Part::Audio,
        "text" => p
            .get("text")
            .and_then(J::as_str)
            .map_or(Part::Skip, Part::Text),
        k if extra_text.contains(&k) => {
            let field = match k {
                "refusal" => "refusal",
                "thinking" => "thinking",
                "tool_reference" => "name",
                _ => "text",
            };
            p.get(field)
                .and_then(J::as_str)
                .map_or(Part::Skip, Part::Text)
        }
        _ => Part::Skip,
    }
}

/// Parses a tool-call `arguments` string.
fn parse_arguments(s: &str) -> Option<J> {
    J::parse(s.as_bytes()).ok()
}

/// Drops a `"model"`-free copy of the request's `chat_template_kwargs` into `vars`.
fn add_kwargs(vars: &mut JMap, req: &JMap) {
    if let Some(J::Obj(kwargs)) = req.get("chat_template_kwargs") {
        for (k, v) in &kwargs.0 {
            vars.insert(k, v.clone());
        }
    }
}

/// Adds the tokenizer's special tokens (`bos_token`, `eos_token`, ...) as HF does.
fn add_specials(vars: &mut JMap, tmpl: &ChatTemplate) {
    for (k, v) in &tmpl.specials {
        vars.insert(k, v.clone());
    }
}
