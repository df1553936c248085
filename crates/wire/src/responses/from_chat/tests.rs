//! Tests of the chat to Responses translation.

use std::sync::Arc;

use super::*;
use crate::reasoning::{OutputField, ThinkTags};
use crate::responses::stream::tests::{events_of, run, spec, REASONING_THEN_TEXT};
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
    let bytes = run(&mut translation(&ctx(None)), &events_of(THINK), &mut seen);
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
        &mut translation(&ctx(None)),
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
    let out = spec::parse_sse(&run(&mut translation(&ctx(Some(tags))), &events, &mut seen));
    spec::check_responses(&out).unwrap();
    let done = &out.last().unwrap().1["response"]["output"];
    assert_eq!(done[0]["type"], "reasoning");
    assert_eq!(done[0]["content"][0]["text"], "ab");
    assert_eq!(done[1]["content"][0]["text"], "c");
}

#[test]
fn whole_answers_translate_with_reasoning_tool_calls_and_usage() {
    let chat = include_bytes!("../../../../../tests/fixtures/chat_answer_think_llamacpp.json");
    let v: Value = serde_json::from_slice(&answer(chat, &ctx(None)).unwrap()).unwrap();
    assert_eq!(v["object"], "response");
    assert_eq!(v["output"][0]["type"], "reasoning");
    assert_eq!(v["output"][1]["content"][0]["text"], "Hi there, tester!");
    assert!(v["usage"]["input_tokens"].as_u64().unwrap() > 0);
    let chat = include_bytes!("../../../../../tests/fixtures/chat_answer_tool_call_llamacpp.json");
    let v: Value = serde_json::from_slice(&answer(chat, &ctx(None)).unwrap()).unwrap();
    assert_eq!(v["output"][0]["type"], "function_call");
    assert_eq!(
        v["output"][0]["call_id"],
        "p2y7uyrnOanfNYgyTsOtWMZ8xTVPAyIM"
    );
    assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(v["usage"]["output_tokens"], 120);
}

/// A chat chunk of choice 0 with `delta`, as an event.
fn chunk(delta: Value) -> (String, String) {
    let c = json!({"id": "chatcmpl-x", "model": "m", "created": 1,
        "choices": [{"index": 0, "delta": delta, "finish_reason": null}]});
    (String::new(), c.to_string())
}

/// The end of a chat stream finished with `finish`.
fn end_of(finish: &str) -> Vec<(String, String)> {
    let c = json!({"id": "chatcmpl-x", "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]});
    vec![
        (String::new(), c.to_string()),
        (String::new(), "[DONE]".into()),
    ]
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

/// The stream of `deltas` finished with `finish`, checked against the specification.
fn run_deltas(deltas: &[Value], finish: &str) -> Vec<(String, Value)> {
    let mut events: Vec<_> = deltas.iter().cloned().map(chunk).collect();
    events.extend(end_of(finish));
    let mut seen = Seen::default();
    let out = spec::parse_sse(&run(&mut translation(&ctx(None)), &events, &mut seen));
    spec::check_responses(&out).unwrap();
    out
}

/// The function calls of a stream: `(call_id, name, arguments streamed)`, each arguments
/// event naming a function_call item, and the done events agreeing with what streamed.
fn calls_of(out: &[(String, Value)]) -> Vec<(String, String, String)> {
    let mut items: Vec<Value> = Vec::new();
    let mut args: Vec<String> = Vec::new();
    for (name, v) in out {
        let at = v["output_index"].as_u64().map(|i| i as usize);
        match name.as_str() {
            "response.output_item.added" => {
                items.push(v["item"].clone());
                args.push(String::new());
            }
            "response.function_call_arguments.delta" => {
                let i = at.unwrap();
                assert_eq!(items[i]["type"], "function_call", "{v}");
                assert_eq!(v["item_id"], items[i]["id"]);
                args[i].push_str(v["delta"].as_str().unwrap());
            }
            "response.function_call_arguments.done" => {
                assert_eq!(v["arguments"], args[at.unwrap()].as_str());
            }
            "response.output_item.done" if v["item"]["type"] == "function_call" => {
                assert_eq!(v["item"]["arguments"], args[at.unwrap()].as_str());
            }
            _ => {}
        }
    }
    let done = &out.last().unwrap().1["response"]["output"];
    items
        .iter()
        .zip(args)
        .enumerate()
        .filter(|(_, (i, _))| i["type"] == "function_call")
        .map(|(n, (i, a))| {
            assert_eq!(done[n]["arguments"], a.as_str());
            let id = i["call_id"].as_str().unwrap().to_owned();
            (id, i["name"].as_str().unwrap().to_owned(), a)
        })
        .collect()
}

fn text_of_stream(out: &[(String, Value)]) -> String {
    out.iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, v)| v["delta"].as_str().unwrap())
        .collect()
}

#[test]
fn a_tool_call_continued_after_text_keeps_its_arguments_in_its_item() {
    let out = run_deltas(
        &[
            json!({"content": "first"}),
            call(0, Some("c0"), Some("f"), "{\"k\":"),
            json!({"content": "between"}),
            call(0, None, None, "1}"),
        ],
        "tool_calls",
    );
    assert_eq!(
        calls_of(&out),
        [("c0".into(), "f".into(), "{\"k\":1}".into())]
    );
    assert_eq!(text_of_stream(&out), "firstbetween");
}

#[test]
fn interleaved_tool_call_indexes_keep_their_own_arguments() {
    let out = run_deltas(
        &[
            call(0, Some("a"), Some("f"), "{\"a\":"),
            call(7, Some("b"), Some("g"), "{}"),
            call(0, None, None, "1}"),
        ],
        "tool_calls",
    );
    assert_eq!(
        calls_of(&out),
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
        r#"{"choices":[{"index":1,"message":{"content":"one"}}]}"#,
    ] {
        assert!(answer(body.as_bytes(), &ctx(None)).is_err(), "{body}");
    }
}

#[test]
fn tool_calls_without_an_id_get_distinct_ids_stable_in_the_answer() {
    let out = run_deltas(
        &[
            call(0, None, Some("f"), "{}"),
            call(1, None, Some("g"), "{}"),
        ],
        "tool_calls",
    );
    let calls = calls_of(&out);
    assert_eq!(calls.len(), 2);
    assert!(calls
        .iter()
        .all(|c| c.0.starts_with("call_") && c.0.len() > 8));
    assert_ne!(calls[0].0, calls[1].0);
    let items = &out.last().unwrap().1["response"]["output"];
    assert_eq!(items[0]["id"], format!("fc_{}", calls[0].0));
    let chat = br#"{"id":"x","choices":[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant","tool_calls":[
        {"type":"function","function":{"name":"f","arguments":"{}"}},
        {"type":"function","function":{"name":"g","arguments":"{}"}}]}}]}"#;
    let v: Value = serde_json::from_slice(&answer(chat, &ctx(None)).unwrap()).unwrap();
    let (a, b) = (&v["output"][0]["call_id"], &v["output"][1]["call_id"]);
    assert!(a.as_str().unwrap().starts_with("call_"));
    assert_ne!(a, b);
}

