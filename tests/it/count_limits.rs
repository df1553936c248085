//! Token counting bounded in concurrency and size through the real server, and counted another
//! way where the local template cannot render what the backend takes: a turn at the count gate
//! (`server.count_concurrency`, `server.count_queue_timeout_ms`), the text one count may
//! tokenize (`server.count_limit_bytes`), and `switchboard_count_fallbacks_total`.
use crate::common;

use crate::conversation_gen;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use switchboard_sim::{Sim, SimConfig};
use switchboard_wire::flavor::Flavor;

/// A llama.cpp simulator whose slots hold a 10 MiB prompt.
async fn llama_sim() -> Sim {
    sim(SimConfig {
        flavor: Flavor::Llamacpp,
        model: "up-model".into(),
        slot_ctx: 100_000_000,
        ..SimConfig::default()
    })
    .await
}

/// Alias `a` counting with the fixtures' Qwen3 tokenizer over `window` tokens.
async fn qwen_proxy(sim: &Sim, window: u32, server: &str) -> Proxy {
    qwen_proxy_with(sim, window, server, "").await
}

/// [`qwen_proxy`], with the `extra` sections (clients) after the alias.
async fn qwen_proxy_with(sim: &Sim, window: u32, server: &str, extra: &str) -> Proxy {
    let f = conversation_gen::files();
    let toml = format!(
        r#"
[server]
{server}
[backends.b]
url = "{{b}}"
flavor = "llamacpp"
slots = 8
[aliases.a]
backend = "b"
upstream_model = "up-model"
context_window = {window}
tokenizer = {{ file = {:?}, config = {:?} }}
{extra}
"#,
        f.file.display().to_string(),
        f.config.display().to_string()
    );
    proxy(&toml, &[("b", sim.url())]).await
}

