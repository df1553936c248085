//! Tests of the chat to Messages translation.

use std::sync::Arc;

use super::*;
use crate::messages::stream::tests::{assert_blocks_in_order, parse};
use crate::reasoning::{OutputField, ThinkTags};
use crate::stream::Action;

/// A real llama-server's chat stream: reasoning, then text (`deepseek_09`).
const THINK: &str = include_str!("../../../../../tests/fixtures/chat_stream_think_llamacpp.txt");
/// A real llama-server's chat stream of one tool call, cut by `max_tokens` (`deepseek_28`).
const TOOL: &str = include_str!("../../../../../tests/fixtures/chat_stream_tool_call_llamacpp.txt");

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
    let out = parse(&translate(&mut translation(&ctx(None)), THINK, &mut seen));
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
    let out = parse(&translate(&mut translation(&ctx(None)), TOOL, &mut seen));
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
        &mut translation(&ctx(Some(tags))),
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
    let out = parse(&translate(&mut translation(&ctx(None)), sse, &mut seen));
    let last = &out.last().unwrap().1;
    assert_eq!(
        last,
        &json!({"type":"error","error":{"type":"overloaded_error","message":"busy"}})
    );
}

#[test]
fn whole_answers_translate_with_tool_use_and_usage() {
    let chat = include_bytes!("../../../../../tests/fixtures/chat_answer_tool_call_llamacpp.json");
    let v: Value = serde_json::from_slice(&answer(chat, &ctx(None)).unwrap()).unwrap();
    assert_eq!(v["type"], "message");
    assert_eq!(v["stop_reason"], "max_tokens");
    assert_eq!(v["content"][0]["type"], "tool_use");
    assert_eq!(v["content"][0]["input"]["city"], "Paris");
    assert_eq!(
        v["usage"],
        json!({"input_tokens":1,"cache_read_input_tokens":157,"output_tokens":120})
    );
    let chat = include_bytes!("../../../../../tests/fixtures/chat_answer_think_llamacpp.json");
    let v: Value = serde_json::from_slice(&answer(chat, &ctx(None)).unwrap()).unwrap();
    assert_eq!(v["content"][0]["type"], "thinking");
    assert_eq!(
        v["content"][1],
        json!({"type":"text","text":"Hi there, tester!"})
    );
    assert_eq!(v["stop_reason"], "end_turn");
}

/// A chat chunk of choice 0 with `delta`.
fn chunk(delta: Value) -> String {
    let c = json!({"id": "chatcmpl-x", "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": null}]});
    format!("data: {c}\n\n")
}

