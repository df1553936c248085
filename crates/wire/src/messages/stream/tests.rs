//! Tests of the Messages stream repair.

use super::*;

/// Runs `events` (`(name, data)`) through a fresh repair; the client's events as
/// `(name, data)`, each name checked against its data's `type`.
pub(crate) fn run(
    s: &mut dyn ApiEvents,
    events: &[(&str, &str)],
    seen: &mut Seen,
) -> Vec<(String, Value)> {
    let mut bytes = Vec::new();
    let now = Instant::now();
    for (name, data) in events {
        let ev = format!("event: {name}\ndata: {data}\n\n");
        match s.event(ev.as_bytes(), now, seen) {
            Action::Keep => bytes.extend_from_slice(ev.as_bytes()),
            Action::Drop => {}
            Action::Replace(b) => bytes.extend_from_slice(&b),
        }
    }
    if let Some(tail) = s.end(seen) {
        bytes.extend_from_slice(&tail);
    }
    parse(&bytes)
}

pub(crate) fn parse(bytes: &[u8]) -> Vec<(String, Value)> {
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let name = e
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .unwrap_or("")
                .to_owned();
            let data = e.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
            let v: Value = serde_json::from_str(data).unwrap();
            assert_eq!(v["type"], name.as_str(), "{e}");
            (name, v)
        })
        .collect()
}

/// The spec's order: one block at a time, indices 0, 1, … in order, thinking signed.
pub(crate) fn assert_blocks_in_order(events: &[(String, Value)]) {
    assert_eq!(events.first().map(|e| e.0.as_str()), Some("message_start"));
    assert_eq!(events.last().map(|e| e.0.as_str()), Some("message_stop"));
    let mut open: Option<(u64, String, bool)> = None;
    let mut next = 0;
    for (name, v) in events {
        let index = v["index"].as_u64();
        match name.as_str() {
            "content_block_start" => {
                assert!(open.is_none(), "a block starts while another is open");
                assert_eq!(index, Some(next));
                let kind = v["content_block"]["type"].as_str().unwrap().to_owned();
                open = Some((next, kind, false));
                next += 1;
            }
            "content_block_delta" => {
                let (i, _, signed) = open.as_mut().expect("a delta outside a block");
                assert_eq!(index, Some(*i));
                *signed |= v["delta"]["type"] == "signature_delta";
            }
            "content_block_stop" => {
                let (i, kind, signed) = open.take().expect("a stop outside a block");
                assert_eq!(index, Some(i));
                assert!(
                    kind != "thinking" || signed,
                    "a thinking block stops unsigned"
                );
            }
            "message_delta" | "message_stop" => assert!(open.is_none()),
            _ => {}
        }
    }
}

fn types(events: &[(String, Value)]) -> Vec<String> {
    events
        .iter()
        .map(|(n, v)| match v["delta"]["type"].as_str() {
            Some(d) if n == "content_block_delta" => format!("{n}:{d}"),
            _ => match v["content_block"]["type"].as_str() {
                Some(b) => format!("{n}:{b}"),
                None => n.clone(),
            },
        })
        .collect()
}

const START: &str = r#"{"type":"message_start","message":{"id":"chatcmpl-Guc","type":"message","role":"assistant","content":[],"model":"tiny-qwen3","stop_reason":null,"stop_sequence":null,"usage":{"cache_read_input_tokens":1,"input_tokens":8,"output_tokens":0}}}"#;

/// What llama.cpp sends for a thinking answer (its `to_json_anthropic` partials and final):
/// the thinking block is signed and stopped only at the end, after the text block's deltas.
const LLAMACPP_THINKING: &[(&str, &str)] = &[
    ("message_start", START),
    (
        "content_block_start",
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}"#,
    ),
    (
        "content_block_delta",
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"plan"}}"#,
    ),
    (
        "content_block_start",
        r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#,
    ),
    (
        "content_block_delta",
        r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"hi"}}"#,
    ),
    (
        "content_block_delta",
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":""}}"#,
    ),
    (
        "content_block_stop",
        r#"{"type":"content_block_stop","index":0}"#,
    ),
    (
        "content_block_stop",
        r#"{"type":"content_block_stop","index":1}"#,
    ),
    (
        "message_delta",
        r#"{"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},"usage":{"output_tokens":4}}"#,
    ),
    ("message_stop", r#"{"type":"message_stop"}"#),
];

