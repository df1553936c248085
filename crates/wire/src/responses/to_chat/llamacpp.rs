//! llama.cpp's `server_chat_convert_responses_to_chatcmpl` (`tools/server/server-chat.cpp`),
//! step for step, refusals in its words.

use serde_json::{json, Map, Value};

use super::last_assistant;
use crate::chat_form::{bad, str_or};
use crate::error::ProxyError;

/// The chat body: every other key of the request kept, `input` and `instructions` made
/// messages, function tools unwrapped, `max_output_tokens` and `reasoning.effort` renamed.
pub(super) fn convert(mut chat: Map<String, Value>) -> Result<Map<String, Value>, ProxyError> {
    let input = chat
        .remove("input")
        .ok_or_else(|| bad("'input' is required"))?;
    if chat
        .get("previous_response_id")
        .and_then(Value::as_str)
        .is_some_and(|p| !p.is_empty())
    {
        return Err(bad("llama.cpp does not support 'previous_response_id'."));
    }
    let mut out: Vec<Value> = Vec::new();
    if let Some(i) = chat.remove("instructions") {
        let text = i.as_str().unwrap_or("");
        out.push(json!({"role": "system", "content": text}));
    }
    match input {
        Value::String(_) => out.push(json!({"role": "user", "content": input})),
        Value::Array(items) => {
            for item in items {
                one_item(item, &mut out)?;
            }
        }
        _ => return Err(bad("'input' must be a string or array of objects")),
    }
    chat.insert("messages".into(), Value::Array(out));
    if let Some(tools) = chat.remove("tools") {
        let Value::Array(tools) = tools else {
            return Err(bad("'tools' must be an array of objects"));
        };
        let mut list = Vec::new();
        for t in tools
            .into_iter()
            .filter(|t| str_or(t, "type", "") == "function")
        {
            let Value::Object(mut f) = t else { continue };
            f.remove("type");
            f.entry("strict").or_insert(Value::Bool(true));
            list.push(json!({"type": "function", "function": f}));
        }
        if !list.is_empty() {
            chat.insert("tools".into(), Value::Array(list));
        }
    }
    if let Some(max) = chat.remove("max_output_tokens") {
        chat.insert("max_tokens".into(), max);
    }
    if let Some(r) = chat.remove("reasoning") {
        if let Some(effort) = r.get("effort") {
            chat.insert("reasoning_effort".into(), effort.clone());
        }
    }
    Ok(chat)
}

fn is_str(v: &Value, key: &str) -> bool {
    v.get(key).is_some_and(Value::is_string)
}

fn is_arr(v: &Value, key: &str) -> bool {
    v.get(key).is_some_and(Value::is_array)
}

/// One input item onto the messages.
fn one_item(mut item: Value, out: &mut Vec<Value>) -> Result<(), ProxyError> {
    let merge_prev = last_assistant(out).is_some();
    if is_str(&item, "content") {
        let text = item["content"].take();
        item["content"] = json!([{"text": text, "type": "input_text"}]);
    }
    let role = item.get("role").and_then(Value::as_str).map(str::to_string);
    let kind = item.get("type").and_then(Value::as_str).map(str::to_string);
    let Some(obj) = item.as_object_mut() else {
        return Err(bad("Cannot determine type of 'item'"));
    };
    if is_arr_map(obj, "content")
        && matches!(role.as_deref(), Some("user" | "system" | "developer"))
    {
        let parts = input_parts(obj.get("content"))?;
        obj.remove("type");
        obj.remove("status");
        obj.insert("content".into(), Value::Array(parts));
        out.push(item);
    } else if role.as_deref() == Some("assistant") && kind.as_deref() == Some("message") {
        let parts = output_parts(obj.get("content"))?;
        match last_assistant(out) {
            Some(prev) if merge_prev => match prev.get_mut("content") {
                Some(Value::Array(c)) => c.extend(parts),
                _ => drop(prev.insert("content".into(), Value::Array(parts))),
            },
            _ => {
                obj.remove("status");
                obj.remove("type");
                obj.insert("content".into(), Value::Array(parts));
                out.push(item);
            }
        }
    } else if is_str(&item, "arguments")
        && is_str(&item, "call_id")
        && is_str(&item, "name")
        && kind.as_deref() == Some("function_call")
    {
        let call = json!({
            "function": {"arguments": item["arguments"], "name": item["name"]},
            "id": item["call_id"],
            "type": "function",
        });
        match last_assistant(out) {
            Some(prev) if merge_prev => match prev.get_mut("tool_calls") {
                Some(Value::Array(calls)) => calls.push(call),
                _ => drop(prev.insert("tool_calls".into(), Value::Array(vec![call]))),
            },
            _ => out.push(json!({"role": "assistant", "tool_calls": [call]})),
        }
    } else if is_str(&item, "call_id")
        && (is_str(&item, "output") || is_arr(&item, "output"))
        && kind.as_deref() == Some("function_call_output")
    {
        out.push(call_output(&item)?);
    } else if is_arr(&item, "summary") && kind.as_deref() == Some("reasoning") {
        let text = reasoning(&item)?;
        match last_assistant(out) {
            Some(prev) if merge_prev => drop(prev.insert("reasoning_content".into(), text)),
            _ => out.push(json!({"role": "assistant", "content": [], "reasoning_content": text})),
        }
    } else {
        return Err(bad("Cannot determine type of 'item'"));
    }
    Ok(())
}

