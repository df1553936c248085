//! The backend simulator over real loopback sockets: shapes, errors, slots, failures.
use std::future::Future;
use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::StatusCode;
use serde_json::{json, Value};
use switchboard_sim::{count_prompt_tokens, Sim, SimConfig};
use switchboard_wire::flavor::Flavor;

const LIMIT: Duration = Duration::from_secs(10);

async fn within<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(LIMIT, f).await.expect("timed out")
}

async fn sim(cfg: SimConfig) -> Sim {
    Sim::spawn(cfg).await.expect("sim starts")
}

fn flavor(flavor: Flavor) -> SimConfig {
    SimConfig {
        flavor,
        ..SimConfig::default()
    }
}

struct Reply {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    body: Bytes,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("json body")
    }
    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
    /// The `data:` payloads of an SSE body.
    fn events(&self) -> Vec<String> {
        events(std::str::from_utf8(&self.body).expect("utf-8"))
    }
}

fn events(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").expect("data event").to_owned())
        .collect()
}

fn parsed(events: &[String]) -> Vec<Value> {
    events
        .iter()
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).expect("json event"))
        .collect()
}

async fn send(req: reqwest::RequestBuilder) -> Reply {
    within(async {
        let resp = req.send().await.expect("response");
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = resp.bytes().await.expect("whole body");
        Reply {
            status,
            headers,
            body,
        }
    })
    .await
}

async fn post(sim: &Sim, path: &str, body: &Value) -> Reply {
    let req = reqwest::Client::new()
        .post(format!("{}{path}", sim.url()))
        .header("content-type", "application/json")
        .body(body.to_string());
    send(req).await
}

async fn get(sim: &Sim, path: &str) -> Reply {
    send(reqwest::Client::new().get(format!("{}{path}", sim.url()))).await
}

fn chat(extra: Value) -> Value {
    let mut body = json!({"model": "sim-model", "messages": [
        {"role": "system", "content": "You are a test."},
        {"role": "user", "content": "Hello! Say hi."}
    ]});
    for (k, v) in extra.as_object().expect("object").clone() {
        body[k] = v;
    }
    body
}

/// Reads a streaming response up to its first complete event.
async fn first_event(resp: &mut reqwest::Response) -> String {
    let mut buf = Vec::new();
    while !buf.windows(2).any(|w| w == b"\n\n") {
        let chunk = within(resp.chunk())
            .await
            .expect("chunk")
            .expect("more body");
        buf.extend_from_slice(&chunk);
    }
    String::from_utf8(buf).expect("utf-8")
}

// ---------- llama.cpp ----------

#[tokio::test]
async fn llamacpp_chat_nonstream_mirrors_llama_server() {
    let sim = sim(SimConfig {
        reasoning: true,
        reasoning_tokens: 2,
        ..SimConfig::default()
    })
    .await;
    let r = post(
        &sim,
        "/v1/chat/completions",
        &chat(json!({"max_tokens": 5})),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("server"), "llama.cpp");
    assert_eq!(r.header("content-type"), "application/json; charset=utf-8");
    let v = r.json();
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "choices",
            "created",
            "model",
            "system_fingerprint",
            "object",
            "usage",
            "id",
            "timings"
        ]
    );
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "sim-model");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(choice["message"]["reasoning_content"], "think0 think1 ");
    assert_eq!(choice["message"]["content"], "word0 word1 word2 ");
    let prompt = count_prompt_tokens(Flavor::Llamacpp, &chat(json!({})));
    assert_eq!(
        v["usage"],
        json!({"completion_tokens": 5, "prompt_tokens": prompt,
        "total_tokens": prompt + 5, "prompt_tokens_details": {"cached_tokens": 0}})
    );
    assert_eq!(v["timings"]["predicted_n"], 5);
    assert_eq!(v["timings"]["prompt_n"], prompt);
    assert!(v["timings"]["predicted_per_second"].is_number());

    let r = post(&sim, "/v1/chat/completions", &chat(json!({})))
        .await
        .json();
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    assert_eq!(r["usage"]["completion_tokens"], 16);
    sim.shutdown().await;
}