#[test]
fn llamacpp_thinking_block_is_stopped_before_the_text_block_starts() {
    let mut seen = Seen::default();
    let out = run(&mut MessagesStream::new(None), LLAMACPP_THINKING, &mut seen);
    assert_blocks_in_order(&out);
    assert_eq!(
        types(&out),
        [
            "message_start",
            "content_block_start:thinking",
            "content_block_delta:thinking_delta",
            "content_block_delta:signature_delta",
            "content_block_stop",
            "content_block_start:text",
            "content_block_delta:text_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(out[1].1["content_block"]["signature"], "");
    let u = seen.usage.unwrap();
    assert_eq!((u.prompt, u.completion), (9, 4));
    assert!(seen.first_token.is_some() && seen.first_content.is_some());
}

/// The real llama-server's stream (`messages_02_stream`) is already in order: it passes
/// with the same events.
#[test]
fn a_stream_in_order_keeps_its_events() {
    let capture = include_str!("../../../../../tests/fixtures/messages_stream_llamacpp.txt");
    let events: Vec<(&str, &str)> = capture
        .split("\n\n")
        .filter_map(|e| {
            let name = e.lines().find_map(|l| l.strip_prefix("event: "))?;
            let data = e.lines().find_map(|l| l.strip_prefix("data: "))?;
            Some((name, data))
        })
        .collect();
    let mut seen = Seen::default();
    let out = run(&mut MessagesStream::new(None), &events, &mut seen);
    assert_blocks_in_order(&out);
    assert_eq!(out.len(), events.len());
    for ((name, v), (n, d)) in out.iter().zip(&events) {
        assert_eq!(name, n);
        assert_eq!(v, &serde_json::from_str::<Value>(d).unwrap());
    }
    assert_eq!(seen.usage.map(|u| (u.prompt, u.completion)), Some((9, 4)));
}

#[test]
fn think_tags_become_a_thinking_block_across_chunk_boundaries() {
    let tags = Arc::new(ThinkTags::preset("qwen3").unwrap());
    let text = |t: &str| {
        json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":t}})
            .to_string()
    };
    let pieces = ["<thi", "nk>pla", "n</th", "ink>the ", "answer<"];
    let deltas: Vec<String> = pieces.iter().map(|p| text(p)).collect();
    let mut events = vec![
        ("message_start", START),
        (
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        ),
    ];
    events.extend(deltas.iter().map(|d| ("content_block_delta", d.as_str())));
    events.extend_from_slice(&LLAMACPP_THINKING[7..]);
    let mut seen = Seen::default();
    let out = run(&mut MessagesStream::new(Some(tags)), &events, &mut seen);
    assert_blocks_in_order(&out);
    let text_of = |kind: &str, key: &str| -> String {
        out.iter()
            .filter(|(_, v)| v["delta"]["type"] == kind)
            .map(|(_, v)| v["delta"][key].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(text_of("thinking_delta", "thinking"), "plan");
    assert_eq!(text_of("text_delta", "text"), "the answer<");
    assert_eq!(out[1].1["content_block"]["type"], "thinking");
}

#[test]
fn tool_use_starts_with_input_and_errors_come_in_anthropics_envelope() {
    let events = [
        ("message_start", START),
        (
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t1","name":"get_weather"}}"#,
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"city\":"}}"#,
        ),
        (
            "error",
            r#"{"code":500,"message":"boom","type":"server_error"}"#,
        ),
    ];
    let mut seen = Seen::default();
    let out = run(&mut MessagesStream::new(None), &events, &mut seen);
    assert_eq!(out[1].1["content_block"]["input"], json!({}));
    let (name, err) = &out[3];
    assert_eq!(name, "error");
    assert_eq!(
        err,
        &json!({"type":"error","error":{"type":"api_error","message":"boom"}})
    );
    // The error ends the stream: nothing more is added when the backend's stream ends.
    assert_eq!(out.len(), 4);
    assert!(seen.error.is_some());
}
