//! The context guard through the real server — exact boundaries, OpenAI's 400 before any
//! byte reaches the backend, canonical backend errors, fallback and clamping.
use crate::common;

use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::types::chat::{
    ChatCompletionRequestUserMessageArgs, CreateChatCompletionRequestArgs,
};
use common::*;
use serde_json::{json, Value};
use switchboard_sim::SimConfig;
use switchboard_wire::flavor::Flavor;

const FLAVORS: [Flavor; 3] = [Flavor::Llamacpp, Flavor::Vllm, Flavor::Sglang];

fn sim_cfg(flavor: Flavor) -> SimConfig {
    SimConfig {
        flavor,
        model: "up-model".into(),
        slot_ctx: 100_000,
        ..SimConfig::default()
    }
}

fn request(max_tokens: Option<u32>, stream: bool) -> Value {
    let mut v = json!({
        "model": "a",
        "messages": [
            {"role": "system", "content": "You are terse and precise."},
            {"role": "user", "content": "Name three rivers of Europe, longest first, one per line please."}
        ],
        "stream": stream,
    });
    if let Some(m) = max_tokens {
        v["max_tokens"] = json!(m);
    }
    v
}

/// A proxy whose alias `a` has `window` and counts with the backend's own tokenizer endpoint.
async fn guarded(flavor: Flavor, url: &str, window: u32, extra: &str) -> Proxy {
    let count = if extra.contains("count =") {
        ""
    } else {
        "count = \"backend\""
    };
    let toml = format!(
        r#"
[backends.b]
url = "{url}"
flavor = "{flavor}"
slots = 8
[aliases.a]
backend = "b"
upstream_model = "up-model"
context_window = {window}
{count}
{extra}
"#
    );
    proxy(&toml, &[]).await
}

/// The prompt count as the proxy's `/tokenize` reports it (the backend's own count).
async fn count(p: &Proxy) -> u32 {
    let v: Value = client()
        .post(p.url("/tokenize"))
        .json(&request(None, false))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["method"], "backend", "{v}");
    v["count"].as_u64().unwrap() as u32
}

fn chat_posts(sim: &switchboard_sim::Sim) -> usize {
    sim.recorder()
        .requests()
        .iter()
        .filter(|r| r.path == "/v1/chat/completions")
        .count()
}

async fn context_error(resp: reqwest::Response) -> Value {
    assert_eq!(resp.status(), 400);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    let v: Value = resp.json().await.unwrap();
    let e = v["error"].clone();
    assert_eq!(e["type"], "invalid_request_error", "{v}");
    assert_eq!(e["param"], "messages", "{v}");
    assert_eq!(e["code"], "context_length_exceeded", "{v}");
    e
}

#[tokio::test]
async fn exactly_at_the_window_passes_one_token_over_is_rejected() {
    for flavor in FLAVORS {
        let sim = sim(sim_cfg(flavor)).await;
        let n = count(&guarded(flavor, &sim.url(), 100_000, "").await).await;
        assert!(n > 10, "{flavor}: {n}");
        let c = client();

        // With max_tokens: prompt + output may equal the window.
        let fits = guarded(flavor, &sim.url(), n + 4, "").await;
        let r = fits.post_chat(&c, &request(Some(4), false)).await;
        assert_eq!(r.status(), 200, "{flavor}");
        let before = chat_posts(&sim);
        let over = guarded(flavor, &sim.url(), n + 3, "").await;
        let r = over.post_chat(&c, &request(Some(4), false)).await;
        let e = context_error(r).await;
        assert_eq!(
            e["message"],
            format!("This model's maximum context length is {} tokens. However, you requested {} tokens ({n} in the messages, 4 in the completion). Please reduce the length of the messages or completion.", n + 3, n + 4),
            "{flavor}"
        );
        assert_eq!(e["n_prompt_tokens"], n + 4);
        assert_eq!(e["n_ctx"], n + 3);
        assert_eq!(
            chat_posts(&sim),
            before,
            "{flavor}: the backend saw the rejected request"
        );

        // Without max_tokens: the prompt alone must stay below the window.
        let fits = guarded(flavor, &sim.url(), n + 1, "").await;
        let r = fits.post_chat(&c, &request(None, false)).await;
        assert_eq!(r.status(), 200, "{flavor}");
        let over = guarded(flavor, &sim.url(), n, "").await;
        let r = over.post_chat(&c, &request(None, false)).await;
        let e = context_error(r).await;
        assert_eq!(
            e["message"],
            format!("This model's maximum context length is {n} tokens. However, your messages resulted in {n} tokens. Please reduce the length of the messages."),
        );
        let m = over.metrics().await;
        assert_eq!(
            sample(
                &m,
                r#"switchboard_context_rejections_total{alias="a",method="backend"}"#
            ),
            1.0
        );
    }
}