#[tokio::test]
async fn llamacpp_stream_without_usage_puts_timings_on_the_finish_chunk() {
    let sim = sim(SimConfig::default()).await;
    let r = post(
        &sim,
        "/v1/chat/completions",
        &chat(json!({"max_tokens": 3, "stream": true})),
    )
    .await;
    assert_eq!(r.header("content-type"), "text/event-stream");
    let ev = r.events();
    assert_eq!(ev.len(), 1 + 3 + 1 + 1);
    assert_eq!(ev.last().unwrap(), "[DONE]");
    let v = parsed(&ev);
    assert_eq!(
        v[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": null})
    );
    assert_eq!(v[0]["object"], "chat.completion.chunk");
    let text: String = v[1..4]
        .iter()
        .map(|c| c["choices"][0]["delta"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(text, "word0 word1 word2 ");
    let finish = &v[4];
    assert_eq!(
        finish["choices"][0],
        json!({"finish_reason": "length", "index": 0, "delta": {}})
    );
    assert_eq!(finish["timings"]["predicted_n"], 3);
    assert!(finish.get("usage").is_none());
    assert!(v.iter().all(|c| c["id"] == v[0]["id"]));
}

#[tokio::test]
async fn llamacpp_stream_with_usage_ends_with_a_usage_chunk() {
    let sim = sim(SimConfig {
        reasoning: true,
        reasoning_tokens: 2,
        ..SimConfig::default()
    })
    .await;
    let body =
        chat(json!({"max_tokens": 4, "stream": true, "stream_options": {"include_usage": true}}));
    let ev = post(&sim, "/v1/chat/completions", &body).await.events();
    let v = parsed(&ev);
    assert_eq!(
        v[1]["choices"][0]["delta"],
        json!({"reasoning_content": "think0 "})
    );
    assert_eq!(v[3]["choices"][0]["delta"], json!({"content": "word0 "}));
    let finish = &v[5];
    assert!(finish.get("timings").is_none());
    let usage = v.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 4);
    assert!(usage["timings"].is_object());
    assert_eq!(ev.last().unwrap(), "[DONE]");
}

#[tokio::test]
async fn llamacpp_context_error_is_a_400_for_stream_and_not() {
    let sim = sim(SimConfig {
        slot_ctx: 64,
        ..SimConfig::default()
    })
    .await;
    let long = "hello ".repeat(100);
    for stream in [false, true] {
        let body = json!({"messages": [{"role": "user", "content": long}], "stream": stream});
        let n = count_prompt_tokens(Flavor::Llamacpp, &body);
        let r = post(&sim, "/v1/chat/completions", &body).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            r.json(),
            json!({"error": {"code": 400,
            "message": format!("request ({n} tokens) exceeds the available context size (64 tokens), try increasing it"),
            "type": "exceed_context_size_error", "n_prompt_tokens": n, "n_ctx": 64}})
        );
    }
    // only the prompt is checked: a generation that would pass the window stops at it
    let body =
        json!({"messages": [{"role": "user", "content": "hello ".repeat(50)}], "max_tokens": 100});
    let n = count_prompt_tokens(Flavor::Llamacpp, &body);
    let v = post(&sim, "/v1/chat/completions", &body).await.json();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 64 - n);
    assert_eq!(sim.recorder().completed(), 1);
}

