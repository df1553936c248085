//! Anthropic Messages requests in chat form: as llama.cpp, vLLM and SGLang each convert them
//! before their chat template runs (what the local count must reproduce), and as Switchboard
//! translates them for a backend that serves only chat completions.
//!
//! The differences are the backends' own: llama.cpp joins system blocks with nothing, keeps a
//! turn's text before its tool results and reads `thinking` as `reasoning_content`; vLLM joins
//! system blocks with nothing, puts tool results before the turn and reads `thinking` as
//! `reasoning`; SGLang joins system blocks with `"\n"` and drops `thinking`.

use serde_json::{json, Map, Value};

use crate::chat_form::{
    bad, copy_keys, data_url, image_part, msg, now_secs, str_or, text_of, text_part, truthy,
    Converter,
};
use crate::error::ProxyError;
use crate::reasoning::InputField;

mod llamacpp;
mod sglang;
mod vllm;

/// `req` (a Messages body) as the chat request `converter` makes of it.
pub fn to_chat(
    req: Map<String, Value>,
    converter: Converter,
) -> Result<Map<String, Value>, ProxyError> {
    match converter {
        Converter::Llamacpp => llamacpp::convert(req),
        Converter::Vllm => vllm::convert(&req),
        Converter::Sglang => sglang::convert(&req),
        Converter::Translate(field) => translate(&req, field),
    }
}

/// Switchboard's translation: the system prompt, each turn with its tool results first (as
/// chat servers expect them right after the calls), thinking in the field the backend reads,
/// and the sampling parameters, tools, tool choice, stop sequences and limits mapped.
fn translate(
    req: &Map<String, Value>,
    field: InputField,
) -> Result<Map<String, Value>, ProxyError> {
    let mut messages = Vec::new();
    let system = match req.get("system") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => blocks
            .iter()
            .filter(|b| str_or(b, "type", "") == "text")
            .map(|b| str_or(b, "text", ""))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    };
    if !system.is_empty() {
        messages.push(msg([("role", "system".into()), ("content", system.into())]));
    }
    let list = req
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("messages: must be an array"))?;
    for m in list {
        translate_turn(m, field, &mut messages)?;
    }
    let mut chat = Map::new();
    copy_keys(req, &mut chat, &["model"]);
    chat.insert("messages".into(), Value::Array(messages));
    copy_keys(
        req,
        &mut chat,
        &["max_tokens", "temperature", "top_p", "top_k", "stream"],
    );
    if let Some(stop) = req.get("stop_sequences").filter(|v| !v.is_null()) {
        chat.insert("stop".into(), stop.clone());
    }
    if matches!(req.get("stream"), Some(Value::Bool(true))) {
        chat.insert("stream_options".into(), json!({"include_usage": true}));
    }
    if let Some(Value::Array(tools)) = req.get("tools") {
        let tools: Vec<Value> = tools.iter().map(translate_tool).collect();
        if !tools.is_empty() {
            chat.insert("tools".into(), Value::Array(tools));
        }
    }
    if let Some(choice) = req.get("tool_choice").and_then(translate_tool_choice) {
        chat.insert("tool_choice".into(), choice);
    }
    if let Some(user) = req
        .get("metadata")
        .and_then(|m| m.get("user_id"))
        .filter(|u| u.is_string())
    {
        chat.insert("user".into(), user.clone());
    }
    copy_keys(req, &mut chat, &["chat_template_kwargs"]);
    Ok(chat)
}