#[tokio::test]
async fn stream_requests_get_the_400_before_any_sse_byte() {
    let sim = sim(sim_cfg(Flavor::Llamacpp)).await;
    let p = guarded(Flavor::Llamacpp, &sim.url(), 12, "").await;
    let r = p.post_chat(&client(), &request(Some(100), true)).await;
    assert_ne!(r.headers()["content-type"], "text/event-stream");
    context_error(r).await;
    assert_eq!(chat_posts(&sim), 0);
}

#[tokio::test]
async fn async_openai_surfaces_context_length_exceeded() {
    let sim = sim(sim_cfg(Flavor::Vllm)).await;
    let p = guarded(Flavor::Vllm, &sim.url(), 12, "").await;
    let client = async_openai::Client::with_config(
        OpenAIConfig::new()
            .with_api_base(p.url("/v1"))
            .with_api_key("sk-test"),
    );
    let req = CreateChatCompletionRequestArgs::default()
        .model("a")
        .max_tokens(100u32)
        .messages([ChatCompletionRequestUserMessageArgs::default()
            .content("a question long enough to overflow a tiny window")
            .build()
            .unwrap()
            .into()])
        .build()
        .unwrap();
    match within("chat", client.chat().create(req)).await.unwrap_err() {
        OpenAIError::ApiError(e) => {
            assert_eq!(e.status_code.as_u16(), 400);
            assert_eq!(e.api_error.code.as_deref(), Some("context_length_exceeded"));
            assert_eq!(e.api_error.param.as_deref(), Some("messages"));
            assert!(e
                .api_error
                .message
                .contains("maximum context length is 12 tokens"));
        }
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn backend_context_errors_are_canonicalised() {
    // No window configured at the proxy: the backend's own error is what comes back, rewritten.
    for flavor in FLAVORS {
        let sim = sim(SimConfig {
            slot_ctx: 10,
            ..sim_cfg(flavor)
        })
        .await;
        let p = proxy(
            &one_alias(flavor.as_str(), "", "").replace("context_window = 4096", ""),
            &[("b", sim.url())],
        )
        .await;
        for stream in [false, true] {
            let r = p.post_chat(&client(), &request(Some(4), stream)).await;
            assert_eq!(r.status(), 400, "{flavor} stream={stream}");
            let e = context_error(r).await;
            let msg = e["message"].as_str().unwrap();
            assert!(
                msg.starts_with("This model's maximum context length is 10 tokens."),
                "{flavor} stream={stream}: {msg}"
            );
        }
        let m = p.metrics().await;
        assert_eq!(
            sample(
                &m,
                r#"switchboard_context_rejections_total{alias="a",method="backend"}"#
            ),
            2.0,
            "{flavor}"
        );
    }
}

/// SGLang puts its context error inside a 200 stream; the proxy reads its first event before
/// answering. That was decided by the alias's first replica, so an SGLang replica behind a
/// replica of another flavour had its error relayed as a 200 stream.
#[tokio::test]
async fn a_stream_context_error_of_an_sglang_replica_is_a_400_whichever_replica_is_first() {
    let sim = sim(SimConfig {
        slot_ctx: 10,
        ..sim_cfg(Flavor::Sglang)
    })
    .await;
    // The first replica, a llama.cpp one, refuses connections: the request goes to the second.
    let toml = format!(
        r#"
[backends.first]
url = "http://127.0.0.1:1"
flavor = "llamacpp"
[backends.sglang]
url = "{}"
flavor = "sglang"
[aliases.a]
backends = ["first", "sglang"]
upstream_model = "up-model"
"#,
        sim.url()
    );
    let p = proxy(&toml, &[]).await;
    let r = p.post_chat(&client(), &request(Some(4), true)).await;
    let e = context_error(r).await;
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.starts_with("This model's maximum context length is 10 tokens."),
        "{msg}"
    );
}

#[tokio::test]
async fn over_window_requests_go_to_the_fallback_alias() {
    let small = sim(sim_cfg(Flavor::Llamacpp)).await;
    let big = sim(SimConfig {
        model: "big-model".into(),
        ..sim_cfg(Flavor::Vllm)
    })
    .await;
    let toml = r#"
[backends.small]
url = "{small}"
flavor = "llamacpp"
[backends.big]
url = "{big}"
flavor = "vllm"
[aliases.a]
backend = "small"
upstream_model = "up-model"
context_window = 12
count = "backend"
context_fallback = "huge"
[aliases.huge]
backend = "big"
upstream_model = "big-model"
context_window = 100000
count = "backend"
"#;
    let p = proxy(toml, &[("small", small.url()), ("big", big.url())]).await;
    let r = p.post_chat(&client(), &request(Some(4), false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-switchboard-alias"], "huge");
    assert_eq!(chat_posts(&small), 0);
    let seen: Value = serde_json::from_slice(&big.recorder().last().unwrap().body).unwrap();
    assert_eq!(seen["model"], "big-model");
    // A request that fits stays on its own alias.
    let mut tiny = request(Some(1), false);
    tiny["messages"] = json!([{"role": "user", "content": "hi"}]);
    let r = p.post_chat(&client(), &tiny).await;
    assert_eq!(r.headers()["x-switchboard-alias"], "a");
}

#[tokio::test]
async fn clamp_lowers_max_tokens_when_the_prompt_fits() {
    let sim = sim(sim_cfg(Flavor::Sglang)).await;
    let n = count(&guarded(Flavor::Sglang, &sim.url(), 100_000, "").await).await;
    let p = guarded(
        Flavor::Sglang,
        &sim.url(),
        n + 10,
        "clamp_max_tokens = true",
    )
    .await;
    for key in ["max_tokens", "max_completion_tokens"] {
        let mut body = request(None, false);
        body[key] = json!(1000);
        let r = p.post_chat(&client(), &body).await;
        assert_eq!(r.status(), 200);
        let seen: Value = serde_json::from_slice(&sim.recorder().last().unwrap().body).unwrap();
        assert_eq!(seen[key], 10, "{key}");
    }
    // A prompt that alone fills the window is still rejected.
    let p = guarded(Flavor::Sglang, &sim.url(), n, "clamp_max_tokens = true").await;
    let r = p.post_chat(&client(), &request(Some(5), false)).await;
    context_error(r).await;
}

#[tokio::test]
async fn local_tokenizer_count_through_the_server_matches_llama_server() {
    // `single_user` of tests/fixtures/conversations.json: llama-server reported 13 prompt tokens.
    let sim = sim(sim_cfg(Flavor::Llamacpp)).await;
    let dir = env!("CARGO_MANIFEST_DIR");
    let extra = format!(
        "count = \"local\"\ntokenizer = {{ file = \"{dir}/tests/fixtures/qwen3/tokenizer.json.gz\", config = \"{dir}/tests/fixtures/qwen3/tokenizer_config.json.gz\" }}"
    );
    let p = guarded(Flavor::Llamacpp, &sim.url(), 13, &extra).await;
    let body = json!({"model": "a", "messages": [{"role": "user", "content": "Hello! Say hi."}]});
    let v: Value = client()
        .post(p.url("/tokenize"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        v,
        json!({"count": 13, "max_model_len": 13, "method": "local"})
    );
    let r = p.post_chat(&client(), &body).await;
    let e = context_error(r).await;
    assert_eq!(e["n_prompt_tokens"], 13);
    let v: Value = client()
        .post(p.url("/v1/messages/count_tokens"))
        .json(&json!({"model": "a", "max_tokens": 5, "messages": [{"role": "user", "content": "Hello! Say hi."}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v, json!({"input_tokens": 13}));
    let m = p.metrics().await;
    assert_eq!(
        sample(
            &m,
            r#"switchboard_context_rejections_total{alias="a",method="local"}"#
        ),
        1.0
    );
}

/// Regression: a chat template whose work grows with the conversation (here quadratic in its
/// messages) rendered for as long as it took; past its render budget the request gets its
/// API's 400, and the backend sees nothing.
#[tokio::test]
async fn a_template_past_its_render_budget_is_a_clear_400() {
    let sim = sim(sim_cfg(Flavor::Llamacpp)).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("tokenizer_config.json");
    let template = "{% for m in messages %}{% for n in messages %}{% for k in range(1000) %}{% endfor %}{% endfor %}{{ m.content }}{% endfor %}";
    std::fs::write(&cfg, json!({ "chat_template": template }).to_string()).unwrap();
    let fx = env!("CARGO_MANIFEST_DIR");
    let extra = format!(
        "count = \"local\"\ntokenizer = {{ file = \"{fx}/tests/fixtures/qwen3/tokenizer.json.gz\", config = \"{}\" }}",
        cfg.display()
    );
    // The free bound (about 1 KiB + 64 bytes a message) cannot clear 200 messages in 10,000
    // tokens, so they are counted: 200 × 200 × 1000 loop turns, over the 10,000,000 steps
    // allowed.
    let p = guarded(Flavor::Llamacpp, &sim.url(), 10_000, &extra).await;
    let messages: Vec<Value> = (0..200)
        .map(|_| json!({"role": "user", "content": "hi"}))
        .collect();
    let body = json!({"model": "a", "messages": messages, "max_tokens": 4});
    let r = p.post_chat(&client(), &body).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    // Its steps (10,000,000) run out first, or on a loaded machine its time (5 s): either is
    // the render budget (each is held to its own in the template's unit tests).
    assert!(
        message.contains("the chat template exceeded its render budget (10000000 steps)")
            || message.contains("the chat template exceeded its render budget (5 s)"),
        "{v}"
    );
    assert_eq!(chat_posts(&sim), 0);
    let m = p.metrics().await;
    assert_eq!(
        sample(&m, r#"switchboard_inflight_requests{alias="a"}"#),
        0.0
    );
}
