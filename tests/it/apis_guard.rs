//! The context guard, clamping, fallback and counting endpoints on Anthropic
//! Messages and OpenAI Responses through the real server, and the translation of both to chat
//! completions for a backend that serves only chat.
use crate::common;

use crate::conversation_gen;

use common::*;
use serde_json::{json, Value};
use switchboard_sim::{Sim, SimConfig};
use switchboard_wire::flavor::Flavor;

fn sim_cfg(flavor: Flavor) -> SimConfig {
    SimConfig {
        flavor,
        model: "up-model".into(),
        slot_ctx: 100_000,
        ..SimConfig::default()
    }
}

/// The Qwen3 tokenizer of the fixtures, as a `tokenizer = {…}` value.
fn tokenizer() -> String {
    let f = conversation_gen::files();
    format!(
        "tokenizer = {{ file = {:?}, config = {:?} }}",
        f.file.display().to_string(),
        f.config.display().to_string()
    )
}

/// Alias `a` on backend `b` (`flavor`) with `window` and `extra` alias keys.
fn config(flavor: &str, window: u32, extra: &str) -> String {
    common::toml::Fleet::new()
        .backend("b", flavor)
        .slots(8)
        .alias("a", "b")
        .model("up-model")
        .window(window)
        .text(extra)
        .render()
}

async fn local_proxy(sim: &Sim, window: u32, extra: &str) -> Proxy {
    let extra = format!("{}\n{extra}", tokenizer());
    proxy(&config("llamacpp", window, &extra), &[("b", sim.url())]).await
}

fn messages(max_tokens: u32, stream: bool) -> Value {
    json!({
        "model": "a",
        "max_tokens": max_tokens,
        "stream": stream,
        "system": [{"type": "text", "text": "You are terse and precise."}],
        "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Call the tool.", "signature": "s"},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}
            ]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "3C, snow"}]}
        ],
        "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    })
}

fn responses(max_output_tokens: u32, stream: bool) -> Value {
    json!({
        "model": "a",
        "max_output_tokens": max_output_tokens,
        "stream": stream,
        "instructions": "You are terse and precise.",
        "input": [
            {"type": "message", "role": "user", "content": "Weather in Oslo?"},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "3C, snow"}
        ],
        "tools": [{"type": "function", "name": "get_weather", "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    })
}

async fn post(p: &Proxy, path: &str, body: &Value) -> (u16, String, Value) {
    let r = within("answer", client().post(p.url(path)).json(body).send())
        .await
        .unwrap();
    let status = r.status().as_u16();
    let ct = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let text = r.text().await.unwrap();
    let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, ct, v)
}

/// The proxy's exact count of `body` on its counting endpoint for `path`'s API.
async fn counted(p: &Proxy, path: &str, body: &Value) -> u32 {
    let (status, _, v) = post(p, path, body).await;
    assert_eq!(status, 200, "{v}");
    v["input_tokens"].as_u64().unwrap() as u32
}

#[tokio::test]
async fn messages_over_the_window_get_anthropics_400_before_the_backend() {
    let sim = sim(sim_cfg(Flavor::Llamacpp)).await;
    let probe = local_proxy(&sim, 100_000, "").await;
    let n = counted(&probe, "/v1/messages/count_tokens", &messages(1, false)).await;
    assert!(n > 100, "{n}");
    // The prompt fits, the prompt plus max_tokens does not.
    let p = local_proxy(&sim, n + 10, "").await;
    for stream in [false, true] {
        let (status, ct, v) = post(&p, "/v1/messages", &messages(11, stream)).await;
        assert_eq!(status, 400, "{v}");
        assert!(ct.starts_with("application/json"), "no SSE byte: {ct}");
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(
            v["error"]["message"],
            format!(
                "input length and `max_tokens` exceed context limit: {n} + 11 > {}, decrease input length or `max_tokens` and try again",
                n + 10
            )
        );
    }
    // The prompt alone does not fit.
    let p = local_proxy(&sim, 64, "").await;
    for stream in [false, true] {
        let (status, _, v) = post(&p, "/v1/messages", &messages(10, stream)).await;
        assert_eq!(status, 400, "{v}");
        assert_eq!(
            v["error"]["message"],
            format!("prompt is too long: {n} tokens > 64 maximum")
        );
    }
    assert_eq!(sim.recorder().received(), 0, "nothing reached the backend");
    // What fits goes through, with the backend's answer.
    let p = local_proxy(&sim, n + 10, "").await;
    let (status, _, v) = post(&p, "/v1/messages", &messages(10, false)).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["type"], "message");
    assert_eq!(sim.recorder().last().unwrap().path, "/v1/messages");
}

#[tokio::test]
async fn responses_over_the_window_get_openais_context_length_exceeded() {
    let sim = sim(sim_cfg(Flavor::Llamacpp)).await;
    let probe = local_proxy(&sim, 100_000, "").await;
    let n = counted(&probe, "/v1/responses/input_tokens", &responses(1, false)).await;
    let p = local_proxy(&sim, n + 10, "").await;
    for stream in [false, true] {
        let (status, ct, v) = post(&p, "/v1/responses", &responses(11, stream)).await;
        assert_eq!(status, 400, "{v}");
        assert!(ct.starts_with("application/json"), "{ct}");
        assert_eq!(v["error"]["code"], "context_length_exceeded");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains(&format!("maximum context length is {} tokens", n + 10))
                && msg.contains(&format!("({n} in the messages, 11 in the completion)")),
            "{msg}"
        );
    }
    assert_eq!(sim.recorder().received(), 0);
    let (status, _, v) = post(&p, "/v1/responses", &responses(10, false)).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "response");
}

