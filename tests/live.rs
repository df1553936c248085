//! The live state: config reload and backend health, as metrics, `/v1/models` and routing show them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use std::time::Duration;

use common::*;
use serde_json::Value;
use switchboard::flavor::Flavor;
use switchboard::live::AppState;
use switchboard::sim::SimConfig;

#[tokio::test]
async fn r5_reload_swaps_config_and_keeps_it_on_error() {
    let sim = sim(SimConfig {
        model: "up-model".into(),
        ..SimConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("routes.toml");
    std::fs::write(
        &path,
        fill(&one_alias("llamacpp", "", ""), &[("b", sim.url())]),
    )
    .unwrap();
    let cfg = switchboard::config::load(&path).unwrap();
    let p = start(AppState::new(cfg, Some(path.clone())).unwrap()).await;
    let c = client();
    let url = p.url("/v1/chat/completions");
    assert_eq!(status(&c, &url, &chat("a", false)).await, 200);

    let renamed = one_alias("llamacpp", "", "").replace("[aliases.a]", "[aliases.z]");
    std::fs::write(&path, fill(&renamed, &[("b", sim.url())])).unwrap();
    switchboard::live::reload::reload(&p.state).await.unwrap();
    assert_eq!(status(&c, &url, &chat("z", false)).await, 200);
    assert_eq!(status(&c, &url, &chat("a", false)).await, 404);

    std::fs::write(&path, "[aliases.broken]\nbackend = \"nope\"\n").unwrap();
    let err = switchboard::live::reload::reload(&p.state)
        .await
        .unwrap_err();
    assert!(err.contains("aliases.broken.backend"), "{err}");
    assert_eq!(status(&c, &url, &chat("z", false)).await, 200);

    let m = p.metrics().await;
    assert_eq!(
        sample(&m, r#"switchboard_config_reloads_total{result="success"}"#),
        1.0
    );
    assert_eq!(
        sample(&m, r#"switchboard_config_reloads_total{result="failure"}"#),
        1.0
    );
}

#[tokio::test]
async fn r5_health_probes_tell_up_loading_and_down() {
    let up = sim(SimConfig::default()).await;
    let loading_llama = sim(SimConfig {
        loading: Duration::from_secs(3600),
        ..SimConfig::default()
    })
    .await;
    let loading_vllm = sim(SimConfig {
        flavor: Flavor::Vllm,
        loading: Duration::from_secs(3600),
        ..SimConfig::default()
    })
    .await;
    let loading_sglang = sim(SimConfig {
        flavor: Flavor::Sglang,
        loading: Duration::from_secs(3600),
        ..SimConfig::default()
    })
    .await;
    let dead_url = dead_url().await;
    let toml = r#"
[server]
health_interval_secs = 1
[backends.up]
url = "{up}"
flavor = "llamacpp"
[backends.ll]
url = "{ll}"
flavor = "llamacpp"
[backends.lv]
url = "{lv}"
flavor = "vllm"
[backends.ls]
url = "{ls}"
flavor = "sglang"
[backends.dead]
url = "{dead}"
flavor = "vllm"
[aliases.a]
backend = "up"
[aliases.b]
backend = "dead"
"#;
    let p = proxy(
        toml,
        &[
            ("up", up.url()),
            ("ll", loading_llama.url()),
            ("lv", loading_vllm.url()),
            ("ls", loading_sglang.url()),
            ("dead", dead_url),
        ],
    )
    .await;
    within("probes", switchboard::live::probes::probe_all(&p.state)).await;
    let m = p.metrics().await;
    for (backend, state) in [
        ("up", "up"),
        ("ll", "loading"),
        ("lv", "loading"),
        ("ls", "loading"),
        ("dead", "down"),
    ] {
        let labels =
            format!("switchboard_backend_state{{backend=\"{backend}\",state=\"{state}\"}}");
        assert_eq!(sample(&m, &labels), 1.0, "{backend}: {m}");
        let up = sample(
            &m,
            &format!("switchboard_backend_up{{backend=\"{backend}\"}}"),
        );
        assert_eq!(up, if state == "up" { 1.0 } else { 0.0 }, "{backend}");
    }
    let v: Value = client()
        .get(p.url("/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let status: Vec<_> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["id"].as_str().unwrap().to_string(),
                e["status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        status,
        [("a".into(), "up".into()), ("b".into(), "down".into())]
    );
}