#[tokio::test]
async fn llamacpp_apply_template_then_tokenize_equals_usage() {
    let sim = sim(SimConfig::default()).await;
    let body = chat(json!({"chat_template_kwargs": {"enable_thinking": false}}));
    let prompt = post(&sim, "/apply-template", &body).await.json()["prompt"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(prompt.starts_with("<|im_start|>system\nYou are a test.<|im_end|>\n"));
    let tok = post(
        &sim,
        "/tokenize",
        &json!({"content": prompt, "add_special": false, "parse_special": true}),
    )
    .await
    .json();
    let usage =
        post(&sim, "/v1/chat/completions", &body).await.json()["usage"]["prompt_tokens"].clone();
    assert_eq!(
        tok["tokens"].as_array().unwrap().len() as u64,
        usage.as_u64().unwrap()
    );
    assert_eq!(usage, count_prompt_tokens(Flavor::Llamacpp, &body));
    let input = post(&sim, "/v1/chat/completions/input_tokens", &body)
        .await
        .json();
    assert_eq!(input["input_tokens"], usage);

    let pieces = post(
        &sim,
        "/tokenize",
        &json!({"content": "Hello world<|im_end|>", "with_pieces": true}),
    )
    .await
    .json();
    assert_eq!(pieces["tokens"][1]["piece"], " world");
    assert_eq!(
        pieces["tokens"][2],
        json!({"id": 151645, "piece": "<|im_end|>"})
    );
    let ids = pieces["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].clone())
        .collect::<Vec<_>>();
    let text = post(&sim, "/detokenize", &json!({"tokens": ids}))
        .await
        .json();
    assert_eq!(text["content"], "Hello world<|im_end|>");
}

#[tokio::test]
async fn llamacpp_discovery_endpoints() {
    let sim = sim(SimConfig {
        slot_ctx: 2048,
        slots: 3,
        model: "m1".into(),
        ..SimConfig::default()
    })
    .await;
    assert_eq!(get(&sim, "/health").await.json(), json!({"status": "ok"}));
    let props = get(&sim, "/props").await.json();
    assert_eq!(props["default_generation_settings"]["n_ctx"], 2048);
    assert_eq!(props["total_slots"], 3);
    let models = get(&sim, "/v1/models").await.json();
    assert_eq!(models["data"][0]["id"], "m1");
    assert_eq!(models["data"][0]["meta"]["n_ctx"], 2048);
    assert_eq!(models["models"][0]["name"], "m1");
    assert_eq!(
        get(&sim, "/slots").await.json().as_array().unwrap().len(),
        3
    );
    let metrics = String::from_utf8(get(&sim, "/metrics").await.body.to_vec()).unwrap();
    assert!(
        metrics.contains("\nllamacpp:requests_processing 0\n"),
        "{metrics}"
    );
    assert!(metrics.contains("llamacpp:prompt_tokens_total"));
    let nope = get(&sim, "/v1/nope").await;
    assert_eq!(nope.status, StatusCode::NOT_FOUND);
    assert_eq!(
        nope.json(),
        json!({"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}})
    );
}

#[tokio::test]
async fn llamacpp_bad_input_errors() {
    let sim = sim(SimConfig::default()).await;
    let req = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", sim.url()))
        .body("{\"model\":\"x\",\"messages\":");
    let r = send(req).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let v = r.json();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("[json.exception.parse_error.101] parse error at line 1"));
    let r = post(&sim, "/v1/chat/completions", &json!({"model": "x"})).await;
    assert_eq!(
        r.json(),
        json!({"error": {"code": 400, "message": "'messages' is required", "type": "invalid_request_error"}})
    );
}

#[tokio::test]
async fn legacy_completions_and_embeddings() {
    let sim = sim(SimConfig::default()).await;
    let v = post(
        &sim,
        "/v1/completions",
        &json!({"prompt": "Once upon a time", "max_tokens": 2}),
    )
    .await
    .json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], "word0 word1 ");
    assert_eq!(v["usage"]["prompt_tokens"], 4);
    let ev = post(
        &sim,
        "/v1/completions",
        &json!({"prompt": "x", "max_tokens": 2, "stream": true}),
    )
    .await
    .events();
    let v = parsed(&ev);
    assert_eq!(v[0]["choices"][0]["text"], "word0 ");
    assert_eq!(ev.len(), 2 + 1 + 1);
    let e = post(&sim, "/v1/embeddings", &json!({"input": ["a", "b"]}))
        .await
        .json();
    assert_eq!(e["data"].as_array().unwrap().len(), 2);
    assert_eq!(e["data"][1]["index"], 1);
    assert_eq!(e["data"][0]["embedding"].as_array().unwrap().len(), 8);
}

// ---------- vLLM ----------

#[tokio::test]
async fn vllm_chat_shapes_use_the_reasoning_field() {
    let sim = sim(SimConfig {
        reasoning: true,
        reasoning_tokens: 1,
        ..flavor(Flavor::Vllm)
    })
    .await;
    let v = post(
        &sim,
        "/v1/chat/completions",
        &chat(json!({"max_tokens": 3})),
    )
    .await
    .json();
    let msg = &v["choices"][0]["message"];
    assert_eq!(msg["reasoning"], "think0 ");
    assert_eq!(msg["content"], "word0 word1 ");
    assert!(msg.get("reasoning_content").is_none());
    assert_eq!(
        v["usage"]["completion_tokens_details"]["reasoning_tokens"],
        1
    );
    assert_eq!(
        v["usage"]["total_tokens"],
        v["usage"]["prompt_tokens"].as_u64().unwrap() + 3
    );

    // stream_options present: vLLM defaults include_usage to true
    let body = chat(json!({"max_tokens": 3, "stream": true, "stream_options": {}}));
    let ev = post(&sim, "/v1/chat/completions", &body).await.events();
    let v = parsed(&ev);
    assert_eq!(
        v[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    assert_eq!(v[1]["choices"][0]["delta"], json!({"reasoning": "think0 "}));
    assert_eq!(v[2]["choices"][0]["delta"], json!({"content": "word0 "}));
    assert_eq!(v[4]["choices"][0]["finish_reason"], "length");
    let usage = v.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 3);
    assert_eq!(
        usage["usage"]["completion_tokens_details"]["reasoning_tokens"],
        1
    );

    let body = chat(json!({"max_tokens": 3, "stream": true}));
    let v = parsed(&post(&sim, "/v1/chat/completions", &body).await.events());
    assert_eq!(v.len(), 1 + 3 + 1, "no usage chunk without stream_options");
    let body =
        chat(json!({"max_tokens": 3, "stream": true, "stream_options": {"include_usage": false}}));
    assert_eq!(
        parsed(&post(&sim, "/v1/chat/completions", &body).await.events()).len(),
        5
    );
}

#[tokio::test]
async fn vllm_context_error_checks_prompt_plus_max_tokens() {
    let sim = sim(SimConfig {
        slot_ctx: 100,
        ..flavor(Flavor::Vllm)
    })
    .await;
    let body = chat(json!({"max_tokens": 95}));
    let n = count_prompt_tokens(Flavor::Vllm, &body);
    let r = post(&sim, "/v1/chat/completions", &body).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        r.json(),
        json!({"error": {
        "message": format!("You passed {n} input tokens and requested 95 output tokens. However, the model's context length is only 100 tokens, resulting in a maximum input length of 5 tokens. Please reduce the length of the input prompt."),
        "type": "BadRequestError", "param": "input_tokens", "code": 400}})
    );
    let r = post(
        &sim,
        "/v1/chat/completions",
        &chat(json!({"max_tokens": 95, "stream": true})),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let ok = post(
        &sim,
        "/v1/chat/completions",
        &chat(json!({"max_tokens": 100 - n})),
    )
    .await;
    assert_eq!(ok.status, StatusCode::OK);
}

#[tokio::test]
async fn vllm_tokenize_models_errors() {
    let sim = sim(flavor(Flavor::Vllm)).await;
    let body = chat(json!({}));
    let tok = post(
        &sim,
        "/tokenize",
        &json!({"model": "sim-model", "messages": body["messages"], "add_generation_prompt": true}),
    )
    .await
    .json();
    let usage =
        post(&sim, "/v1/chat/completions", &body).await.json()["usage"]["prompt_tokens"].clone();
    assert_eq!(tok["count"], usage);
    assert_eq!(tok["max_model_len"], 4096);
    assert_eq!(
        tok["tokens"].as_array().unwrap().len() as u64,
        usage.as_u64().unwrap()
    );
    let tok = post(&sim, "/tokenize", &json!({"prompt": "a b c"}))
        .await
        .json();
    assert_eq!(tok["count"], 3);
    assert_eq!(
        get(&sim, "/v1/models").await.json()["data"][0]["max_model_len"],
        4096
    );
    let h = get(&sim, "/health").await;
    assert_eq!((h.status, h.body.len()), (StatusCode::OK, 0));
    let r = post(&sim, "/v1/chat/completions", &json!({"model": "x"})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json()["error"]["type"], "BadRequestError");
    assert_eq!(r.json()["error"]["code"], 400);
    assert_eq!(
        get(&sim, "/nope").await.json(),
        json!({"detail": "Not Found"})
    );
    let metrics = String::from_utf8(get(&sim, "/metrics").await.body.to_vec()).unwrap();
    assert!(
        metrics.contains("vllm:num_requests_running{model_name=\"sim-model\"} 0"),
        "{metrics}"
    );
}

#[tokio::test]
async fn vllm_does_not_answer_until_loaded() {
    let loading = Duration::from_millis(300);
    let started = Instant::now();
    let sim = sim(SimConfig {
        loading,
        ..flavor(Flavor::Vllm)
    })
    .await;
    let r = get(&sim, "/health").await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(started.elapsed() >= loading, "answered while loading");
}

#[tokio::test]
async fn openai_flavour_has_no_tokenize_and_speaks_openai_errors() {
    let sim = sim(SimConfig {
        slot_ctx: 10,
        ..flavor(Flavor::Openai)
    })
    .await;
    assert_eq!(
        post(&sim, "/tokenize", &json!({"prompt": "x"}))
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    let r = post(&sim, "/v1/chat/completions", &chat(json!({}))).await;
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
    let v = parsed(
        &post(
            &sim,
            "/v1/chat/completions",
            &json!({"messages": [], "stream": true, "max_tokens": 1}),
        )
        .await
        .events(),
    );
    assert_eq!(v[1]["choices"][0]["delta"]["content"], "word0 ");
}

// ---------- SGLang ----------

#[tokio::test]
async fn sglang_chat_shapes() {
    let sim = sim(SimConfig {
        reasoning: true,
        reasoning_tokens: 1,
        ..flavor(Flavor::Sglang)
    })
    .await;
    let v = post(
        &sim,
        "/v1/chat/completions",
        &chat(json!({"max_tokens": 2})),
    )
    .await
    .json();
    assert_eq!(v["choices"][0]["message"]["reasoning_content"], "think0 ");
    assert_eq!(v["choices"][0]["message"]["content"], "word0 ");
    assert_eq!(
        v["usage"]["completion_tokens_details"]["reasoning_tokens"],
        1
    );

    let body =
        chat(json!({"max_tokens": 2, "stream": true, "stream_options": {"include_usage": true}}));
    let ev = post(&sim, "/v1/chat/completions", &body).await.events();
    let v = parsed(&ev);
    assert_eq!(v[1]["choices"][0]["delta"]["reasoning_content"], "think0 ");
    assert_eq!(v[2]["choices"][0]["delta"]["content"], "word0 ");
    assert_eq!(v[3]["choices"][0]["finish_reason"], "length");
    assert_eq!(v[4]["choices"], json!([]));
    assert_eq!(
        v[4]["usage"]["total_tokens"],
        v[4]["usage"]["prompt_tokens"].as_u64().unwrap() + 2
    );
    let body = chat(json!({"max_tokens": 2, "stream": true, "stream_options": {}}));
    assert_eq!(
        parsed(&post(&sim, "/v1/chat/completions", &body).await.events()).len(),
        4
    );
}

#[tokio::test]
async fn sglang_context_error_comes_inside_a_200_stream() {
    let sim = sim(SimConfig {
        slot_ctx: 10,
        ..flavor(Flavor::Sglang)
    })
    .await;
    let body = chat(json!({}));
    let n = count_prompt_tokens(Flavor::Sglang, &body);
    let message =
        format!("The input ({n} tokens) is longer than the model's context length (10 tokens).");
    let r = post(&sim, "/v1/chat/completions", &body).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        r.json(),
        json!({"object": "error", "message": message, "type": "BadRequestError", "param": null, "code": 400})
    );
    let r = post(&sim, "/v1/chat/completions", &chat(json!({"stream": true}))).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("content-type"), "text/event-stream");
    let ev = r.events();
    assert_eq!(ev.len(), 2);
    let err: Value = serde_json::from_str(&ev[0]).unwrap();
    assert_eq!(err["error"]["message"], message);
    assert_eq!(err["error"]["code"], 400);
    assert_eq!(ev[1], "[DONE]");
    assert_eq!(sim.recorder().completed() + sim.recorder().cancelled(), 0);
}

#[tokio::test]
async fn sglang_tokenize_needs_exactly_one_input() {
    let sim = sim(flavor(Flavor::Sglang)).await;
    let body = chat(json!({}));
    let usage =
        post(&sim, "/v1/chat/completions", &body).await.json()["usage"]["prompt_tokens"].clone();
    for path in ["/v1/tokenize", "/tokenize"] {
        let tok = post(&sim, path, &json!({"messages": body["messages"]}))
            .await
            .json();
        assert_eq!(tok["count"], usage);
        assert_eq!(tok["max_model_len"], 4096);
    }
    let r = post(
        &sim,
        "/v1/tokenize",
        &json!({"prompt": "a", "messages": []}),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json()["object"], "error");
}

#[tokio::test]
async fn loading_llamacpp_and_sglang_answer_503() {
    let loading = Duration::from_secs(600);
    let sim_l = sim(SimConfig {
        loading,
        ..SimConfig::default()
    })
    .await;
    let h = get(&sim_l, "/health").await;
    assert_eq!(h.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        h.json(),
        json!({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})
    );
    assert_eq!(
        post(&sim_l, "/v1/chat/completions", &chat(json!({})))
            .await
            .status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        get(&sim_l, "/v1/models").await.json()["data"][0]["meta"],
        Value::Null
    );
    let sim_s = sim(SimConfig {
        loading,
        ..flavor(Flavor::Sglang)
    })
    .await;
    let h = get(&sim_s, "/health").await;
    assert_eq!(
        (h.status, h.body.len()),
        (StatusCode::SERVICE_UNAVAILABLE, 0)
    );
}

// ---------- behaviour ----------

#[tokio::test]
async fn think_tags_go_inline_in_content() {
    let sim = sim(SimConfig {
        reasoning: true,
        reasoning_tokens: 1,
        think_tags_in_content: true,
        ..flavor(Flavor::Vllm)
    })
    .await;
    let v = post(
        &sim,
        "/v1/chat/completions",
        &chat(json!({"max_tokens": 4})),
    )
    .await
    .json();
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "<think>think0 </think>word0 "
    );
    assert_eq!(v["choices"][0]["message"]["reasoning"], Value::Null);
    let body = chat(json!({"max_tokens": 4, "chat_template_kwargs": {"enable_thinking": false}}));
    let v = post(&sim, "/v1/chat/completions", &body).await.json();
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "word0 word1 word2 word3 "
    );
}

