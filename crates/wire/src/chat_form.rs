//! Chat form: the conversions of a Messages or Responses request into a chat-completions
//! request (a backend's own, or Switchboard's translation), and the JSON helpers the converters
//! share. Which one applies to a backend is `config::Backend::translation` / `counting`.

use serde_json::{Map, Value};

use crate::error::{bounded, ProxyError};
use crate::flavor::Flavor;
use crate::reasoning::InputField;
use crate::runtime::Engine;

/// Whose conversion into chat form a request goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Converter {
    /// llama.cpp's `server_chat_convert_anthropic_to_oai` / `_responses_to_chatcmpl`.
    Llamacpp,
    /// vLLM's `AnthropicServingMessages._convert_anthropic_to_openai_request` /
    /// `responses.utils.construct_input_messages`.
    Vllm,
    /// SGLang's `AnthropicServing._convert_to_chat_completion_request` (Messages); its
    /// Responses requests follow vLLM's construction.
    Sglang,
    /// Switchboard's own translation, for a backend that serves only chat completions; the
    /// reasoning of the history goes in the field that backend reads.
    Translate(InputField),
}

impl Converter {
    /// The converter of a backend that serves the API itself: its engine's, or the
    /// translation for a runtime that converts nothing itself.
    pub fn native(flavor: Flavor) -> Converter {
        match flavor.runtime().converts {
            Some(Engine::Llamacpp) => Converter::Llamacpp,
            Some(Engine::Vllm) => Converter::Vllm,
            Some(Engine::Sglang) => Converter::Sglang,
            None => Converter::translate(flavor),
        }
    }

    /// The translation for a chat-only backend of `flavor`.
    pub fn translate(flavor: Flavor) -> Converter {
        Converter::Translate(flavor.runtime().reasoning_field)
    }
}

/// The conversion of one API's request (a JSON object) into the chat request `Converter`
/// makes of it.
pub type Conversion = fn(Map<String, Value>, Converter) -> Result<Map<String, Value>, ProxyError>;

/// `body` parsed, converted by `convert` as `converter` does it and written out; with
/// `model`, that is the chat request's model.
pub(crate) fn convert(
    body: &[u8],
    converter: Converter,
    convert: Conversion,
    model: Option<&str>,
) -> Result<Vec<u8>, ProxyError> {
    let mut chat = convert(object(body)?, converter)?;
    if let Some(model) = model {
        chat.insert("model".into(), Value::from(model));
    }
    to_bytes(&chat)
}

/// A request the converter refuses, in the words of the backend that would refuse it.
pub(crate) fn bad(msg: impl Into<String>) -> ProxyError {
    ProxyError::InvalidRequest(msg.into())
}

/// `body` parsed as a JSON object.
pub(crate) fn object(body: &[u8]) -> Result<Map<String, Value>, ProxyError> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ProxyError::InvalidJson(
            "the request body must be a JSON object".into(),
        )),
        Err(e) => Err(ProxyError::InvalidJson(bounded(e))),
    }
}

/// The chat body as JSON bytes.
pub(crate) fn to_bytes(chat: &Map<String, Value>) -> Result<Vec<u8>, ProxyError> {
    serde_json::to_vec(chat).map_err(|e| ProxyError::InvalidJson(e.to_string()))
}

/// The string at `key`, or `default` when it is missing or not a string (llama.cpp's
/// `json_value`).
pub(crate) fn str_or<'a>(v: &'a Value, key: &str, default: &'a str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or(default)
}

/// The non-empty string at `key` (Python's truthiness of an optional string).
pub(crate) fn text_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str).filter(|s| !s.is_empty())
}

/// Python's truthiness of a JSON value.
pub(crate) fn truthy(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
    }
}

/// A chat message object from `(key, value)` pairs, in order.
pub(crate) fn msg<const N: usize>(pairs: [(&str, Value); N]) -> Value {
    let mut m = Map::new();
    for (k, v) in pairs {
        m.insert(k.to_string(), v);
    }
    Value::Object(m)
}

/// A `data:` URL of an Anthropic base64 image source.
pub(crate) fn data_url(media_type: &str, data: &str) -> String {
    format!("data:{media_type};base64,{data}")
}

/// An image part of a chat message.
pub(crate) fn image_part(url: &str) -> Value {
    serde_json::json!({"type": "image_url", "image_url": {"url": url}})
}

/// A text part of a chat message.
pub(crate) fn text_part(text: &str) -> Value {
    serde_json::json!({"type": "text", "text": text})
}

/// Copies the keys of `from` that are set into `to`, under the same name.
pub(crate) fn copy_keys(from: &Map<String, Value>, to: &mut Map<String, Value>, keys: &[&str]) {
    for k in keys {
        if let Some(v) = from.get(*k).filter(|v| !v.is_null()) {
            to.insert((*k).to_string(), v.clone());
        }
    }
}

/// The seconds since the epoch (vLLM names tool calls without an id after them).
pub(crate) fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converters_follow_the_flavour() {
        assert_eq!(Converter::native(Flavor::Llamacpp), Converter::Llamacpp);
        assert_eq!(Converter::native(Flavor::Vllm), Converter::Vllm);
        assert_eq!(
            Converter::native(Flavor::Openai),
            Converter::Translate(InputField::Reasoning)
        );
        assert_eq!(
            Converter::translate(Flavor::Llamacpp),
            Converter::Translate(InputField::ReasoningContent)
        );
        assert!(truthy(Some(&serde_json::json!("x"))));
        assert!(!truthy(Some(&serde_json::json!([]))));
    }
}
