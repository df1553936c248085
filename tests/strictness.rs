//! Issue 17: client input is echoed bounded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::{json, Value};
use switchboard::flavor::Flavor;
use switchboard::sim::SimConfig;

/// One alias `a` with a 4096-token window, counted by estimate (no backend call), on `{b}`.
fn config() -> String {
    one_alias("llamacpp", "", "count = \"estimate\"")
}

async fn backend() -> switchboard::sim::Sim {
    sim(SimConfig {
        flavor: Flavor::Llamacpp,
        model: "up-model".into(),
        ..SimConfig::default()
    })
    .await
}

async fn error_of(resp: reqwest::Response) -> (u16, usize, Value) {
    let status = resp.status().as_u16();
    let body = within("error body", resp.bytes()).await.unwrap();
    let v: Value = serde_json::from_slice(&body).unwrap();
    (status, body.len(), v["error"].clone())
}

/// Regression (issue 17): a 20 MB `model` came back as a 20 MB 404 body (and log line).
#[tokio::test]
async fn r17_a_huge_model_value_is_echoed_truncated() {
    let sim = backend().await;
    let p = proxy(&config(), &[("b", sim.url())]).await;
    let c = client();
    let model = "m".repeat(20 << 20);
    let resp = within(
        "answer",
        c.post(p.url("/v1/chat/completions"))
            .json(&json!({"model": model, "messages": []}))
            .send(),
    )
    .await
    .unwrap();
    let (status, len, e) = error_of(resp).await;
    assert_eq!((status, e["code"].as_str()), (404, Some("model_not_found")));
    assert!(len < 1024, "a {len}-byte error body");
    let message = e["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!(
            "The model `{}… (20971520 bytes)`",
            "m".repeat(256)
        )),
        "{message}"
    );
    assert!(message.ends_with("Known models: a"), "{message}");

    // A long path, an unknown model id in a path, a long content type: bounded too.
    let long = "p".repeat(60_000);
    let resp = within("answer", c.get(p.url(&format!("/v2/{long}"))).send())
        .await
        .unwrap();
    let (status, len, e) = error_of(resp).await;
    assert_eq!((status, e["code"].as_str()), (404, Some("unknown_url")));
    assert!(len < 1024, "a {len}-byte error body");
    assert!(
        e["message"].as_str().unwrap().ends_with("… (60004 bytes)"),
        "{e}"
    );
    let resp = within("answer", c.get(p.url(&format!("/v1/models/{long}"))).send())
        .await
        .unwrap();
    let (status, len, e) = error_of(resp).await;
    assert_eq!((status, e["code"].as_str()), (404, Some("model_not_found")));
    assert!(len < 1024, "a {len}-byte error body");
    let resp = within(
        "answer",
        c.post(p.url("/v1/chat/completions"))
            .header("content-type", format!("text/{long}"))
            .body("{}")
            .send(),
    )
    .await
    .unwrap();
    let (status, len, e) = error_of(resp).await;
    assert_eq!(
        (status, e["code"].as_str()),
        (400, Some("unsupported_content_type"))
    );
    assert!(len < 1024, "a {len}-byte error body");
    assert!(sim.recorder().requests().is_empty());
}
