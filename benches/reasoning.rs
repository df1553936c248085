//! Cost per streamed event of the reasoning rewrite: nothing to do, a field rename, inline tags.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use switchboard_wire::reasoning::{OutputField, StreamRewriter, ThinkTags};

/// A llama.cpp chunk (the shape of its `--reasoning-format none` stream) carrying `delta`.
fn llamacpp(delta: &str) -> String {
    format!(
        r#"{{"choices":[{{"finish_reason":null,"index":0,"delta":{delta}}}],"created":1796026263,"id":"chatcmpl-sWeZjTLb4UlpUnXzDa8gBu2cJM9MTveM","model":"tiny-qwen3","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}}"#
    )
}

/// A vLLM ≥ 0.16 chunk carrying reasoning under `reasoning`.
fn vllm_reasoning(text: &str) -> String {
    format!(
        r#"{{"id":"chatcmpl-8f3a2c1e9b7d4f6a8c0e2b4d6f8a0c2e","object":"chat.completion.chunk","created":1796026263,"model":"qwen3-32b","choices":[{{"index":0,"delta":{{"reasoning":"{text}"}},"logprobs":null,"finish_reason":null}}]}}"#
    )
}

fn qwen3() -> Arc<ThinkTags> {
    Arc::new(ThinkTags::preset("qwen3").unwrap_or_else(|| unreachable!()))
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("reasoning_stream_event");
    group.throughput(Throughput::Elements(1));

    let plain = llamacpp(r#"{"content":" there"}"#);
    let mut rw = StreamRewriter::new(OutputField::ReasoningContent, None);
    group.bench_function("nothing_to_do", |b| {
        b.iter(|| rw.rewrite(black_box(plain.as_bytes())).len())
    });

    // Tags configured, the reasoning block already closed: still no parse.
    let mut rw = StreamRewriter::new(OutputField::ReasoningContent, Some(qwen3()));
    for event in ["<think>", "hm", "</think>"] {
        rw.rewrite(llamacpp(&format!(r#"{{"content":"{event}"}}"#)).as_bytes());
    }
    group.bench_function("nothing_to_do_tags_configured", |b| {
        b.iter(|| rw.rewrite(black_box(plain.as_bytes())).len())
    });

    let renamed = vllm_reasoning(" about");
    let mut rw = StreamRewriter::new(OutputField::ReasoningContent, None);
    group.bench_function("rename", |b| {
        b.iter(|| rw.rewrite(black_box(renamed.as_bytes())).len())
    });

    // The `--reasoning-format none` capture: tags cut across chunks, reasoning, content.
    let pieces = [
        "<t", "h", "ink", ">\n", "L", "et", " m", "e", " thin", "k", " ab", "ou", "t", " it",
        ".\n", "</", "th", "in", "k", ">\n\n", "H", "i", " there", ",", " te", "ster", "!",
    ];
    let events: Vec<String> = pieces
        .iter()
        .map(|p| llamacpp(&serde_json::json!({ "content": p }).to_string()))
        .collect();
    let tags = qwen3();
    let mut rw = StreamRewriter::new(OutputField::ReasoningContent, Some(tags.clone()));
    let mut next = 0;
    group.bench_function("inline_tags", |b| {
        b.iter(|| {
            if next == events.len() {
                next = 0;
                rw = StreamRewriter::new(OutputField::ReasoningContent, Some(tags.clone()));
            }
            let n = rw.rewrite(black_box(events[next].as_bytes())).len();
            next += 1;
            n
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
