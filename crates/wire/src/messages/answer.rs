//! A whole Messages answer whose text carries inline think tags: each text block split into a
//! `thinking` block and the text that follows it.

use serde_json::{json, Value};

use crate::reasoning::{TextSplitter, ThinkTags};

/// `body` with its text blocks split on `tags`; `None` when no block has any.
pub(crate) fn split_think_tags(body: &[u8], tags: &ThinkTags) -> Option<Vec<u8>> {
    let mut v: Value = serde_json::from_slice(body).ok()?;
    let blocks = v.get_mut("content")?.as_array_mut()?;
    let mut changed = false;
    let mut out = Vec::with_capacity(blocks.len() + 1);
    for block in blocks.drain(..) {
        let text = (block.get("type").and_then(Value::as_str) == Some("text"))
            .then(|| block.get("text").and_then(Value::as_str))
            .flatten();
        let Some(text) = text else {
            out.push(block);
            continue;
        };
        let split = TextSplitter::split_all(tags, text);
        if split.reasoning.is_empty() && split.answer == text {
            out.push(block);
            continue;
        }
        changed = true;
        if !split.reasoning.is_empty() {
            out.push(json!({"type": "thinking", "thinking": split.reasoning, "signature": ""}));
        }
        if !split.answer.is_empty() {
            let mut block = block;
            block["text"] = Value::String(split.answer);
            out.push(block);
        }
    }
    *blocks = out;
    if !changed {
        return None;
    }
    serde_json::to_vec(&v).ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn text_with_tags_becomes_thinking_then_text() {
        let tags = ThinkTags::preset("qwen3").unwrap();
        let body = br#"{"type":"message","content":[{"type":"text","text":"<think>plan</think>answer"}],"usage":{"input_tokens":1,"output_tokens":2}}"#;
        let v: Value = serde_json::from_slice(&split_think_tags(body, &tags).unwrap()).unwrap();
        assert_eq!(
            v["content"],
            json!([{"type":"thinking","thinking":"plan","signature":""},{"type":"text","text":"answer"}])
        );
        assert_eq!(v["usage"]["output_tokens"], 2);
        let plain = br#"{"content":[{"type":"text","text":"answer"}]}"#;
        assert!(split_think_tags(plain, &tags).is_none());
    }
}
