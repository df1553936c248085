//! A whole Responses answer to the specification: every field of a response object present
//! (llama.cpp leaves most out), and inline think tags in a message's text as a `reasoning`
//! item before it.

use serde_json::{json, Value};

use super::stream::complete_response;
use crate::reasoning::{TextSplitter, ThinkTags};

/// `body` with the response fields it lacks, and its messages split on `tags`; `None` when
/// nothing changed (or it is not a response object).
pub(crate) fn rewrite(body: &[u8], tags: Option<&ThinkTags>) -> Option<Vec<u8>> {
    let split = tags.and_then(|t| split_think_tags(body, t));
    let mut v: Value = serde_json::from_slice(split.as_deref().unwrap_or(body)).ok()?;
    let obj = v
        .as_object_mut()
        .filter(|o| o.get("object") == Some(&json!("response")))?;
    let before = obj.len();
    let model = obj
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    complete_response(obj, &model);
    if obj.len() == before {
        return split;
    }
    serde_json::to_vec(&v).ok()
}

/// The reasoning item written for a message with id `id`.
pub(crate) fn reasoning_item(id: &str, text: &str) -> Value {
    let tail = id.strip_prefix("msg_").unwrap_or(id);
    json!({"type": "reasoning", "id": format!("rs_{tail}"), "summary": [],
        "content": [{"type": "reasoning_text", "text": text}], "status": "completed"})
}

/// `body` with its messages' text split on `tags`; `None` when no message has any.
pub(crate) fn split_think_tags(body: &[u8], tags: &ThinkTags) -> Option<Vec<u8>> {
    let mut v: Value = serde_json::from_slice(body).ok()?;
    let items = v.get_mut("output")?.as_array_mut()?;
    let mut changed = false;
    let mut out = Vec::with_capacity(items.len() + 1);
    for mut item in items.drain(..) {
        if item["type"] != "message" {
            out.push(item);
            continue;
        }
        let mut reasoning = String::new();
        for part in item["content"].as_array_mut().into_iter().flatten() {
            let Some(text) = part["text"]
                .as_str()
                .filter(|_| part["type"] == "output_text")
            else {
                continue;
            };
            let split = TextSplitter::split_all(tags, text);
            if split.reasoning.is_empty() && split.answer == text {
                continue;
            }
            changed = true;
            reasoning.push_str(&split.reasoning);
            part["text"] = json!(split.answer);
        }
        if !reasoning.is_empty() {
            out.push(reasoning_item(
                item["id"].as_str().unwrap_or("msg"),
                &reasoning,
            ));
        }
        out.push(item);
    }
    *items = out;
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
    fn a_bare_answer_gets_the_fields_of_a_response() {
        // A real llama-server's answer (`responses_03`).
        let body = br#"{"completed_at":1796117996,"created_at":1796117996,"id":"resp_Tqom","model":"tiny-qwen3","object":"response","output":[{"content":[{"type":"output_text","annotations":[],"logprobs":[],"text":"VectorXd"}],"id":"msg_EsA6","role":"assistant","status":"completed","type":"message"}],"status":"completed","usage":{"input_tokens":9,"output_tokens":4,"total_tokens":13,"input_tokens_details":{"cached_tokens":8}}}"#;
        let v: Value = serde_json::from_slice(&rewrite(body, None).unwrap()).unwrap();
        assert_eq!(v["id"], "resp_Tqom");
        assert_eq!(v["tools"], json!([]));
        assert_eq!(v["error"], Value::Null);
        assert_eq!(v["usage"]["input_tokens"], 9);
        let done = serde_json::to_vec(&v).unwrap();
        assert!(
            rewrite(&done, None).is_none(),
            "a complete answer passes as it is"
        );
    }

    #[test]
    fn a_message_with_tags_gets_a_reasoning_item_before_it() {
        let tags = ThinkTags::preset("qwen3").unwrap();
        let body = br#"{"object":"response","output":[{"type":"message","id":"msg_1","role":"assistant","content":[{"type":"output_text","annotations":[],"text":"<think>plan</think>answer"}]}]}"#;
        let v: Value = serde_json::from_slice(&split_think_tags(body, &tags).unwrap()).unwrap();
        assert_eq!(v["output"][0]["type"], "reasoning");
        assert_eq!(v["output"][0]["id"], "rs_1");
        assert_eq!(v["output"][0]["content"][0]["text"], "plan");
        assert_eq!(v["output"][1]["content"][0]["text"], "answer");
        let plain =
            br#"{"output":[{"type":"message","content":[{"type":"output_text","text":"a"}]}]}"#;
        assert!(split_think_tags(plain, &tags).is_none());
    }
}
