//! llama.cpp's Messages → chat converter (`tools/server/server-chat.cpp`
//! `server_chat_convert_anthropic_to_oai`), step for step.

use serde_json::{json, Map, Value};

use super::{image_url, tool_call};
use crate::chat_form::{bad, image_part, msg, str_or, text_part};
use crate::error::ProxyError;

/// llama.cpp's `server_chat_convert_anthropic_to_oai`.
pub(super) fn convert(mut req: Map<String, Value>) -> Result<Map<String, Value>, ProxyError> {
    let mut messages = Vec::new();
    if let Some(system) = req.get("system").filter(|s| !s.is_null()) {
        let text = match system {
            Value::String(s) => billing_header(s),
            Value::Array(blocks) => blocks
                .iter()
                .filter(|b| str_or(b, "type", "") == "text")
                .map(|b| billing_header(str_or(b, "text", "")))
                .collect(),
            _ => String::new(),
        };
        messages.push(msg([("role", "system".into()), ("content", text.into())]));
    }
    let list = req
        .remove("messages")
        .ok_or_else(|| bad("'messages' is required"))?;
    if let Value::Array(list) = list {
        for m in list {
            llamacpp_turn(m, &mut messages);
        }
    }
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages));
    if let Some(Value::Array(tools)) = req.get("tools") {
        let tools = tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": str_or(t, "name", ""),
                    "description": str_or(t, "description", ""),
                    "parameters": t.get("input_schema").cloned().unwrap_or_else(|| json!({})),
                }})
            })
            .collect();
        chat.insert("tools".into(), Value::Array(tools));
    }
    if let Some(tc) = req.get("tool_choice").filter(|t| t.is_object()) {
        match str_or(tc, "type", "") {
            "auto" => drop(chat.insert("tool_choice".into(), "auto".into())),
            "any" | "tool" => drop(chat.insert("tool_choice".into(), "required".into())),
            _ => {}
        }
    }
    if let Some(stop) = req.get("stop_sequences") {
        chat.insert("stop".into(), stop.clone());
    }
    let max = req
        .get("max_tokens")
        .cloned()
        .unwrap_or_else(|| 4096.into());
    chat.insert("max_tokens".into(), max);
    for key in [
        "temperature",
        "top_p",
        "top_k",
        "stream",
        "chat_template_kwargs",
    ] {
        if let Some(v) = req.get(key) {
            chat.insert(key.into(), v.clone());
        }
    }
    Ok(chat)
}

/// One turn: string content (or none) as it is; blocks into text/image parts, reasoning and
/// tool calls, the turn first and its tool results after it.
fn llamacpp_turn(m: Value, out: &mut Vec<Value>) {
    let role = str_or(&m, "role", "").to_string();
    let blocks = match m {
        Value::Object(mut obj) => match obj.get("content") {
            None if role == "assistant" => return,
            Some(Value::Array(_)) => match obj.remove("content") {
                Some(Value::Array(blocks)) => blocks,
                _ => return,
            },
            _ => {
                out.push(Value::Object(obj));
                return;
            }
        },
        other => {
            out.push(other);
            return;
        }
    };
    let mut content = Vec::new();
    let mut calls = Vec::new();
    let mut results = Vec::new();
    let mut reasoning = String::new();
    for b in blocks {
        match str_or(&b, "type", "") {
            "text" => content.push(b),
            "thinking" => reasoning.push_str(str_or(&b, "thinking", "")),
            "image" => {
                let source = b.get("source").filter(|s| !s.is_null());
                if let Some(url) = image_url(source) {
                    content.push(image_part(&url));
                }
            }
            "tool_use" => calls.push(tool_call(
                str_or(&b, "id", ""),
                str_or(&b, "name", ""),
                b.get("input"),
            )),
            "tool_result" => results.push(llamacpp_result(&b)),
            _ => {}
        }
    }
    if !content.is_empty() || !calls.is_empty() || !reasoning.is_empty() {
        let mut turn = Map::new();
        turn.insert("role".into(), Value::String(role));
        let body = if content.is_empty() {
            Value::from("")
        } else {
            Value::Array(content)
        };
        turn.insert("content".into(), body);
        if !calls.is_empty() {
            turn.insert("tool_calls".into(), Value::Array(calls));
        }
        if !reasoning.is_empty() {
            turn.insert("reasoning_content".into(), reasoning.into());
        }
        out.push(Value::Object(turn));
    }
    out.extend(results);
}

/// A `tool_result` block: text-only content joined with nothing, else typed parts.
fn llamacpp_result(b: &Value) -> Value {
    let id = str_or(b, "tool_use_id", "");
    let content = match b.get("content") {
        Some(Value::String(s)) => Value::from(s.as_str()),
        Some(Value::Array(items)) => {
            let mut text = String::new();
            let mut parts = Vec::new();
            let mut images = false;
            for c in items {
                match str_or(c, "type", "") {
                    "text" => {
                        let t = str_or(c, "text", "");
                        text.push_str(t);
                        parts.push(text_part(t));
                    }
                    "image" => {
                        images = true;
                        if let Some(url) = image_url(c.get("source")) {
                            parts.push(image_part(&url));
                        }
                    }
                    _ => {}
                }
            }
            if images {
                Value::Array(parts)
            } else {
                text.into()
            }
        }
        _ => "".into(),
    };
    msg([
        ("role", "tool".into()),
        ("tool_call_id", id.into()),
        ("content", content),
    ])
}

/// llama.cpp stamps the per-request `cch=` of Claude Code's billing header out of the system
/// prompt so that its prefix cache holds.
fn billing_header(text: &str) -> String {
    const PREFIX: &str = "x-anthropic-billing-header:";
    let mut s = text.to_string();
    if !s.starts_with(PREFIX) {
        return s;
    }
    if let Some(at) = s[PREFIX.len()..].find("cch=").map(|i| i + PREFIX.len() + 4) {
        if s.as_bytes().get(at + 5) == Some(&b';') && s.is_char_boundary(at + 5) {
            s.replace_range(at..at + 5, "fffff");
        }
    }
    s
}
