//! Each converter's chat form of the same Messages requests.

use serde_json::{json, Value};

use super::to_chat;
use crate::reasoning::InputField;
use crate::wire::chat_form::Converter;

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