#[tokio::test]
async fn clamp_lowers_each_apis_own_limit() {
    let sim = sim(sim_cfg(Flavor::Llamacpp)).await;
    let probe = local_proxy(&sim, 100_000, "").await;
    let nm = counted(&probe, "/v1/messages/count_tokens", &messages(1, false)).await;
    let nr = counted(&probe, "/v1/responses/input_tokens", &responses(1, false)).await;
    let window = nm.max(nr) + 20;
    let p = local_proxy(&sim, window, "clamp_max_tokens = true").await;
    let (status, _, v) = post(&p, "/v1/messages", &messages(5000, false)).await;
    assert_eq!(status, 200, "{v}");
    let sent: Value = serde_json::from_slice(&sim.recorder().last().unwrap().body).unwrap();
    assert_eq!(sent["max_tokens"], window - nm);
    let (status, _, v) = post(&p, "/v1/responses", &responses(5000, false)).await;
    assert_eq!(status, 200, "{v}");
    let sent: Value = serde_json::from_slice(&sim.recorder().last().unwrap().body).unwrap();
    assert_eq!(sent["max_output_tokens"], window - nr);
    assert!(sent.get("max_tokens").is_none());
}

#[tokio::test]
async fn context_fallback_serves_both_apis_from_the_larger_alias() {
    let small = sim(sim_cfg(Flavor::Llamacpp)).await;
    let big = sim(sim_cfg(Flavor::Llamacpp)).await;
    let toml = format!(
        r#"
[backends.b]
url = "{{b}}"
flavor = "llamacpp"
[backends.big]
url = "{{big}}"
flavor = "llamacpp"
[aliases.a]
backend = "b"
upstream_model = "up-model"
context_window = 64
context_fallback = "large"
{tok}
[aliases.large]
backend = "big"
upstream_model = "up-model"
context_window = 100000
{tok}
"#,
        tok = tokenizer()
    );
    let p = proxy(&toml, &[("b", small.url()), ("big", big.url())]).await;
    let (status, _, v) = post(&p, "/v1/messages", &messages(10, false)).await;
    assert_eq!(status, 200, "{v}");
    let (status, _, v) = post(&p, "/v1/responses", &responses(10, false)).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(small.recorder().received(), 0);
    let paths: Vec<String> = big
        .recorder()
        .requests()
        .into_iter()
        .map(|r| r.path)
        .collect();
    assert_eq!(paths, ["/v1/messages", "/v1/responses"]);
}

