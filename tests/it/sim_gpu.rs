//! The simulator's GPU mode over real sockets: slot choice, KV cache reuse, `timings` and
//! `cached_tokens` as each dialect reports them, `/sim/gpu`.
use crate::common;

use std::future::Future;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use switchboard_sim::{count_prompt_tokens, GpuRun, GpuSim, Sim, SimConfig};
use switchboard_wire::flavor::Flavor;

const LIMIT: Duration = Duration::from_secs(20);

async fn within<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(LIMIT, f).await.expect("timed out")
}

/// A fast GPU: tests that do not measure time stay quick.
const FAST: GpuSim = GpuSim {
    prefill_tps: 1e6,
    decode_tps: 1e5,
    prefill_half_depth: 0,
    decode_half_depth: 0,
    batch: 512,
};

async fn sim(flavor: Flavor, slots: u32, gpu: GpuSim) -> Sim {
    common::gpu_sim(flavor, slots, gpu).await
}

async fn post(sim: &Sim, path: &str, body: &Value) -> Value {
    let resp = within(
        reqwest::Client::new()
            .post(format!("{}{path}", sim.url()))
            .json(body)
            .send(),
    )
    .await
    .expect("answer");
    assert_eq!(resp.status(), 200);
    let text = within(resp.text()).await.expect("body");
    serde_json::from_str(&text).unwrap_or(Value::String(text))
}

/// `n` words of a text that starts with `topic`.
fn words(topic: &str, n: usize) -> String {
    (0..n).map(|i| format!("{topic}{i} ")).collect()
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

fn chat(messages: &[Value], max_tokens: u32) -> Value {
    json!({"model": "m", "messages": messages, "max_tokens": max_tokens})
}

fn answer_text(v: &Value) -> String {
    v["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_owned()
}

/// The `data:` payloads of an SSE body, parsed (`[DONE]` left out).
fn data_events(text: &str) -> Vec<Value> {
    text.split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).expect("json event"))
        .collect()
}

