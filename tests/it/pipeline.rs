//! The routed pipeline through the real server: routing, rewrite, errors, streaming, cancellation, shutdown.
use crate::common;

use std::time::Duration;

use common::*;
use futures_util::StreamExt;
use serde_json::{json, Value};
use switchboard_sim::SimConfig;
use switchboard_wire::flavor::Flavor;

fn sim_cfg(flavor: Flavor) -> SimConfig {
    SimConfig {
        flavor,
        model: "up-model".into(),
        ..SimConfig::default()
    }
}

async fn error_of(resp: reqwest::Response) -> (u16, Value) {
    let status = resp.status().as_u16();
    let v: Value = resp.json().await.unwrap();
    for k in ["message", "type", "param", "code"] {
        assert!(v["error"].get(k).is_some(), "envelope lacks {k}: {v}");
    }
    (status, v["error"].clone())
}

/// A body as a backend got it, less the `"id_slot":N,` a llama.cpp backend gets first (the
/// slot its request took); whether it was there.
fn unpinned(body: &[u8]) -> (String, bool) {
    let text = std::str::from_utf8(body).unwrap();
    match text.strip_prefix("{\"id_slot\":") {
        Some(rest) => {
            let digits = rest.find(',').unwrap();
            assert!(rest[..digits].chars().all(|c| c.is_ascii_digit()), "{text}");
            (format!("{{{}", &rest[digits + 1..]), true)
        }
        None => (text.to_string(), false),
    }
}

#[tokio::test]
async fn routes_by_alias_and_old_name_rewriting_model() {
    for flavor in [Flavor::Llamacpp, Flavor::Vllm, Flavor::Sglang] {
        let sim = sim(sim_cfg(flavor)).await;
        let p = proxy(&one_alias(flavor.as_str(), "", ""), &[("b", sim.url())]).await;
        let c = client();
        let body = r#"{"messages":[{"role":"user","content":"Hi"}],  "model":"a", "temperature":0.5,"max_tokens":3}"#;
        let r = c
            .post(p.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .header("x-request-id", "req-123")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{flavor}");
        assert_eq!(r.headers()["x-request-id"], "req-123");
        assert_eq!(r.headers()["x-switchboard-alias"], "a");
        assert!(r.headers().get("deprecation").is_none());
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["object"], "chat.completion");
        let seen = sim.recorder().last().unwrap();
        assert_eq!(seen.path, "/v1/chat/completions");
        // Only `model` changed (and a llama.cpp backend told the slot it runs on); every
        // other byte is the client's.
        let (sent, pinned) = unpinned(&seen.body);
        assert_eq!(pinned, flavor == Flavor::Llamacpp, "{flavor}");
        assert_eq!(
            sent,
            body.replace(r#""model":"a""#, r#""model":"up-model""#)
        );
        assert_eq!(seen.headers["x-request-id"], "req-123");

        let r = p.post_chat(&c, &chat("old-a", false)).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["deprecation"], "true");
        let link = r.headers()["link"].to_str().unwrap();
        assert!(link.contains("/v1/models/a>"), "{link}");
    }
}

/// Regression: a stream's answer carried an empty `x-request-id` (the id left with the
/// exchange when the stream body took it over).
#[tokio::test]
async fn stream_answers_echo_the_request_id() {
    let sim = sim(sim_cfg(Flavor::Vllm)).await;
    let p = proxy(&one_alias("vllm", "", ""), &[("b", sim.url())]).await;
    let c = client();
    let r = c
        .post(p.url("/v1/chat/completions"))
        .header("x-request-id", "req-stream-7")
        .json(&chat("a", true))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-request-id"], "req-stream-7");
    assert!(sse_payloads(r).await.last().is_some_and(|d| d == "[DONE]"));

    // Without one from the client, a fresh id: 32 hex digits, different each time.
    let mut ids = Vec::new();
    for _ in 0..2 {
        let r = p.post_chat(&c, &chat("a", true)).await;
        let id = r.headers()["x-request-id"].to_str().unwrap().to_string();
        assert!(
            id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
            "{id:?}"
        );
        ids.push(id);
        sse_payloads(r).await;
    }
    assert_ne!(ids[0], ids[1]);
}

