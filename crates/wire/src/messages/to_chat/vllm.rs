//! vLLM's Messages → chat converter (`entrypoints/anthropic/serving.py`
//! `AnthropicServingMessages._convert_anthropic_to_openai_request`), step for step.

use serde_json::{json, Map, Value};

use super::{call_id, tool_call};
use crate::chat_form::{bad, copy_keys, image_part, msg, str_or, text_of, text_part, truthy};
use crate::error::ProxyError;

/// vLLM's `_convert_anthropic_to_openai_request`.
pub(super) fn convert(req: &Map<String, Value>) -> Result<Map<String, Value>, ProxyError> {
    let list = req
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("messages: Field required"))?;
    let mut messages = Vec::new();
    let mut system = Vec::new();
    let system_blocks = |content: &Value, out: &mut Vec<String>| match content {
        Value::String(s) => out.push(s.clone()),
        Value::Array(blocks) => {
            for b in blocks {
                if let Some(t) = text_of(b, "text").filter(|_| str_or(b, "type", "") == "text") {
                    if !t.starts_with("x-anthropic-billing-header") {
                        out.push(t.to_string());
                    }
                }
            }
        }
        _ => {}
    };
    if let Some(s) = req.get("system").filter(|s| truthy(Some(s))) {
        system_blocks(s, &mut system);
    }
    for m in list.iter().filter(|m| str_or(m, "role", "") == "system") {
        if let Some(c) = m.get("content") {
            system_blocks(c, &mut system);
        }
    }
    if !system.is_empty() {
        messages.push(msg([
            ("role", "system".into()),
            ("content", system.concat().into()),
        ]));
    }
    for m in list.iter().filter(|m| str_or(m, "role", "") != "system") {
        vllm_turn(m, &mut messages);
    }
    let mut chat = Map::new();
    copy_keys(req, &mut chat, &["model"]);
    chat.insert("messages".into(), Value::Array(messages));
    copy_keys(req, &mut chat, &["chat_template_kwargs"]);
    if let Some(Value::Array(tools)) = req.get("tools") {
        let tools = tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.get("name").cloned().unwrap_or(Value::Null),
                    "description": t.get("description").cloned().unwrap_or(Value::Null),
                    "parameters": t.get("input_schema").cloned().unwrap_or(Value::Null),
                    "defer_loading": t.get("defer_loading").cloned().unwrap_or(Value::Null),
                }})
            })
            .collect();
        chat.insert("tools".into(), Value::Array(tools));
    }
    Ok(chat)
}

/// One vLLM turn: tool results of a user turn become tool messages ahead of it (their images
/// a user message after each), thinking becomes `reasoning`, one text block a string.
fn vllm_turn(m: &Value, out: &mut Vec<Value>) {
    let role = str_or(m, "role", "");
    let mut turn = Map::new();
    turn.insert("role".into(), role.into());
    match m.get("content") {
        Some(Value::String(s)) => drop(turn.insert("content".into(), s.as_str().into())),
        Some(Value::Array(blocks)) => {
            let mut parts = Vec::new();
            let mut calls = Vec::new();
            let mut reasoning = Vec::new();
            for b in blocks {
                match str_or(b, "type", "") {
                    "text" => parts.extend(text_of(b, "text").map(text_part)),
                    "image" if truthy(b.get("source")) => {
                        parts.push(image_part(&vllm_image_url(&b["source"])));
                    }
                    "thinking" => reasoning.extend(b.get("thinking").and_then(Value::as_str)),
                    "tool_use" => calls.push(tool_call(
                        &call_id(b),
                        text_of(b, "name").unwrap_or(""),
                        b.get("input").filter(|v| truthy(Some(v))),
                    )),
                    "tool_result" if role == "user" => vllm_user_result(b, out),
                    "tool_result" => {
                        let text = python_str(b.get("content"));
                        parts.push(text_part(&format!("Tool result: {text}")));
                    }
                    _ => {}
                }
            }
            if !reasoning.is_empty() {
                turn.insert("reasoning".into(), reasoning.concat().into());
            }
            if !calls.is_empty() {
                turn.insert("tool_calls".into(), Value::Array(calls));
            }
            match parts.as_slice() {
                [] => {}
                [one] if one["type"] == "text" => {
                    turn.insert("content".into(), one["text"].clone());
                }
                _ => drop(turn.insert("content".into(), Value::Array(parts))),
            }
        }
        _ => {}
    }
    if role != "user" || turn.contains_key("content") {
        out.push(Value::Object(turn));
    }
}

/// vLLM's `_convert_image_source_to_url`: a `url` source as it is, anything else as base64.
fn vllm_image_url(source: &Value) -> String {
    if str_or(source, "type", "") == "url" {
        return str_or(source, "url", "").to_string();
    }
    crate::chat_form::data_url(
        str_or(source, "media_type", "image/jpeg"),
        str_or(source, "data", ""),
    )
}

/// vLLM's `_convert_user_tool_result`.
fn vllm_user_result(b: &Value, out: &mut Vec<Value>) {
    let id = text_of(b, "tool_use_id").unwrap_or("");
    let mut images = Vec::new();
    let mut refs = Vec::new();
    let text = match b.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(items)) => {
            let mut texts = Vec::new();
            for item in items.iter().filter(|i| i.is_object()) {
                match str_or(item, "type", "") {
                    "text" => texts.push(str_or(item, "text", "")),
                    "image" => {
                        let url = vllm_image_url(item.get("source").unwrap_or(&Value::Null));
                        if !url.is_empty() {
                            images.push(image_part(&url));
                        }
                    }
                    "tool_reference" => {
                        let name = text_of(item, "tool_name").or_else(|| text_of(item, "name"));
                        refs.extend(name.map(|n| json!({"type": "tool_reference", "name": n})));
                    }
                    _ => {}
                }
            }
            texts.join("\n")
        }
        _ => String::new(),
    };
    out.push(msg([
        ("role", "tool".into()),
        ("tool_call_id", id.into()),
        ("content", text.into()),
    ]));
    if !images.is_empty() {
        out.push(msg([
            ("role", "user".into()),
            ("content", Value::Array(images)),
        ]));
    }
    if !refs.is_empty() {
        out.push(msg([
            ("role", "tool".into()),
            ("tool_call_id", id.into()),
            ("content", Value::Array(refs)),
        ]));
    }
}

/// Python's `str(content) if content else ""` for a string or a JSON value (`repr` style).
pub(super) fn python_str(v: Option<&Value>) -> String {
    fn repr(v: &Value, out: &mut String) {
        match v {
            Value::Null => out.push_str("None"),
            Value::Bool(b) => out.push_str(if *b { "True" } else { "False" }),
            Value::Number(n) => out.push_str(&n.to_string()),
            Value::String(s) => {
                out.push('\'');
                out.push_str(&s.replace('\\', "\\\\").replace('\'', "\\'"));
                out.push('\'');
            }
            Value::Array(a) => {
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    repr(x, out);
                }
                out.push(']');
            }
            Value::Object(o) => {
                out.push('{');
                for (i, (k, x)) in o.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    repr(&Value::from(k.as_str()), out);
                    out.push_str(": ");
                    repr(x, out);
                }
                out.push('}');
            }
        }
    }
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(v) if truthy(Some(v)) => {
            let mut out = String::new();
            repr(v, &mut out);
            out
        }
        _ => String::new(),
    }
}