#[tokio::test]
async fn one_slot_queues_the_second_request_until_the_first_ends() {
    let sim = sim(SimConfig {
        slots: 1,
        gate: true,
        ..SimConfig::default()
    })
    .await;
    let client = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", sim.url());
    let body = chat(json!({"max_tokens": 2, "stream": true})).to_string();
    let mut first = within(client.post(&url).body(body.clone()).send())
        .await
        .unwrap();
    first_event(&mut first).await;
    assert_eq!(sim.recorder().running(), 1);

    let second = tokio::spawn(client.post(&url).body(body).send());
    within(sim.recorder().wait_queued(1)).await;
    assert_eq!(sim.recorder().running(), 1);
    assert_eq!(sim.recorder().completed(), 0);

    sim.release();
    let rest = within(first.bytes()).await.unwrap();
    assert!(rest.ends_with(b"data: [DONE]\n\n"));
    let second = within(second).await.unwrap().unwrap();
    within(sim.recorder().wait_completed(1)).await;
    let text = within(second.bytes()).await.unwrap();
    assert!(text.ends_with(b"data: [DONE]\n\n"));
    within(sim.recorder().wait_completed(2)).await;
    assert_eq!((sim.recorder().queued(), sim.recorder().running()), (0, 0));
}

#[tokio::test]
async fn gate_holds_streams_after_their_first_event() {
    let sim = sim(SimConfig {
        gate: true,
        ..SimConfig::default()
    })
    .await;
    let url = format!("{}/v1/chat/completions", sim.url());
    let body = chat(json!({"max_tokens": 2, "stream": true})).to_string();
    let mut resp = within(reqwest::Client::new().post(&url).body(body.clone()).send())
        .await
        .unwrap();
    let first = first_event(&mut resp).await;
    assert_eq!(events(&first).len(), 1);
    assert_eq!(sim.recorder().completed(), 0);
    sim.release();
    let rest = within(resp.bytes()).await.unwrap();
    assert_eq!(events(std::str::from_utf8(&rest).unwrap()).len(), 2 + 1 + 1);
    // the gate stays open for later streams
    let r = post(
        &sim,
        "/v1/chat/completions",
        &serde_json::from_str(&body).unwrap(),
    )
    .await;
    assert_eq!(r.events().len(), 1 + 2 + 1 + 1);
    assert_eq!(sim.recorder().completed(), 2);
}