fn is_arr_map(m: &Map<String, Value>, key: &str) -> bool {
    m.get(key).is_some_and(Value::is_array)
}

/// `input_text` / `input_image` parts as chat parts.
fn input_parts(content: Option<&Value>) -> Result<Vec<Value>, ProxyError> {
    let mut parts = Vec::new();
    for p in content
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice)
    {
        match str_or(p, "type", "") {
            "input_text" => {
                let text = p
                    .get("text")
                    .ok_or_else(|| bad("'Input text' requires 'text'"))?;
                parts.push(json!({"text": text, "type": "text"}));
            }
            "input_image" => {
                let url = p
                    .get("image_url")
                    .ok_or_else(|| bad("'image_url' is required"))?;
                parts.push(json!({"image_url": {"url": url}, "type": "image_url"}));
            }
            "input_file" => {
                return Err(bad(
                    "'input_file' is not supported by llamacpp at this moment",
                ))
            }
            _ => {
                return Err(bad(
                    "'type' must be one of 'input_text', 'input_image', or 'input_file'",
                ))
            }
        }
    }
    Ok(parts)
}

/// An assistant message's `output_text` (or `input_text`) and `refusal` parts.
fn output_parts(content: Option<&Value>) -> Result<Vec<Value>, ProxyError> {
    let mut parts = Vec::new();
    match content {
        Some(Value::String(s)) => parts.push(json!({"text": s, "type": "text"})),
        Some(Value::Array(list)) => {
            for p in list {
                match str_or(p, "type", "") {
                    "output_text" | "input_text" => {
                        if !is_str(p, "text") {
                            return Err(bad("'Output text' requires 'text'"));
                        }
                        parts.push(json!({"text": p["text"], "type": "text"}));
                    }
                    "refusal" => {
                        if !is_str(p, "refusal") {
                            return Err(bad("'Refusal' requires 'refusal'"));
                        }
                        parts.push(json!({"refusal": p["refusal"], "type": "refusal"}));
                    }
                    _ => return Err(bad("'type' must be one of 'output_text' or 'refusal'")),
                }
            }
        }
        _ => {}
    }
    Ok(parts)
}

/// A `function_call_output` item as a tool message.
fn call_output(item: &Value) -> Result<Value, ProxyError> {
    let output = &item["output"];
    if output.is_string() {
        return Ok(json!({"content": output, "role": "tool", "tool_call_id": item["call_id"]}));
    }
    let mut outputs = output.as_array().cloned().unwrap_or_default();
    for o in &mut outputs {
        let kind = o
            .get("type")
            .ok_or_else(|| bad("Output of tool call missing 'type' field"))?
            .clone();
        match kind.as_str() {
            Some("input_text") => o["type"] = "text".into(),
            Some("input_image") => {
                let url = o
                    .get("image_url")
                    .cloned()
                    .ok_or_else(|| bad("'image_url' is required"))?;
                o["type"] = "image_url".into();
                o["image_url"] = json!({"url": url});
            }
            _ => {
                return Err(bad(
                    "Output of tool call should be 'Input text' or 'Input image'",
                ))
            }
        }
    }
    Ok(json!({"content": outputs, "role": "tool", "tool_call_id": item["call_id"]}))
}

/// A reasoning item's first `content` text (llama.cpp requires one).
fn reasoning(item: &Value) -> Result<Value, ProxyError> {
    let content = item
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("item['content'] is not an array"))?;
    let first = content
        .first()
        .ok_or_else(|| bad("item['content'] is empty"))?;
    first
        .get("text")
        .filter(|t| t.is_string())
        .cloned()
        .ok_or_else(|| bad("item['content']['text'] is not a string"))
}
