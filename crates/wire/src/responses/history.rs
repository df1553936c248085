//! Reasoning items sent back in a Responses history, in the form each backend reads them.
//!
//! How a runtime reads them is its [`crate::runtime::Runtime::reasoning_items`]: llama.cpp
//! takes a reasoning item only with a `summary` array and a non-empty `content` array whose
//! first part has the text (it refuses the whole request otherwise), while clients such as
//! Codex send the summary and leave `content` out; vLLM refuses any item with
//! `encrypted_content`. Items are rewritten so the backend reads their text: the summary texts
//! become the content where it is required (an item with no text at all is left out), and the
//! encrypted content, which no self-hosted backend can read, is dropped elsewhere.

use memchr::memmem;
use serde_json::{json, Value};

use crate::chat_form::{object, str_or, to_bytes};
use crate::error::ProxyError;
use crate::flavor::Flavor;
use crate::runtime::ReasoningItems;

/// `body` with its reasoning items in the form `flavor` reads, or `None` when none needs it.
pub(crate) fn reasoning_items(body: &[u8], flavor: Flavor) -> Result<Option<Vec<u8>>, ProxyError> {
    if memmem::find(body, b"\"reasoning\"").is_none() {
        return Ok(None);
    }
    let mut req = object(body)?;
    let Some(Value::Array(items)) = req.get_mut("input") else {
        return Ok(None);
    };
    let mut changed = false;
    let form = flavor.runtime().reasoning_items;
    items.retain_mut(|item| {
        if str_or(item, "type", "") != "reasoning" {
            return true;
        }
        match form {
            ReasoningItems::ContentRequired => with_content(item, &mut changed),
            ReasoningItems::EncryptedDropped => {
                if item.get("encrypted_content").is_some() {
                    if let Some(o) = item.as_object_mut() {
                        o.remove("encrypted_content");
                        changed = true;
                    }
                }
                true
            }
        }
    });
    if !changed {
        return Ok(None);
    }
    to_bytes(&req).map(Some)
}

/// Keeps the item (made readable) or says to leave it out.
fn with_content(item: &mut Value, changed: &mut bool) -> bool {
    let has_text = item
        .get("content")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .is_some_and(|p| p.get("text").is_some_and(Value::is_string));
    let Some(o) = item.as_object_mut() else {
        return true;
    };
    if !o.get("summary").is_some_and(Value::is_array) {
        o.insert("summary".into(), json!([]));
        *changed = true;
    }
    if has_text {
        return true;
    }
    let summary: Vec<&str> = o["summary"]
        .as_array()
        .map(|s| {
            s.iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect()
        })
        .unwrap_or_default();
    *changed = true;
    if summary.is_empty() {
        return false;
    }
    let text = summary.join("\n");
    o.insert(
        "content".into(),
        json!([{"type": "reasoning_text", "text": text}]),
    );
    true
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn items(body: &Value, flavor: Flavor) -> Value {
        let out = reasoning_items(&serde_json::to_vec(body).unwrap(), flavor).unwrap();
        let v: Value = out.map_or(body.clone(), |b| serde_json::from_slice(&b).unwrap());
        v["input"].clone()
    }

    #[test]
    fn summaries_become_content_for_llamacpp_and_encrypted_content_goes_for_vllm() {
        let body = json!({"model": "m", "input": [
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "think"}], "encrypted_content": "xyz"},
            {"type": "reasoning", "id": "rs_2", "summary": []},
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "kept"}]},
            {"type": "message", "role": "user", "content": "hi"}
        ]});
        let l = items(&body, Flavor::Llamacpp);
        assert_eq!(l.as_array().unwrap().len(), 3);
        assert_eq!(
            l[0]["content"],
            json!([{"type": "reasoning_text", "text": "think"}])
        );
        assert_eq!(l[1]["content"][0]["text"], "kept");
        let v = items(&body, Flavor::Vllm);
        assert_eq!(v.as_array().unwrap().len(), 4);
        assert!(v[0].get("encrypted_content").is_none());
        let plain = json!({"model": "m", "input": "reasoning"});
        assert!(
            reasoning_items(&serde_json::to_vec(&plain).unwrap(), Flavor::Llamacpp)
                .unwrap()
                .is_none()
        );
    }
}
