//! Reasoning reaches clients in one configured field, whatever the backend wrote.
use crate::common;

use common::*;
use serde_json::{json, Value};
use switchboard_sim::SimConfig;
use switchboard_wire::flavor::Flavor;

/// (reasoning, content) as a client reading `fields` would assemble them; asserts the other
/// reasoning name is absent.
fn collect(objs: &[Value], fields: &[&str], absent: Option<&str>) -> (String, String) {
    let mut reasoning = String::new();
    let mut content = String::new();
    for o in objs {
        let first = fields[0];
        if let Some(t) = o.get(first).and_then(Value::as_str) {
            reasoning.push_str(t);
        }
        for f in &fields[1..] {
            assert_eq!(
                o.get(*f).and_then(Value::as_str),
                o.get(first).and_then(Value::as_str),
                "both fields carry the same text: {o}"
            );
        }
        if let Some(a) = absent {
            // A null placeholder may stay; text must not.
            assert!(
                o.get(a).is_none_or(Value::is_null),
                "{a} must not carry text: {o}"
            );
        }
        if let Some(t) = o.get("content").and_then(Value::as_str) {
            content.push_str(t);
        }
    }
    (reasoning, content)
}

/// Messages (non-stream) or deltas (stream) of a chat answer.
async fn parts(resp: reqwest::Response, stream: bool) -> Vec<Value> {
    assert_eq!(resp.status(), 200);
    if stream {
        sse_payloads(resp)
            .await
            .iter()
            .filter(|p| p.as_str() != "[DONE]")
            .filter_map(|p| serde_json::from_str::<Value>(p).ok())
            .filter_map(|v| v["choices"].get(0).map(|c| c["delta"].clone()))
            .collect()
    } else {
        let v: Value = resp.json().await.unwrap();
        vec![v["choices"][0]["message"].clone()]
    }
}

/// What the backend itself said: (reasoning, content), splitting `<think>` tags by hand.
async fn direct(sim_url: &str, flavor: Flavor, inline: bool) -> (String, String) {
    let body = json!({"model": "up-model", "messages": [{"role": "user", "content": "q"}], "max_tokens": 12});
    let v: Value = client()
        .post(format!("{sim_url}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let msg = &v["choices"][0]["message"];
    let content = msg["content"].as_str().unwrap_or_default().to_string();
    if inline {
        let (r, c) = content.split_once("</think>").expect("inline tags");
        return (r.trim_start_matches("<think>").to_string(), c.to_string());
    }
    let field = match flavor {
        Flavor::Vllm => "reasoning",
        _ => "reasoning_content",
    };
    (msg[field].as_str().unwrap_or_default().to_string(), content)
}

#[tokio::test]
async fn reasoning_comes_in_the_configured_field_for_every_flavour_streamed_and_not() {
    for flavor in [Flavor::Llamacpp, Flavor::Vllm, Flavor::Sglang] {
        for inline in [false, true] {
            let sim = sim(SimConfig {
                flavor,
                model: "up-model".into(),
                reasoning: true,
                think_tags_in_content: inline,
                ..SimConfig::default()
            })
            .await;
            let (want_r, want_c) = direct(&sim.url(), flavor, inline).await;
            assert!(!want_r.is_empty() && !want_c.is_empty());
            let alias_extra = if inline { "think_tags = \"qwen3\"" } else { "" };
            for setting in ["reasoning_content", "reasoning", "both"] {
                let p = proxy(
                    &one_alias(
                        flavor.as_str(),
                        &format!("reasoning_field = \"{setting}\""),
                        alias_extra,
                    ),
                    &[("b", sim.url())],
                )
                .await;
                let (fields, absent): (&[&str], Option<&str>) = match setting {
                    "reasoning_content" => (&["reasoning_content"], Some("reasoning")),
                    "reasoning" => (&["reasoning"], Some("reasoning_content")),
                    _ => (&["reasoning_content", "reasoning"], None),
                };
                for stream in [false, true] {
                    let body = json!({"model": "a", "messages": [{"role": "user", "content": "q"}], "max_tokens": 12, "stream": stream});
                    let resp = p.post_chat(&client(), &body).await;
                    let objs = parts(resp, stream).await;
                    let (r, c) = collect(&objs, fields, absent);
                    let case = format!("{flavor} inline={inline} field={setting} stream={stream}");
                    assert_eq!(r, want_r, "{case}");
                    assert_eq!(c, want_c, "{case}");
                }
            }
        }
    }
}

#[tokio::test]
async fn the_reasoning_field_header_overrides_the_config_and_a_bad_one_is_400() {
    let sim = sim(SimConfig {
        flavor: Flavor::Vllm,
        model: "up-model".into(),
        reasoning: true,
        ..SimConfig::default()
    })
    .await;
    let (want_r, _) = direct(&sim.url(), Flavor::Vllm, false).await;
    let p = proxy(&one_alias("vllm", "", ""), &[("b", sim.url())]).await;
    for stream in [false, true] {
        let body = json!({"model": "a", "messages": [{"role": "user", "content": "q"}], "max_tokens": 12, "stream": stream});
        let resp = client()
            .post(p.url("/v1/chat/completions"))
            .header("X-Reasoning-Field", "reasoning")
            .json(&body)
            .send()
            .await
            .unwrap();
        let (r, _) = collect(
            &parts(resp, stream).await,
            &["reasoning"],
            Some("reasoning_content"),
        );
        assert_eq!(r, want_r);
    }
    let resp = client()
        .post(p.url("/v1/chat/completions"))
        .header("X-Reasoning-Field", "thoughts")
        .json(&chat("a", false))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("X-Reasoning-Field"));
}

#[tokio::test]
async fn history_reasoning_reaches_backend_under_its_own_name() {
    for (flavor, want, other) in [
        (Flavor::Vllm, "reasoning", "reasoning_content"),
        (Flavor::Llamacpp, "reasoning_content", "reasoning"),
        (Flavor::Sglang, "reasoning_content", "reasoning"),
    ] {
        let sim = sim(SimConfig {
            flavor,
            model: "up-model".into(),
            ..SimConfig::default()
        })
        .await;
        let p = proxy(&one_alias(flavor.as_str(), "", ""), &[("b", sim.url())]).await;
        let body = json!({
            "model": "a",
            "max_tokens": 2,
            "messages": [
                {"role": "user", "content": "first"},
                {"role": "assistant", "content": "answer one", other: "thought one", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\":1}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "42"},
                {"role": "assistant", "content": "answer two", want: "thought two"},
                {"role": "user", "content": "second"}
            ]
        });
        let r = p.post_chat(&client(), &body).await;
        assert_eq!(r.status(), 200);
        let seen: Value = serde_json::from_slice(&sim.recorder().last().unwrap().body).unwrap();
        let msgs = seen["messages"].as_array().unwrap();
        assert_eq!(msgs[1][want], "thought one", "{flavor}: {seen}");
        assert!(msgs[1].get(other).is_none(), "{flavor}: {seen}");
        assert_eq!(msgs[1]["tool_calls"], body["messages"][1]["tool_calls"]);
        assert_eq!(msgs[3][want], "thought two");
        assert_eq!(msgs[2], body["messages"][2]);
        assert_eq!(seen["model"], "up-model");
    }
}