/// The counting endpoints give the count the real llama-server gave for recorded requests.
#[tokio::test]
async fn count_tokens_and_input_tokens_equal_the_real_servers_counts() {
    let sim = sim(sim_cfg(Flavor::Llamacpp)).await;
    let p = local_proxy(&sim, 100_000, "").await;
    for (kind, path) in [
        ("messages", "/v1/messages/count_tokens"),
        ("responses", "/v1/responses/input_tokens"),
    ] {
        let raw = std::fs::read(conversation_gen::fixtures().join(format!("recorded_{kind}.json")))
            .unwrap();
        let v: Value = serde_json::from_slice(&raw).unwrap();
        let mut checked = 0;
        for rec in v["records"].as_array().unwrap() {
            let Some(want) = rec["llamacpp_count"].as_u64() else {
                continue;
            };
            let mut body = rec["body"].clone();
            body["model"] = json!("a");
            let (status, _, got) = post(&p, path, &body).await;
            assert_eq!(status, 200, "{}: {got}", rec["name"]);
            assert_eq!(got["input_tokens"], want, "{}", rec["name"]);
            if kind == "responses" {
                assert_eq!(got["object"], "response.input_tokens");
            }
            checked += 1;
        }
        assert!(checked >= 20, "{kind}: {checked}");
    }
    assert_eq!(sim.recorder().received(), 0, "counted locally");
}

#[tokio::test]
async fn backend_counting_asks_the_backends_endpoints_on_both_apis() {
    let sim = sim(sim_cfg(Flavor::Llamacpp)).await;
    let p = proxy(
        &config("llamacpp", 100_000, "count = \"backend\""),
        &[("b", sim.url())],
    )
    .await;
    // The counting endpoints are the backend's own.
    let nm = counted(&p, "/v1/messages/count_tokens", &messages(1, false)).await;
    let nr = counted(&p, "/v1/responses/input_tokens", &responses(1, false)).await;
    let paths: Vec<String> = sim
        .recorder()
        .requests()
        .into_iter()
        .map(|r| r.path)
        .collect();
    assert_eq!(
        paths,
        ["/v1/messages/count_tokens", "/v1/responses/input_tokens"]
    );
    let sent: Value = serde_json::from_slice(&sim.recorder().last().unwrap().body).unwrap();
    assert_eq!(sent["model"], "up-model");
    // The guard counts the chat form with the backend's tokenize endpoints: the same numbers.
    let over = proxy(
        &config("llamacpp", nm + 5, "count = \"backend\""),
        &[("b", sim.url())],
    )
    .await;
    let (status, _, v) = post(&over, "/v1/messages", &messages(10, false)).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(
        v["error"]["message"],
        format!(
            "input length and `max_tokens` exceed context limit: {nm} + 10 > {}, decrease input length or `max_tokens` and try again",
            nm + 5
        )
    );
    let over = proxy(
        &config("llamacpp", nr + 5, "count = \"backend\""),
        &[("b", sim.url())],
    )
    .await;
    let (status, _, v) = post(&over, "/v1/responses", &responses(10, false)).await;
    assert_eq!(status, 400, "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains(&format!("({nr} in the messages, 10 in the completion)")));
    let paths: Vec<String> = sim
        .recorder()
        .requests()
        .into_iter()
        .map(|r| r.path)
        .collect();
    assert!(
        !paths
            .iter()
            .any(|p| p == "/v1/messages" || p == "/v1/responses"),
        "{paths:?}"
    );
}

/// A backend context error on these endpoints reaches the client in its API's words.
#[tokio::test]
async fn backend_context_errors_are_canonicalised_per_api() {
    let mut cfg = sim_cfg(Flavor::Llamacpp);
    cfg.slot_ctx = 32;
    let sim = sim(cfg).await;
    let p = proxy(&one_alias("llamacpp", "", ""), &[("b", sim.url())]).await;
    let (status, _, v) = post(&p, "/v1/messages", &dict_model(messages(10, false))).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["type"], "error");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with("prompt is too long: ") && msg.ends_with(" tokens > 32 maximum"),
        "{msg}"
    );
    let (status, _, v) = post(&p, "/v1/responses", &dict_model(responses(10, false))).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "context_length_exceeded");
}