/// One Messages turn as chat messages: its tool results (and their images), then the turn.
fn translate_turn(m: &Value, field: InputField, out: &mut Vec<Value>) -> Result<(), ProxyError> {
    let role = m
        .get("role")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("messages: every message needs a role"))?;
    let blocks = match m.get("content") {
        Some(Value::String(s)) => {
            out.push(msg([("role", role.into()), ("content", s.clone().into())]));
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        _ => {
            return Err(bad(
                "messages: content must be a string or an array of blocks",
            ))
        }
    };
    let mut parts = Vec::new();
    let mut calls = Vec::new();
    let mut thinking = String::new();
    for b in blocks {
        match str_or(b, "type", "") {
            "text" => parts.push(text_part(str_or(b, "text", ""))),
            "image" => {
                if let Some(url) = image_url(b.get("source")) {
                    parts.push(image_part(&url));
                }
            }
            "thinking" => thinking.push_str(str_or(b, "thinking", "")),
            "tool_use" => calls.push(tool_call(
                str_or(b, "id", ""),
                str_or(b, "name", ""),
                b.get("input"),
            )),
            "tool_result" => tool_result(b, out),
            _ => {}
        }
    }
    if parts.is_empty() && calls.is_empty() && thinking.is_empty() {
        return Ok(());
    }
    let mut turn = Map::new();
    turn.insert("role".into(), role.into());
    let content = match parts.as_slice() {
        [] => Value::Null,
        [one] if one["type"] == "text" => one["text"].clone(),
        _ => Value::Array(parts),
    };
    turn.insert("content".into(), content);
    if !calls.is_empty() {
        turn.insert("tool_calls".into(), Value::Array(calls));
    }
    if !thinking.is_empty() {
        turn.insert(field.name().into(), thinking.into());
    }
    out.push(Value::Object(turn));
    Ok(())
}

/// A `tool_result` block as a tool message, its images in a user message after it.
fn tool_result(b: &Value, out: &mut Vec<Value>) {
    let id = str_or(b, "tool_use_id", "");
    let mut images = Vec::new();
    let text = match b.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(items)) => {
            let mut texts = Vec::new();
            for item in items {
                match str_or(item, "type", "") {
                    "text" => texts.push(str_or(item, "text", "")),
                    "image" => images.extend(image_url(item.get("source")).map(|u| image_part(&u))),
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
}

/// The id vLLM and SGLang give a `tool_use` block that has none.
pub(super) fn call_id(b: &Value) -> String {
    text_of(b, "id").map_or_else(|| format!("call_{}", now_secs()), str::to_string)
}

/// The URL of an Anthropic image source (`base64` as a `data:` URL, or `url`).
pub(super) fn image_url(source: Option<&Value>) -> Option<String> {
    let source = source?;
    match str_or(source, "type", "") {
        "base64" => Some(data_url(
            str_or(source, "media_type", "image/jpeg"),
            str_or(source, "data", ""),
        )),
        "url" => Some(str_or(source, "url", "").to_string()),
        _ => None,
    }
}

/// A chat tool call of a `tool_use` block, its input as a compact JSON string.
pub(super) fn tool_call(id: &str, name: &str, input: Option<&Value>) -> Value {
    let args = match input.filter(|v| !v.is_null()) {
        Some(v) => v.to_string(),
        None => "{}".to_string(),
    };
    json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})
}

fn translate_tool(t: &Value) -> Value {
    let mut f = Map::new();
    f.insert("name".into(), str_or(t, "name", "").into());
    if let Some(d) = text_of(t, "description") {
        f.insert("description".into(), d.into());
    }
    f.insert(
        "parameters".into(),
        t.get("input_schema")
            .cloned()
            .unwrap_or_else(|| json!({"type": "object"})),
    );
    json!({"type": "function", "function": f})
}

