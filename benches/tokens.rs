//! Token counting hot paths: the free bound on 1 MB, a cold exact count of a 200k-token
//! conversation, the same conversation warm with one new turn, and the guard on a 100 KB
//! request in chat and in Anthropic Messages form (bound clears / exact count, warm cache).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/fixtures/conversation_gen.rs"]
mod conversation_gen;

use conversation_gen::{files, fixtures};

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use serde_json::{json, Value};
use std::sync::Arc;

use switchboard_proxy::config::MediaCosts;
use switchboard_proxy::guard::{self, Counted, GuardSpec};
use switchboard_proxy::tokens::bound::PromptView;
use switchboard_proxy::tokens::local::LocalCounter;
use switchboard_proxy::tokens::Counter;
use switchboard_wire::flavor::Flavor;
use switchboard_wire::{self as wire, Endpoint};

/// The recorded 100k-token spec, doubled: about 200k Qwen3 tokens.
fn conversation_200k() -> Value {
    let raw = std::fs::read(fixtures().join("conversations.json")).unwrap();
    let list: Vec<Value> = serde_json::from_slice(&raw).unwrap();
    let spec = list.iter().find(|c| c["name"] == "long_100k").unwrap();
    let mut spec = conversation_gen::Spec::from_json(&spec["generate"]);
    spec.turns = spec.turns * 2 + 1;
    conversation_gen::body(&spec)
}

/// The conversation with one more exchange appended, spliced into the serialized body the
/// way a client resends its history (the body ends with the `messages` array).
fn with_turn(body: &[u8], i: u64) -> Vec<u8> {
    assert!(body.ends_with(b"]}"));
    let turn = json!([
        {"role": "assistant", "content": format!("Answer number {i}: the count is exact.")},
        {"role": "user", "content": format!("Follow-up question {i}, with a few more words.")}
    ]);
    let turn = serde_json::to_vec(&turn).unwrap();
    let mut out = Vec::with_capacity(body.len() + turn.len());
    out.extend_from_slice(&body[..body.len() - 2]);
    out.push(b',');
    out.extend_from_slice(&turn[1..turn.len() - 1]);
    out.extend_from_slice(b"]}");
    out
}

fn bench(c: &mut Criterion) {
    let media = MediaCosts::default();
    let conv = conversation_200k();
    let bytes = serde_json::to_vec(&conv).unwrap();

    // A 1 MB request: the 200k-token conversation grown to 1 MiB.
    let mut big = conv.clone();
    let mut n = 0;
    while serde_json::to_vec(&big).unwrap().len() < 1 << 20 {
        let extra = conv["messages"][1 + n % 500].clone();
        big["messages"].as_array_mut().unwrap().push(extra);
        n += 1;
    }
    let big = serde_json::to_vec(&big).unwrap();
    c.bench_function("bound_check_1MiB", |b| {
        b.iter(|| {
            let view = PromptView::parse(black_box(&big)).unwrap();
            black_box(view.prompt_bound(&media))
        })
    });

    let mut group = c.benchmark_group("exact_200k");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(20));
    for flavor in [Flavor::Llamacpp, Flavor::Vllm] {
        let lc = LocalCounter::load(&files(), flavor).unwrap();
        let tokens = lc.count(&bytes, &media).unwrap();
        eprintln!("{flavor}: {tokens} tokens in {} bytes", bytes.len());
        group.bench_function(format!("cold_{flavor}"), |b| {
            b.iter_batched(
                || lc.clear_cache(),
                |()| black_box(lc.count(black_box(&bytes), &media).unwrap()),
                BatchSize::PerIteration,
            )
        });
        lc.count(&bytes, &media).unwrap();
        let mut i = 0u64;
        group.bench_function(format!("warm_one_new_turn_{flavor}"), |b| {
            b.iter_batched(
                || {
                    i += 1;
                    with_turn(&bytes, i)
                },
                |body| black_box(lc.count(black_box(&body), &media).unwrap()),
                BatchSize::PerIteration,
            )
        });
    }
    group.finish();
}

/// The generated conversation cut to about 100 KB, as a chat body and as the Messages body of
/// the same conversation (system prompt on top, text blocks, a tool call and its result).
fn requests_100kb() -> (Vec<u8>, Vec<u8>) {
    let raw = std::fs::read(fixtures().join("conversations.json")).unwrap();
    let list: Vec<Value> = serde_json::from_slice(&raw).unwrap();
    let spec = list.iter().find(|c| c["name"] == "long_100k").unwrap();
    let all = conversation_gen::messages(&conversation_gen::Spec::from_json(&spec["generate"]));
    let mut chat = vec![all[0].clone()];
    let mut size = 0;
    for m in &all[1..] {
        if size > 100_000 {
            break;
        }
        size += m["content"].as_str().unwrap().len() + 40;
        chat.push(m.clone());
    }
    if chat.len() % 2 == 1 {
        chat.pop();
    }
    let chat_body = json!({"model": "m", "max_tokens": 1000, "messages": chat});
    let turns: Vec<Value> = chat[1..]
        .iter()
        .map(|m| json!({"role": m["role"], "content": [{"type": "text", "text": m["content"]}]}))
        .collect();
    let messages = json!({
        "model": "m",
        "max_tokens": 1000,
        "system": [{"type": "text", "text": chat[0]["content"]}],
        "messages": turns,
    });
    (
        serde_json::to_vec(&chat_body).unwrap(),
        serde_json::to_vec(&messages).unwrap(),
    )
}

fn bench_guard(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let client = switchboard_upstream::Client::default();
    let lc = LocalCounter::load(&files(), Flavor::Llamacpp).unwrap();
    let counter = Arc::new(Counter::from_local(lc));
    let (chat, messages) = requests_100kb();
    eprintln!(
        "guard_100KB: chat {} bytes, messages {} bytes",
        chat.len(),
        messages.len()
    );
    let mut group = c.benchmark_group("guard_100KB");
    // 10M tokens: the byte bound clears both; 1000: the exact count runs (and rejects).
    for (label, window) in [("bound", 10_000_000), ("exact_warm", 1000)] {
        let spec = GuardSpec::with_counter(Arc::clone(&counter), window, false);
        for (api, endpoint, body) in [
            ("chat", Endpoint::chat_completions, &chat),
            ("messages", Endpoint::from_path("/v1/messages"), &messages),
        ] {
            let adapter = wire::adapter(endpoint);
            let check = || {
                let req = Counted {
                    adapter,
                    body,
                    converter: switchboard_wire::Converter::Llamacpp,
                    who: None,
                };
                rt.block_on(guard::check_request(&spec, &client, req))
                    .unwrap()
            };
            eprintln!("{api} {label}: {:?}", check());
            group.bench_function(format!("{api}_{label}"), |b| b.iter(|| black_box(check())));
        }
    }
    group.finish();
}

criterion_group!(benches, bench, bench_guard);
criterion_main!(benches);
