//! Requests shaped per alias (defaults, stripped fields, the output cap, inputs
//! enforced, legacy images) as the backend receives them, and a backend that writes spaced
//! JSON counted and relayed like any other.
use crate::common;

use common::*;
use serde_json::{json, Value};
use switchboard_sim::{Sim, SimConfig};
use switchboard_wire::flavor::Flavor;

fn sim_cfg(flavor: Flavor) -> SimConfig {
    SimConfig {
        flavor,
        model: "up-model".into(),
        ..SimConfig::default()
    }
}

/// Aliases over one llama.cpp backend `b`: `think` and `nothink` (one model, two defaults),
/// `capped` (an output cap, stripped fields), `text` (text only), `seeing` (images),
/// `hearing` (images and audio).
const FLEET: &str = r#"
[backends.b]
url = "{b}"
flavor = "llamacpp"
slots = 8

[aliases.think]
backend = "b"
upstream_model = "up-model"
defaults = { temperature = 0.0, chat_template_kwargs = { enable_thinking = true } }

[aliases.nothink]
backend = "b"
upstream_model = "up-model"
defaults = { temperature = 0.6, top_k = 20, chat_template_kwargs = { enable_thinking = false } }

[aliases.capped]
backend = "b"
upstream_model = "up-model"
context_window = 4096
max_output_tokens = 1000
strip_params = ["logprobs", "parallel_tool_calls"]

[aliases.text]
backend = "b"
upstream_model = "up-model"

[aliases.seeing]
backend = "b"
upstream_model = "up-model"
inputs = ["text", "image"]

[aliases.hearing]
backend = "b"
upstream_model = "up-model"
inputs = ["text", "image", "audio"]
"#;

/// The fleet's backend, the proxy, and a client for it.
async fn fleet() -> (Sim, Fleet) {
    let sim = sim(sim_cfg(Flavor::Llamacpp)).await;
    let p = proxy(FLEET, &[("b", sim.url())]).await;
    (sim, Fleet { p, c: client() })
}

struct Fleet {
    p: Proxy,
    c: reqwest::Client,
}

/// POST `body` to `path`; the status and the answer's JSON (null when it is none).
async fn post(f: &Fleet, path: &str, body: &Value) -> (u16, Value) {
    let r = within("the answer", f.c.post(f.p.url(path)).json(body).send())
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = within("the body", r.text()).await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// The body of the last request the backend received.
fn received(sim: &Sim) -> Value {
    serde_json::from_slice(&sim.recorder().last().expect("a request").body).unwrap()
}

fn chat_to(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 4})
}

#[tokio::test]
async fn defaults_are_set_when_the_client_sends_none() {
    let (sim, p) = fleet().await;
    for (alias, temperature, thinking) in [("think", 0.0, true), ("nothink", 0.6, false)] {
        let (status, _) = post(&p, "/v1/chat/completions", &chat_to(alias)).await;
        assert_eq!(status, 200);
        let seen = received(&sim);
        assert_eq!(seen["model"], "up-model");
        assert_eq!(seen["temperature"], temperature, "{alias}: {seen}");
        assert_eq!(
            seen["chat_template_kwargs"],
            json!({"enable_thinking": thinking}),
            "{alias}"
        );
    }
    assert_eq!(received(&sim)["top_k"], 20);
    // An alias without defaults sends the request as it came.
    post(&p, "/v1/chat/completions", &chat_to("text")).await;
    let seen = received(&sim);
    assert!(seen.get("temperature").is_none() && seen.get("chat_template_kwargs").is_none());
}

#[tokio::test]
async fn defaults_leave_what_the_client_sent_and_fill_nested_gaps() {
    let (sim, p) = fleet().await;
    let mut body = chat_to("nothink");
    body["temperature"] = json!(1.2);
    body["chat_template_kwargs"] = json!({"enable_thinking": true});
    assert_eq!(post(&p, "/v1/chat/completions", &body).await.0, 200);
    let seen = received(&sim);
    assert_eq!(seen["temperature"], 1.2);
    assert_eq!(
        seen["chat_template_kwargs"],
        json!({"enable_thinking": true})
    );
    assert_eq!(seen["top_k"], 20);

    body["chat_template_kwargs"] = json!({"reasoning_budget": 64});
    body["temperature"] = Value::Null;
    assert_eq!(post(&p, "/v1/chat/completions", &body).await.0, 200);
    let seen = received(&sim);
    assert_eq!(seen["temperature"], 0.6);
    assert_eq!(
        seen["chat_template_kwargs"],
        json!({"reasoning_budget": 64, "enable_thinking": false})
    );
}