#[tokio::test]
async fn fail_after_cuts_the_connection_without_done() {
    let sim = sim(SimConfig {
        fail_after: Some(3),
        ..SimConfig::default()
    })
    .await;
    let url = format!("{}/v1/chat/completions", sim.url());
    let body = chat(json!({"max_tokens": 10, "stream": true})).to_string();
    let mut resp = within(reqwest::Client::new().post(&url).body(body).send())
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut got = Vec::new();
    let err = loop {
        match within(resp.chunk()).await {
            Ok(Some(c)) => got.extend_from_slice(&c),
            Ok(None) => panic!("stream ended cleanly"),
            Err(e) => break e,
        }
    };
    let text = String::from_utf8(got).unwrap();
    assert_eq!(events(&text).len(), 3, "{err}");
    assert!(!text.contains("[DONE]"));
    assert_eq!(
        (
            sim.recorder().failed(),
            sim.recorder().completed(),
            sim.recorder().cancelled()
        ),
        (1, 0, 0)
    );
}

#[tokio::test]
async fn dropping_a_stream_counts_as_cancelled_and_frees_the_slot() {
    let sim = sim(SimConfig {
        slots: 1,
        gate: true,
        ..SimConfig::default()
    })
    .await;
    let url = format!("{}/v1/chat/completions", sim.url());
    let body = chat(json!({"stream": true})).to_string();
    let mut resp = within(reqwest::Client::new().post(&url).body(body).send())
        .await
        .unwrap();
    first_event(&mut resp).await;
    drop(resp);
    within(sim.recorder().wait_cancelled(1)).await;
    assert_eq!(sim.recorder().running(), 0);
    assert_eq!(sim.recorder().completed(), 0);
}

