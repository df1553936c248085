//! What a named client is charged through the real server: a stream cut short its prompt and
//! the tokens relayed, a request without `max_tokens` a default reservation (times `n`), a
//! request that never reached a backend nothing, a backend's usage no more than the request
//! could cost.
use crate::common;

use std::time::Duration;

use common::toml::Fleet;
use common::{client, proxy, sample, sim, within, Proxy};
use futures_util::StreamExt;
use serde_json::{json, Value};
use switchboard_sim::{Sim, SimConfig};

/// The day's budget of the test clients: large, so nothing here is refused by it.
const DAY: i64 = 1_000_000;

/// Alias `s` on `sim`, and client `c` (key `key`, read from `var`) with a day's budget and
/// the `extra` client keys.
async fn metered(sim: &Sim, var: &str, key: &str, extra: &str) -> Proxy {
    std::env::set_var(var, key);
    let cfg = Fleet::new()
        .backend("b", "llamacpp")
        .slots(4)
        .alias("s", "b")
        .model("sim-model")
        .text(&format!(
            "[clients.c]\nkey_env = \"{var}\"\ntokens_per_day = {DAY}"
        ))
        .text(extra)
        .render();
    proxy(&cfg, &[("b", sim.url())]).await
}

fn chat_body(max_tokens: Option<u32>, stream: bool) -> Value {
    let mut v = json!({"model": "s", "stream": stream,
        "messages": [{"role": "user", "content": "Hello there"}]});
    if let Some(m) = max_tokens {
        v["max_tokens"] = json!(m);
    }
    v
}