#[tokio::test]
async fn defaults_reach_every_api_that_has_the_field() {
    let (sim, p) = fleet().await;
    let requests = [
        (
            "/v1/completions",
            json!({"model": "nothink", "prompt": "Hi", "max_tokens": 2}),
        ),
        ("/v1/responses", json!({"model": "nothink", "input": "Hi"})),
        (
            "/v1/messages",
            json!({"model": "nothink", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}),
        ),
    ];
    for (path, body) in requests {
        post(&p, path, &body).await;
        let last = sim.recorder().last().unwrap();
        assert_eq!(last.path, path);
        let seen = received(&sim);
        assert_eq!(seen["temperature"], 0.6, "{path}");
        assert_eq!(
            seen["chat_template_kwargs"]["enable_thinking"], false,
            "{path}"
        );
    }
}

#[tokio::test]
async fn stripped_fields_never_reach_the_backend() {
    let (sim, p) = fleet().await;
    let mut body = chat_to("capped");
    body["logprobs"] = json!(true);
    body["parallel_tool_calls"] = json!(false);
    body["seed"] = json!(7);
    assert_eq!(post(&p, "/v1/chat/completions", &body).await.0, 200);
    let seen = received(&sim);
    assert!(seen.get("logprobs").is_none() && seen.get("parallel_tool_calls").is_none());
    assert_eq!(seen["seed"], 7);
    assert_eq!(seen["messages"], body["messages"]);
}

#[tokio::test]
async fn output_cap_is_applied_on_each_api() {
    let (sim, p) = fleet().await;
    let messages = json!([{"role": "user", "content": "Hi"}]);
    let cases = [
        (
            "/v1/chat/completions",
            json!({"model": "capped", "messages": messages, "max_tokens": 5000}),
            "max_tokens",
        ),
        (
            "/v1/chat/completions",
            json!({"model": "capped", "messages": messages, "max_completion_tokens": 3000}),
            "max_completion_tokens",
        ),
        (
            "/v1/chat/completions",
            json!({"model": "capped", "messages": messages}),
            "max_tokens",
        ),
        (
            "/v1/completions",
            json!({"model": "capped", "prompt": "Hi", "max_tokens": 2000}),
            "max_tokens",
        ),
        (
            "/v1/responses",
            json!({"model": "capped", "input": "Hi"}),
            "max_output_tokens",
        ),
        (
            "/v1/responses",
            json!({"model": "capped", "input": "Hi", "max_output_tokens": 1001}),
            "max_output_tokens",
        ),
        (
            "/v1/messages",
            json!({"model": "capped", "messages": messages, "max_tokens": 8192}),
            "max_tokens",
        ),
    ];
    for (path, body, limit) in cases {
        let before = sim.recorder().received();
        post(&p, path, &body).await;
        assert_eq!(sim.recorder().received(), before + 1, "{path} {body}");
        assert_eq!(received(&sim)[limit], 1000, "{path} {body}");
    }
    // A limit under the cap is left as it is.
    let body = json!({"model": "capped", "messages": messages, "max_tokens": 12});
    post(&p, "/v1/chat/completions", &body).await;
    assert_eq!(received(&sim)["max_tokens"], 12);
}

#[tokio::test]
async fn the_guard_counts_the_capped_request() {
    let sim = sim(sim_cfg(Flavor::Llamacpp)).await;
    let toml = one_alias("llamacpp", "", "max_output_tokens = 4000");
    let p = Fleet {
        p: proxy(&toml, &[("b", sim.url())]).await,
        c: client(),
    };
    // Without a limit this prompt fits the 4096-token window; the cap sets 4000 output
    // tokens, and prompt plus 4000 does not.
    let body =
        json!({"model": "a", "messages": [{"role": "user", "content": "word ".repeat(200)}]});
    let (status, err) = post(&p, "/v1/chat/completions", &body).await;
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["error"]["code"], "context_length_exceeded");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("4000 in the completion"),
        "{err}"
    );
    assert!(sim.recorder().requests().is_empty());
    // A short prompt fits with the cap, and goes out with it.
    let (status, _) = post(&p, "/v1/chat/completions", &chat_to("a")).await;
    assert_eq!(status, 200);
    assert_eq!(received(&sim)["max_tokens"], 4);
}