#[tokio::test]
async fn dropping_a_non_stream_request_counts_as_cancelled() {
    let sim = sim(SimConfig {
        ttft: Duration::from_secs(600),
        ..SimConfig::default()
    })
    .await;
    let url = format!("{}/v1/chat/completions", sim.url());
    let pending = tokio::spawn(
        reqwest::Client::new()
            .post(url)
            .body(chat(json!({})).to_string())
            .send(),
    );
    within(sim.recorder().wait_running(1)).await;
    pending.abort();
    within(sim.recorder().wait_cancelled(1)).await;
    assert_eq!(sim.recorder().running(), 0);
}

#[tokio::test]
async fn recorder_keeps_requests_in_order() {
    let sim = sim(SimConfig::default()).await;
    get(&sim, "/health").await;
    let req = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", sim.url()))
        .header("authorization", "Bearer k")
        .body(chat(json!({})).to_string());
    send(req).await;
    within(sim.recorder().wait_requests(2)).await;
    let all = sim.recorder().requests();
    assert_eq!(all.len(), 2);
    assert_eq!(
        (all[0].method.as_str(), all[0].path.as_str()),
        ("GET", "/health")
    );
    let last = sim.recorder().last().unwrap();
    assert_eq!(last.path, "/v1/chat/completions");
    assert_eq!(last.headers["authorization"], "Bearer k");
    assert_eq!(
        serde_json::from_slice::<Value>(&last.body).unwrap(),
        chat(json!({}))
    );
}