/// A chat stream of `deltas`, finished with `finish`.
fn stream_of(deltas: &[Value], finish: &str) -> String {
    let mut sse: String = deltas.iter().cloned().map(chunk).collect();
    let end = json!({"id": "chatcmpl-x", "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]});
    sse.push_str(&format!("data: {end}\n\ndata: [DONE]\n\n"));
    sse
}

/// A delta of the tool call at `index`.
fn call(index: u64, id: Option<&str>, name: Option<&str>, args: &str) -> Value {
    let mut f = json!({"arguments": args});
    if let Some(n) = name {
        f["name"] = json!(n);
    }
    let mut c = json!({"index": index, "function": f});
    if let Some(id) = id {
        c["id"] = json!(id);
    }
    json!({"tool_calls": [c]})
}

/// The tool_use blocks of a stream: `(id, name, arguments streamed)`, each delta checked to
/// be of its block's type.
fn tool_blocks(out: &[(String, Value)]) -> Vec<(String, String, String)> {
    let mut blocks = Vec::new();
    let mut kind = String::new();
    for (name, v) in out {
        if name == "content_block_start" {
            kind = v["content_block"]["type"].as_str().unwrap().to_owned();
            if kind == "tool_use" {
                let b = &v["content_block"];
                let (id, n) = (b["id"].as_str().unwrap(), b["name"].as_str().unwrap());
                blocks.push((id.to_owned(), n.to_owned(), String::new()));
            }
        }
        if name == "content_block_delta" {
            let d = &v["delta"];
            let want = match kind.as_str() {
                "tool_use" => "input_json_delta",
                "text" => "text_delta",
                _ => d["type"].as_str().unwrap(),
            };
            assert_eq!(
                d["type"], want,
                "a delta of another type in a {kind} block: {v}"
            );
            if let Some(p) = d["partial_json"].as_str() {
                blocks.last_mut().unwrap().2.push_str(p);
            }
        }
    }
    blocks
}

fn run_sse(sse: &str) -> (Vec<(String, Value)>, Seen) {
    let mut seen = Seen::default();
    let out = parse(&translate(&mut translation(&ctx(None)), sse, &mut seen));
    (out, seen)
}

#[test]
fn a_tool_call_continued_after_text_stays_in_its_tool_use_block() {
    let sse = stream_of(
        &[
            json!({"content": "first"}),
            call(0, Some("c0"), Some("f"), "{\"k\":"),
            json!({"content": "between"}),
            call(0, None, None, "1}"),
        ],
        "tool_calls",
    );
    let (out, _) = run_sse(&sse);
    assert_blocks_in_order(&out);
    assert_eq!(
        tool_blocks(&out),
        [("c0".into(), "f".into(), "{\"k\":1}".into())]
    );
    let text: String = out
        .iter()
        .filter_map(|(_, v)| v["delta"]["text"].as_str())
        .collect();
    assert_eq!(text, "firstbetween");
    assert_eq!(out[out.len() - 2].1["delta"]["stop_reason"], "tool_use");
}

#[test]
fn interleaved_tool_call_indexes_keep_their_own_arguments() {
    let sse = stream_of(
        &[
            call(0, Some("a"), Some("f"), "{\"a\":"),
            call(7, Some("b"), Some("g"), "{}"),
            call(0, None, None, "1}"),
        ],
        "tool_calls",
    );
    let (out, _) = run_sse(&sse);
    assert_blocks_in_order(&out);
    assert_eq!(
        tool_blocks(&out),
        [
            ("a".into(), "f".into(), "{\"a\":1}".into()),
            ("b".into(), "g".into(), "{}".into())
        ]
    );
}

#[test]
fn whole_answers_that_are_not_chat_completions_are_refused() {
    for body in [
        r#"{"id":"x","choices":[]}"#,
        "null",
        r#"{"choices":null}"#,
        r#"{"choices":[{"index":0,"finish_reason":"stop"}]}"#,
        r#"{"choices":[{"index":0,"message":null}]}"#,
        r#"{"choices":[{"index":1,"message":{"content":"one"}}]}"#,
        "not json",
    ] {
        let e = answer(body.as_bytes(), &ctx(None)).unwrap_err();
        assert!(!e.to_string().is_empty(), "{body}");
    }
}

#[test]
fn tool_calls_without_an_id_get_distinct_ids_stable_in_the_answer() {
    let sse = stream_of(
        &[
            call(0, None, Some("f"), "{}"),
            call(1, None, Some("g"), "{}"),
        ],
        "tool_calls",
    );
    let (out, _) = run_sse(&sse);
    let blocks = tool_blocks(&out);
    assert_eq!(blocks.len(), 2);
    assert!(blocks
        .iter()
        .all(|b| b.0.starts_with("toolu_") && b.0.len() > 8));
    assert_ne!(blocks[0].0, blocks[1].0);
    let chat = br#"{"id":"x","choices":[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant","tool_calls":[
        {"type":"function","function":{"name":"f","arguments":"{}"}},
        {"type":"function","function":{"name":"g","arguments":"{}"}}]}}]}"#;
    let v: Value = serde_json::from_slice(&answer(chat, &ctx(None)).unwrap()).unwrap();
    let (a, b) = (&v["content"][0]["id"], &v["content"][1]["id"]);
    assert!(a.as_str().unwrap().starts_with("toolu_"));
    assert_ne!(a, b);
}

/// Feeds raw events (bytes, each a whole event) through a fresh translation.
fn run_raw(events: &[&[u8]]) -> (Vec<(String, Value)>, Seen) {
    let mut t = translation(&ctx(None));
    let mut seen = Seen::default();
    let mut out = Vec::new();
    for ev in events {
        match t.event(ev, Instant::now(), &mut seen) {
            Action::Keep => out.extend_from_slice(ev),
            Action::Drop => {}
            Action::Replace(b) => out.extend_from_slice(&b),
        }
    }
    out.extend(t.end(&mut seen).unwrap_or_default());
    (parse(&out), seen)
}