/// POST `body` to `path`: status and JSON answer.
async fn post(p: &Proxy, path: &str, body: &Value) -> (u16, Value) {
    let r = within("the answer", client().post(p.url(path)).json(body).send())
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn fallbacks(m: &str, reason: &str) -> f64 {
    sample(
        m,
        &format!(r#"switchboard_count_fallbacks_total{{alias="a",reason="{reason}"}}"#),
    )
}

/// 13 tokens for the Qwen3 template (recorded from llama-server: `single_user`).
fn hello() -> Value {
    json!({"model": "a", "max_tokens": 5, "messages": [{"role": "user", "content": "Hello! Say hi."}]})
}

/// Waits (bounded) until `cond` holds of the proxy's count gate.
async fn until_gate(p: &Proxy, what: &str, cond: impl Fn(i64, i64) -> bool) {
    let snap = p.state.live.load_full();
    let gate = snap.count_gate();
    within(what, async {
        while !cond(gate.running(), gate.waiting()) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn counts_past_the_concurrency_wait_for_a_turn_and_other_requests_go_on() {
    let sim = llama_sim().await;
    let p = qwen_proxy(&sim, 4096, "count_concurrency = 1").await;
    let snap = p.state.live.load_full();
    // The one turn is taken: every count must wait for it.
    let held = snap.count_gate().turn().await.unwrap();
    let counts: Vec<_> = (0..4)
        .map(|_| {
            let url = p.url("/v1/messages/count_tokens");
            tokio::spawn(async move {
                let r = client().post(url).json(&hello()).send().await.unwrap();
                (r.status().as_u16(), r.json::<Value>().await.unwrap())
            })
        })
        .collect();
    until_gate(&p, "four counts waiting", |running, waiting| {
        running == 1 && waiting == 4
    })
    .await;
    let m = p.metrics().await;
    assert_eq!(sample(&m, "switchboard_counts_waiting"), 4.0, "{m}");
    assert_eq!(sample(&m, "switchboard_counts_running"), 1.0, "{m}");
    // The workers serve other requests while counts wait (the bound clears this one).
    let r = p.post_chat(&client(), &chat("a", false)).await;
    assert_eq!(r.status(), 200);
    for c in &counts {
        assert!(!c.is_finished(), "a count ran without a turn");
    }
    drop(held);
    for c in counts {
        let (status, v) = within("a count", c).await.unwrap();
        assert_eq!(status, 200, "{v}");
        assert_eq!(v, json!({"input_tokens": 13}));
    }
    until_gate(&p, "the gate empty", |running, waiting| {
        running == 0 && waiting == 0
    })
    .await;
}

#[tokio::test]
async fn a_count_without_a_turn_in_time_is_503_and_the_guard_estimates() {
    let sim = llama_sim().await;
    let server = "count_concurrency = 1\ncount_queue_timeout_ms = 100";
    // A window under the byte bound of any request: the guard must count.
    let p = qwen_proxy(&sim, 1000, server).await;
    let snap = p.state.live.load_full();
    let _held = snap.count_gate().turn().await.unwrap();
    let (status, v) = post(&p, "/v1/messages/count_tokens", &hello()).await;
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "overloaded_error", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("token counting is busy"), "{message}");
    let (status, v) = post(&p, "/v1/chat/completions", &hello()).await;
    assert_eq!(status, 200, "the guard estimated instead: {v}");
    let m = p.metrics().await;
    assert_eq!(fallbacks(&m, "busy"), 1.0, "{m}");
    assert_eq!(fallbacks(&m, "too_large"), 0.0, "{m}");
}

/// A Messages count request of one user message of `text`.
fn count_request(text: &str) -> Value {
    json!({"model": "a", "max_tokens": 5, "messages": [{"role": "user", "content": text}]})
}

#[tokio::test]
async fn a_count_past_count_limit_bytes_is_413_and_the_guard_estimates() {
    let sim = llama_sim().await;
    // Past the default limit of 8 MiB, under the default body limit of 64 MiB.
    let text = varied_text(9 << 20, 3);
    let p = qwen_proxy(&sim, 4_000_000, "").await;
    let (status, v) = post(&p, "/v1/messages/count_tokens", &count_request(&text)).await;
    assert_eq!(status, 413, "{v}");
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "request_too_large", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("more than the limit of 8388608 bytes (server.count_limit_bytes)"),
        "{message}"
    );
    let responses = json!({"model": "a", "input": text});
    let (status, v) = post(&p, "/v1/responses/input_tokens", &responses).await;
    assert_eq!(status, 413, "{v}");
    assert_eq!(v["error"]["code"], "request_too_large", "{v}");
    // The guard is not refused: 9 MiB cannot be cleared by the byte bound of a 4M-token
    // window, the estimate clears it, the simulator answers.
    let (status, v) = post(&p, "/v1/chat/completions", &count_request(&text)).await;
    assert_eq!(status, 200, "{v}");
    let m = p.metrics().await;
    assert_eq!(fallbacks(&m, "too_large"), 1.0, "{m}");
    assert_eq!(
        sample(
            &m,
            r#"switchboard_requests_total{alias="a",endpoint="count_tokens",status="413",stream="false"}"#
        ),
        1.0,
        "{m}"
    );
}

#[tokio::test]
async fn text_already_counted_is_not_held_against_the_limit() {
    let sim = llama_sim().await;
    let p = qwen_proxy(&sim, 4096, "count_limit_bytes = 65536").await;
    let (first, second) = (varied_text(40_000, 11), varied_text(40_000, 12));
    let (status, v) = post(&p, "/v1/messages/count_tokens", &count_request(&first)).await;
    assert_eq!(status, 200, "{v}");
    let one = v["input_tokens"].as_u64().unwrap();
    // 80 kB of text, of which only the new turn (40 kB) is not in the fragment cache.
    let grown = json!({"model": "a", "max_tokens": 5, "messages": [
        {"role": "user", "content": first},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": second},
    ]});
    let (status, v) = post(&p, "/v1/messages/count_tokens", &grown).await;
    assert_eq!(status, 200, "{v}");
    assert!(v["input_tokens"].as_u64().unwrap() > one + 10_000, "{v}");
    // The same shape with both long turns new is past the limit.
    let fresh = json!({"model": "a", "max_tokens": 5, "messages": [
        {"role": "user", "content": varied_text(40_000, 13)},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": varied_text(40_000, 14)},
    ]});
    let (status, v) = post(&p, "/v1/messages/count_tokens", &fresh).await;
    assert_eq!(status, 413, "{v}");
}

#[tokio::test]
async fn requests_the_local_template_cannot_render_are_counted_another_way_and_forwarded() {
    let sim = llama_sim().await;
    // A window under the byte bound of any request: the guard must count each one.
    let p = qwen_proxy(&sim, 1000, "").await;
    let empty = json!({"model": "a", "max_tokens": 4, "messages": []});
    let prefill = json!({"model": "a", "max_tokens": 4,
        "messages": [{"role": "assistant", "content": "Sure, the rivers are"}]});
    for body in [&empty, &prefill] {
        let (status, v) = post(&p, "/v1/chat/completions", body).await;
        assert_eq!(status, 200, "{body}: {v}");
        assert_eq!(v["object"], "chat.completion", "{v}");
    }
    let m = p.metrics().await;
    assert_eq!(fallbacks(&m, "template"), 2.0, "{m}");
    // The counting endpoints give the backend's own count of them.
    let (status, v) = post(&p, "/tokenize", &empty).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["method"], "backend", "{v}");
    let (status, v) = post(&p, "/v1/messages/count_tokens", &prefill).await;
    assert_eq!(status, 200, "{v}");
    assert!(v["input_tokens"].as_u64().unwrap() > 0, "{v}");
    let m = p.metrics().await;
    assert_eq!(fallbacks(&m, "template"), 4.0, "{m}");
    // A request the template renders is counted locally, as before.
    let (status, v) = post(&p, "/tokenize", &hello()).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["method"], "local", "{v}");
    assert_eq!(v["count"], 13, "{v}");
    assert_eq!(fallbacks(&p.metrics().await, "template"), 4.0);
}

/// POST a count of `hello` with `key`, answered in the background: its status.
fn count_as(p: &Proxy, key: &'static str) -> tokio::task::JoinHandle<u16> {
    let url = p.url("/v1/messages/count_tokens");
    tokio::spawn(async move {
        let r = client()
            .post(url)
            .bearer_auth(key)
            .json(&hello())
            .send()
            .await
            .unwrap();
        r.status().as_u16()
    })
}

/// Clients `a` (key `a-key`) and `b` (key `b-key`), with the `a_limits` of `a`.
fn two_clients(a_limits: &str) -> String {
    std::env::set_var("SB_T_COUNT_A", "a-key");
    std::env::set_var("SB_T_COUNT_B", "b-key");
    format!(
        "[clients.a]\nkey_env = \"SB_T_COUNT_A\"\n{a_limits}\n[clients.b]\nkey_env = \"SB_T_COUNT_B\"\n"
    )
}

#[tokio::test]
async fn a_count_is_one_of_its_clients_requests_per_minute() {
    let sim = llama_sim().await;
    let p = qwen_proxy_with(&sim, 4096, "", &two_clients("requests_per_minute = 2")).await;
    for _ in 0..2 {
        assert_eq!(within("a count", count_as(&p, "a-key")).await.unwrap(), 200);
    }
    let r = within(
        "the third count",
        client()
            .post(p.url("/v1/messages/count_tokens"))
            .bearer_auth("a-key")
            .json(&hello())
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "rate_limit_error", "{v}");
    // Another client's counts are its own.
    assert_eq!(
        within("b's count", count_as(&p, "b-key")).await.unwrap(),
        200
    );
    let m = p.metrics().await;
    let refused = r#"switchboard_client_refusals_total{client="a",reason="rate_limit"}"#;
    assert_eq!(sample(&m, refused), 1.0, "{m}");
}

#[tokio::test]
async fn a_client_holding_the_counting_pool_lets_another_client_count_next() {
    let sim = llama_sim().await;
    let p = qwen_proxy_with(&sim, 4096, "count_concurrency = 2", &two_clients("")).await;
    let snap = p.state.live.load_full();
    let id = |name: &str| {
        let c = snap.clients.callers().iter().find(|c| c.name() == name);
        c.unwrap().state.id
    };
    // Client a counts twice at once: the whole pool.
    let gate = snap.count_gate();
    let first = gate.turn_of(Some(id("a"))).await.unwrap();
    let _second = gate.turn_of(Some(id("a"))).await.unwrap();
    // A third count of a waits; then one of b.
    let a = count_as(&p, "a-key");
    until_gate(&p, "a's count waiting", |_, waiting| waiting == 1).await;
    let b = count_as(&p, "b-key");
    until_gate(&p, "b's count waiting", |_, waiting| waiting == 2).await;
    // With two clients counting, each may hold one turn: the one a gives back is b's.
    drop(first);
    let (a, b) = (std::pin::pin!(a), std::pin::pin!(b));
    let done = within("a count to end", futures_util::future::select(b, a)).await;
    let futures_util::future::Either::Left((status, a)) = done else {
        panic!("a's third count went before b's first");
    };
    assert_eq!(status.unwrap(), 200);
    // b is done counting: a's part is the whole pool again.
    assert_eq!(within("a's count", a).await.unwrap(), 200);
    until_gate(&p, "the gate left as held", |running, waiting| {
        running == 1 && waiting == 0
    })
    .await;
}
