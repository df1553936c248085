//! Hot paths of every request: the request view and `model` rewrite, the shaping step, the
//! usage read of an answer, the relay of a stream's events, the per-request metrics
//! recording, and the status page's window. (Event transforms alone: `benches/reasoning.rs`;
//! the guard: `benches/tokens.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use http::HeaderValue;
use serde_json::json;
use switchboard_proxy::observe::metrics::Metrics;
use switchboard_proxy::observe::record::Record;
use switchboard_proxy::observe::window::{Sample, Window};
use switchboard_wire::request::ParsedRequest;
use switchboard_wire::usage;
use switchboard_wire::usage::Usage;
use switchboard_wire::Endpoint;

/// A chat request of about `size` bytes: a system prompt and alternating turns.
fn body(size: usize) -> Vec<u8> {
    let turn = "The quick brown fox jumps over the lazy dog, \\\"quoted\\\" and naïve. ".repeat(8);
    let mut messages = vec![json!({"role": "system", "content": "You are a careful assistant."})];
    let mut i = 0;
    while serde_json::to_vec(&messages).map_or(0, |v| v.len()) < size {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        messages.push(json!({"role": role, "content": turn}));
        i += 1;
    }
    serde_json::to_vec(&json!({
        "model": "frank-zealot",
        "messages": messages,
        "stream": true,
        "max_tokens": 512,
        "temperature": 0.2,
    }))
    .unwrap()
}

fn request_view(c: &mut Criterion) {
    let mut g = c.benchmark_group("request_view_and_model_rewrite");
    for (name, size) in [("1KB", 1 << 10), ("100KB", 100 << 10), ("1MB", 1 << 20)] {
        let b = body(size);
        g.throughput(Throughput::Bytes(b.len() as u64));
        g.bench_with_input(BenchmarkId::from_parameter(name), &b, |bench, b| {
            bench.iter(|| {
                let req = ParsedRequest::parse(b).unwrap();
                req.upstream_body(b, "gemma-4-12b-qat", true)
            })
        });
    }
    g.finish();
}

/// A real llama-server's non-streamed answer (tiny Qwen3 model), verbatim.
const LLAMACPP_ANSWER: &str = r#"{"choices":[{"finish_reason":"length","index":0,"message":{"role":"assistant","content":"fontStyle Bamboocome zoningفرنس.lists estaba guid㎧职业生涯mir隍"}}],"created":1796026244,"model":"tiny-qwen3","system_fingerprint":"b0-unknown","object":"chat.completion","usage":{"completion_tokens":12,"prompt_tokens":23,"total_tokens":35,"prompt_tokens_details":{"cached_tokens":0}},"id":"chatcmpl-ZVIsHc0s4nZ04oU9pEI0kGJxIRFA37lJ","timings":{"cache_n":0,"prompt_n":23,"prompt_ms":3.426,"prompt_per_token_ms":0.14895652173913043,"prompt_per_second":6713.368359603036,"predicted_n":12,"predicted_ms":15.79,"predicted_per_token_ms":1.4354545454545453,"predicted_per_second":696.6434452184927}}"#;