fn dict_model(mut v: Value) -> Value {
    v["model"] = json!("a");
    v
}

/// A chat-only backend (`flavor = "openai"`, or `apis = ["chat"]`) gets Messages and Responses
/// requests as chat completions.
#[tokio::test]
async fn chat_only_backends_receive_translated_chat_requests() {
    let openai = sim(sim_cfg(Flavor::Openai)).await;
    let p = proxy(&config("openai", 100_000, ""), &[("b", openai.url())]).await;
    let (status, _, v) = post(&p, "/v1/messages", &messages(10, false)).await;
    assert_eq!(status, 200, "{v}");
    let got = openai.recorder().last().unwrap();
    assert_eq!(got.path, "/v1/chat/completions");
    let sent: Value = serde_json::from_slice(&got.body).unwrap();
    assert_eq!(
        sent,
        json!({
            "model": "up-model",
            "messages": [
                {"role": "system", "content": "You are terse and precise."},
                {"role": "user", "content": "Weather in Oslo?"},
                {"role": "assistant", "content": null,
                 "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}],
                 "reasoning": "Call the tool."},
                {"role": "tool", "tool_call_id": "toolu_1", "content": "3C, snow"}
            ],
            "max_tokens": 10,
            "stream": false,
            "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
        })
    );
    // A llama.cpp backend configured as chat-only: Responses translated, reasoning in its field.
    let llama = sim(sim_cfg(Flavor::Llamacpp)).await;
    let p = proxy(
        &config("llamacpp", 100_000, "").replace("slots = 8", "slots = 8\napis = [\"chat\"]"),
        &[("b", llama.url())],
    )
    .await;
    let mut req = responses(10, true);
    req["input"].as_array_mut().unwrap().insert(
        1,
        json!({"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Call it."}]}),
    );
    let r = within(
        "answer",
        client().post(p.url("/v1/responses")).json(&req).send(),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let got = llama.recorder().last().unwrap();
    assert_eq!(got.path, "/v1/chat/completions");
    let sent: Value = serde_json::from_slice(&got.body).unwrap();
    assert_eq!(
        sent["messages"][0],
        json!({"role": "system", "content": "You are terse and precise."})
    );
    assert_eq!(sent["messages"][2]["reasoning_content"], "Call it.");
    assert_eq!(sent["messages"][2]["tool_calls"][0]["id"], "c1");
    assert_eq!(
        sent["messages"][3],
        json!({"role": "tool", "tool_call_id": "c1", "content": "3C, snow"})
    );
    assert_eq!(sent["max_tokens"], 10);
    assert_eq!(sent["stream_options"], json!({"include_usage": true}));
    assert_eq!(sent["tools"][0]["function"]["name"], "get_weather");
}

/// The guard counts a translated request as the chat request it became.
#[tokio::test]
async fn translated_requests_are_guarded_as_chat() {
    let openai = sim(sim_cfg(Flavor::Openai)).await;
    let extra = tokenizer();
    let p = proxy(&config("openai", 64, &extra), &[("b", openai.url())]).await;
    let (status, _, v) = post(&p, "/v1/messages", &messages(10, true)).await;
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("prompt is too long: "),
        "{v}"
    );
    assert_eq!(openai.recorder().received(), 0);
}
