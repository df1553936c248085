//! Tests of the Responses stream repair.

use super::*;

#[path = "../../../../../tests/it/common/spec.rs"]
pub(crate) mod spec;

/// The events of an SSE text as `(name, data)` string pairs.
pub(crate) fn events_of(sse: &str) -> Vec<(String, String)> {
    sse.split("\n\n")
        .filter_map(|e| {
            let name = e.lines().find_map(|l| l.strip_prefix("event: "));
            let data = e.lines().find_map(|l| l.strip_prefix("data: "))?;
            Some((name.unwrap_or("").to_owned(), data.to_owned()))
        })
        .collect()
}

/// Runs events through `t`, each as its own chunk; the client's bytes.
pub(crate) fn run(t: &mut dyn ApiEvents, events: &[(String, String)], seen: &mut Seen) -> Vec<u8> {
    let mut out = Vec::new();
    let now = Instant::now();
    for (name, data) in events {
        let ev = if name.is_empty() {
            format!("data: {data}\n\n")
        } else {
            format!("event: {name}\ndata: {data}\n\n")
        };
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

fn ev(v: Value) -> (String, String) {
    (v["type"].as_str().unwrap().to_owned(), v.to_string())
}

/// What llama.cpp sends for reasoning then text (its partial and final results, by its
/// source): the reasoning item stays open until the end, with no content part.
pub(crate) fn llamacpp_reasoning_stream() -> Vec<(String, String)> {
    let r = json!({"id": "resp_1", "object": "response", "status": "in_progress"});
    vec![
        ev(json!({"type": "response.created", "response": r})),
        ev(json!({"type": "response.in_progress", "response": r})),
        ev(
            json!({"type": "response.output_item.added", "item": {"id": "rs_1", "summary": [],
            "type": "reasoning", "content": [], "encrypted_content": "", "status": "in_progress"}}),
        ),
        ev(json!({"type": "response.reasoning_text.delta", "delta": "plan", "item_id": "rs_1"})),
        ev(
            json!({"type": "response.output_item.added", "item": {"content": [], "id": "msg_1",
            "role": "assistant", "status": "in_progress", "type": "message"}}),
        ),
        ev(
            json!({"type": "response.content_part.added", "item_id": "msg_1",
            "part": {"type": "output_text", "text": ""}}),
        ),
        ev(json!({"type": "response.output_text.delta", "item_id": "msg_1", "delta": "hi"})),
        ev(
            json!({"type": "response.output_item.done", "item": {"id": "rs_1", "summary": [],
            "type": "reasoning", "content": [{"text": "plan", "type": "reasoning_text"}],
            "encrypted_content": ""}}),
        ),
        ev(json!({"type": "response.output_text.done", "item_id": "msg_1", "text": "hi"})),
        ev(
            json!({"type": "response.content_part.done", "item_id": "msg_1", "part": {
            "type": "output_text", "annotations": [], "logprobs": [], "text": "hi"}}),
        ),
        ev(
            json!({"type": "response.output_item.done", "item": {"type": "message",
            "status": "completed", "id": "msg_1", "content": [{"type": "output_text",
            "annotations": [], "logprobs": [], "text": "hi"}], "role": "assistant"}}),
        ),
        ev(
            json!({"type": "response.completed", "response": {"id": "resp_1", "object": "response",
            "created_at": 1, "status": "completed", "model": "tiny-qwen3", "output": [],
            "usage": {"input_tokens": 9, "output_tokens": 4, "total_tokens": 13}},
            "timings": {"prompt_per_second": 3998.0, "predicted_per_second": 715.9}}),
        ),
    ]
}

/// The order the specification (and vLLM) has for reasoning then text.
pub(crate) const REASONING_THEN_TEXT: &[&str] = &[
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.reasoning_text.delta",
    "response.reasoning_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
];

#[test]
fn the_real_llama_server_stream_is_repaired_to_the_specification() {
    let capture = include_str!("../../../../../tests/fixtures/responses_stream_llamacpp.txt");
    let mut seen = Seen::default();
    let out = spec::parse_sse(&run(
        &mut ResponsesStream::new(None, "alias"),
        &events_of(capture),
        &mut seen,
    ));
    spec::check_responses(&out).unwrap();
    assert_eq!(out.len(), events_of(capture).len());
    let done = &out.last().unwrap().1["response"];
    assert_eq!(done["output"][0]["content"][0]["text"], "mvstice_tacYLES");
    assert_eq!(done["id"], "resp_1Fh4utKrGAWZH7w5voye5zOEBmK6SM8Y");
    assert_eq!(out[0].1["response"]["model"], "alias");
    let u = seen.usage.unwrap();
    assert_eq!((u.prompt, u.completion), (9, 4));
    assert!(u.decode_tps.is_some());
    assert!(seen.first_content.is_some());
}

#[test]
fn a_reasoning_item_is_closed_before_the_message_begins() {
    let mut seen = Seen::default();
    let bytes = run(
        &mut ResponsesStream::new(None, "m"),
        &llamacpp_reasoning_stream(),
        &mut seen,
    );
    let out = spec::parse_sse(&bytes);
    spec::check_responses(&out).unwrap();
    assert_eq!(spec::types(&out), REASONING_THEN_TEXT);
    let done = &out.last().unwrap().1["response"]["output"];
    assert_eq!(done[0]["content"][0]["text"], "plan");
    assert_eq!(done[0]["status"], "completed");
    assert_eq!(done[1]["content"][0]["text"], "hi");
    assert!(seen.first_token.is_some());
}

#[test]
fn think_tags_become_a_reasoning_item_across_chunk_boundaries() {
    let tags = Arc::new(ThinkTags::preset("qwen3").unwrap());
    let r = json!({"id": "resp_2", "object": "response", "status": "in_progress"});
    let mut events = vec![
        ev(json!({"type": "response.created", "response": r})),
        ev(
            json!({"type": "response.output_item.added", "item": {"content": [], "id": "msg_2",
            "role": "assistant", "status": "in_progress", "type": "message"}}),
        ),
        ev(
            json!({"type": "response.content_part.added", "item_id": "msg_2",
            "part": {"type": "output_text", "text": ""}}),
        ),
    ];
    for piece in ["<thi", "nk>pl", "an</th", "ink>the", " answer"] {
        events.push(ev(
            json!({"type": "response.output_text.delta", "item_id": "msg_2", "delta": piece}),
        ));
    }
    let full = "<think>plan</think>the answer";
    events.push(ev(
        json!({"type": "response.output_text.done", "item_id": "msg_2", "text": full}),
    ));
    events.push(ev(
        json!({"type": "response.output_item.done", "item": {"type": "message",
        "id": "msg_2", "content": [{"type": "output_text", "text": full}], "role": "assistant"}}),
    ));
    events.push(ev(
        json!({"type": "response.completed", "response": {"id": "resp_2", "status": "completed",
        "usage": {"input_tokens": 3, "output_tokens": 5}}}),
    ));
    let mut seen = Seen::default();
    let out = spec::parse_sse(&run(
        &mut ResponsesStream::new(Some(tags), "m"),
        &events,
        &mut seen,
    ));
    spec::check_responses(&out).unwrap();
    let mut want: Vec<&str> = REASONING_THEN_TEXT.to_vec();
    want.remove(1); // this backend sent no response.in_progress
    let got = spec::types(&out);
    let squeezed: Vec<&str> = got.iter().map(String::as_str).fold(Vec::new(), |mut v, t| {
        if !(t.ends_with(".delta") && v.last() == Some(&t)) {
            v.push(t);
        }
        v
    });
    assert_eq!(squeezed, want);
    let output = &out.last().unwrap().1["response"]["output"];
    assert_eq!(output[0]["type"], "reasoning");
    assert_eq!(output[0]["id"], "rs_2");
    assert_eq!(output[0]["content"][0]["text"], "plan");
    assert_eq!(output[1]["id"], "msg_2");
    assert_eq!(output[1]["content"][0]["text"], "the answer");
}

#[test]
fn function_call_arguments_are_closed_and_errors_are_the_apis_error_event() {
    let r = json!({"id": "resp_3", "object": "response", "status": "in_progress"});
    let events = vec![
        ev(json!({"type": "response.created", "response": r})),
        ev(
            json!({"type": "response.output_item.added", "item": {"id": "fc_a", "arguments": "",
            "call_id": "call_a", "name": "get_weather", "type": "function_call", "status": "in_progress"}}),
        ),
        ev(
            json!({"type": "response.function_call_arguments.delta", "delta": "{\"city\":", "item_id": "fc_a"}),
        ),
        ev(
            json!({"type": "response.function_call_arguments.delta", "delta": "\"Oslo\"}", "item_id": "fc_a"}),
        ),
        ev(
            json!({"type": "response.output_item.done", "item": {"id": "fc_a", "type": "function_call",
            "status": "completed", "arguments": "{\"city\":\"Oslo\"}", "call_id": "call_a", "name": "get_weather"}}),
        ),
        // llama.cpp's error inside a Responses stream: a chat-style data line.
        (
            "".to_owned(),
            r#"{"error":{"code":500,"message":"boom","type":"server_error"}}"#.to_owned(),
        ),
    ];
    let mut seen = Seen::default();
    let out = spec::parse_sse(&run(
        &mut ResponsesStream::new(None, "m"),
        &events,
        &mut seen,
    ));
    spec::check_responses(&out).unwrap();
    let types = spec::types(&out);
    assert_eq!(
        types[2..],
        [
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "error",
            "response.failed"
        ]
    );
    assert_eq!(out[4].1["arguments"], "{\"city\":\"Oslo\"}");
    assert_eq!(out[6].1["code"], "server_error");
    assert_eq!(out[6].1["message"], "boom");
    assert_eq!(out[7].1["response"]["status"], "failed");
    assert!(seen.error.is_some());
}

#[test]
fn a_broken_stream_ends_with_the_error_event() {
    let mut s = ResponsesStream::new(None, "m");
    let mut seen = Seen::default();
    let first = llamacpp_reasoning_stream();
    let mut out = run_until(&mut s, &first[..4], &mut seen);
    let e = ProxyError::UpstreamProtocol {
        backend: "b".into(),
        detail: "stream broken: reset".into(),
    };
    out.extend_from_slice(&s.broken(&e, &mut seen));
    let out = spec::parse_sse(&out);
    spec::check_responses(&out).unwrap();
    let (name, err) = &out[out.len() - 2];
    assert_eq!(name, "error");
    assert_eq!(err["code"], "bad_gateway");
    assert_eq!(out.last().unwrap().0, "response.failed");
}

fn run_until(t: &mut ResponsesStream, events: &[(String, String)], seen: &mut Seen) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, data) in events {
        let ev = format!("event: {name}\ndata: {data}\n\n");
        if let Action::Replace(b) = t.event(ev.as_bytes(), Instant::now(), seen) {
            out.extend_from_slice(&b);
        }
    }
    out
}