/// Usage and timings of a non-streamed answer: the key search the proxy uses against a full
/// parse of the body (what stream events get), on the real answer and on one whose content
/// is 4 KB longer.
fn usage_of_answer(c: &mut Criterion) {
    let mut g = c.benchmark_group("usage_of_answer");
    let long = LLAMACPP_ANSWER.replace(
        "\"content\":\"",
        &format!("\"content\":\"{}", "All work and no play. ".repeat(186)),
    );
    for (name, answer) in [("real", LLAMACPP_ANSWER.to_string()), ("4KB_longer", long)] {
        let answer = answer.into_bytes();
        g.throughput(Throughput::Bytes(answer.len() as u64));
        g.bench_with_input(BenchmarkId::new("key_search", name), &answer, |bench, a| {
            bench.iter(|| usage::of_body(a).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("full_parse", name), &answer, |bench, a| {
            bench.iter(|| usage::of_event(a).unwrap())
        });
    }
    g.finish();
}

fn metrics_per_request(c: &mut Criterion) {
    let metrics = Metrics::new();
    let unknown = metrics.alias("unknown");
    let alias = metrics.alias("frank-zealot");
    c.bench_function("metrics_record_per_request", |bench| {
        bench.iter(|| {
            let mut ex = Record::start(
                &unknown,
                Endpoint::chat_completions,
                HeaderValue::from_static(""),
            );
            ex.route(&alias, "dankclaw-7771");
            ex.stream = true;
            ex.sending();
            ex.headers_received();
            let now = Instant::now();
            ex.first_token = Some(now);
            ex.first_content = Some(now);
            ex.last_token = Some(now);
            ex.usage = Some(Usage {
                prompt: 1200,
                completion: 200,
                reasoning: Some(50),
                cached: None,
                prefill_tps: Some(2500.0),
                decode_tps: Some(80.0),
                timings: None,
            });
            ex.status = 200;
            ex.completed = true;
            drop(ex);
        })
    });
}

/// The shaping step on an alias that configures nothing (the byte searches only) and on one
/// with defaults, a stripped field and an output cap (the members rewritten).
fn shape_request(c: &mut Criterion) {
    use switchboard_wire::shape::{shape, Input, ShapeSpec};
    let chat = Some(&switchboard_wire::chat::SHAPING);
    let mut g = c.benchmark_group("shape");
    let plain = ShapeSpec {
        alias: "frank-zealot".into(),
        inputs: Input::default(),
        ..ShapeSpec::default()
    };
    let shaped = ShapeSpec {
        defaults: json!({"temperature": 0.0, "chat_template_kwargs": {"enable_thinking": false}})
            .as_object()
            .cloned()
            .unwrap(),
        strip: vec!["logprobs".into()],
        max_output_tokens: std::num::NonZeroU32::new(256),
        ..plain.clone()
    };
    for (name, size) in [("1KB", 1 << 10), ("100KB", 100 << 10)] {
        let b = body(size);
        g.throughput(Throughput::Bytes(b.len() as u64));
        g.bench_with_input(BenchmarkId::new("nothing_to_do", name), &b, |bench, b| {
            bench.iter(|| shape(b, &plain, chat).unwrap())
        });
        g.bench_with_input(
            BenchmarkId::new("defaults_and_cap", name),
            &b,
            |bench, b| bench.iter(|| shape(b, &shaped, chat).unwrap()),
        );
    }
    g.finish();
}

/// A 200-token llama.cpp stream (role chunk, tokens, finish, usage chunk, `[DONE]`) through
/// the relay, in one chunk, with the reasoning rewriter and the usage chunk dropped.
fn relay_stream(c: &mut Criterion) {
    use futures_util::StreamExt;
    use switchboard_proxy::pipeline::relay::{relay, RelayOptions};
    use switchboard_wire::reasoning::{OutputField, StreamRewriter};
    use switchboard_wire::EventTransform;
    let tail = r#"],"created":1796026263,"id":"chatcmpl-sWeZjTLb4UlpUnXzDa8gBu2cJM9MTveM","model":"tiny-qwen3","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}"#;
    let mut events = format!(
        "data: {{\"choices\":[{{\"finish_reason\":null,\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":null}}}}{tail}\n\n"
    );
    for i in 0..200 {
        events.push_str(&format!(
            "data: {{\"choices\":[{{\"finish_reason\":null,\"index\":0,\"delta\":{{\"content\":\" word{i}\"}}}}{tail}\n\n"
        ));
    }
    events.push_str(&format!(
        "data: {{\"choices\":[{{\"finish_reason\":\"length\",\"index\":0,\"delta\":{{}}}}{tail}\n\n"
    ));
    events.push_str("data: {\"choices\":[],\"usage\":{\"completion_tokens\":200,\"prompt_tokens\":23,\"total_tokens\":223}}\n\ndata: [DONE]\n\n");
    let events = bytes::Bytes::from(events);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let metrics = Metrics::new();
    let alias = metrics.alias("frank-zealot");
    let mut g = c.benchmark_group("relay");
    g.throughput(Throughput::Elements(203));
    g.bench_function("llamacpp_200_tokens", |bench| {
        bench.iter(|| {
            let ex = Record::start(
                &alias,
                Endpoint::chat_completions,
                HeaderValue::from_static(""),
            );
            let upstream = futures_util::stream::iter([Ok::<_, switchboard_upstream::BoxError>(
                events.clone(),
            )])
            .boxed();
            let opts = RelayOptions {
                drop_usage_chunk: true,
                transform: Some(
                    Box::new(StreamRewriter::new(OutputField::ReasoningContent, None))
                        as Box<dyn EventTransform>,
                ),
                events: None,
                adapter: switchboard_wire::adapter(Endpoint::chat_completions),
                tally: Default::default(),
                event_limit: 8 << 20,
            };
            let body = relay(upstream, ex, None, opts);
            rt.block_on(http_body_util::BodyExt::collect(body))
                .unwrap()
                .to_bytes()
                .len()
        })
    });
    g.finish();
}

/// The status page's five-minute window: what one finished request adds to it (inside the
/// record's drop above, which has its time already), and the summary the page reads.
fn status_window(c: &mut Criterion) {
    let w = Window::new(Instant::now());
    let at = Instant::now();
    let sample = Sample {
        error: false,
        ttft: Some(Duration::from_millis(180)),
        decode_tps: Some(42.0),
        tokens: 16,
    };
    c.bench_function("status_window_record", |b| b.iter(|| w.record(at, sample)));
    c.bench_function("status_window_summary", |b| b.iter(|| w.summary(at)));
}

criterion_group!(
    benches,
    request_view,
    shape_request,
    usage_of_answer,
    relay_stream,
    metrics_per_request,
    status_window
);
criterion_main!(benches);
