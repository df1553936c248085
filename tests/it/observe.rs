//! Per-alias metrics from known traffic, read back from a live scrape.
use crate::common;

use common::*;
use futures_util::StreamExt;
use serde_json::{json, Value};
use switchboard_sim::{count_prompt_tokens, SimConfig};
use switchboard_wire::flavor::Flavor;

fn sim_cfg() -> SimConfig {
    SimConfig {
        flavor: Flavor::Llamacpp,
        model: "up-model".into(),
        ..SimConfig::default()
    }
}

#[tokio::test]
async fn known_traffic_gives_exact_metric_counts() {
    let sim = sim(sim_cfg()).await;
    let p = proxy(&one_alias("llamacpp", "", ""), &[("b", sim.url())]).await;
    let c = client();
    let url = p.url("/v1/chat/completions");
    let mut prompt = 0u64;
    for i in 0..3 {
        let body = json!({"model": "a", "messages": [{"role": "user", "content": format!("question number {i}")}], "max_tokens": 4});
        prompt += u64::from(count_prompt_tokens(Flavor::Llamacpp, &body));
        let r = c.post(&url).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    }
    for _ in 0..2 {
        let body = chat("old-a", true);
        prompt += u64::from(count_prompt_tokens(Flavor::Llamacpp, &body));
        let events = sse_payloads(c.post(&url).json(&body).send().await.unwrap()).await;
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    }
    let r = c
        .post(&url)
        .json(&chat("nope", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    r.bytes().await.unwrap();

    let m = p.metrics().await;
    let req = |labels: &str| sample(&m, &format!("switchboard_requests_total{{{labels}}}"));
    assert_eq!(
        req(r#"alias="a",endpoint="chat_completions",status="200",stream="false""#),
        3.0,
        "{m}"
    );
    assert_eq!(
        req(r#"alias="a",endpoint="chat_completions",status="200",stream="true""#),
        2.0
    );
    assert_eq!(
        req(r#"alias="unknown",endpoint="chat_completions",status="404",stream="false""#),
        1.0
    );
    assert_eq!(
        sample(
            &m,
            r#"switchboard_request_duration_seconds_count{alias="a"}"#
        ),
        5.0
    );
    assert_eq!(
        sample(
            &m,
            r#"switchboard_time_to_first_token_seconds_count{alias="a"}"#
        ),
        2.0
    );
    assert_eq!(
        sample(
            &m,
            r#"switchboard_time_to_first_content_seconds_count{alias="a"}"#
        ),
        2.0
    );
    assert_eq!(
        sample(&m, r#"switchboard_prompt_tokens_total{alias="a"}"#),
        prompt as f64
    );
    assert_eq!(
        sample(&m, r#"switchboard_completion_tokens_total{alias="a"}"#),
        20.0
    );
    assert_eq!(
        sample(
            &m,
            r#"switchboard_prefill_tokens_per_second_count{alias="a"}"#
        ),
        5.0
    );
    assert_eq!(
        sample(
            &m,
            r#"switchboard_decode_tokens_per_second_count{alias="a"}"#
        ),
        5.0
    );
    assert_eq!(
        sample(&m, r#"switchboard_proxy_overhead_seconds_count{alias="a"}"#),
        5.0
    );
    assert_eq!(
        sample(&m, r#"switchboard_inflight_requests{alias="a"}"#),
        0.0
    );
    assert_eq!(
        sample(&m, r#"switchboard_client_cancels_total{alias="a"}"#),
        0.0
    );
    assert!(m.contains("switchboard_build_info{version=\""));
}

#[tokio::test]
async fn usage_chunk_hidden_from_clients_that_did_not_ask_but_counted() {
    let sim = sim(sim_cfg()).await;
    let p = proxy(&one_alias("llamacpp", "", ""), &[("b", sim.url())]).await;
    let c = client();
    let url = p.url("/v1/chat/completions");
    let events = sse_payloads(c.post(&url).json(&chat("a", true)).send().await.unwrap()).await;
    assert!(
        events.iter().all(|e| !e.contains("\"usage\"")),
        "{events:?}"
    );
    // The backend was asked for usage all the same.
    let seen: Value = serde_json::from_slice(&sim.recorder().last().unwrap().body).unwrap();
    assert_eq!(seen["stream_options"]["include_usage"], true);
    let m = p.metrics().await;
    assert_eq!(
        sample(&m, r#"switchboard_completion_tokens_total{alias="a"}"#),
        4.0
    );
    assert!(sample(&m, r#"switchboard_prompt_tokens_total{alias="a"}"#) > 0.0);

    // A client that asked for usage gets it.
    let mut body = chat("a", true);
    body["stream_options"] = json!({"include_usage": true});
    let events = sse_payloads(c.post(&url).json(&body).send().await.unwrap()).await;
    let usage: Vec<_> = events.iter().filter(|e| e.contains("\"usage\"")).collect();
    assert_eq!(usage.len(), 1, "{events:?}");
    let m = p.metrics().await;
    assert_eq!(
        sample(&m, r#"switchboard_completion_tokens_total{alias="a"}"#),
        8.0
    );
}

#[tokio::test]
async fn inflight_returns_to_zero_after_failures_rejections_and_disconnects() {
    let sim = sim(SimConfig {
        gate: true,
        ..sim_cfg()
    })
    .await;
    let dead_url = dead_url().await;
    let toml = r#"
[server]
body_limit_bytes = 1024
[backends.b]
url = "{b}"
flavor = "llamacpp"
slots = 8
[backends.dead]
url = "{dead}"
flavor = "llamacpp"
[aliases.a]
backend = "b"
upstream_model = "up-model"
[aliases.d]
backend = "dead"
"#;
    let p = proxy(toml, &[("b", sim.url()), ("dead", dead_url)]).await;
    let c = client();
    let url = p.url("/v1/chat/completions");
    // Backend unreachable.
    assert_eq!(status(&c, &url, &chat("d", false)).await, 502);
    // Rejections.
    assert_eq!(status(&c, &url, &chat("x", false)).await, 404);
    let big = json!({"model": "a", "messages": [{"role": "user", "content": "y".repeat(2000)}]});
    assert_eq!(status(&c, &url, &big).await, 413);
    // Client disconnect mid-stream.
    let r = c.post(&url).json(&chat("a", true)).send().await.unwrap();
    let mut body = r.bytes_stream();
    within("first event", body.next()).await.unwrap().unwrap();
    drop(body);
    within("cancel", sim.recorder().wait_cancelled(1)).await;
    within("gauges back to zero", async {
        loop {
            let m = p.metrics().await;
            let total: f64 = ["a", "d", "unknown"]
                .iter()
                .map(|a| {
                    sample(
                        &m,
                        &format!("switchboard_inflight_requests{{alias=\"{a}\"}}"),
                    )
                })
                .sum();
            if total == 0.0 && sample(&m, r#"switchboard_client_cancels_total{alias="a"}"#) == 1.0 {
                break;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    let m = p.metrics().await;
    assert_eq!(
        sample(
            &m,
            r#"switchboard_upstream_errors_total{alias="d",reason="connect"}"#
        ),
        1.0
    );
    assert_eq!(sample(&m, r#"switchboard_queued_requests{alias="a"}"#), 0.0);
}

#[tokio::test]
async fn metrics_negotiates_openmetrics() {
    let sim = sim(sim_cfg()).await;
    let p = proxy(&one_alias("llamacpp", "", ""), &[("b", sim.url())]).await;
    let r = client()
        .get(p.url("/metrics"))
        .header("accept", "application/openmetrics-text; version=1.0.0")
        .send()
        .await
        .unwrap();
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/openmetrics-text"));
    let text = r.text().await.unwrap();
    assert!(text.ends_with("# EOF\n"));
    assert!(text.contains("# TYPE switchboard_config_reloads counter"));
    assert!(text.contains("switchboard_config_reloads_total{result=\"failure\"} 0"));
    let plain = p.metrics().await;
    assert!(plain.contains("# TYPE switchboard_config_reloads_total counter"));
    assert!(!plain.contains("# EOF"));
}

/// The metrics text of one alias, one request, one probed backend, a client and a store:
/// every family has a series.
fn every_family_rendered() -> String {
    let m = switchboard_proxy::observe::metrics::Metrics::new();
    m.alias("a")
        .request(switchboard_wire::Endpoint::chat_completions, 200, false);
    m.backend_state("b", switchboard_proxy::fleet::health::BackendState::up);
    m.client("c").request(200);
    m.breaker_state("b", switchboard_proxy::fleet::breaker::BreakerState::closed);
    let _store = m.shared_signals("redis://cache:6379/0");
    m.alias("a").fallback(
        &m.alias("f"),
        switchboard_proxy::fleet::routes::FallbackReason::connect,
    );
    let _watch = m.conn_watch("b");
    let a = m.alias("a");
    let measured = switchboard_proxy::fleet::work::Measured {
        work: switchboard_proxy::fleet::cost::Work {
            prefill: 1.0,
            decode: 2.0,
        },
        predicted: switchboard_proxy::fleet::cost::Work {
            prefill: 1.5,
            decode: 2.0,
        },
        reported: true,
    };
    a.work("b", "c", &measured);
    a.preempted(switchboard_proxy::config::Priority::Batch);
    a.cached(10);
    a.predicted_wait(1.0);
    m.speeds("b", &switchboard_proxy::fleet::cost::CostModel::default());
    m.batches.line("a", "c", "completed");
    m.batches
        .statuses(&["completed"], &[("completed".to_string(), 1)]);
    m.render(false)
}

#[test]
fn exported_families_match_the_documented_contract() {
    let contract = include_str!("../../deploy/metrics.txt");
    let text = every_family_rendered();
    for name in contract
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        assert!(
            text.contains(&format!("# TYPE {name} ")),
            "documented metric {name} is not exported"
        );
    }
}

/// docs/METRICS.md's table, each family with its type: `a` / `_b` in a row are
/// `switchboard_a` and `switchboard_b`.
fn documented_families() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in include_str!("../../docs/METRICS.md").lines() {
        let cells: Vec<&str> = line.split(" | ").collect();
        if !line.starts_with("| `switchboard_") || cells.len() < 3 {
            continue;
        }
        let kind = cells[1].trim().to_string();
        for name in cells[0].trim_start_matches("| ").split(" / ") {
            let name = name.trim().trim_matches('`');
            let name = match name.strip_prefix('_') {
                Some(rest) => format!("switchboard_{rest}"),
                None => name.to_string(),
            };
            out.push((name, kind.clone()));
        }
    }
    out
}

#[test]
fn the_metrics_reference_lists_each_family_registered_with_its_type_and_no_other() {
    let text = every_family_rendered();
    let registered: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(name, kind)| (name.to_string(), kind.to_string()))
        .collect();
    assert!(registered.len() > 30, "{text}");
    let documented = documented_families();
    for family in &registered {
        assert!(
            documented.contains(family),
            "docs/METRICS.md has no row for {} ({})",
            family.0,
            family.1
        );
    }
    for family in &documented {
        assert!(
            registered.contains(family),
            "docs/METRICS.md lists {} ({}), which is not registered so",
            family.0,
            family.1
        );
    }
}

#[tokio::test]
async fn metrics_behind_keys_refuse_a_scrape_without_one() {
    std::env::set_var("SB_T_METRICS_KEYS", "scrape-1, scrape-2");
    let sim = sim(sim_cfg()).await;
    let toml = one_alias("llamacpp", "metrics_keys_env = \"SB_T_METRICS_KEYS\"", "");
    let p = proxy(&toml, &[("b", sim.url())]).await;
    let c = client();
    // The keys are for /metrics only: the proxy itself stays open.
    let r = c
        .post(p.url("/v1/chat/completions"))
        .json(&chat("a", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let scrape = |key: Option<&'static str>| {
        let mut req = c.get(p.url("/metrics"));
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        async move {
            let resp = req.send().await.unwrap();
            (resp.status().as_u16(), resp.text().await.unwrap())
        }
    };
    for key in [None, Some("wrong"), Some("scrape-1,scrape-2")] {
        let (status, body) = scrape(key).await;
        assert_eq!(status, 401, "{key:?}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["error"]["code"], "invalid_api_key", "{body}");
        assert!(!body.contains("switchboard_"), "{body}");
    }
    for key in ["scrape-1", "scrape-2"] {
        let (status, body) = scrape(Some(key)).await;
        assert_eq!(status, 200, "{key}");
        assert!(
            body.contains("switchboard_requests_total{alias=\"a\""),
            "{body}"
        );
    }
}
