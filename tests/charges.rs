//! What a named client is charged through the real server: a stream cut short its prompt and
//! the tokens relayed, a request without `max_tokens` a default reservation (times `n`), a
//! request that never reached a backend nothing, a backend's usage no more than the request
//! could cost.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{client, proxy, sample, sim, within, Proxy};
use futures_util::StreamExt;
use serde_json::{json, Value};
use switchboard::sim::{Sim, SimConfig};

/// The day's budget of the test clients: large, so nothing here is refused by it.
const DAY: i64 = 1_000_000;

/// Alias `s` on `sim`, and client `c` (key `key`, read from `var`) with a day's budget and
/// the `extra` client keys.
async fn metered(sim: &Sim, var: &str, key: &str, extra: &str) -> Proxy {
    std::env::set_var(var, key);
    let cfg = format!(
        r#"
[backends.b]
url = "{{b}}"
flavor = "llamacpp"
slots = 4
[aliases.s]
backend = "b"
upstream_model = "sim-model"
[clients.c]
key_env = "{var}"
tokens_per_day = {DAY}
{extra}
"#
    );
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
