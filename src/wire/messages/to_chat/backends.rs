//! The backends' own Messages → chat converters, step for step (llama.cpp `tools/server/
//! server-chat.cpp`, vLLM `entrypoints/anthropic/serving.py`, SGLang
//! `entrypoints/anthropic/serving.py`).

use serde_json::{json, Map, Value};

use super::{call_id, image_url, tool_call};
use crate::error::ProxyError;
use crate::wire::chat_form::{bad, copy_keys, image_part, msg, str_or, text_of, text_part, truthy};

/// llama.cpp's `server_chat_convert_anthropic_to_oai`.
pub(super) fn llamacpp(req: &Map<String, Value>) -> Result<Map<String, Value>, ProxyError> {
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
        .get("messages")
        .ok_or_else(|| bad("'messages' is required"))?;
    for m in list.as_array().map_or(&[][..], Vec::as_slice) {
        llamacpp_turn(m, &mut messages);
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
fn llamacpp_turn(m: &Value, out: &mut Vec<Value>) {
    let role = str_or(m, "role", "");
    let blocks = match m.get("content") {
        None if role == "assistant" => return,
        Some(Value::Array(blocks)) => blocks,
        _ => {
            out.push(m.clone());
            return;
        }
    };
    let mut content = Vec::new();
    let mut calls = Vec::new();
    let mut results = Vec::new();
    let mut reasoning = String::new();
    for b in blocks {
        match str_or(b, "type", "") {
            "text" => content.push(b.clone()),
            "thinking" => reasoning.push_str(str_or(b, "thinking", "")),
            "image" => {
                let source = b.get("source").filter(|s| !s.is_null());
                if let Some(url) = image_url(source) {
                    content.push(image_part(&url));
                }
            }
            "tool_use" => calls.push(tool_call(
                str_or(b, "id", ""),
                str_or(b, "name", ""),
                b.get("input"),
            )),
            "tool_result" => results.push(llamacpp_result(b)),
            _ => {}
        }
    }
    if !content.is_empty() || !calls.is_empty() || !reasoning.is_empty() {
        let mut turn = Map::new();
        turn.insert("role".into(), role.into());
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

/// vLLM's `_convert_anthropic_to_openai_request`.
pub(super) fn vllm(req: &Map<String, Value>) -> Result<Map<String, Value>, ProxyError> {
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
    crate::wire::chat_form::data_url(
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
fn python_str(v: Option<&Value>) -> String {
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

/// SGLang's `_convert_to_chat_completion_request`.
pub(super) fn sglang(req: &Map<String, Value>) -> Result<Map<String, Value>, ProxyError> {
    let list = req
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("messages: Field required"))?;
    let mut messages = Vec::new();
    match req.get("system") {
        Some(Value::String(s)) if !s.is_empty() => {
            messages.push(msg([
                ("role", "system".into()),
                ("content", s.as_str().into()),
            ]));
        }
        Some(Value::Array(blocks)) if !blocks.is_empty() => {
            let text: Vec<&str> = blocks
                .iter()
                .filter(|b| str_or(b, "type", "") == "text")
                .filter_map(|b| text_of(b, "text"))
                .collect();
            messages.push(msg([
                ("role", "system".into()),
                ("content", text.join("\n").into()),
            ]));
        }
        _ => {}
    }
    for m in list {
        sglang_turn(m, &mut messages);
    }
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages));
    copy_keys(req, &mut chat, &["model", "max_tokens"]);
    if let Some(Value::Array(tools)) = req.get("tools").filter(|t| truthy(Some(t))) {
        let tools = tools
            .iter()
            .map(|t| {
                let mut tool = Map::new();
                tool.insert("type".into(), "function".into());
                if let Some(d) = t.get("defer_loading").filter(|d| !d.is_null()) {
                    tool.insert("defer_loading".into(), d.clone());
                }
                tool.insert(
                    "function".into(),
                    json!({
                        "name": str_or(t, "name", ""),
                        "description": text_of(t, "description").unwrap_or(""),
                        "parameters": t.get("input_schema").cloned().unwrap_or(Value::Null),
                    }),
                );
                Value::Object(tool)
            })
            .collect();
        chat.insert("tools".into(), Value::Array(tools));
    }
    Ok(chat)
}

/// One SGLang turn: tool results of a user turn become tool messages ahead of it; thinking is
/// dropped; one text part becomes a string.
fn sglang_turn(m: &Value, out: &mut Vec<Value>) {
    let role = str_or(m, "role", "");
    let blocks = match m.get("content") {
        Some(Value::Array(blocks)) => blocks,
        other => {
            let content = other.cloned().unwrap_or(Value::Null);
            out.push(msg([("role", role.into()), ("content", content)]));
            return;
        }
    };
    let mut parts = Vec::new();
    let mut calls = Vec::new();
    for b in blocks {
        match str_or(b, "type", "") {
            "text" => parts.extend(text_of(b, "text").map(text_part)),
            "image" => parts.extend(sglang_image(b.get("source"))),
            "tool_use" => calls.push(tool_call(
                &call_id(b),
                text_of(b, "name").unwrap_or(""),
                b.get("input").filter(|v| truthy(Some(v))),
            )),
            "tool_result" => {
                let (content, text) = sglang_result(b.get("content"));
                if role == "user" {
                    let id = text_of(b, "tool_use_id")
                        .or_else(|| text_of(b, "id"))
                        .unwrap_or("");
                    out.push(msg([
                        ("role", "tool".into()),
                        ("tool_call_id", id.into()),
                        ("content", content),
                    ]));
                } else {
                    parts.push(text_part(&format!("Tool result: {text}")));
                }
            }
            _ => {}
        }
    }
    let mut turn = Map::new();
    turn.insert("role".into(), role.into());
    let has_calls = !calls.is_empty();
    if has_calls {
        turn.insert("tool_calls".into(), Value::Array(calls));
    }
    match parts.as_slice() {
        [] if !has_calls => return,
        [] => {}
        [one] if one["type"] == "text" => drop(turn.insert("content".into(), one["text"].clone())),
        _ => drop(turn.insert("content".into(), Value::Array(parts))),
    }
    out.push(Value::Object(turn));
}

fn sglang_image(source: Option<&Value>) -> Option<Value> {
    let source = source.filter(|s| s.is_object())?;
    if str_or(source, "type", "") == "base64" {
        let data = text_of(source, "data")?;
        let url = crate::wire::chat_form::data_url(str_or(source, "media_type", "image/png"), data);
        return Some(image_part(&url));
    }
    text_of(source, "url").map(image_part)
}

/// SGLang's `_convert_tool_result_content`: (the tool message's content, its text).
fn sglang_result(content: Option<&Value>) -> (Value, String) {
    let Some(Value::Array(items)) = content else {
        let text = python_str(content);
        return (text.clone().into(), text);
    };
    let mut parts = Vec::new();
    let mut texts = Vec::new();
    for item in items.iter().filter(|i| i.is_object()) {
        match str_or(item, "type", "") {
            "text" => {
                if let Some(t) = text_of(item, "text") {
                    texts.push(t);
                    parts.push(text_part(t));
                }
            }
            "image" => parts.extend(sglang_image(item.get("source"))),
            "tool_reference" => {
                let name = text_of(item, "tool_name").or_else(|| text_of(item, "name"));
                parts.extend(name.map(|n| json!({"type": "tool_reference", "name": n})));
            }
            _ => {}
        }
    }
    let text = texts.join("\n");
    match parts.as_slice() {
        [one] if one["type"] == "text" => (one["text"].clone(), text),
        [] => ("".into(), text),
        _ => (Value::Array(parts), text),
    }
}