/// An image part and an audio part as each API writes them.
fn parts(path: &str, model: &str) -> [(&'static str, Value); 2] {
    match path {
        "/v1/chat/completions" => [
            (
                "image_url",
                json!({"model": model, "messages": [{"role": "user", "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo"}}]}]}),
            ),
            (
                "input_audio",
                json!({"model": model, "messages": [{"role": "user", "content": [
                {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}]}]}),
            ),
        ],
        "/v1/responses" => [
            (
                "input_image",
                json!({"model": model, "input": [{"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "what is this?"},
                {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo"}]}]}),
            ),
            (
                "input_audio",
                json!({"model": model, "input": [{"type": "message", "role": "user", "content": [
                {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}]}]}),
            ),
        ],
        _ => [
            (
                "image",
                json!({"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo"}}]}]}),
            ),
            (
                "image",
                json!({"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo"}}]}]}]}),
            ),
        ],
    }
}

/// The refusal in the envelope of the API of `path`: Anthropic's on Messages (no code or
/// param there), OpenAI's with `unsupported_input` and the param elsewhere.
fn assert_refusal(path: &str, err: &Value, param: &str) {
    if path == "/v1/messages" {
        assert_eq!(err["type"], "error", "{err}");
        assert_eq!(err["error"]["type"], "invalid_request_error", "{err}");
    } else {
        assert_eq!(err["error"]["code"], "unsupported_input", "{err}");
        assert_eq!(err["error"]["param"], param, "{err}");
    }
}

#[tokio::test]
async fn image_and_audio_parts_are_refused_per_alias_on_every_api() {
    let (sim, p) = fleet().await;
    for path in ["/v1/chat/completions", "/v1/responses", "/v1/messages"] {
        let param = if path == "/v1/responses" {
            "input"
        } else {
            "messages"
        };
        for (part, body) in parts(path, "text") {
            let (status, err) = post(&p, path, &body).await;
            assert_eq!(status, 400, "{path} {part}: {err}");
            assert_refusal(path, &err, param);
            let msg = err["error"]["message"].as_str().unwrap();
            assert!(msg.contains("model text") && msg.contains(part), "{msg}");
        }
        assert!(sim.recorder().requests().is_empty(), "{path}");
    }
    // `seeing` takes the image parts and refuses the audio one; `hearing` takes both.
    for path in ["/v1/chat/completions", "/v1/responses", "/v1/messages"] {
        let [(_, image), (part, other)] = parts(path, "seeing");
        let before = sim.recorder().received();
        post(&p, path, &image).await;
        assert_eq!(sim.recorder().received(), before + 1, "{path}");
        assert_eq!(received(&sim)["model"], "up-model");
        let (status, err) = post(&p, path, &other).await;
        if part == "input_audio" {
            assert_eq!(status, 400, "{path}: {err}");
            assert!(
                err["error"]["message"].as_str().unwrap().contains("audio"),
                "{err}"
            );
            assert_eq!(sim.recorder().received(), before + 1);
        } else {
            assert_eq!(sim.recorder().received(), before + 2, "{path}");
        }
        for (_, body) in parts(path, "hearing") {
            let before = sim.recorder().received();
            post(&p, path, &body).await;
            assert_eq!(sim.recorder().received(), before + 1, "{path}");
        }
    }
}

#[tokio::test]
async fn legacy_images_become_image_parts_of_the_last_user_message() {
    let (sim, p) = fleet().await;
    let body = json!({"model": "seeing", "max_tokens": 4, "images": ["iVBORw0KGgo", "https://example.invalid/cat.jpg"],
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is this?"}]});
    assert_eq!(post(&p, "/v1/chat/completions", &body).await.0, 200);
    let seen = received(&sim);
    assert!(seen.get("images").is_none(), "{seen}");
    assert_eq!(seen["messages"][0], body["messages"][0]);
    assert_eq!(
        seen["messages"][1],
        json!({"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo"}},
            {"type": "image_url", "image_url": {"url": "https://example.invalid/cat.jpg"}}]})
    );
    // Responses and Messages get their own part shapes.
    let responses = json!({"model": "seeing", "input": "what is this?", "images": ["/9j/4AAQ"]});
    post(&p, "/v1/responses", &responses).await;
    let seen = received(&sim);
    assert!(seen.get("images").is_none());
    assert_eq!(
        seen["input"],
        json!([{"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "what is this?"},
            {"type": "input_image", "image_url": "data:image/jpeg;base64,/9j/4AAQ", "detail": "auto"}]}])
    );
    let messages = json!({"model": "seeing", "max_tokens": 4, "images": ["iVBORw0KGgo"],
        "messages": [{"role": "user", "content": "what is this?"}]});
    post(&p, "/v1/messages", &messages).await;
    assert_eq!(
        received(&sim)["messages"][0]["content"][1],
        json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo"}})
    );
}

