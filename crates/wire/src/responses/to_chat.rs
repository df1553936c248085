//! Responses requests in chat form: as llama.cpp and vLLM each convert them before their chat
//! template runs (SGLang's Responses requests follow vLLM's construction), and as Switchboard
//! translates them for a backend that serves only chat completions.
//!
//! The differences are the backends' own: llama.cpp keeps every other key of the body, turns
//! `input_text` into text parts, merges assistant items into one message and reads a reasoning
//! item's first `content` text as `reasoning_content` (refusing items it cannot type); vLLM
//! passes user and system items to its chat parser as they are, takes an assistant message's
//! first text, and reads reasoning as `reasoning`.

use serde_json::{json, Map, Value};

use crate::chat_form::{bad, copy_keys, image_part, msg, str_or, text_part, Converter};
use crate::error::ProxyError;
use crate::reasoning::InputField;

mod llamacpp;

/// `req` (a Responses body) as the chat request `converter` makes of it.
pub fn to_chat(
    req: Map<String, Value>,
    converter: Converter,
) -> Result<Map<String, Value>, ProxyError> {
    match converter {
        Converter::Llamacpp => llamacpp::convert(req),
        Converter::Vllm | Converter::Sglang => vllm(&req),
        Converter::Translate(field) => translate(&req, field),
    }
}

/// What an input item is, by the fields the converters look at.
enum Item<'a> {
    Message {
        role: &'a str,
        content: &'a Value,
    },
    Call {
        id: &'a str,
        name: &'a str,
        arguments: &'a str,
    },
    Output {
        id: &'a str,
        output: &'a Value,
    },
    Reasoning(&'a Value),
    Other,
}

fn item(v: &Value) -> Item<'_> {
    let kind = str_or(v, "type", "");
    match kind {
        "function_call" => Item::Call {
            id: str_or(v, "call_id", ""),
            name: str_or(v, "name", ""),
            arguments: str_or(v, "arguments", ""),
        },
        "function_call_output" => Item::Output {
            id: str_or(v, "call_id", ""),
            output: v.get("output").unwrap_or(&Value::Null),
        },
        "reasoning" => Item::Reasoning(v),
        "message" | "" => match v.get("role").and_then(Value::as_str) {
            Some(role) => Item::Message {
                role,
                content: v.get("content").unwrap_or(&Value::Null),
            },
            None => Item::Other,
        },
        _ => Item::Other,
    }
}

/// The last message, when it is the assistant's (items after it merge into it).
fn last_assistant(out: &mut [Value]) -> Option<&mut Map<String, Value>> {
    out.last_mut()
        .and_then(Value::as_object_mut)
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
}

fn tool_call(id: &str, name: &str, arguments: &str) -> Value {
    json!({"id": id, "function": {"name": name, "arguments": arguments}, "type": "function"})
}

/// A reasoning item's text: its first `content` text, else its first summary text.
fn reasoning_text(v: &Value) -> Option<&str> {
    let first = |key: &str| {
        v.get(key)
            .and_then(Value::as_array)
            .and_then(|a| a.first())
            .and_then(|c| c.get("text"))
            .and_then(Value::as_str)
    };
    first("content").or_else(|| first("summary"))
}

fn text_of_value(v: &Value) -> Option<&str> {
    v.as_str().filter(|s| !s.is_empty())
}

/// vLLM's `construct_input_messages` (+ `construct_tool_dicts` for the tools).
fn vllm(req: &Map<String, Value>) -> Result<Map<String, Value>, ProxyError> {
    let mut out: Vec<Value> = Vec::new();
    if let Some(i) = req.get("instructions").and_then(|i| text_of_value(i)) {
        out.push(msg([("role", "system".into()), ("content", i.into())]));
    }
    let mut continue_final = false;
    match req.get("input") {
        Some(Value::String(s)) => out.push(msg([
            ("role", "user".into()),
            ("content", s.as_str().into()),
        ])),
        Some(Value::Array(items)) => {
            for v in items {
                vllm_item(v, &mut out)?;
            }
            continue_final = items.last().is_some_and(|last| {
                matches!(str_or(last, "type", "message"), "message" | "reasoning")
                    && matches!(str_or(last, "status", ""), "in_progress" | "incomplete")
            });
        }
        _ => return Err(bad("input: Field required")),
    }
    let mut chat = Map::new();
    copy_keys(req, &mut chat, &["model"]);
    chat.insert("messages".into(), Value::Array(out));
    if continue_final {
        chat.insert("continue_final_message".into(), true.into());
        chat.insert("add_generation_prompt".into(), false.into());
    }
    copy_keys(req, &mut chat, &["chat_template_kwargs"]);
    if let Some(Value::Array(tools)) = req.get("tools") {
        let tools: Vec<Value> = tools
            .iter()
            .filter(|t| str_or(t, "type", "") == "function")
            .map(|t| {
                let field = |k: &str| t.get(k).cloned().unwrap_or(Value::Null);
                json!({"type": "function", "function": {
                    "name": field("name"),
                    "description": field("description"),
                    "parameters": field("parameters"),
                    "strict": field("strict"),
                }})
            })
            .collect();
        if !tools.is_empty() {
            chat.insert("tools".into(), Value::Array(tools));
        }
    }
    Ok(chat)
}