/// The day's tokens left after a probe's own reservation (its prompt and one token).
async fn left_after_probe(p: &Proxy, key: &str) -> i64 {
    let r = within(
        "the probe",
        client()
            .post(p.url("/v1/chat/completions"))
            .bearer_auth(key)
            .json(&chat_body(Some(1), false))
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    r.headers()["x-ratelimit-remaining-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// Wait until the metric `series` reaches `n`.
async fn until_metric(p: &Proxy, series: &str, n: f64) {
    within(series, async {
        while sample(&p.metrics().await, series) < n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// Stream a chat to `s`, read `events` events of it, then hang up.
async fn read_then_hang_up(p: &Proxy, key: &str, events: usize) {
    let r = client()
        .post(p.url("/v1/chat/completions"))
        .bearer_auth(key)
        .json(&chat_body(Some(500), true))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut body = r.bytes_stream();
    let mut text = String::new();
    while text.matches("data:").count() < events {
        let chunk = within("the stream's events", body.next()).await;
        text.push_str(&String::from_utf8_lossy(&chunk.unwrap().unwrap()));
    }
    drop(body);
}

#[tokio::test]
async fn a_stream_cut_short_is_charged_the_tokens_it_relayed() {
    // The backend sends 100 events and holds the stream: no usage ever comes.
    let stalled = sim(SimConfig {
        stall_after: Some(100),
        ..SimConfig::default()
    })
    .await;
    let p = metered(&stalled, "SB_T_CUT", "cut-key", "").await;
    read_then_hang_up(&p, "cut-key", 100).await;
    until_metric(&p, r#"switchboard_client_cancels_total{alias="s"}"#, 1.0).await;
    let spent = DAY - left_after_probe(&p, "cut-key").await;
    // Its prompt (a few tokens), about 99 relayed tokens, and the probe's few.
    assert!((95..=130).contains(&spent), "spent {spent}");

    // The backend fails after 100 events: the stream ends without usage.
    let failing = sim(SimConfig {
        fail_after: Some(100),
        ..SimConfig::default()
    })
    .await;
    let p = metered(&failing, "SB_T_FAILED", "failed-key", "").await;
    let r = client()
        .post(p.url("/v1/chat/completions"))
        .bearer_auth("failed-key")
        .json(&chat_body(Some(500), true))
        .send()
        .await
        .unwrap();
    let events = common::sse_payloads(r).await;
    assert!(events.len() >= 100, "{}", events.len());
    until_metric(
        &p,
        r#"switchboard_client_requests_total{client="c",status="200"}"#,
        1.0,
    )
    .await;
    let spent = DAY - left_after_probe(&p, "failed-key").await;
    assert!((95..=130).contains(&spent), "spent {spent}");
}

/// POST a chat with `key`: its status and the tokens per minute left, as its headers say.
async fn tokens_left_after(p: &Proxy, key: &str, body: &Value) -> (reqwest::Response, i64) {
    let r = within(
        "the answer's head",
        client()
            .post(p.url("/v1/chat/completions"))
            .bearer_auth(key)
            .json(body)
            .send(),
    )
    .await
    .unwrap();
    let left = r.headers()["x-ratelimit-remaining-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    (r, left)
}

#[tokio::test]
async fn a_request_without_max_tokens_reserves_the_default_for_each_choice() {
    // Streams hold after their first event: what they reserved stays reserved.
    let gated = sim(SimConfig {
        gate: true,
        ..SimConfig::default()
    })
    .await;
    std::env::set_var("SB_T_RESERVE_D", "default-key");
    let extra = "tokens_per_minute = 1000\nreserve_output_tokens = 300\n\
                 [clients.d]\nkey_env = \"SB_T_RESERVE_D\"\ntokens_per_minute = 1000";
    let p = metered(&gated, "SB_T_RESERVE", "reserve-key", extra).await;
    let mut two = chat_body(None, true);
    two["n"] = json!(2);
    let (first, left) = tokens_left_after(&p, "reserve-key", &two).await;
    assert_eq!(first.status(), 200);
    // Its prompt (a few tokens) and 300 for each of its 2 choices.
    assert!((380..=400).contains(&left), "left {left}");
    let (second, _) = tokens_left_after(&p, "reserve-key", &two).await;
    assert_eq!(second.status(), 429, "the burst passed the budget");
    // A max_tokens counts for each choice too.
    let mut capped = chat_body(Some(150), true);
    capped["n"] = json!(2);
    let (third, left) = tokens_left_after(&p, "reserve-key", &capped).await;
    assert_eq!(third.status(), 200);
    // 300 of what was left (the minute refills some 17 tokens a second meanwhile).
    assert!((70..=160).contains(&left), "left {left}");
    // The default (1024) is more than the whole minute: as much of it as fits is reserved,
    // the request is not refused for it.
    let (held, left) = tokens_left_after(&p, "default-key", &chat_body(None, true)).await;
    assert_eq!(held.status(), 200);
    assert!(left <= 5, "left {left}");
    let (refused, _) = tokens_left_after(&p, "default-key", &chat_body(None, true)).await;
    assert_eq!(refused.status(), 429);
    gated.release();
    drop((first, third, held));
}

/// A backend answering every chat with `usage` as it reports it.
async fn reporting(usage: Value) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let usage = usage.clone();
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                let mut buf = Vec::new();
                while let Some(n) = common::read_request(&mut tcp, &mut buf).await {
                    buf.drain(..n);
                    let body = json!({
                        "id": "x", "object": "chat.completion", "created": 1, "model": "m",
                        "choices": [{"index": 0, "finish_reason": "stop",
                            "message": {"role": "assistant", "content": "ok"}}],
                        "usage": usage,
                    })
                    .to_string();
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                        body.len()
                    );
                    if tcp.write_all(head.as_bytes()).await.is_err()
                        || tcp.write_all(body.as_bytes()).await.is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    url
}

#[tokio::test]
async fn a_usage_past_what_the_request_could_cost_is_charged_that_cost() {
    let liar = reporting(
        json!({"prompt_tokens": 5, "completion_tokens": 1_000_000_000_000u64,
        "total_tokens": 1_000_000_000_005u64}),
    )
    .await;
    let s = sim(SimConfig::default()).await;
    std::env::set_var("SB_T_CLAMP", "clamp-key");
    let cfg = Fleet::new()
        .backend("liar", "openai")
        .slots(4)
        .backend("b", "llamacpp")
        .slots(4)
        .alias("l", "liar")
        .alias("s", "b")
        .model("sim-model")
        .text(&format!(
            "[clients.c]\nkey_env = \"SB_T_CLAMP\"\ntokens_per_day = {DAY}"
        ))
        .render();
    let p = proxy(&cfg, &[("liar", liar), ("b", s.url())]).await;
    let mut body = chat_body(Some(50), false);
    body["model"] = json!("l");
    let (r, _) = tokens_left_after(&p, "clamp-key", &body).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.json::<Value>().await.unwrap()["usage"]["completion_tokens"],
        1_000_000_000_000u64,
        "the client sees the usage as reported"
    );
    until_metric(
        &p,
        r#"switchboard_client_requests_total{client="c",status="200"}"#,
        1.0,
    )
    .await;
    // Charged its prompt (a few tokens) and its 50 at most: no debt, no wait of days.
    let spent = DAY - left_after_probe(&p, "clamp-key").await;
    assert!((50..=70).contains(&spent), "spent {spent}");
}