#[test]
fn an_unreadable_event_ends_the_stream_with_error_then_response_failed() {
    let start = format!(
        "data: {}\n\n",
        chunk(call(0, Some("c0"), Some("f"), "{\"k\":")).1
    );
    let bad: [&[u8]; 4] = [
        b"data: [1]\n\n",
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\n\n",
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"1\\ud800}\"}}]}}]}\n\n",
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\xff1}\"}}]}}]}\n\n",
    ];
    for ev in bad {
        let mut t = translation(&ctx(None));
        let mut seen = Seen::default();
        let mut out = Vec::new();
        let mut events = vec![start.clone().into_bytes(), ev.to_vec()];
        events.extend(
            end_of("tool_calls")
                .into_iter()
                .map(|(_, d)| format!("data: {d}\n\n").into_bytes()),
        );
        for e in &events {
            if let Action::Replace(b) = t.event(e, Instant::now(), &mut seen) {
                out.extend(b);
            }
        }
        out.extend(t.end(&mut seen).unwrap_or_default());
        let out = spec::parse_sse(&out);
        spec::check_responses(&out).unwrap();
        let names = spec::types(&out);
        assert_eq!(
            names[names.len() - 2..],
            ["error", "response.failed"],
            "{names:?}"
        );
        assert!(!names.iter().any(|n| n == "response.completed"));
        assert!(seen.error.is_some());
    }
}

#[test]
fn object_arguments_and_list_content_are_kept() {
    let chat = br#"{"id":"x","choices":[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant",
        "content":[{"type":"text","text":"a"},{"type":"text","text":"b"}],
        "tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":{"k":1}}}]}}]}"#;
    let v: Value = serde_json::from_slice(&answer(chat, &ctx(None)).unwrap()).unwrap();
    assert_eq!(v["output"][0]["content"][0]["text"], "ab");
    assert_eq!(v["output"][1]["arguments"], r#"{"k":1}"#);
    let out = run_deltas(
        &[
            json!({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": {"k": 1}}}]}),
        ],
        "tool_calls",
    );
    assert_eq!(
        calls_of(&out),
        [("c".into(), "f".into(), "{\"k\":1}".into())]
    );
}

#[test]
fn other_choices_are_neither_merged_nor_shown() {
    let one = |delta: Value| {
        let c = json!({"id": "chatcmpl-x", "choices": [{"index": 1, "delta": delta}]});
        (String::new(), c.to_string())
    };
    let mut events = vec![
        chunk(json!({"content": "zero"})),
        one(json!({"content": "one"})),
        one(call(0, Some("c1"), Some("f"), "{}")),
    ];
    events.extend(end_of("stop"));
    let mut seen = Seen::default();
    let out = spec::parse_sse(&run(&mut translation(&ctx(None)), &events, &mut seen));
    spec::check_responses(&out).unwrap();
    assert_eq!(text_of_stream(&out), "zero");
    assert!(calls_of(&out).is_empty());
    let chat = br#"{"id":"x","choices":[{"index":1,"finish_reason":"tool_calls","message":{"tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"}}]}},
        {"index":0,"finish_reason":"stop","message":{"content":"zero"}}]}"#;
    let v: Value = serde_json::from_slice(&answer(chat, &ctx(None)).unwrap()).unwrap();
    assert_eq!(v["output"].as_array().unwrap().len(), 1);
    assert_eq!(v["output"][0]["content"][0]["text"], "zero");
}

#[test]
fn n_never_reaches_the_translated_request() {
    use crate::flavor::Flavor;
    use crate::{Adapter, Converter};
    let body = br#"{"model":"m","n":3,"input":"hi"}"#;
    for flavor in [
        Flavor::Llamacpp,
        Flavor::Vllm,
        Flavor::Sglang,
        Flavor::Openai,
    ] {
        let chat = super::super::Responses
            .to_chat(body, Converter::translate(flavor))
            .unwrap();
        let v: Value = serde_json::from_slice(&chat).unwrap();
        assert!(v.get("n").is_none(), "{v}");
        assert_eq!(v["messages"][0]["content"], "hi");
    }
}