fn vllm_item(v: &Value, out: &mut Vec<Value>) -> Result<(), ProxyError> {
    match item(v) {
        Item::Call {
            id,
            name,
            arguments,
        } => {
            let call = tool_call(id, name, arguments);
            match last_assistant(out) {
                Some(prev) => match prev.get_mut("tool_calls") {
                    Some(Value::Array(calls)) => calls.push(call),
                    _ => drop(prev.insert("tool_calls".into(), Value::Array(vec![call]))),
                },
                None => out.push(msg([
                    ("role", "assistant".into()),
                    ("tool_calls", Value::Array(vec![call])),
                ])),
            }
        }
        Item::Reasoning(r) => {
            if r.get("encrypted_content")
                .is_some_and(|e| !e.is_null() && e != "")
            {
                return Err(bad("Encrypted content is not supported."));
            }
            let text = reasoning_text(r).unwrap_or("");
            match last_assistant(out) {
                Some(prev) if !prev.contains_key("reasoning") => {
                    prev.insert("reasoning".into(), text.into());
                }
                _ => out.push(msg([
                    ("role", "assistant".into()),
                    ("reasoning", text.into()),
                ])),
            }
        }
        Item::Output { id, output } => out.push(msg([
            ("role", "tool".into()),
            ("content", output.clone()),
            ("tool_call_id", id.into()),
        ])),
        Item::Message {
            role: "assistant",
            content,
        } => {
            let text = match content {
                Value::String(s) => Some(s.as_str()),
                Value::Array(parts) => parts
                    .first()
                    .and_then(|p| p.get("text"))
                    .and_then(Value::as_str),
                _ => None,
            };
            match (text, last_assistant(out)) {
                (None, _) => out.push(v.clone()),
                (Some(t), Some(prev)) if !prev.contains_key("content") => {
                    prev.insert("content".into(), t.into());
                }
                (Some(t), _) => {
                    out.push(msg([("role", "assistant".into()), ("content", t.into())]))
                }
            }
        }
        _ => out.push(v.clone()),
    }
    Ok(())
}

/// Switchboard's translation: instructions as the system message, items as chat messages
/// (calls merged into the assistant turn, outputs as tool messages, reasoning in the field the
/// backend reads), and the parameters mapped.
fn translate(
    req: &Map<String, Value>,
    field: InputField,
) -> Result<Map<String, Value>, ProxyError> {
    if req
        .get("previous_response_id")
        .is_some_and(|p| !p.is_null())
    {
        return Err(bad(
            "previous_response_id is not supported: this model's backend serves only chat completions, send the whole conversation",
        ));
    }
    let mut out: Vec<Value> = Vec::new();
    if let Some(Value::String(i)) = req.get("instructions") {
        out.push(msg([
            ("role", "system".into()),
            ("content", i.as_str().into()),
        ]));
    }
    match req.get("input") {
        Some(Value::String(s)) => out.push(msg([
            ("role", "user".into()),
            ("content", s.as_str().into()),
        ])),
        Some(Value::Array(items)) => {
            for v in items {
                translate_item(v, field, &mut out)?;
            }
        }
        _ => return Err(bad("input: must be a string or an array of items")),
    }
    let mut chat = Map::new();
    copy_keys(req, &mut chat, &["model"]);
    chat.insert("messages".into(), Value::Array(out));
    copy_keys(
        req,
        &mut chat,
        &[
            "temperature",
            "top_p",
            "stream",
            "parallel_tool_calls",
            "user",
        ],
    );
    if let Some(max) = req.get("max_output_tokens").filter(|v| !v.is_null()) {
        chat.insert("max_tokens".into(), max.clone());
    }
    if matches!(req.get("stream"), Some(Value::Bool(true))) {
        chat.insert("stream_options".into(), json!({"include_usage": true}));
    }
    translate_options(req, &mut chat);
    Ok(chat)
}

