//! Bodies of the counting endpoints: `POST /tokenize` and Anthropic's `/v1/messages/count_tokens`.

use serde_json::{json, Map, Value};

use super::{count_error, GuardSpec};
use crate::error::{bounded, ProxyError};

/// `POST /tokenize` with `{model, messages, tools?}` → `{count, max_model_len, method}`:
/// the prompt's count as the guard would make it exactly (media parts at their cost).
pub async fn tokenize_response(
    spec: &GuardSpec,
    client: &dyn crate::tokens::backend::Transport,
    body: &[u8],
) -> Result<Value, ProxyError> {
    let count = spec
        .counter
        .count_prompt(client, body, &spec.media)
        .await
        .map_err(count_error)?;
    Ok(json!({
        "count": count,
        "max_model_len": spec.window,
        "method": spec.counter.kind().as_str(),
    }))
}

/// `POST /v1/messages/count_tokens` in Anthropic's shape (`system` + `messages` + `tools`)
/// → `{input_tokens}`, counted as the equivalent chat request.
pub async fn count_tokens_response(
    spec: &GuardSpec,
    client: &dyn crate::tokens::backend::Transport,
    body: &[u8],
) -> Result<Value, ProxyError> {
    let req: Value =
        serde_json::from_slice(body).map_err(|e| ProxyError::InvalidJson(bounded(e)))?;
    let chat = anthropic_to_chat(&req)?;
    let bytes = serde_json::to_vec(&chat).map_err(|e| ProxyError::InvalidJson(e.to_string()))?;
    let count = spec
        .counter
        .count_prompt(client, &bytes, &spec.media)
        .await
        .map_err(count_error)?;
    Ok(json!({ "input_tokens": count }))
}

/// Maps an Anthropic Messages request to the chat completions request it corresponds to:
/// `system` → a system message; `text` → text parts; `image`/`document` → image parts;
/// `tool_use` → assistant `tool_calls` (arguments as a JSON string); `tool_result` →
/// `tool` messages before the rest of the user turn; `thinking` → `reasoning_content`;
/// `tools[{name, description, input_schema}]` → function tools.
pub fn anthropic_to_chat(req: &Value) -> Result<Value, ProxyError> {
    let bad = |m: &str| ProxyError::InvalidRequest(m.to_string());
    let mut messages = Vec::new();
    match req.get("system") {
        Some(Value::String(s)) => messages.push(json!({"role": "system", "content": s})),
        Some(Value::Array(blocks)) => {
            let text: Vec<&str> = blocks
                .iter()
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect();
            messages.push(json!({"role": "system", "content": text.join("\n")}));
        }
        Some(Value::Null) | None => {}
        Some(_) => return Err(bad("system must be a string or an array of text blocks")),
    }
    let list = req
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("messages must be an array"))?;
    for m in list {
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("every message needs a role"))?;
        match m.get("content") {
            Some(Value::String(s)) => messages.push(json!({"role": role, "content": s})),
            Some(Value::Array(blocks)) => convert_blocks(role, blocks, &mut messages),
            _ => {
                return Err(bad(
                    "message content must be a string or an array of blocks",
                ))
            }
        }
    }
    let mut chat = Map::new();
    chat.insert(
        "model".into(),
        req.get("model").cloned().unwrap_or(Value::Null),
    );
    chat.insert("messages".into(), Value::Array(messages));
    if let Some(Value::Array(tools)) = req.get("tools") {
        let tools: Vec<Value> = tools
            .iter()
            .filter(|t| t.get("input_schema").is_some() || t.get("type").is_none())
            .map(|t| {
                let mut f = Map::new();
                f.insert("name".into(), t.get("name").cloned().unwrap_or(Value::Null));
                if let Some(d) = t.get("description") {
                    f.insert("description".into(), d.clone());
                }
                f.insert(
                    "parameters".into(),
                    t.get("input_schema").cloned().unwrap_or_else(|| json!({})),
                );
                json!({"type": "function", "function": f})
            })
            .collect();
        if !tools.is_empty() {
            chat.insert("tools".into(), Value::Array(tools));
        }
    }
    Ok(Value::Object(chat))
}

fn convert_blocks(role: &str, blocks: &[Value], out: &mut Vec<Value>) {
    let mut parts = Vec::new();
    let mut calls = Vec::new();
    let mut thinking = Vec::new();
    for b in blocks {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => {
                let text = b.get("text").and_then(Value::as_str).unwrap_or("");
                parts.push(json!({"type": "text", "text": text}));
            }
            Some("image" | "document") => {
                parts.push(json!({"type": "image_url", "image_url": {"url": "data:,"}}));
            }
            Some("tool_use") => {
                let args = b.get("input").cloned().unwrap_or_else(|| json!({}));
                calls.push(json!({
                    "id": b.get("id").cloned().unwrap_or(Value::Null),
                    "type": "function",
                    "function": {
                        "name": b.get("name").cloned().unwrap_or(Value::Null),
                        "arguments": args.to_string(),
                    },
                }));
            }
            Some("tool_result") => {
                let content = match b.get("content") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(inner)) => inner
                        .iter()
                        .filter_map(|i| i.get("text").and_then(Value::as_str))
                        .collect::<Vec<_>>()
                        .join("\n"),
                    _ => String::new(),
                };
                out.push(json!({
                    "role": "tool",
                    "tool_call_id": b.get("tool_use_id").cloned().unwrap_or(Value::Null),
                    "content": content,
                }));
            }
            Some("thinking") => {
                if let Some(t) = b.get("thinking").and_then(Value::as_str) {
                    thinking.push(t.to_string());
                }
            }
            _ => {}
        }
    }
    if parts.is_empty() && calls.is_empty() && thinking.is_empty() {
        return;
    }
    let mut msg = Map::new();
    msg.insert("role".into(), Value::from(role));
    let only_text = parts.iter().all(|p| p["type"] == "text");
    let content = if only_text {
        let texts: Vec<&str> = parts.iter().filter_map(|p| p["text"].as_str()).collect();
        Value::from(texts.join("\n"))
    } else {
        Value::Array(parts)
    };
    msg.insert("content".into(), content);
    if !thinking.is_empty() {
        msg.insert("reasoning_content".into(), Value::from(thinking.join("\n")));
    }
    if !calls.is_empty() {
        msg.insert("tool_calls".into(), Value::Array(calls));
    }
    out.push(Value::Object(msg));
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn maps_anthropic_shape_to_chat() {
        let req = json!({
            "model": "m",
            "system": [{"type": "text", "text": "be brief"}],
            "messages": [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "call the tool"},
                    {"type": "tool_use", "id": "t1", "name": "get", "input": {"city": "Oslo"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "rain"}]},
                    {"type": "text", "text": "thanks"},
                    {"type": "image", "source": {"type": "base64", "data": "AAAA"}}
                ]}
            ],
            "tools": [{"name": "get", "description": "d", "input_schema": {"type": "object"}}]
        });
        let chat = anthropic_to_chat(&req).unwrap();
        assert_eq!(
            chat,
            json!({
                "model": "m",
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "weather?"},
                    {"role": "assistant", "content": "", "reasoning_content": "call the tool",
                     "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "get", "arguments": "{\"city\":\"Oslo\"}"}}]},
                    {"role": "tool", "tool_call_id": "t1", "content": "rain"},
                    {"role": "user", "content": [
                        {"type": "text", "text": "thanks"},
                        {"type": "image_url", "image_url": {"url": "data:,"}}
                    ]}
                ],
                "tools": [{"type": "function", "function": {"name": "get", "description": "d", "parameters": {"type": "object"}}}]
            })
        );
    }
}