/// `auto` → `"auto"`, `any` → `"required"`, `none` → `"none"`, `tool` → the named function.
pub(super) fn translate_tool_choice(tc: &Value) -> Option<Value> {
    Some(match str_or(tc, "type", "") {
        "auto" => "auto".into(),
        "any" => "required".into(),
        "none" => "none".into(),
        "tool" if truthy(tc.get("name")) => {
            json!({"type": "function", "function": {"name": tc["name"]}})
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    //! Each converter's chat form of the same Messages requests.

    use serde_json::{json, Value};

    use super::to_chat;
    use crate::chat_form::Converter;
    use crate::reasoning::InputField;

    fn convert(req: Value, c: Converter) -> Value {
        Value::Object(to_chat(req.as_object().unwrap().clone(), c).unwrap())
    }

    fn history() -> Value {
        json!({
            "model": "m",
            "max_tokens": 100,
            "system": [{"type": "text", "text": "be brief"}, {"type": "text", "text": "and kind"}],
            "messages": [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "call the tool", "signature": "s"},
                    {"type": "tool_use", "id": "t1", "name": "get", "input": {"city": "Oslo"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "rain"}, {"type": "text", "text": "cold"}]},
                    {"type": "text", "text": "thanks"}
                ]}
            ],
            "tools": [{"name": "get", "description": "d", "input_schema": {"type": "object"}}],
            "stop_sequences": ["END"],
            "stream": true
        })
    }

    #[test]
    fn llamacpp_keeps_the_turn_before_its_tool_results() {
        let chat = convert(history(), Converter::Llamacpp);
        assert_eq!(
            chat["messages"],
            json!([
                {"role": "system", "content": "be briefand kind"},
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "get", "arguments": "{\"city\":\"Oslo\"}"}}], "reasoning_content": "call the tool"},
                {"role": "user", "content": [{"type": "text", "text": "thanks"}]},
                {"role": "tool", "tool_call_id": "t1", "content": "raincold"}
            ])
        );
        assert_eq!(
            chat["tools"][0]["function"]["parameters"],
            json!({"type": "object"})
        );
        assert_eq!(chat["stop"], json!(["END"]));
        assert_eq!(chat["max_tokens"], 100);
    }

    #[test]
    fn vllm_puts_tool_results_first_and_reads_thinking_as_reasoning() {
        let chat = convert(history(), Converter::Vllm);
        let m = &chat["messages"];
        assert_eq!(
            m[0],
            json!({"role": "system", "content": "be briefand kind"})
        );
        assert_eq!(m[2]["reasoning"], "call the tool");
        assert!(m[2].get("content").is_none());
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "t1", "content": "rain\ncold"})
        );
        assert_eq!(m[4], json!({"role": "user", "content": "thanks"}));
        assert_eq!(chat["tools"][0]["function"]["defer_loading"], Value::Null);
    }

    #[test]
    fn sglang_joins_system_blocks_with_newlines_and_drops_thinking() {
        let chat = convert(history(), Converter::Sglang);
        let m = &chat["messages"];
        assert_eq!(m[0]["content"], "be brief\nand kind");
        assert!(m[2].get("reasoning").is_none() && m[2].get("reasoning_content").is_none());
        // Two text parts stay parts (one would have become a string).
        assert_eq!(
            m[3]["content"],
            json!([{"type": "text", "text": "rain"}, {"type": "text", "text": "cold"}])
        );
        assert_eq!(chat["tools"][0]["function"]["description"], "d");
    }

    #[test]
    fn translation_maps_parameters_for_a_chat_only_backend() {
        let mut req = history();
        req["tool_choice"] = json!({"type": "tool", "name": "get"});
        req["temperature"] = json!(0.2);
        let chat = convert(req, Converter::Translate(InputField::Reasoning));
        let m = &chat["messages"];
        assert_eq!(m[0]["content"], "be brief\nand kind");
        assert_eq!(m[2]["reasoning"], "call the tool");
        assert_eq!(m[2]["content"], Value::Null);
        assert_eq!(m[3]["role"], "tool");
        assert_eq!(m[4], json!({"role": "user", "content": "thanks"}));
        assert_eq!(chat["stop"], json!(["END"]));
        assert_eq!(chat["max_tokens"], 100);
        assert_eq!(chat["temperature"], 0.2);
        assert_eq!(chat["stream_options"]["include_usage"], true);
        assert_eq!(
            chat["tool_choice"],
            json!({"type": "function", "function": {"name": "get"}})
        );
        assert_eq!(chat["model"], "m");
    }

    #[test]
    fn billing_header_stamp_is_normalised_by_llamacpp_only() {
        let req = json!({"system": "x-anthropic-billing-header: cc_version=1; cch=a5145;You are", "messages": []});
        let chat = convert(req.clone(), Converter::Llamacpp);
        assert_eq!(
            chat["messages"][0]["content"],
            "x-anthropic-billing-header: cc_version=1; cch=fffff;You are"
        );
        let chat = convert(req, Converter::Vllm);
        assert_eq!(
            chat["messages"][0]["content"],
            "x-anthropic-billing-header: cc_version=1; cch=a5145;You are"
        );
    }
}