#[tokio::test]
async fn next_turn_reuses_the_slot_cache_less_the_last_token() {
    let sim = sim(Flavor::Llamacpp, 2, FAST).await;
    let first = vec![user(&words("alpha", 60))];
    let one = post(&sim, "/v1/chat/completions", &chat(&first, 8)).await;
    let p1 = count_prompt_tokens(Flavor::Llamacpp, &chat(&first, 8));
    assert_eq!(one["timings"]["cache_n"], 0);
    assert_eq!(one["timings"]["prompt_n"], p1);
    assert_eq!(one["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

    let mut next = first.clone();
    next.push(json!({"role": "assistant", "content": answer_text(&one)}));
    next.push(user(&words("beta", 30)));
    let body = chat(&next, 8);
    let two = post(&sim, "/v1/chat/completions", &body).await;
    let p2 = count_prompt_tokens(Flavor::Llamacpp, &body);
    // The first prompt and 7 of its 8 tokens: the last one sampled is never evaluated.
    let cached = p1 + 7;
    assert_eq!(two["timings"]["cache_n"], cached);
    assert_eq!(two["timings"]["prompt_n"], p2 - cached);
    assert_eq!(two["usage"]["prompt_tokens"], p2);
    assert_eq!(
        two["usage"]["prompt_tokens_details"]["cached_tokens"],
        cached
    );
    let runs = sim.recorder().gpu_runs();
    assert_eq!((runs[0].slot, runs[1].slot), (0, 0));
    assert_eq!(
        runs[1],
        GpuRun {
            id_slot: None,
            slot: 0,
            cached,
            prompt_n: p2 - cached
        }
    );
}

#[tokio::test]
async fn id_slot_runs_there_and_waits_its_turn_while_busy() {
    let cfg = SimConfig {
        slots: 2,
        slot_ctx: 65536,
        gate: true,
        gpu: Some(FAST),
        ..SimConfig::default()
    };
    let sim = Sim::spawn(cfg).await.expect("sim starts");
    let client = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", sim.url());
    // A holds slot 0: a gated stream stops after its first event.
    let mut a_body = chat(&[user(&words("a", 20))], 4);
    a_body["stream"] = json!(true);
    a_body["id_slot"] = json!(0);
    let mut a = within(client.post(&url).json(&a_body).send())
        .await
        .unwrap();
    within(a.chunk()).await.unwrap().expect("first event");
    // B wants slot 0 too: it waits.
    let mut b_body = chat(&[user(&words("b", 20))], 4);
    b_body["id_slot"] = json!(0);
    let b = tokio::spawn({
        let (client, url) = (client.clone(), url.clone());
        async move { client.post(&url).json(&b_body).send().await?.text().await }
    });
    within(sim.recorder().wait_queued(1)).await;
    // C names no slot: the free one. D names slot 3 of 2: llama.cpp wraps it to slot 1.
    post(&sim, "/v1/chat/completions", &chat(&[user("c")], 4)).await;
    let mut d_body = chat(&[user("d")], 4);
    d_body["id_slot"] = json!(3);
    post(&sim, "/v1/chat/completions", &d_body).await;
    assert_eq!(sim.recorder().queued(), 1, "B still waits");
    drop(a);
    within(b).await.unwrap().expect("B answered");
    let runs: Vec<(Option<i64>, usize)> = sim
        .recorder()
        .gpu_runs()
        .iter()
        .map(|r| (r.id_slot, r.slot))
        .collect();
    assert_eq!(runs, [(Some(0), 0), (None, 1), (Some(3), 1), (Some(0), 0)]);
    assert_eq!(sim.recorder().cancelled(), 1);
}

#[tokio::test]
async fn each_conversation_returns_to_the_slot_that_holds_it() {
    let sim = sim(Flavor::Llamacpp, 2, FAST).await;
    let x = vec![user(&words("x", 80))];
    let y = vec![user(&words("y", 80))];
    for turn in [&x, &y] {
        post(&sim, "/v1/chat/completions", &chat(turn, 4)).await;
    }
    for (turn, topic) in [(&x, "xx"), (&y, "yy")] {
        let mut more = turn.clone();
        more.push(json!({"role": "assistant", "content": "word0 word1 word2 word3 "}));
        more.push(user(&words(topic, 10)));
        let v = post(&sim, "/v1/chat/completions", &chat(&more, 4)).await;
        assert!(v["timings"]["cache_n"].as_u64().unwrap() > 80);
    }
    let slots: Vec<usize> = sim.recorder().gpu_runs().iter().map(|r| r.slot).collect();
    assert_eq!(slots, [0, 1, 0, 1]);
}

#[tokio::test]
async fn timings_follow_the_modelled_rates() {
    let gpu = GpuSim {
        prefill_tps: 40_000.0,
        decode_tps: 1_000.0,
        ..FAST
    };
    let sim = sim(Flavor::Llamacpp, 1, gpu).await;
    let body = chat(&[user(&words("w", 4000))], 50);
    let start = Instant::now();
    let v = post(&sim, "/v1/chat/completions", &body).await;
    let took = start.elapsed().as_secs_f64() * 1000.0;
    let t = &v["timings"];
    let prompt_n = t["prompt_n"].as_f64().unwrap();
    let (prompt_ms, predicted_ms) = (
        t["prompt_ms"].as_f64().unwrap(),
        t["predicted_ms"].as_f64().unwrap(),
    );
    let expect_prompt = prompt_n / 40.0;
    assert!(
        (prompt_ms - expect_prompt).abs() < 0.2 * expect_prompt,
        "{prompt_ms}"
    );
    assert!((predicted_ms - 50.0).abs() < 10.0, "{predicted_ms}");
    assert_eq!(t["predicted_n"], 50);
    let per_second = t["prompt_per_second"].as_f64().unwrap();
    assert!((per_second - 40_000.0).abs() < 8_000.0, "{per_second}");
    // The answer took at least the modelled time.
    assert!(took >= prompt_ms + predicted_ms - 1.0, "{took}");
    assert!(sim.gpu_busy() >= Duration::from_millis(100));
}

#[tokio::test]
async fn streams_and_other_apis_report_the_cache_where_llama_server_does() {
    let sim = sim(Flavor::Llamacpp, 1, FAST).await;
    let history = words("h", 50);
    post(&sim, "/v1/chat/completions", &chat(&[user(&history)], 4)).await;
    // A stream: timings on its last chunk before [DONE], usage with cached tokens.
    let mut body = chat(&[user(&history)], 4);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let text = post(&sim, "/v1/chat/completions", &body).await;
    let events = data_events(text.as_str().expect("sse"));
    let last = events.last().expect("events");
    let p = count_prompt_tokens(Flavor::Llamacpp, &body);
    assert_eq!(last["timings"]["cache_n"], p - 1);
    assert_eq!(last["timings"]["prompt_n"], 1);
    assert_eq!(
        last["usage"]["prompt_tokens_details"]["cached_tokens"],
        p - 1
    );
    assert!(events[..events.len() - 1]
        .iter()
        .all(|e| e.get("timings").is_none()));
    // Messages: the prompt split into cached and not; no timings.
    let msg = json!({"model": "m", "max_tokens": 4,
        "messages": [{"role": "user", "content": history}]});
    let m = post(&sim, "/v1/messages", &msg).await;
    let cached = m["usage"]["cache_read_input_tokens"].as_u64().unwrap();
    assert!(cached > 0);
    assert_eq!(
        cached + m["usage"]["input_tokens"].as_u64().unwrap(),
        u64::from(p)
    );
    assert!(m.get("timings").is_none());
    // Responses: cached tokens in usage; timings only beside a stream's response.completed.
    let resp = json!({"model": "m", "max_output_tokens": 4, "input": history});
    let r = post(&sim, "/v1/responses", &resp).await;
    assert!(r["usage"]["input_tokens_details"]["cached_tokens"].as_u64() > Some(0));
    assert!(r.get("timings").is_none());
    let mut streamed = resp.clone();
    streamed["stream"] = json!(true);
    let text = post(&sim, "/v1/responses", &streamed).await;
    let events = data_events(text.as_str().expect("sse"));
    let done = events.last().expect("events");
    assert_eq!(done["type"], "response.completed");
    assert!(done["timings"]["cache_n"].as_u64() > Some(0));
    let runs = sim.recorder().gpu_runs();
    assert_eq!(runs.len(), 5);
    // Responses keeps `id_slot` (its body is converted in place); Messages drops it.
    let mut pinned = resp.clone();
    pinned["id_slot"] = json!(0);
    post(&sim, "/v1/responses", &pinned).await;
    let mut unpinned = msg.clone();
    unpinned["id_slot"] = json!(0);
    post(&sim, "/v1/messages", &unpinned).await;
    let runs = sim.recorder().gpu_runs();
    assert_eq!((runs[5].id_slot, runs[6].id_slot), (Some(0), None));
}

#[tokio::test]
async fn vllm_reports_prefix_cache_hits_from_any_slot() {
    let sim = sim(Flavor::Vllm, 2, FAST).await;
    let first = vec![user(&words("v", 100))];
    let one = post(&sim, "/v1/chat/completions", &chat(&first, 8)).await;
    assert_eq!(one["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert!(one.get("timings").is_none());
    let p1 = count_prompt_tokens(Flavor::Vllm, &chat(&first, 8));
    let mut next = first.clone();
    next.push(json!({"role": "assistant", "content": answer_text(&one)}));
    next.push(user("more"));
    let mut body = chat(&next, 8);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let text = post(&sim, "/v1/chat/completions", &body).await;
    let events = data_events(text.as_str().expect("sse"));
    let usage = &events.last().expect("usage chunk")["usage"];
    let shared = p1 + 7;
    assert_eq!(
        usage["prompt_tokens_details"]["cached_tokens"],
        shared - shared % 16
    );
    // Its second request ran on the other slot (least recently used) and still hit.
    let runs = sim.recorder().gpu_runs();
    assert_eq!((runs[0].slot, runs[1].slot), (0, 1));
}

#[tokio::test]
async fn sim_gpu_reports_busy_time_and_slots() {
    let sim = sim(Flavor::Llamacpp, 2, FAST).await;
    post(&sim, "/v1/chat/completions", &chat(&[user("hello")], 4)).await;
    let report = within(
        reqwest::Client::new()
            .get(format!("{}/sim/gpu", sim.url()))
            .send(),
    )
    .await
    .unwrap();
    let v: Value = within(report.json()).await.unwrap();
    assert!(v["busy_seconds"].as_f64().unwrap() > 0.0);
    let p = count_prompt_tokens(Flavor::Llamacpp, &chat(&[user("hello")], 4));
    assert_eq!(
        v["slots"],
        json!([{"id": 0, "cached_tokens": p + 3, "busy": false},
               {"id": 1, "cached_tokens": 0, "busy": false}])
    );
    let slots = within(
        reqwest::Client::new()
            .get(format!("{}/slots", sim.url()))
            .send(),
    )
    .await
    .unwrap();
    let s: Value = within(slots.json()).await.unwrap();
    assert_eq!(s[0]["n_past"], p + 3);
    assert_eq!(s[0]["is_processing"], false);
}