#[test]
fn an_unreadable_event_ends_the_stream_with_an_error_event() {
    let start = chunk(call(0, Some("c0"), Some("f"), "{\"k\":"));
    let finish = stream_of(&[], "tool_calls");
    let finish: Vec<&str> = finish.split_inclusive("\n\n").collect();
    let bad: [&[u8]; 4] = [
        b"data: [1]\n\n",
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\n\n",
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"1\\ud800}\"}}]}}]}\n\n",
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\xff1}\"}}]}}]}\n\n",
    ];
    for ev in bad {
        let (out, seen) = run_raw(&[
            start.as_bytes(),
            ev,
            finish[0].as_bytes(),
            finish[1].as_bytes(),
        ]);
        let (name, last) = out.last().unwrap();
        assert_eq!(name, "error", "{out:?}");
        assert_eq!(last["error"]["type"], "api_error");
        assert!(out.iter().all(|(n, _)| n != "message_delta"), "{out:?}");
        assert!(seen.error.is_some());
    }
}

#[test]
fn object_arguments_and_list_content_are_kept() {
    let chat = br#"{"id":"x","choices":[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant",
        "content":[{"type":"text","text":"a"},{"type":"text","text":"b"}],
        "tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":{"k":1}}}]}}]}"#;
    let v: Value = serde_json::from_slice(&answer(chat, &ctx(None)).unwrap()).unwrap();
    assert_eq!(v["content"][0], json!({"type": "text", "text": "ab"}));
    assert_eq!(v["content"][1]["input"], json!({"k": 1}));
    let sse = stream_of(
        &[
            json!({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": {"k": 1}}}]}),
        ],
        "tool_calls",
    );
    let (out, _) = run_sse(&sse);
    assert_eq!(
        tool_blocks(&out),
        [("c".into(), "f".into(), "{\"k\":1}".into())]
    );
}

#[test]
fn other_choices_are_neither_merged_nor_shown() {
    let one = |delta: Value| {
        let c = json!({"id": "chatcmpl-x", "choices": [{"index": 1, "delta": delta}]});
        format!("data: {c}\n\n")
    };
    let sse = [
        chunk(json!({"content": "zero"})),
        one(json!({"content": "one"})),
        one(call(0, Some("c1"), Some("f"), "{}")),
        stream_of(&[], "stop"),
    ]
    .concat();
    let (out, _) = run_sse(&sse);
    assert_blocks_in_order(&out);
    let text: String = out
        .iter()
        .filter_map(|(_, v)| v["delta"]["text"].as_str())
        .collect();
    assert_eq!(text, "zero");
    assert!(tool_blocks(&out).is_empty());
    assert_eq!(out[out.len() - 2].1["delta"]["stop_reason"], "end_turn");
    let chat = br#"{"id":"x","choices":[{"index":1,"finish_reason":"tool_calls","message":{"tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"}}]}},
        {"index":0,"finish_reason":"stop","message":{"content":"zero"}}]}"#;
    let v: Value = serde_json::from_slice(&answer(chat, &ctx(None)).unwrap()).unwrap();
    assert_eq!(v["content"], json!([{"type": "text", "text": "zero"}]));
    assert_eq!(v["stop_reason"], "end_turn");
}

#[test]
fn n_never_reaches_the_translated_request() {
    use crate::flavor::Flavor;
    use crate::{Adapter, Converter};
    let body = br#"{"model":"m","max_tokens":5,"n":3,"messages":[{"role":"user","content":"hi"}]}"#;
    for flavor in [
        Flavor::Llamacpp,
        Flavor::Vllm,
        Flavor::Sglang,
        Flavor::Openai,
    ] {
        let chat = super::super::Messages
            .to_chat(body, Converter::translate(flavor))
            .unwrap();
        let v: Value = serde_json::from_slice(&chat).unwrap();
        assert!(v.get("n").is_none(), "{v}");
        assert_eq!(v["messages"][0]["content"], "hi");
    }
}