/// Tools, tool choice, reasoning effort and the text format.
fn translate_options(req: &Map<String, Value>, chat: &mut Map<String, Value>) {
    if let Some(Value::Array(tools)) = req.get("tools") {
        let tools: Vec<Value> = tools
            .iter()
            .filter(|t| str_or(t, "type", "") == "function")
            .map(|t| {
                let mut f = t.as_object().cloned().unwrap_or_default();
                f.remove("type");
                json!({"type": "function", "function": f})
            })
            .collect();
        if !tools.is_empty() {
            chat.insert("tools".into(), Value::Array(tools));
        }
    }
    match req.get("tool_choice") {
        Some(Value::String(s)) => drop(chat.insert("tool_choice".into(), s.as_str().into())),
        Some(tc @ Value::Object(_)) if str_or(tc, "type", "") == "function" => {
            let choice = json!({"type": "function", "function": {"name": str_or(tc, "name", "")}});
            chat.insert("tool_choice".into(), choice);
        }
        _ => {}
    }
    if let Some(effort) = req
        .get("reasoning")
        .and_then(|r| r.get("effort"))
        .filter(|e| e.is_string())
    {
        chat.insert("reasoning_effort".into(), effort.clone());
    }
    if let Some(format) = req.get("text").and_then(|t| t.get("format")) {
        match str_or(format, "type", "") {
            "json_schema" => {
                let mut schema = format.as_object().cloned().unwrap_or_default();
                schema.remove("type");
                chat.insert(
                    "response_format".into(),
                    json!({"type": "json_schema", "json_schema": schema}),
                );
            }
            "json_object" => {
                drop(chat.insert("response_format".into(), json!({"type": "json_object"})))
            }
            _ => {}
        }
    }
}

fn translate_item(v: &Value, field: InputField, out: &mut Vec<Value>) -> Result<(), ProxyError> {
    match item(v) {
        Item::Message { role, content } => {
            let content = match content {
                Value::String(s) => Value::from(s.as_str()),
                Value::Array(parts) => translate_parts(parts)?,
                _ => return Err(bad("input: a message needs content")),
            };
            let merge = role == "assistant" && content.is_string();
            match last_assistant(out) {
                Some(prev) if merge && prev.get("content").is_none_or(Value::is_null) => {
                    prev.insert("content".into(), content);
                }
                _ => out.push(msg([("role", role.into()), ("content", content)])),
            }
        }
        Item::Call {
            id,
            name,
            arguments,
        } => {
            let call = tool_call(id, name, arguments);
            match last_assistant(out) {
                Some(prev) => match prev.get_mut("tool_calls") {
                    Some(Value::Array(calls)) => calls.push(call),
                    _ => drop(prev.insert("tool_calls".into(), Value::Array(vec![call]))),
                },
                None => out.push(msg([
                    ("role", "assistant".into()),
                    ("content", Value::Null),
                    ("tool_calls", Value::Array(vec![call])),
                ])),
            }
        }
        Item::Output { id, output } => {
            let content = match output {
                Value::String(s) => Value::from(s.as_str()),
                Value::Array(parts) => translate_parts(parts)?,
                other => other.to_string().into(),
            };
            out.push(msg([
                ("role", "tool".into()),
                ("tool_call_id", id.into()),
                ("content", content),
            ]));
        }
        Item::Reasoning(r) => {
            let text = reasoning_text(r).unwrap_or("");
            if !text.is_empty() {
                match last_assistant(out) {
                    Some(prev) if !prev.contains_key(field.name()) => {
                        prev.insert(field.name().into(), text.into());
                    }
                    _ => out.push(msg([
                        ("role", "assistant".into()),
                        ("content", Value::Null),
                        (field.name(), text.into()),
                    ])),
                }
            }
        }
        Item::Other => {
            let kind = str_or(v, "type", "");
            return Err(bad(format!(
                "input: items of type {kind:?} cannot be sent to a backend that serves only chat completions"
            )));
        }
    }
    Ok(())
}

/// Responses content parts as chat parts; all-text content becomes one string.
fn translate_parts(parts: &[Value]) -> Result<Value, ProxyError> {
    let mut out = Vec::with_capacity(parts.len());
    for p in parts {
        match str_or(p, "type", "") {
            "input_text" | "output_text" | "text" => out.push(text_part(str_or(p, "text", ""))),
            "refusal" => out.push(text_part(str_or(p, "refusal", ""))),
            "input_image" => {
                let url = match p.get("image_url") {
                    Some(Value::String(u)) => u.as_str(),
                    Some(o) => str_or(o, "url", ""),
                    None => "",
                };
                out.push(image_part(url));
            }
            other => {
                return Err(bad(format!(
                    "input: content parts of type {other:?} cannot be sent to a backend that serves only chat completions"
                )))
            }
        }
    }
    if let [one] = out.as_slice() {
        if one["type"] == "text" {
            return Ok(one["text"].clone());
        }
    }
    Ok(Value::Array(out))
}

