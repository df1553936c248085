//! The Messages and Responses APIs through the proxy, against the simulator of each flavour:
//! streams to the specification, usage and first tokens in the metrics, think tags as
//! thinking blocks and reasoning items, mid-stream failures as each API's error event.
use crate::common;

use std::time::Duration;

use common::spec::{check_messages, check_responses, parse_sse, types};
use common::*;
use serde_json::{json, Value};
use switchboard_sim::SimConfig;
use switchboard_wire::flavor::Flavor;

fn sim_cfg(flavor: Flavor) -> SimConfig {
    SimConfig {
        flavor,
        model: "up-model".into(),
        reasoning: true,
        reasoning_tokens: 3,
        completion_tokens: 6,
        // Tokens a little apart, so that decode speed has a span to be measured over.
        token_delay: Duration::from_millis(1),
        ..SimConfig::default()
    }
}

fn messages_body(stream: bool) -> Value {
    json!({"model": "a", "max_tokens": 6, "stream": stream, "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi there"}]}]})
}

fn responses_body(stream: bool) -> Value {
    json!({"model": "a", "max_output_tokens": 6, "stream": stream, "instructions": "Be brief.",
        "input": [{"type": "message", "role": "user", "content": "hi there"}]})
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

/// The usage a Messages answer or stream reported: (prompt, completion).
fn messages_usage(whole: Option<&Value>, events: &[(String, Value)]) -> (u64, u64) {
    let sum = |u: &Value| {
        [
            "input_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
        ]
        .iter()
        .map(|k| u[*k].as_u64().unwrap_or(0))
        .sum::<u64>()
    };
    if let Some(w) = whole {
        return (
            sum(&w["usage"]),
            w["usage"]["output_tokens"].as_u64().unwrap(),
        );
    }
    let start = &events[0].1["message"]["usage"];
    let delta = &events.iter().find(|(n, _)| n == "message_delta").unwrap().1["usage"];
    let prompt = if delta["input_tokens"].is_u64() {
        sum(delta)
    } else {
        sum(start)
    };
    (prompt, delta["output_tokens"].as_u64().unwrap())
}

#[tokio::test]
async fn messages_usage_and_first_tokens_are_counted_streamed_and_not() {
    for flavor in [Flavor::Llamacpp, Flavor::Vllm, Flavor::Sglang] {
        let sim = sim(sim_cfg(flavor)).await;
        let p = proxy(&one_alias(flavor.as_str(), "", ""), &[("b", sim.url())]).await;
        let (mut prompt, mut completion) = (0, 0);
        for stream in [false, true, true] {
            let (status, bytes) = post(&p, "/v1/messages", &messages_body(stream)).await;
            assert_eq!(status, 200, "{flavor}: {}", String::from_utf8_lossy(&bytes));
            let (pr, co) = if stream {
                let events = parse_sse(&bytes);
                check_messages(&events).unwrap_or_else(|e| panic!("{flavor}: {e}"));
                messages_usage(None, &events)
            } else {
                messages_usage(Some(&serde_json::from_slice(&bytes).unwrap()), &[])
            };
            assert!(pr > 0 && co > 0, "{flavor}");
            prompt += pr;
            completion += co;
        }
        let m = p.metrics().await;
        let get = |name: &str| sample(&m, &format!("switchboard_{name}{{alias=\"a\"}}"));
        assert_eq!(get("prompt_tokens_total"), prompt as f64, "{flavor}");
        assert_eq!(
            get("completion_tokens_total"),
            completion as f64,
            "{flavor}"
        );
        assert_eq!(get("time_to_first_token_seconds_count"), 2.0, "{flavor}");
        assert_eq!(get("time_to_first_content_seconds_count"), 2.0, "{flavor}");
        assert_eq!(get("decode_tokens_per_second_count"), 2.0, "{flavor}");
    }
}

#[tokio::test]
async fn responses_usage_and_first_tokens_are_counted_streamed_and_not() {
    for flavor in [Flavor::Llamacpp, Flavor::Vllm] {
        let sim = sim(sim_cfg(flavor)).await;
        let p = proxy(&one_alias(flavor.as_str(), "", ""), &[("b", sim.url())]).await;
        let (mut prompt, mut completion, mut reasoning) = (0, 0, 0);
        for stream in [false, true] {
            let (status, bytes) = post(&p, "/v1/responses", &responses_body(stream)).await;
            assert_eq!(status, 200, "{flavor}: {}", String::from_utf8_lossy(&bytes));
            let r = if stream {
                let events = parse_sse(&bytes);
                check_responses(&events).unwrap_or_else(|e| panic!("{flavor}: {e}"));
                events.last().unwrap().1["response"].clone()
            } else {
                serde_json::from_slice::<Value>(&bytes).unwrap()
            };
            prompt += r["usage"]["input_tokens"].as_u64().unwrap();
            completion += r["usage"]["output_tokens"].as_u64().unwrap();
            reasoning += r["usage"]["output_tokens_details"]["reasoning_tokens"]
                .as_u64()
                .unwrap_or(0);
        }
        let m = p.metrics().await;
        let get = |name: &str| sample(&m, &format!("switchboard_{name}{{alias=\"a\"}}"));
        assert!(prompt > 0 && completion > 0);
        assert_eq!(get("prompt_tokens_total"), prompt as f64, "{flavor}");
        assert_eq!(
            get("completion_tokens_total"),
            completion as f64,
            "{flavor}"
        );
        assert_eq!(get("reasoning_tokens_total"), reasoning as f64, "{flavor}");
        assert_eq!(get("time_to_first_token_seconds_count"), 1.0, "{flavor}");
        assert_eq!(get("prefill_tokens_per_second_count"), 1.0, "{flavor}");
    }
}

/// llama.cpp's own Responses stream fails the specification; through the proxy it passes.
#[tokio::test]
async fn the_repaired_llamacpp_responses_stream_is_consistent() {
    let sim = sim(sim_cfg(Flavor::Llamacpp)).await;
    let raw = client()
        .post(format!("{}/v1/responses", sim.url()))
        .json(&responses_body(true))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert!(
        check_responses(&parse_sse(&raw)).is_err(),
        "the backend's own stream"
    );
    let p = proxy(&one_alias("llamacpp", "", ""), &[("b", sim.url())]).await;
    let (_, bytes) = post(&p, "/v1/responses", &responses_body(true)).await;
    let events = parse_sse(&bytes);
    check_responses(&events).unwrap();
    let squeezed: Vec<String> = types(&events).into_iter().fold(Vec::new(), |mut v, t| {
        if !(t.ends_with(".delta") && v.last() == Some(&t)) {
            v.push(t);
        }
        v
    });
    assert_eq!(
        squeezed,
        [
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
            "response.completed"
        ]
    );
}

/// A backend without a reasoning parser leaves `<think>…</think>` in the text; with
/// `think_tags` the client gets thinking blocks and reasoning items, whether a tag arrives in
/// an event of its own or cut across two.
#[tokio::test]
async fn think_tags_become_thinking_blocks_and_reasoning_items() {
    let sim = sim(SimConfig {
        think_tags_in_content: true,
        ..sim_cfg(Flavor::Llamacpp)
    })
    .await;
    let alias = one_alias("llamacpp", "", "think_tags = \"qwen3\"");
    let p = proxy(&alias, &[("b", sim.url())]).await;
    let body = |mut b: Value| {
        b["max_tokens"] = json!(8);
        b["max_output_tokens"] = json!(8);
        b
    };
    let (_, bytes) = post(&p, "/v1/messages", &body(messages_body(true))).await;
    let events = parse_sse(&bytes);
    check_messages(&events).unwrap();
    let text = |key: &str| -> String {
        let kind = format!("{key}_delta");
        events
            .iter()
            .filter(|(_, v)| v["delta"]["type"] == kind.as_str())
            .map(|(_, v)| v["delta"][key].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(text("thinking"), "think0 think1 think2 ");
    assert_eq!(text("text"), "word0 word1 word2 ");
    let (_, bytes) = post(&p, "/v1/messages", &body(messages_body(false))).await;
    let whole: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(whole["content"][0]["thinking"], "think0 think1 think2 ");
    assert_eq!(whole["content"][1]["text"], "word0 word1 word2 ");

    let (_, bytes) = post(&p, "/v1/responses", &body(responses_body(true))).await;
    let events = parse_sse(&bytes);
    check_responses(&events).unwrap();
    let output = &events.last().unwrap().1["response"]["output"];
    assert_eq!(output[0]["type"], "reasoning");
    assert_eq!(output[0]["content"][0]["text"], "think0 think1 think2 ");
    assert_eq!(output[1]["content"][0]["text"], "word0 word1 word2 ");
    let (_, bytes) = post(&p, "/v1/responses", &body(responses_body(false))).await;
    let whole: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        whole["output"][0]["content"][0]["text"],
        "think0 think1 think2 "
    );
    assert_eq!(
        whole["output"][1]["content"][0]["text"],
        "word0 word1 word2 "
    );
}

#[tokio::test]
async fn a_mid_stream_failure_is_each_apis_error_event() {
    let sim = sim(SimConfig {
        fail_after: Some(3),
        token_delay: Duration::from_millis(2),
        ..sim_cfg(Flavor::Llamacpp)
    })
    .await;
    let p = proxy(&one_alias("llamacpp", "", ""), &[("b", sim.url())]).await;
    let (_, bytes) = post(&p, "/v1/messages", &messages_body(true)).await;
    let events = parse_sse(&bytes);
    let (name, last) = events.last().unwrap();
    assert_eq!(name, "error", "{}", String::from_utf8_lossy(&bytes));
    assert_eq!(last["type"], "error");
    assert_eq!(last["error"]["type"], "api_error");
    assert!(last["error"]["message"]
        .as_str()
        .unwrap()
        .contains("stream broken"));
    assert_eq!(events[0].0, "message_start");

    let (_, bytes) = post(&p, "/v1/responses", &responses_body(true)).await;
    let events = parse_sse(&bytes);
    check_responses(&events).unwrap();
    let n = events.len();
    assert_eq!(events[n - 2].0, "error");
    assert_eq!(events[n - 2].1["code"], "bad_gateway");
    assert_eq!(events[n - 1].0, "response.failed");
    assert_eq!(events[n - 1].1["response"]["status"], "failed");

    let m = p.metrics().await;
    assert_eq!(
        sample(
            &m,
            r#"switchboard_upstream_errors_total{alias="a",reason="stream_broken"}"#
        ),
        2.0
    );
}

/// Chat usage the proxy asked for is counted and kept from a client that did not ask; the
/// other APIs always carry their usage (their specifications have no way to leave it out).
#[tokio::test]
async fn usage_asked_of_the_backend_is_hidden_from_a_chat_client() {
    let sim = sim(sim_cfg(Flavor::Llamacpp)).await;
    let p = proxy(&one_alias("llamacpp", "", ""), &[("b", sim.url())]).await;
    let r = p.post_chat(&client(), &chat("a", true)).await;
    let events = sse_payloads(r).await;
    assert!(
        events.iter().all(|e| !e.contains("\"usage\"")),
        "{events:?}"
    );
    let recorded = sim.recorder().last().unwrap();
    let sent: Value = serde_json::from_slice(&recorded.body).unwrap();
    assert_eq!(sent["stream_options"]["include_usage"], true);
    let m = p.metrics().await;
    assert!(sample(&m, r#"switchboard_completion_tokens_total{alias="a"}"#) > 0.0);
}

/// The simulator speaks each flavour's own shapes: llama.cpp's Messages stream closes its
/// thinking block late and its Responses stream lacks the specification's fields; vLLM's are
/// to the specification; SGLang streams no thinking; a chat-only server has neither API.
#[tokio::test]
async fn the_simulator_speaks_each_flavours_messages_and_responses() {
    let raw = |flavor: Flavor, path: &'static str, body: Value| async move {
        let sim = sim(sim_cfg(flavor)).await;
        let r = client()
            .post(format!("{}{path}", sim.url()))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, parse_sse(&r.bytes().await.unwrap()))
    };
    let (_, llama) = raw(Flavor::Llamacpp, "/v1/messages", messages_body(true)).await;
    assert!(check_messages(&llama).is_err());
    let (_, vllm) = raw(Flavor::Vllm, "/v1/messages", messages_body(true)).await;
    check_messages(&vllm).unwrap();
    let (_, sglang) = raw(Flavor::Sglang, "/v1/messages", messages_body(true)).await;
    check_messages(&sglang).unwrap();
    assert!(sglang
        .iter()
        .all(|(_, v)| v["content_block"]["type"] != "thinking"));
    assert_eq!(sglang[0].1["message"]["usage"]["input_tokens"], 0);
    let (_, llama) = raw(Flavor::Llamacpp, "/v1/responses", responses_body(true)).await;
    assert!(llama
        .iter()
        .all(|(_, v)| v.get("sequence_number").is_none()));
    let (_, vllm) = raw(Flavor::Vllm, "/v1/responses", responses_body(true)).await;
    check_responses(&vllm).unwrap();
    let (status, _) = raw(Flavor::Openai, "/v1/messages", messages_body(true)).await;
    assert_eq!(status, 404);
}

/// A chat-only backend serves both APIs by translation: the request reaches it as a chat
/// completion, the answer comes back in the client's API (whole, and streamed to the
/// specification in the native stream's event order), its usage in the metrics.
#[tokio::test]
async fn a_chat_only_backend_serves_both_apis_by_translation() {
    let native = sim(sim_cfg(Flavor::Llamacpp)).await;
    let chat_only = sim(sim_cfg(Flavor::Openai)).await;
    let n = proxy(&one_alias("llamacpp", "", ""), &[("b", native.url())]).await;
    let p = proxy(&one_alias("openai", "", ""), &[("b", chat_only.url())]).await;
    let squeeze = |events: &[(String, Value)]| {
        types(events).into_iter().fold(Vec::new(), |mut v, t| {
            if !(t.ends_with("delta") && v.last() == Some(&t)) {
                v.push(t);
            }
            v
        })
    };
    let (mut prompt, mut completion) = (0, 0);
    for stream in [false, true] {
        let (status, bytes) = post(&p, "/v1/messages", &messages_body(stream)).await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
        assert_eq!(
            chat_only.recorder().last().unwrap().path,
            "/v1/chat/completions"
        );
        let (pr, co) = if stream {
            let events = parse_sse(&bytes);
            check_messages(&events).unwrap();
            let (_, own) = post(&n, "/v1/messages", &messages_body(true)).await;
            assert_eq!(squeeze(&events), squeeze(&parse_sse(&own)));
            messages_usage(None, &events)
        } else {
            let whole: Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(whole["type"], "message");
            assert_eq!(whole["content"][0]["type"], "thinking");
            assert_eq!(whole["content"][1]["text"], "word0 word1 word2 ");
            messages_usage(Some(&whole), &[])
        };
        prompt += pr;
        completion += co;

        let (status, bytes) = post(&p, "/v1/responses", &responses_body(stream)).await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
        let r = if stream {
            let events = parse_sse(&bytes);
            check_responses(&events).unwrap();
            let (_, own) = post(&n, "/v1/responses", &responses_body(true)).await;
            assert_eq!(squeeze(&events), squeeze(&parse_sse(&own)));
            events.last().unwrap().1["response"].clone()
        } else {
            serde_json::from_slice::<Value>(&bytes).unwrap()
        };
        assert_eq!(r["object"], "response");
        assert_eq!(r["output"].as_array().unwrap().len(), 2, "{r}");
        prompt += r["usage"]["input_tokens"].as_u64().unwrap();
        completion += r["usage"]["output_tokens"].as_u64().unwrap();
    }
    let m = p.metrics().await;
    let get = |name: &str| sample(&m, &format!("switchboard_{name}{{alias=\"a\"}}"));
    assert!(prompt > 0 && completion > 0);
    assert_eq!(get("prompt_tokens_total"), prompt as f64);
    assert_eq!(get("completion_tokens_total"), completion as f64);
    assert_eq!(get("time_to_first_token_seconds_count"), 2.0);
}

/// Replicas of one alias may differ in what they serve: a Messages request that the native
/// replica did not take goes to the chat-only one translated, and comes back as Messages.
#[tokio::test]
async fn a_chat_only_replica_gets_the_request_translated() {
    let chat_only = sim(sim_cfg(Flavor::Openai)).await;
    let toml = r#"
[backends.b]
url = "{b}"
flavor = "llamacpp"
[backends.c]
url = "{c}"
flavor = "openai"
[aliases.a]
backends = ["b", "c"]
upstream_model = "up-model"
context_window = 4096
"#;
    let p = proxy(toml, &[("b", dead_url().await), ("c", chat_only.url())]).await;
    for _ in 0..2 {
        let (status, bytes) = post(&p, "/v1/messages", &messages_body(false)).await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
        let whole: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(whole["type"], "message", "{whole}");
    }
    let got = chat_only.recorder().requests();
    assert!(!got.is_empty());
    assert!(got.iter().all(|r| r.path == "/v1/chat/completions"));
    let sent: Value = serde_json::from_slice(&got[0].body).unwrap();
    assert_eq!(sent["messages"][0]["role"], "system");
}
