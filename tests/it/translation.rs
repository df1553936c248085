//! Answers of a chat-only backend translated into Messages and Responses through the real
//! proxy, against a raw loopback backend that sends exactly the chat answer a test chooses:
//! a tool call continued after text, whole answers that are not chat completions, events
//! that cannot be read.
use crate::common;

use common::spec::{check_messages, check_responses, parse_sse, types};
use common::*;
use serde_json::{json, Value};

/// A backend that answers every request with `body` under `content_type`, then closes.
async fn answering(content_type: &str, body: Vec<u8>) -> String {
    let mut answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    answer.extend(body);
    raw_backend(answer, false).await.url
}

/// A chat stream of choice-0 `deltas`, finished with `finish`, as SSE bytes.
fn chat_sse(deltas: &[Value], finish: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let chunk = |choice: Value| {
        json!({"id": "chatcmpl-t", "object": "chat.completion.chunk", "created": 1,
            "model": "up-model", "choices": [choice]})
    };
    for d in deltas {
        let c = chunk(json!({"index": 0, "delta": d, "finish_reason": null}));
        out.extend(format!("data: {c}\n\n").into_bytes());
    }
    let c = chunk(json!({"index": 0, "delta": {}, "finish_reason": finish}));
    out.extend(format!("data: {c}\n\ndata: [DONE]\n\n").into_bytes());
    out
}

fn call(index: u64, id: Option<&str>, name: Option<&str>, args: &str) -> Value {
    let mut f = json!({"arguments": args});
    if let Some(n) = name {
        f["name"] = json!(n);
    }
    let mut c = json!({"index": index, "type": "function", "function": f});
    if let Some(id) = id {
        c["id"] = json!(id);
    }
    json!({"tool_calls": [c]})
}

/// A proxy whose alias `a` is on a chat-only backend at `url`.
async fn chat_only(url: String) -> Proxy {
    proxy(&one_alias("openai", "", ""), &[("b", url)]).await
}

async fn post(p: &Proxy, path: &str, body: &Value) -> (u16, Vec<u8>) {
    let r = within("the answer", client().post(p.url(path)).json(body).send())
        .await
        .unwrap();
    let status = r.status().as_u16();
    (
        status,
        within("the body", r.bytes()).await.unwrap().to_vec(),
    )
}

fn messages_body(stream: bool) -> Value {
    json!({"model": "a", "max_tokens": 50, "stream": stream,
        "messages": [{"role": "user", "content": "weather?"}]})
}

fn responses_body(stream: bool) -> Value {
    json!({"model": "a", "max_output_tokens": 50, "stream": stream, "input": "weather?"})
}