#[cfg(test)]
mod tests {
    //! Each converter's chat form of the same Responses requests.

    use serde_json::{json, Value};

    use super::to_chat;
    use crate::chat_form::Converter;
    use crate::reasoning::InputField;

    fn convert(req: Value, c: Converter) -> Result<Value, crate::error::ProxyError> {
        to_chat(req.as_object().unwrap().clone(), c).map(Value::Object)
    }

    fn history() -> Value {
        json!({
            "model": "m",
            "instructions": "be brief",
            "max_output_tokens": 50,
            "input": [
                {"type": "message", "role": "user", "content": "weather?"},
                {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "call it"}]},
                {"type": "function_call", "call_id": "c1", "name": "get", "arguments": "{\"city\":\"Oslo\"}"},
                {"type": "function_call_output", "call_id": "c1", "output": "rain"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Rain."}]},
                {"role": "user", "content": [{"type": "input_text", "text": "thanks"}]}
            ],
            "tools": [{"type": "function", "name": "get", "description": "d", "parameters": {"type": "object"}}],
            "reasoning": {"effort": "low"}
        })
    }

    #[test]
    fn llamacpp_merges_into_the_assistant_turn_and_keeps_other_keys() {
        let chat = convert(history(), Converter::Llamacpp).unwrap();
        assert_eq!(
            chat["messages"],
            json!([
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"text": "weather?", "type": "text"}]},
                {"role": "assistant", "content": [], "reasoning_content": "call it",
                 "tool_calls": [{"function": {"arguments": "{\"city\":\"Oslo\"}", "name": "get"}, "id": "c1", "type": "function"}]},
                {"content": "rain", "role": "tool", "tool_call_id": "c1"},
                {"role": "assistant", "content": [{"text": "Rain.", "type": "text"}]},
                {"role": "user", "content": [{"text": "thanks", "type": "text"}]}
            ])
        );
        assert_eq!(chat["max_tokens"], 50);
        assert_eq!(chat["reasoning_effort"], "low");
        assert_eq!(chat["model"], "m");
        assert_eq!(chat["tools"][0]["function"]["strict"], true);
        assert!(chat.get("input").is_none() && chat.get("instructions").is_none());
    }

    #[test]
    fn llamacpp_refuses_what_it_cannot_type() {
        let mut req = history();
        req["input"] =
            json!([{"type": "reasoning", "summary": [{"type": "summary_text", "text": "x"}]}]);
        let e = convert(req.clone(), Converter::Llamacpp).unwrap_err();
        assert!(
            e.to_string().contains("item['content'] is not an array"),
            "{e}"
        );
        req["input"] = json!([{"role": "assistant", "content": "no type"}]);
        let e = convert(req, Converter::Llamacpp).unwrap_err();
        assert_eq!(e.to_string(), "Cannot determine type of 'item'");
    }

    #[test]
    fn vllm_takes_first_texts_and_reads_reasoning() {
        let chat = convert(history(), Converter::Vllm).unwrap();
        let m = &chat["messages"];
        assert_eq!(m[0], json!({"role": "system", "content": "be brief"}));
        assert_eq!(
            m[1],
            json!({"type": "message", "role": "user", "content": "weather?"})
        );
        assert_eq!(m[2]["reasoning"], "call it");
        assert_eq!(m[2]["tool_calls"][0]["id"], "c1");
        assert_eq!(
            m[3],
            json!({"role": "tool", "content": "rain", "tool_call_id": "c1"})
        );
        assert_eq!(m[4], json!({"role": "assistant", "content": "Rain."}));
        assert_eq!(chat["tools"][0]["function"]["strict"], Value::Null);
    }

    #[test]
    fn translation_maps_items_and_parameters() {
        let chat = convert(
            history(),
            Converter::Translate(InputField::ReasoningContent),
        )
        .unwrap();
        let m = &chat["messages"];
        assert_eq!(m[1], json!({"role": "user", "content": "weather?"}));
        assert_eq!(m[2]["reasoning_content"], "call it");
        assert_eq!(m[2]["tool_calls"][0]["function"]["name"], "get");
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "c1", "content": "rain"})
        );
        assert_eq!(m[4], json!({"role": "assistant", "content": "Rain."}));
        assert_eq!(chat["max_tokens"], 50);
        assert_eq!(chat["reasoning_effort"], "low");
        assert_eq!(
            chat["tools"][0],
            json!({"type": "function", "function": {"name": "get", "description": "d", "parameters": {"type": "object"}}})
        );
        let mut req = history();
        req["previous_response_id"] = json!("resp_1");
        assert!(convert(req, Converter::Translate(InputField::Reasoning)).is_err());
    }
}
