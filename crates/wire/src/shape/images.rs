//! The legacy top-level `images` array, which backends ignore: turned into image parts of the
//! last user message for an alias that takes images, refused for one that does not.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use super::body::Members;
use super::{Form, ShapeSpec};
use crate::error::ProxyError;

/// One entry of `images`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Image {
    /// An `http(s)://` URL.
    Url(String),
    /// Base64 data, given bare or as a `data:` URL.
    Data { media_type: String, data: String },
}

impl Image {
    fn url(&self) -> String {
        match self {
            Image::Url(u) => u.clone(),
            Image::Data { media_type, data } => format!("data:{media_type};base64,{data}"),
        }
    }

    /// The image as a content part of `api`.
    fn part(&self, api: &Form) -> Value {
        let data = match self {
            Image::Url(_) => None,
            Image::Data { media_type, data } => Some((media_type.as_str(), data.as_str())),
        };
        (api.image_part)(&self.url(), data)
    }
}

fn invalid(message: impl Into<String>) -> ProxyError {
    ProxyError::InvalidParam {
        param: "images",
        message: message.into(),
    }
}

fn text_part(api: &Form, text: String) -> Value {
    json!({"type": api.text_part, "text": text})
}

/// The media type of base64 image data, from its first bytes (PNG when unknown: backends
/// read the image itself).
fn sniff(data: &str) -> &'static str {
    match data.as_bytes() {
        [b'/', b'9', b'j', b'/', ..] => "image/jpeg",
        [b'R', b'0', b'l', b'G', b'O', b'D', ..] => "image/gif",
        [b'U', b'k', b'l', b'G', b'R', ..] => "image/webp",
        _ => "image/png",
    }
}

fn image(i: usize, entry: &Value) -> Result<Image, ProxyError> {
    let Some(s) = entry.as_str().map(str::trim) else {
        return Err(invalid(format!(
            "images[{i}] must be a base64 string or a URL"
        )));
    };
    if s.starts_with("http://") || s.starts_with("https://") {
        return Ok(Image::Url(s.to_owned()));
    }
    if let Some(rest) = s.strip_prefix("data:") {
        let Some((media_type, data)) = rest.split_once(";base64,") else {
            return Err(invalid(format!(
                "images[{i}] is a data URL without base64 data"
            )));
        };
        return Ok(Image::Data {
            media_type: media_type.to_owned(),
            data: data.to_owned(),
        });
    }
    let base64 = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=' | b'-' | b'_');
    if s.is_empty() || !s.bytes().all(base64) {
        return Err(invalid(format!(
            "images[{i}] is neither an http(s) or data URL nor base64 data"
        )));
    }
    Ok(Image::Data {
        media_type: sniff(s).to_owned(),
        data: s.to_owned(),
    })
}

/// Handle a request's `images` member (already taken out of `members`): nothing for `null`
/// or `[]`, a refusal when the alias takes no images, else the images appended as parts of
/// the last user message of the conversation.
pub(super) fn attach(
    members: &mut Members<'_>,
    images: Cow<'_, [u8]>,
    spec: &ShapeSpec,
    api: &Form,
) -> Result<(), ProxyError> {
    let list: Value =
        serde_json::from_slice(&images).map_err(|e| ProxyError::InvalidJson(e.to_string()))?;
    let entries = match list {
        Value::Null => return Ok(()),
        Value::Array(a) if a.is_empty() => return Ok(()),
        Value::Array(a) => a,
        _ => return Err(invalid("must be an array of base64 strings or URLs")),
    };
    if !spec.inputs.image {
        return Err(ProxyError::LegacyImages {
            alias: spec.alias.clone(),
        });
    }
    let images = entries
        .iter()
        .enumerate()
        .map(|(i, e)| image(i, e))
        .collect::<Result<Vec<_>, _>>()?;
    let Some(key) = api.conversation else {
        return Err(invalid(
            "this endpoint has no messages to attach images to: send image parts to /v1/chat/completions",
        ));
    };
    let parts: Vec<Value> = images.iter().map(|i| i.part(api)).collect();
    let conversation = members.get(key).map(<[u8]>::to_vec);
    let new = match conversation.as_deref() {
        Some(text) if api.typed_items && text.first() == Some(&b'"') => {
            let text: String =
                serde_json::from_slice(text).map_err(|e| ProxyError::InvalidJson(e.to_string()))?;
            let mut content = vec![text_part(api, text)];
            content.extend(parts);
            serde_json::to_vec(&json!([{"type": "message", "role": "user", "content": content}]))
                .unwrap_or_default()
        }
        Some(list) => with_parts(list, parts, api)?,
        None => return Err(no_user()),
    };
    members.set(key, new);
    Ok(())
}

