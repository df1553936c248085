//! Tests of the chat to Messages translation.

use std::sync::Arc;

use super::*;
use crate::reasoning::{OutputField, ThinkTags};
use crate::wire::messages::stream::tests::{assert_blocks_in_order, parse};

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

/// Feeds the chat stream `sse` event by event (each as its own chunk).
pub(crate) fn translate(t: &mut dyn ApiEvents, sse: &str, seen: &mut Seen) -> Vec<u8> {
    let mut out = Vec::new();
    let now = Instant::now();
    for ev in sse.split_inclusive("\n\n") {
        match t.event(ev.as_bytes(), now, seen) {
            Action::Keep => out.extend_from_slice(ev.as_bytes()),
            Action::Drop => {}
            Action::Replace(b) => out.extend_from_slice(&b),
        }
    }
    if let Some(tail) = t.end(seen) {
        out.extend_from_slice(&tail);
    }
    out
}

#[test]
fn a_reasoning_chat_stream_becomes_thinking_then_text() {
    let mut seen = Seen::default();
    let out = parse(&translate(&mut FromChat::new(&ctx(None)), THINK, &mut seen));
    assert_blocks_in_order(&out);
    let kinds: Vec<_> = out
        .iter()
        .filter(|(n, _)| n == "content_block_start")
        .map(|(_, v)| v["content_block"]["type"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(kinds, ["thinking", "text"]);
    let text: String = out
        .iter()
        .filter_map(|(_, v)| v["delta"]["text"].as_str())
        .collect();
    assert_eq!(text, "Hi there, tester!");
    let thinking: String = out
        .iter()
        .filter_map(|(_, v)| v["delta"]["thinking"].as_str())
        .collect();
    assert_eq!(thinking, "Let me think about it.\n");
    let delta = &out[out.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    let u = seen.usage.unwrap();
    assert!(u.prompt > 0 && u.completion > 0);
    assert_eq!(
        delta["usage"]["input_tokens"].as_u64().unwrap()
            + delta["usage"]["cache_read_input_tokens"].as_u64().unwrap(),
        u.prompt
    );
    assert!(u.decode_tps.is_some(), "llama.cpp's timings are kept");
    assert!(seen.first_token.unwrap() <= seen.first_content.unwrap());
}

#[test]
fn a_tool_call_stream_becomes_a_tool_use_block() {
    let mut seen = Seen::default();
    let out = parse(&translate(&mut FromChat::new(&ctx(None)), TOOL, &mut seen));
    assert_blocks_in_order(&out);
    let start = out
        .iter()
        .find(|(n, _)| n == "content_block_start")
        .unwrap();
    assert_eq!(start.1["content_block"]["type"], "tool_use");
    assert_eq!(start.1["content_block"]["name"], "get_weather");
    assert_eq!(start.1["content_block"]["input"], json!({}));
    let args: String = out
        .iter()
        .filter_map(|(_, v)| v["delta"]["partial_json"].as_str())
        .collect();
    let parsed: Value = serde_json::from_str(&args).unwrap();
    assert_eq!(parsed["city"], "Paris");
    assert_eq!(out[out.len() - 2].1["delta"]["stop_reason"], "max_tokens");
    assert_eq!(out[out.len() - 2].1["usage"]["output_tokens"], 120);
}

#[test]
fn inline_think_tags_of_a_chat_backend_become_thinking() {
    let tags = Arc::new(ThinkTags::preset("qwen3").unwrap());
    let chunk = |t: &str| {
        let c = json!({"id":"chatcmpl-1","model":"m","choices":[{"index":0,"delta":{"content":t},"finish_reason":null}]});
        format!("data: {c}\n\n")
    };
    let mut sse: String = ["<th", "ink>a", "b</thi", "nk>c"]
        .iter()
        .map(|t| chunk(t))
        .collect();
    sse.push_str("data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n");
    let mut seen = Seen::default();
    let out = parse(&translate(
        &mut FromChat::new(&ctx(Some(tags))),
        &sse,
        &mut seen,
    ));
    assert_blocks_in_order(&out);
    let thinking: String = out
        .iter()
        .filter_map(|(_, v)| v["delta"]["thinking"].as_str())
        .collect();
    let text: String = out
        .iter()
        .filter_map(|(_, v)| v["delta"]["text"].as_str())
        .collect();
    assert_eq!((thinking.as_str(), text.as_str()), ("ab", "c"));
}

#[test]
fn a_chat_error_in_the_stream_is_anthropics_error_event() {
    let sse = "data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"error\":{\"code\":503,\"message\":\"busy\",\"type\":\"unavailable_error\"}}\n\ndata: [DONE]\n\n";
    let mut seen = Seen::default();
    let out = parse(&translate(&mut FromChat::new(&ctx(None)), sse, &mut seen));
    let last = &out.last().unwrap().1;
    assert_eq!(
        last,
        &json!({"type":"error","error":{"type":"overloaded_error","message":"busy"}})
    );
}

#[test]
fn whole_answers_translate_with_tool_use_and_usage() {
    let chat = include_bytes!("../../../tests/fixtures/chat_answer_tool_call_llamacpp.json");
    let v: Value = serde_json::from_slice(&answer(chat, &ctx(None)).unwrap()).unwrap();
    assert_eq!(v["type"], "message");
    assert_eq!(v["stop_reason"], "max_tokens");
    assert_eq!(v["content"][0]["type"], "tool_use");
    assert_eq!(v["content"][0]["input"]["city"], "Paris");
    assert_eq!(
        v["usage"],
        json!({"input_tokens":1,"cache_read_input_tokens":157,"output_tokens":120})
    );
    let chat = include_bytes!("../../../tests/fixtures/chat_answer_think_llamacpp.json");
    let v: Value = serde_json::from_slice(&answer(chat, &ctx(None)).unwrap()).unwrap();
    assert_eq!(v["content"][0]["type"], "thinking");
    assert_eq!(
        v["content"][1],
        json!({"type":"text","text":"Hi there, tester!"})
    );
    assert_eq!(v["stop_reason"], "end_turn");
}