#[tokio::test]
async fn legacy_images_are_refused_for_an_alias_without_images() {
    let (sim, p) = fleet().await;
    let body = json!({"model": "text", "max_tokens": 4, "images": ["iVBORw0KGgo"],
        "messages": [{"role": "user", "content": "what is this?"}]});
    for path in ["/v1/chat/completions", "/v1/responses", "/v1/messages"] {
        let (status, err) = post(&p, path, &body).await;
        assert_eq!(status, 400, "{path}");
        assert_refusal(path, &err, "images");
        let msg = err["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("model text") && msg.contains("\"images\""),
            "{msg}"
        );
    }
    // Malformed for an alias that takes images: a 400 that names the entry.
    let mut bad = body.clone();
    bad["model"] = json!("seeing");
    bad["images"] = json!([{"url": "x"}]);
    let (status, err) = post(&p, "/v1/chat/completions", &bad).await;
    assert_eq!(status, 400);
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("images[0]"),
        "{err}"
    );
    assert!(sim.recorder().requests().is_empty());
}

#[tokio::test]
async fn models_list_each_alias_input_kinds() {
    let (_sim, p) = fleet().await;
    let list: Value = within("models", p.c.get(p.p.url("/v1/models")).send())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let inputs = |id: &str| {
        list["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["id"] == id)
            .map(|m| m["inputs"].clone())
    };
    assert_eq!(inputs("text"), Some(json!(["text"])));
    assert_eq!(inputs("seeing"), Some(json!(["text", "image"])));
    assert_eq!(inputs("hearing"), Some(json!(["text", "image", "audio"])));
    let one: Value =
        p.c.get(p.p.url("/v1/models/seeing"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    assert_eq!(one["inputs"], json!(["text", "image"]));
}

/// A sample (`name{labels}`) of a simulator's metrics.
async fn backend_counter(sim: &Sim, name: &str) -> f64 {
    let text = reqwest::get(format!("{}/metrics", sim.url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    sample(&text, name)
}

#[tokio::test]
async fn spaced_json_usage_is_hidden_from_the_client_and_counted() {
    for (flavor, prompt_name, completion_name) in [
        (
            Flavor::Llamacpp,
            "llamacpp:prompt_tokens_total",
            "llamacpp:tokens_predicted_total",
        ),
        (
            Flavor::Vllm,
            r#"vllm:prompt_tokens_total{model_name="up-model"}"#,
            r#"vllm:generation_tokens_total{model_name="up-model"}"#,
        ),
    ] {
        let sim = sim(SimConfig {
            spaced_json: true,
            ..sim_cfg(flavor)
        })
        .await;
        let p = proxy(&one_alias(flavor.as_str(), "", ""), &[("b", sim.url())]).await;
        let c = client();
        for i in 0..3 {
            let mut body = chat("a", true);
            body["messages"][0]["content"] = json!(format!("question number {i}, spaced"));
            let events = sse_payloads(p.post_chat(&c, &body).await).await;
            assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
            assert!(events.len() > 3, "{events:?}");
            for e in &events {
                assert!(
                    !e.contains("usage"),
                    "{flavor:?}: usage chunk reached the client: {e}"
                );
            }
            // The backend did write spaced JSON.
            assert!(events[1].contains("\": "), "{}", events[1]);
        }
        let prompt = backend_counter(&sim, prompt_name).await;
        let completion = backend_counter(&sim, completion_name).await;
        assert!(prompt > 0.0 && completion > 0.0, "{prompt} {completion}");
        let m = p.metrics().await;
        assert_eq!(
            sample(&m, r#"switchboard_prompt_tokens_total{alias="a"}"#),
            prompt,
            "{flavor:?}"
        );
        assert_eq!(
            sample(&m, r#"switchboard_completion_tokens_total{alias="a"}"#),
            completion,
            "{flavor:?}"
        );
    }
}