fn no_user() -> ProxyError {
    invalid("the request has no user message to attach the images to")
}

#[derive(Deserialize)]
struct Role<'a> {
    #[serde(borrow, default)]
    role: Option<Cow<'a, str>>,
}

/// The list of messages (or Responses input items) `list` with `parts` appended to the
/// content of its last user message; the other items keep their JSON text.
fn with_parts(list: &[u8], parts: Vec<Value>, api: &Form) -> Result<Vec<u8>, ProxyError> {
    let items: Vec<&RawValue> = serde_json::from_slice(list)
        .map_err(|_| invalid("the request's messages are not a list to attach the images to"))?;
    let is_user = |raw: &&RawValue| {
        serde_json::from_str::<Role>(raw.get()).is_ok_and(|r| r.role.as_deref() == Some("user"))
    };
    let at = items.iter().rposition(is_user).ok_or_else(no_user)?;
    let mut message: Map<String, Value> = serde_json::from_str(items[at].get())
        .map_err(|e| ProxyError::InvalidJson(e.to_string()))?;
    let content = match message.get_mut("content") {
        Some(Value::Array(list)) => {
            list.extend(parts);
            None
        }
        Some(Value::String(text)) => {
            let mut content = vec![text_part(api, std::mem::take(text))];
            content.extend(parts);
            Some(content)
        }
        None | Some(Value::Null) => Some(parts),
        Some(_) => {
            return Err(invalid(
                "the last user message's content is neither text nor a list",
            ))
        }
    };
    if let Some(content) = content {
        message.insert("content".to_owned(), Value::Array(content));
    }
    if api.typed_items && !message.contains_key("type") {
        // llama-server reads a list content only from an item typed as a message.
        message.insert("type".to_owned(), Value::from("message"));
    }
    let new = serde_json::to_vec(&message).unwrap_or_default();
    let mut out = Vec::with_capacity(list.len() + new.len());
    out.push(b'[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        if i == at {
            out.extend_from_slice(&new);
        } else {
            out.extend_from_slice(item.get().as_bytes());
        }
    }
    out.push(b']');
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_urls_data_urls_or_base64() {
        let img = |s: &str| image(0, &Value::from(s));
        assert_eq!(
            img("https://x/y.png").unwrap(),
            Image::Url("https://x/y.png".into())
        );
        assert_eq!(
            img("data:image/webp;base64,UklGRg==").unwrap(),
            Image::Data {
                media_type: "image/webp".into(),
                data: "UklGRg==".into()
            }
        );
        assert_eq!(
            img("/9j/4AAQ").unwrap().url(),
            "data:image/jpeg;base64,/9j/4AAQ"
        );
        assert_eq!(
            img("iVBORw0KGgo").unwrap().url(),
            "data:image/png;base64,iVBORw0KGgo"
        );
        assert!(img("not base64!").is_err());
        assert!(img("data:image/png,raw").is_err());
        assert!(image(1, &json!({"url": "x"}))
            .unwrap_err()
            .to_string()
            .contains("images[1]"));
    }
}
