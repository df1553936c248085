//! Hot paths of every request: the request view and `model` rewrite, the usage read of an
//! answer, the per-request metrics recording, and the status page's window. (Event
//! transforms: `benches/reasoning.rs`; the guard: `benches/tokens.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use serde_json::json;
use switchboard::observe::metrics::Metrics;
use switchboard::observe::record::Record;
use switchboard::observe::window::{Sample, Window};
use switchboard::wire::request::ParsedRequest;
use switchboard::wire::usage;
use switchboard::wire::usage::Usage;
use switchboard::wire::Endpoint;

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
            let mut ex = Record::start(&unknown, Endpoint::chat_completions, String::new());
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
                prefill_tps: Some(2500.0),
                decode_tps: Some(80.0),
            });
            ex.status = 200;
            ex.completed = true;
            drop(ex);
        })
    });
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
    };
    c.bench_function("status_window_record", |b| b.iter(|| w.record(at, sample)));
    c.bench_function("status_window_summary", |b| b.iter(|| w.summary(at)));
}

criterion_group!(
    benches,
    request_view,
    usage_of_answer,
    metrics_per_request,
    status_window
);
criterion_main!(benches);