#[tokio::test]
async fn other_endpoints_are_routed_by_model() {
    let sim = sim(sim_cfg(Flavor::Llamacpp)).await;
    let p = proxy(&one_alias("llamacpp", "", ""), &[("b", sim.url())]).await;
    let c = client();
    let r = c
        .post(p.url("/v1/embeddings"))
        .json(&json!({"model": "a", "input": "hello"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = c
        .post(p.url("/v1/completions?x=1"))
        .json(&json!({"model": "a", "prompt": "hello", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let seen = sim.recorder().last().unwrap();
    assert_eq!(seen.path, "/v1/completions");
    let v: Value = serde_json::from_slice(&seen.body).unwrap();
    assert_eq!(v["model"], "up-model");
}

#[tokio::test]
async fn models_lists_aliases_only() {
    let sim = sim(sim_cfg(Flavor::Vllm)).await;
    let p = proxy(&one_alias("vllm", "", ""), &[("b", sim.url())]).await;
    let v: Value = p.get_json("/v1/models").await;
    assert_eq!(v["object"], "list");
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 1);
    assert_eq!(data[0]["id"], "a");
    assert_eq!(data[0]["owned_by"], "switchboard");
    assert_eq!(data[0]["context_length"], 4096);
    assert_eq!(data[0]["max_model_len"], 4096);
    let r = client()
        .get(p.url("/v1/models/old-a"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (status, e) = error_of(client().get(p.url("/v1/models/zzz")).send().await.unwrap()).await;
    assert_eq!((status, e["code"].as_str()), (404, Some("model_not_found")));
}

/// The accept loop sends model-routed POSTs to their handler itself; the fixed routes under
/// `/v1/` stay the Router's: POSTed to, `/v1/models` is a 404 that never reaches a backend.
#[tokio::test]
async fn fixed_v1_routes_are_not_model_routed() {
    let sim = sim(sim_cfg(Flavor::Llamacpp)).await;
    let p = proxy(&one_alias("llamacpp", "", ""), &[("b", sim.url())]).await;
    let c = client();
    for path in ["/v1/models", "/v1/models/a"] {
        let r = c.post(p.url(path)).json(&json!({"model": "a"})).send();
        let (s, e) = error_of(r.await.unwrap()).await;
        assert_eq!(
            (s, e["code"].as_str()),
            (404, Some("unknown_url")),
            "{path}"
        );
    }
    assert!(sim.recorder().requests().is_empty());
    let r = p
        .post_chat(
            &c,
            &json!({"model": "a", "messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(sim.recorder().requests().len(), 1);
}

#[tokio::test]
async fn client_errors_get_the_envelope() {
    let sim = sim(sim_cfg(Flavor::Llamacpp)).await;
    let p = proxy(
        &one_alias("llamacpp", "body_limit_bytes = 2048", ""),
        &[("b", sim.url())],
    )
    .await;
    let c = client();
    let url = p.url("/v1/chat/completions");

    let (s, e) = error_of(
        c.post(&url)
            .json(&chat("nope", false))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((s, e["code"].as_str()), (404, Some("model_not_found")));
    assert!(e["message"].as_str().unwrap().contains("a"), "{e}");
    assert_eq!(e["param"], "model");

    let (s, e) = error_of(
        c.post(&url)
            .json(&json!({"messages": []}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((s, e["code"].as_str()), (400, Some("missing_model")));

    let (s, e) = error_of(
        c.post(&url)
            .header("content-type", "application/json")
            .body("{\"model\": \"a\",")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (s, e["type"].as_str()),
        (400, Some("invalid_request_error"))
    );
    assert_eq!(e["code"], "invalid_json");

    let (s, e) = error_of(
        c.post(&url)
            .header("content-type", "text/plain")
            .body(chat("a", false).to_string())
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (s, e["code"].as_str()),
        (400, Some("unsupported_content_type"))
    );

    let big = json!({"model": "a", "messages": [{"role": "user", "content": "x".repeat(4096)}]});
    let (s, e) = error_of(c.post(&url).json(&big).send().await.unwrap()).await;
    assert_eq!((s, e["code"].as_str()), (413, Some("request_too_large")));

    let (s, e) = error_of(c.get(p.url("/nope")).send().await.unwrap()).await;
    assert_eq!((s, e["code"].as_str()), (404, Some("unknown_url")));
    let (s, _) = error_of(c.get(&url).send().await.unwrap()).await;
    assert_eq!(s, 404);

    // Nothing of the above reached the backend.
    assert!(sim.recorder().requests().is_empty());

    // A backend's own 4xx passes through unchanged.
    let r = c
        .post(&url)
        .json(&json!({"model": "a", "foo": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert!(v["error"]["message"].is_string(), "{v}");
}

#[tokio::test]
async fn backend_unreachable_is_502() {
    let url = dead_url().await;
    let p = proxy(&one_alias("llamacpp", "", ""), &[("b", url)]).await;
    let (s, e) = error_of(p.post_chat(&client(), &chat("a", false)).await).await;
    assert_eq!((s, e["code"].as_str()), (502, Some("bad_gateway")));
    assert!(
        !e["message"].as_str().unwrap().contains("127.0.0.1"),
        "leaks the address: {e}"
    );
}

#[tokio::test]
async fn backend_too_slow_for_headers_is_504() {
    // A vLLM backend that is loading accepts the connection but never answers.
    let sim = sim(SimConfig {
        loading: Duration::from_secs(3600),
        ..sim_cfg(Flavor::Vllm)
    })
    .await;
    let p = proxy(
        &one_alias("vllm", "header_timeout_secs = 1", ""),
        &[("b", sim.url())],
    )
    .await;
    let (s, e) = error_of(p.post_chat(&client(), &chat("a", false)).await).await;
    assert_eq!((s, e["code"].as_str()), (504, Some("upstream_timeout")));
}

#[tokio::test]
async fn backend_loading_is_503_with_retry_after() {
    let sim = sim(SimConfig {
        loading: Duration::from_secs(3600),
        ..sim_cfg(Flavor::Llamacpp)
    })
    .await;
    let p = proxy(&one_alias("llamacpp", "", ""), &[("b", sim.url())]).await;
    let r = p.post_chat(&client(), &chat("a", false)).await;
    assert!(r.headers().get("retry-after").is_some());
    let (s, e) = error_of(r).await;
    assert_eq!((s, e["code"].as_str()), (503, Some("model_loading")));
}

#[tokio::test]
async fn stream_events_arrive_while_backend_still_generating() {
    for flavor in [Flavor::Llamacpp, Flavor::Vllm, Flavor::Sglang] {
        let sim = sim(SimConfig {
            gate: true,
            ..sim_cfg(flavor)
        })
        .await;
        let p = proxy(&one_alias(flavor.as_str(), "", ""), &[("b", sim.url())]).await;
        let r = p.post_chat(&client(), &chat("a", true)).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["content-type"], "text/event-stream");
        assert_eq!(r.headers()["x-accel-buffering"], "no");
        let mut body = r.bytes_stream();
        // The backend is held after its first event: that event must already be here.
        let first = within("first event", body.next()).await.unwrap().unwrap();
        let first = String::from_utf8_lossy(&first).to_string();
        assert!(first.starts_with("data: {"), "{flavor}: {first}");
        assert_eq!(sim.recorder().completed(), 0);
        sim.release();
        let mut rest = String::new();
        while let Some(chunk) = within("rest of stream", body.next()).await {
            rest.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        }
        assert!(rest.ends_with("data: [DONE]\n\n"), "{flavor}: {rest}");
        // The usage chunk the proxy asked for is not shown to a client that did not ask.
        assert!(!rest.contains("\"choices\":[]"), "{flavor}: {rest}");
    }
}

#[tokio::test]
async fn client_disconnect_cancels_upstream() {
    for gated_before_first_byte in [false, true] {
        let sim = sim(SimConfig {
            gate: true,
            ttft: if gated_before_first_byte {
                Duration::from_secs(3600)
            } else {
                Duration::ZERO
            },
            ..sim_cfg(Flavor::Llamacpp)
        })
        .await;
        let p = proxy(&one_alias("llamacpp", "", ""), &[("b", sim.url())]).await;
        let c = client();
        let fut = c
            .post(p.url("/v1/chat/completions"))
            .json(&chat("a", true))
            .send();
        if gated_before_first_byte {
            // Disconnect while the backend has sent nothing yet.
            let req = tokio::spawn(fut);
            within("request reaches backend", sim.recorder().wait_requests(1)).await;
            req.abort();
        } else {
            let r = fut.await.unwrap();
            let mut body = r.bytes_stream();
            within("first event", body.next()).await.unwrap().unwrap();
            drop(body);
        }
        // The backend sees the cancel promptly (well within a second on an idle machine).
        tokio::time::timeout(Duration::from_secs(5), sim.recorder().wait_cancelled(1))
            .await
            .expect("backend saw the cancel");
        let m = p.metrics().await;
        within("inflight back to 0", async {
            loop {
                let m = p.metrics().await;
                if sample(&m, "switchboard_inflight_requests{alias=\"a\"}") == 0.0 {
                    break;
                }
                tokio::task::yield_now().await;
            }
        })
        .await;
        let _ = m;
    }
}

#[tokio::test]
async fn backend_death_mid_stream_ends_with_error_not_done() {
    let sim = sim(SimConfig {
        fail_after: Some(3),
        completion_tokens: 20,
        ..sim_cfg(Flavor::Vllm)
    })
    .await;
    let p = proxy(&one_alias("vllm", "", ""), &[("b", sim.url())]).await;
    let r = p
        .post_chat(
            &client(),
            &json!({"model": "a", "messages": [{"role": "user", "content": "x"}], "stream": true}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let events = sse_payloads(r).await;
    let last = events.last().unwrap();
    assert!(!events.iter().any(|e| e == "[DONE]"), "{events:?}");
    let v: Value = serde_json::from_str(last).unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("stream broken"),
        "{v}"
    );
    let m = p.metrics().await;
    assert_eq!(
        sample(
            &m,
            "switchboard_upstream_errors_total{alias=\"a\",reason=\"stream_broken\"}"
        ),
        1.0
    );
}

#[tokio::test]
async fn graceful_shutdown_lets_running_stream_finish() {
    let sim = sim(SimConfig {
        gate: true,
        ..sim_cfg(Flavor::Llamacpp)
    })
    .await;
    let mut p = proxy(&one_alias("llamacpp", "", ""), &[("b", sim.url())]).await;
    let r = p.post_chat(&client(), &chat("a", true)).await;
    let mut body = r.bytes_stream();
    within("first event", body.next()).await.unwrap().unwrap();
    p.shutdown();
    // New connections are refused once shutdown began.
    within("listener closed", async {
        loop {
            if tokio::net::TcpStream::connect(p.addr).await.is_err() {
                break;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(!p.task.is_finished());
    sim.release();
    let mut rest = String::new();
    while let Some(chunk) = within("rest of stream", body.next()).await {
        rest.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    assert!(rest.ends_with("data: [DONE]\n\n"), "{rest}");
    within("server exits", &mut p.task).await.unwrap().unwrap();
}

/// Write `request` (which asks for `connection: close`) to the proxy as raw bytes and read
/// the whole answer.
async fn raw_exchange(p: &Proxy, request: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut s, request.as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    within(
        "answer",
        tokio::io::AsyncReadExt::read_to_string(&mut s, &mut out),
    )
    .await
    .unwrap();
    out
}

#[tokio::test]
async fn dot_segments_never_reach_backend_paths() {
    let sim = sim(sim_cfg(Flavor::Llamacpp)).await;
    let p = proxy(&one_alias("llamacpp", "", ""), &[("b", sim.url())]).await;
    // A raw TCP request: HTTP clients normalise `..` away before sending.
    for path in [
        "/v1/../slots/0?action=erase",
        "/v1/%2e%2e/slots/0",
        "/v1/x%2F..%2Fslots",
    ] {
        let body = r#"{"model":"a"}"#;
        let req = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let out = raw_exchange(&p, &req).await;
        assert!(out.starts_with("HTTP/1.1 404"), "{path}: {out}");
        assert!(out.contains("unknown_url"), "{path}: {out}");
    }
    assert!(sim.recorder().requests().is_empty());
}

/// The hop-by-hop fields of a client's request (and the ones its `Connection` names) stay
/// between the client and the proxy: the backend's head is written without them.
#[tokio::test]
async fn hop_by_hop_request_fields_never_reach_the_backend() {
    let sim = sim(sim_cfg(Flavor::Llamacpp)).await;
    let p = proxy(&one_alias("llamacpp", "", ""), &[("b", sim.url())]).await;
    // A raw TCP request: HTTP clients set some of these fields themselves.
    let body = r#"{"model":"a","messages":[{"role":"user","content":"Hi"}]}"#;
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: switchboard.example\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close, X-Secret-Hop\r\nX-Secret-Hop: 1\r\nTE: trailers\r\nTrailer: x-after\r\nKeep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\nProxy-Authorization: Basic cDpw\r\nAccept-Encoding: gzip\r\nX-Kept: yes\r\n\r\n{body}",
        body.len()
    );
    let out = raw_exchange(&p, &req).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let seen = sim.recorder().last().unwrap();
    for gone in [
        "connection",
        "x-secret-hop",
        "te",
        "trailer",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "accept-encoding",
    ] {
        assert!(
            !seen.headers.contains_key(gone),
            "{gone} reached the backend: {:?}",
            seen.headers
        );
    }
    assert_eq!(seen.headers["x-kept"], "yes");
    assert_eq!(seen.headers["content-type"], "application/json");
    assert_ne!(seen.headers["host"], "switchboard.example");
    assert_eq!(seen.headers.get_all("host").iter().count(), 1);
    let upstream_len: usize = seen.headers["content-length"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(upstream_len, seen.body.len());
}

#[tokio::test]
async fn limits_the_backends_accept_pass_unchanged() {
    let sim = sim(sim_cfg(Flavor::Llamacpp)).await;
    let p = proxy(
        &one_alias("llamacpp", "", "").replace("context_window = 4096", ""),
        &[("b", sim.url())],
    )
    .await;
    for body in [
        r#"{"model":"a","max_tokens":-1,"messages":[{"role":"user","content":"x"}]}"#,
        r#"{"model":"a","max_tokens":5.0,"messages":[{"role":"user","content":"x"}]}"#,
    ] {
        let r = client()
            .post(p.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_ne!(r.status(), 400, "{body}");
        let seen = sim.recorder().last().unwrap();
        assert_eq!(
            unpinned(&seen.body).0,
            body.replace("\"a\"", "\"up-model\"")
        );
    }
}

#[tokio::test]
async fn client_keys_are_checked_and_not_forwarded() {
    let sim = sim(sim_cfg(Flavor::Llamacpp)).await;
    let mut cfg = switchboard_proxy::config::from_toml(&fill(
        &one_alias("llamacpp", "", ""),
        &[("b", sim.url())],
    ))
    .unwrap();
    cfg.server.api_keys = Some(vec!["sk-team".into()]);
    let p = start(switchboard_proxy::live::AppState::new(cfg, None).unwrap()).await;
    let url = p.url("/v1/chat/completions");
    let c = client();
    let r = c.post(&url).json(&chat("a", false)).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let r = c
        .post(&url)
        .header("authorization", "Bearer nope")
        .json(&chat("a", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    for (name, value) in [
        ("authorization", "Bearer sk-team"),
        ("authorization", "bearer sk-team"),
        ("x-api-key", "sk-team"),
    ] {
        let r = c
            .post(&url)
            .header(name, value)
            .json(&chat("a", false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{name}: {value}");
        let seen = sim.recorder().last().unwrap();
        assert!(
            seen.headers.get("authorization").is_none() && seen.headers.get("x-api-key").is_none()
        );
    }
}

#[tokio::test]
async fn reload_keeps_the_backend_slots_of_unchanged_backends() {
    let sim = sim(sim_cfg(Flavor::Llamacpp)).await;
    let text = fill(&one_alias("llamacpp", "", ""), &[("b", sim.url())]);
    let state = switchboard_proxy::live::AppState::new(
        switchboard_proxy::config::from_toml(&text).unwrap(),
        None,
    )
    .unwrap();
    let before = std::sync::Arc::clone(&state.live.load().replica("b").unwrap().slots);
    state
        .swap(switchboard_proxy::config::from_toml(&text).unwrap())
        .unwrap();
    assert!(std::sync::Arc::ptr_eq(
        &before,
        &state.live.load().replica("b").unwrap().slots
    ));
    state
        .swap(
            switchboard_proxy::config::from_toml(&text.replace("slots = 8", "slots = 2")).unwrap(),
        )
        .unwrap();
    assert!(!std::sync::Arc::ptr_eq(
        &before,
        &state.live.load().replica("b").unwrap().slots
    ));
}

/// The fields of a backend's connection (and the ones its `Connection` names) stay between the
/// proxy and the backend; the connection itself is reused.
#[tokio::test]
async fn backend_connection_fields_are_not_relayed() {
    // A real llama-server's head (../shared/realworld captures), plus a field `Connection`
    // names and one that is the message's own.
    let body = r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#;
    let answer = format!(
        "HTTP/1.1 200 OK\r\nServer: llama.cpp\r\nAccess-Control-Allow-Origin: \r\nContent-Type: application/json; charset=utf-8\r\nKeep-Alive: timeout=5, max=100\r\nConnection: X-Trace\r\nX-Trace: 7\r\nProxy-Connection: keep-alive\r\nX-Backend-Build: b1\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let RawBackend {
        url,
        connections: accepted,
        ..
    } = raw_backend(answer, true).await;
    let p = proxy(&one_alias("llamacpp", "", ""), &[("b", url)]).await;
    let c = client();
    for _ in 0..2 {
        let resp = p.post_chat(&c, &chat("a", false)).await;
        assert_eq!(resp.status(), 200);
        let h = resp.headers().clone();
        for gone in [
            "keep-alive",
            "connection",
            "x-trace",
            "proxy-connection",
            "access-control-allow-origin",
        ] {
            assert!(!h.contains_key(gone), "{gone} was relayed: {h:?}");
        }
        assert_eq!(h["server"], "llama.cpp");
        assert_eq!(h["x-backend-build"], "b1");
        assert_eq!(h["content-type"], "application/json; charset=utf-8");
        let v: Value = within("body", resp.json()).await.unwrap();
        assert_eq!(v["choices"][0]["message"]["content"], "hi");
    }
    assert_eq!(
        accepted.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the backend connection is reused"
    );
}

/// A stream stays a stream when the backend's `Connection` names its `Content-Type`: the proxy
/// reads the type before it drops the fields `Connection` names.
#[tokio::test]
async fn a_stream_whose_content_type_connection_names_is_relayed_as_a_stream() {
    let events = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n",
        "data: [DONE]\n\n"
    );
    let answer = format!(
        "HTTP/1.1 200 OK\r\nConnection: Content-Type\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{events}\r\n0\r\n\r\n",
        events.len()
    );
    let url = raw_backend(answer, true).await.url;
    let p = proxy(&one_alias("llamacpp", "", ""), &[("b", url)]).await;
    let resp = p.post_chat(&client(), &chat("a", true)).await;
    assert_eq!(resp.status(), 200);
    // Set by the stream relay only.
    assert_eq!(resp.headers()["cache-control"], "no-cache");
    assert!(!resp.headers().contains_key("content-type"));
    let payloads = sse_payloads(resp).await;
    assert_eq!(payloads.last().map(String::as_str), Some("[DONE]"));
    assert!(payloads[0].contains("\"hi\""), "{payloads:?}");
}

/// A body that breaks HTTP/1.1 after a good head (a chunk size that is no number) is the
/// same failure whole and streamed: the same error to the client (a stream's used to say the
/// backend "failed", a whole answer's that it sent a malformed answer), and the metric reason
/// `protocol`.
#[tokio::test]
async fn a_malformed_body_has_one_reason_whole_and_streamed() {
    const WHOLE: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
        transfer-encoding: chunked\r\n\r\n2\r\n{\"\r\nzz\r\n";
    const STREAMED: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
        transfer-encoding: chunked\r\n\r\n2\r\n{\"\r\nzz\r\n";
    let mut codes = Vec::new();
    for (answer, stream) in [(WHOLE, false), (STREAMED, true)] {
        let p = proxy(
            &one_alias("vllm", "", ""),
            &[("b", raw_backend(answer.to_vec(), true).await.url)],
        )
        .await;
        let r = p.post_chat(&client(), &chat("a", stream)).await;
        let error: Value = if stream {
            assert_eq!(r.status(), 200);
            let events = sse_payloads(r).await;
            serde_json::from_str(events.last().unwrap()).unwrap()
        } else {
            assert_eq!(r.status(), 502);
            r.json().await.unwrap()
        };
        codes.push((
            error["error"]["type"].clone(),
            error["error"]["code"].clone(),
            error["error"]["message"].clone(),
        ));
        let m = p.metrics().await;
        let reason = |r: &str| {
            sample(
                &m,
                &format!(r#"switchboard_upstream_errors_total{{alias="a",reason="{r}"}}"#),
            )
        };
        assert_eq!(
            (reason("protocol"), reason("stream_broken")),
            (1.0, 0.0),
            "{m}"
        );
    }
    assert_eq!(codes[0], codes[1], "{codes:?}");
}
