//! Tests of the chat to Responses translation.

use std::sync::Arc;

use super::*;
use crate::reasoning::{OutputField, ThinkTags};
use crate::wire::responses::stream::tests::{events_of, run, spec, REASONING_THEN_TEXT};

/// A real llama-server's chat stream: reasoning, then text (`deepseek_09`).
const THINK: &str = include_str!("../../../tests/fixtures/chat_stream_think_llamacpp.txt");
/// A real llama-server's chat stream of one tool call, cut by `max_tokens` (`deepseek_28`).
const TOOL: &str = include_str!("../../../tests/fixtures/chat_stream_tool_call_llamacpp.txt");

fn ctx(tags: Option<Arc<ThinkTags>>) -> StreamContext {
    StreamContext {
        output: OutputField::ReasoningContent,
        tags,
        model: "alias".into(),
    }
}

/// Event types with runs of the same delta squeezed to one.
fn squeezed(events: &[(String, Value)]) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for t in spec::types(events) {
        if !(t.ends_with(".delta") && v.last() == Some(&t)) {
            v.push(t);
        }
    }
    v
}

#[test]
fn a_reasoning_chat_stream_has_the_native_streams_event_order() {
    let mut seen = Seen::default();
    let bytes = run(&mut FromChat::new(&ctx(None)), &events_of(THINK), &mut seen);
    let out = spec::parse_sse(&bytes);
    spec::check_responses(&out).unwrap();
    assert_eq!(squeezed(&out), REASONING_THEN_TEXT);
    let done = &out.last().unwrap().1["response"];
    assert_eq!(done["output"][0]["type"], "reasoning");
    assert_eq!(
        done["output"][0]["content"][0]["text"],
        "Let me think about it.\n"
    );
    assert_eq!(done["output"][1]["content"][0]["text"], "Hi there, tester!");
    assert_eq!(done["incomplete_details"], Value::Null);
    let u = seen.usage.unwrap();
    assert_eq!(done["usage"]["input_tokens"], u.prompt);
    assert_eq!(done["usage"]["output_tokens"], u.completion);
    assert!(u.decode_tps.is_some(), "llama.cpp's timings are kept");
}

#[test]
fn a_tool_call_chat_stream_becomes_a_function_call_item() {
    let mut seen = Seen::default();
    let out = spec::parse_sse(&run(
        &mut FromChat::new(&ctx(None)),
        &events_of(TOOL),
        &mut seen,
    ));
    spec::check_responses(&out).unwrap();
    assert_eq!(
        squeezed(&out),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    let done = &out.last().unwrap().1["response"];
    let call = &done["output"][0];
    assert_eq!(call["name"], "get_weather");
    assert_eq!(call["call_id"], "DfFlsXYbFOZsMaXxpgfKpw4u7vcgeAOy");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args["city"], "Paris");
    assert_eq!(done["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(done["usage"]["input_tokens_details"]["cached_tokens"], 157);
}

#[test]
fn inline_think_tags_of_a_chat_backend_become_a_reasoning_item() {
    let tags = Arc::new(ThinkTags::preset("qwen3").unwrap());
    let mut events: Vec<(String, String)> = ["<th", "ink>a", "b</thi", "nk>c"]
        .iter()
        .map(|t| {
            let c = json!({"id":"chatcmpl-7","model":"m","created":1,
                "choices":[{"index":0,"delta":{"content":t},"finish_reason":null}]});
            (String::new(), c.to_string())
        })
        .collect();
    events.push((
        String::new(),
        r#"{"id":"chatcmpl-7","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#.into(),
    ));
    events.push((String::new(), "[DONE]".into()));
    let mut seen = Seen::default();
    let out = spec::parse_sse(&run(
        &mut FromChat::new(&ctx(Some(tags))),
        &events,
        &mut seen,
    ));
    spec::check_responses(&out).unwrap();
    let done = &out.last().unwrap().1["response"]["output"];
    assert_eq!(done[0]["type"], "reasoning");
    assert_eq!(done[0]["content"][0]["text"], "ab");
    assert_eq!(done[1]["content"][0]["text"], "c");
}

#[test]
fn whole_answers_translate_with_reasoning_tool_calls_and_usage() {
    let chat = include_bytes!("../../../tests/fixtures/chat_answer_think_llamacpp.json");
    let v: Value = serde_json::from_slice(&answer(chat, &ctx(None)).unwrap()).unwrap();
    assert_eq!(v["object"], "response");
    assert_eq!(v["output"][0]["type"], "reasoning");
    assert_eq!(v["output"][1]["content"][0]["text"], "Hi there, tester!");
    assert!(v["usage"]["input_tokens"].as_u64().unwrap() > 0);
    let chat = include_bytes!("../../../tests/fixtures/chat_answer_tool_call_llamacpp.json");
    let v: Value = serde_json::from_slice(&answer(chat, &ctx(None)).unwrap()).unwrap();
    assert_eq!(v["output"][0]["type"], "function_call");
    assert_eq!(
        v["output"][0]["call_id"],
        "p2y7uyrnOanfNYgyTsOtWMZ8xTVPAyIM"
    );
    assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(v["usage"]["output_tokens"], 120);
}