#[tokio::test]
async fn a_tool_call_continued_after_text_reaches_its_own_block_and_item() {
    let sse = chat_sse(
        &[
            json!({"content": "Let me look. "}),
            call(0, Some("c0"), Some("get_weather"), "{\"city\":"),
            json!({"content": "One moment."}),
            call(0, None, None, "\"Paris\"}"),
            call(1, None, Some("get_time"), "{}"),
        ],
        "tool_calls",
    );
    let p = chat_only(answering("text/event-stream", sse).await).await;

    let (status, bytes) = post(&p, "/v1/messages", &messages_body(true)).await;
    assert_eq!(status, 200);
    let events = parse_sse(&bytes);
    check_messages(&events).unwrap();
    let mut blocks: Vec<(Value, String)> = Vec::new();
    for (name, v) in &events {
        match name.as_str() {
            "content_block_start" => blocks.push((v["content_block"].clone(), String::new())),
            "content_block_delta" => {
                let (block, text) = blocks.last_mut().unwrap();
                let d = &v["delta"];
                let want = if block["type"] == "tool_use" {
                    "input_json_delta"
                } else {
                    "text_delta"
                };
                assert_eq!(d["type"], want, "{v}");
                text.push_str(d["partial_json"].as_str().or(d["text"].as_str()).unwrap());
            }
            _ => {}
        }
    }
    let tools: Vec<_> = blocks
        .iter()
        .filter(|(b, _)| b["type"] == "tool_use")
        .collect();
    assert_eq!(tools.len(), 2, "{blocks:?}");
    assert_eq!(tools[0].0["id"], "c0");
    assert_eq!(tools[0].1, r#"{"city":"Paris"}"#);
    assert_eq!(tools[1].0["name"], "get_time");
    assert!(tools[1].0["id"].as_str().unwrap().starts_with("toolu_"));
    assert_eq!(tools[1].1, "{}");
    let text: String = blocks
        .iter()
        .filter(|(b, _)| b["type"] == "text")
        .map(|(_, t)| t.as_str())
        .collect();
    assert_eq!(text, "Let me look. One moment.");
    let stop = events.iter().find(|(n, _)| n == "message_delta").unwrap();
    assert_eq!(stop.1["delta"]["stop_reason"], "tool_use");

    let (status, bytes) = post(&p, "/v1/responses", &responses_body(true)).await;
    assert_eq!(status, 200);
    let events = parse_sse(&bytes);
    check_responses(&events).unwrap();
    for (name, v) in &events {
        if name.starts_with("response.function_call_arguments.") {
            let i = v["output_index"].as_u64().unwrap() as usize;
            let added = events
                .iter()
                .filter(|(n, _)| n == "response.output_item.added")
                .nth(i)
                .unwrap();
            assert_eq!(added.1["item"]["type"], "function_call", "{v}");
            assert_eq!(v["item_id"], added.1["item"]["id"]);
        }
    }
    let (name, done) = events.last().unwrap();
    assert_eq!(name, "response.completed");
    let calls: Vec<&Value> = done["response"]["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "function_call")
        .collect();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0]["call_id"], "c0");
    assert_eq!(calls[0]["arguments"], r#"{"city":"Paris"}"#);
    assert!(calls[1]["call_id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(calls[1]["arguments"], "{}");
}

#[tokio::test]
async fn a_whole_answer_that_is_not_a_chat_completion_is_a_502_in_each_apis_envelope() {
    for body in [
        r#"{"id":"chatcmpl-t","object":"chat.completion","choices":[]}"#,
        "null",
        r#"{"id":"chatcmpl-t","object":"chat.completion","choices":[{"index":0,"finish_reason":"stop"}]}"#,
    ] {
        let p = chat_only(answering("application/json", body.into()).await).await;
        let (status, bytes) = post(&p, "/v1/messages", &messages_body(false)).await;
        assert_eq!(status, 502, "{body}");
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], "api_error");
        assert!(v["error"]["message"].as_str().unwrap().contains("choice 0"));

        let (status, bytes) = post(&p, "/v1/responses", &responses_body(false)).await;
        assert_eq!(status, 502, "{body}");
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["error"]["code"], "bad_gateway", "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("choice 0"));
        assert!(v.get("choices").is_none());

        let m = p.metrics().await;
        let protocol = r#"switchboard_upstream_errors_total{alias="a",reason="protocol"}"#;
        assert_eq!(sample(&m, protocol), 2.0);
    }
}

#[tokio::test]
async fn an_unreadable_event_is_each_apis_error_event() {
    let start = chat_sse(
        &[call(0, Some("c0"), Some("get_weather"), "{\"city\":")],
        "x",
    );
    // The first event only: the call begun.
    let start = &start[..start.windows(2).position(|w| w == b"\n\n").unwrap() + 2];
    let bad: [&[u8]; 3] = [
        b"data: {\"choices\":[{\"index\":0,\"delta\":\n\n",
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\\ud800\\\"}\"}}]}}]}\n\n",
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\xff\\\"}\"}}]}}]}\n\n",
    ];
    for ev in bad {
        let mut sse = start.to_vec();
        sse.extend_from_slice(ev);
        sse.extend(chat_sse(&[], "tool_calls"));
        let p = chat_only(answering("text/event-stream", sse).await).await;

        let (status, bytes) = post(&p, "/v1/messages", &messages_body(true)).await;
        assert_eq!(status, 200);
        let events = parse_sse(&bytes);
        check_messages(&events).unwrap();
        let (name, last) = events.last().unwrap();
        assert_eq!(name, "error", "{:?}", types(&events));
        assert_eq!(last["error"]["type"], "api_error");
        assert!(!types(&events).contains(&"message_delta".to_owned()));

        let (status, bytes) = post(&p, "/v1/responses", &responses_body(true)).await;
        assert_eq!(status, 200);
        let events = parse_sse(&bytes);
        check_responses(&events).unwrap();
        let names = types(&events);
        assert_eq!(
            names[names.len() - 2..],
            ["error", "response.failed"],
            "{names:?}"
        );
        assert!(!names.contains(&"response.completed".to_owned()));
    }
}
