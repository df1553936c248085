//! Each converter's chat form of the same Responses requests.

use serde_json::{json, Value};

use super::to_chat;
use crate::reasoning::InputField;
use crate::wire::chat_form::Converter;

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
