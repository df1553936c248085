//! Each wire API answers what the proxy itself refuses in its own error envelope, through the
//! real server: Anthropic's on Messages, OpenAI's on chat completions and Responses.
use crate::common;

use common::*;
use serde_json::{json, Value};

async fn answer(resp: reqwest::Response) -> (u16, Value) {
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

fn messages(model: &str) -> Value {
    json!({
        "model": model,
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "Hello"}],
    })
}

/// Anthropic's `{"type":"error","error":{"type","message"}}` and nothing of OpenAI's.
fn assert_anthropic(v: &Value, kind: &str) {
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], kind, "{v}");
    assert!(v["error"]["message"].is_string(), "{v}");
    assert!(v["error"].get("code").is_none(), "{v}");
}

#[tokio::test]
async fn messages_errors_come_in_anthropics_envelope() {
    let dead = dead_url().await;
    let keys = "api_keys_env = \"R16_MESSAGES_KEYS\"";
    std::env::set_var("R16_MESSAGES_KEYS", "k1");
    let p = proxy(&one_alias("llamacpp", keys, ""), &[("b", dead)]).await;
    let c = client();
    let url = p.url("/v1/messages");
    let auth = |r: reqwest::RequestBuilder| r.header("x-api-key", "k1");

    let (s, v) = answer(
        auth(c.post(&url))
            .json(&messages("nope"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, 404);
    assert_anthropic(&v, "not_found_error");
    assert!(v["error"]["message"].as_str().unwrap().contains("`nope`"));

    let (s, v) = answer(c.post(&url).json(&messages("a")).send().await.unwrap()).await;
    assert_eq!(s, 401);
    assert_anthropic(&v, "authentication_error");

    let bad_json = auth(c.post(&url))
        .header("content-type", "application/json")
        .body("{\"model\":");
    let (s, v) = answer(bad_json.send().await.unwrap()).await;
    assert_eq!(s, 400);
    assert_anthropic(&v, "invalid_request_error");

    let (s, v) = answer(
        auth(c.post(&url))
            .json(&messages("a"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, 502, "the backend is unreachable");
    assert_anthropic(&v, "api_error");

    let count = auth(c.post(p.url("/v1/messages/count_tokens"))).json(&messages("nope"));
    let (s, v) = answer(count.send().await.unwrap()).await;
    assert_eq!(s, 404);
    assert_anthropic(&v, "not_found_error");
}

#[tokio::test]
async fn chat_and_responses_errors_come_in_openais_envelope() {
    let p = proxy(&one_alias("llamacpp", "", ""), &[("b", dead_url().await)]).await;
    let c = client();
    for path in ["/v1/chat/completions", "/v1/responses"] {
        let body = json!({"model": "nope", "input": "hi", "messages": []});
        let (s, v) = answer(c.post(p.url(path)).json(&body).send().await.unwrap()).await;
        assert_eq!(s, 404, "{path}");
        assert_eq!(v["error"]["code"], "model_not_found", "{path}: {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{path}: {v}");
        assert!(v.get("type").is_none(), "{path}: {v}");
    }
}