#[tokio::test]
async fn shutdown_closes_the_port_and_open_streams() {
    let sim = sim(SimConfig {
        gate: true,
        ..SimConfig::default()
    })
    .await;
    let url = sim.url();
    let body = chat(json!({"stream": true})).to_string();
    let mut resp = within(
        reqwest::Client::new()
            .post(format!("{url}/v1/chat/completions"))
            .body(body)
            .send(),
    )
    .await
    .unwrap();
    first_event(&mut resp).await;
    let rec = sim.recorder().clone();
    within(sim.shutdown()).await;
    assert_eq!(rec.cancelled(), 1);
    assert!(within(resp.chunk()).await.is_err());
    assert!(
        within(reqwest::Client::new().get(format!("{url}/health")).send())
            .await
            .is_err()
    );
}

#[tokio::test]
async fn delays_pace_the_stream() {
    let token_delay = Duration::from_millis(20);
    let sim = sim(SimConfig {
        ttft: Duration::from_millis(50),
        token_delay,
        ..SimConfig::default()
    })
    .await;
    let started = Instant::now();
    let r = post(
        &sim,
        "/v1/chat/completions",
        &chat(json!({"max_tokens": 3, "stream": true})),
    )
    .await;
    assert!(started.elapsed() >= Duration::from_millis(50) + 2 * token_delay);
    assert_eq!(r.events().len(), 1 + 3 + 1 + 1);
}
