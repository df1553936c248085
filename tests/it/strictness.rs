//! Paths spelled another way are refused before they are classified, client input
//! is echoed bounded, and a backend answer that breaks HTTP/1.1 is counted as `protocol`.
use crate::common;

use std::sync::atomic::Ordering;

use common::*;
use serde_json::{json, Value};
use switchboard_sim::SimConfig;
use switchboard_wire::flavor::Flavor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One alias `a` with a 4096-token window, counted by estimate (no backend call), on `{b}`.
fn config() -> String {
    one_alias("llamacpp", "", "count = \"estimate\"")
}

async fn backend() -> switchboard_sim::Sim {
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

/// Regression: a 20 MB `model` came back as a 20 MB 404 body (and log line).
#[tokio::test]
async fn a_huge_model_value_is_echoed_truncated() {
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

/// A prompt far over alias `a`'s window, in the shape of the API at `path`.
fn over_window(path: &str) -> String {
    let text = "many words ".repeat(20_000);
    let body = if path.contains("messages") {
        json!({"model": "a", "max_tokens": 16, "messages": [{"role": "user", "content": text}]})
    } else if path.contains("responses") {
        json!({"model": "a", "input": text})
    } else if path.contains("chat") {
        json!({"model": "a", "messages": [{"role": "user", "content": text}]})
    } else {
        json!({"model": "a", "prompt": text})
    };
    body.to_string()
}

/// POST `body` to `path` over a raw connection (HTTP clients rewrite some paths before
/// sending); the whole answer.
async fn raw_post(p: &Proxy, path: &str, body: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    within("answer", s.read_to_end(&mut out)).await.unwrap();
    String::from_utf8(out).unwrap()
}

/// Each path is refused with 404 `unknown_url`, and its over-window prompt never reaches the
/// backend; its canonical spelling does reach it (or is refused by the guard, for chat).
async fn refused_everywhere(paths: &[(&str, &str)]) {
    let sim = backend().await;
    let p = proxy(&config(), &[("b", sim.url())]).await;
    for (path, _) in paths {
        let out = raw_post(&p, path, &over_window(path)).await;
        assert!(out.starts_with("HTTP/1.1 404"), "{path}: {out}");
        assert!(out.contains("\"unknown_url\""), "{path}: {out}");
    }
    assert!(
        sim.recorder().requests().is_empty(),
        "{:?}",
        sim.recorder()
            .requests()
            .iter()
            .map(|r| &r.path)
            .collect::<Vec<_>>()
    );
    // Spelled canonically, the same requests are classified as their API: the guard refuses
    // each prompt in its API's words (Messages and Responses are guarded too).
    for (_, canonical) in paths {
        let out = raw_post(&p, canonical, &over_window(canonical)).await;
        assert!(out.starts_with("HTTP/1.1 400"), "{canonical}: {out}");
        if *canonical == "/v1/messages" {
            assert!(out.contains("prompt is too long"), "{out}");
        } else {
            assert!(out.contains("context_length_exceeded"), "{out}");
        }
    }
    assert!(sim.recorder().requests().is_empty());
    let m = p.metrics().await;
    assert_eq!(
        sample(
            &m,
            "switchboard_requests_total{alias=\"unknown\",endpoint=\"other\",status=\"404\",stream=\"false\"}"
        ),
        paths.len() as f64,
        "{m}"
    );
}

/// Regression: `POST /v1/ch%61t/completions` with an over-window prompt was
/// forwarded unguarded, without the usage request and under another endpoint label, and
/// llama.cpp and vLLM decode it to their chat handler.
#[tokio::test]
async fn percent_encoded_chat_path_is_guarded() {
    refused_everywhere(&[
        ("/v1/ch%61t/completions", "/v1/chat/completions"),
        ("/v1/%63hat/completions", "/v1/chat/completions"),
        ("/v1/chat/c%6Fmpletions", "/v1/chat/completions"),
        ("/v1/chat/completions/", "/v1/chat/completions"),
        ("/v1//chat/completions", "/v1/chat/completions"),
        ("/v1/chat%2Fcompletions", "/v1/chat/completions"),
        ("/v1/chat/completions%", "/v1/chat/completions"),
    ])
    .await;
}

#[tokio::test]
async fn percent_encoded_responses_path_is_refused() {
    refused_everywhere(&[
        ("/v1/re%73ponses", "/v1/responses"),
        ("/v1/%72esponses", "/v1/responses"),
        ("/v1/responses/", "/v1/responses"),
    ])
    .await;
}

#[tokio::test]
async fn percent_encoded_messages_path_is_refused() {
    refused_everywhere(&[
        ("/v1/me%73sages", "/v1/messages"),
        ("/v1/messages%2F", "/v1/messages"),
        ("/v1/./messages", "/v1/messages"),
    ])
    .await;
}

/// The fixed routes under `/v1/` and the other routed APIs: another spelling is not a way
/// around their own handling (count_tokens counts, it does not forward).
#[tokio::test]
async fn other_spellings_of_v1_paths_are_refused() {
    let sim = backend().await;
    let p = proxy(&config(), &[("b", sim.url())]).await;
    for path in [
        "/v1/messages/count%5Ftokens",
        "/v1/messages/count%5ftokens",
        "/v1/responses/input%5Ftokens",
        "/v1/m%6Fdels",
        "/v1/c%6Fmpletions",
        "/v1/embedding%73",
        "/v1/completions/",
    ] {
        let out = raw_post(&p, path, &over_window(path)).await;
        assert!(out.starts_with("HTTP/1.1 404"), "{path}: {out}");
        assert!(out.contains("\"unknown_url\""), "{path}: {out}");
    }
    assert!(sim.recorder().requests().is_empty());
}

fn reason(m: &str, reason: &str) -> f64 {
    sample(
        m,
        &format!("switchboard_upstream_errors_total{{alias=\"a\",reason=\"{reason}\"}}"),
    )
}

/// Regression: malformed backend heads were counted as `connect` errors.
#[tokio::test]
async fn a_malformed_backend_head_counts_as_protocol() {
    let c = client();
    for answer in [
        &b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\nabc"[..],
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\nabc",
        b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
    ] {
        let RawBackend { url, requests, .. } = raw_backend(answer.to_vec(), false).await;
        let p = proxy(&config(), &[("b", url)]).await;
        let resp = p.post_chat(&c, &chat("a", false)).await;
        let (status, _, e) = error_of(resp).await;
        assert_eq!((status, e["code"].as_str()), (502, Some("bad_gateway")));
        assert_eq!(requests.load(Ordering::SeqCst), 1, "the request went once");
        let m = p.metrics().await;
        let text = String::from_utf8_lossy(answer);
        assert_eq!(reason(&m, "protocol"), 1.0, "{text}");
        assert_eq!(reason(&m, "connect"), 0.0, "{text}");
        assert_eq!(reason(&m, "stream_broken"), 0.0, "{text}");
    }
}

/// A connection closed before any head is a connection failure, not the backend's protocol.
#[tokio::test]
async fn a_backend_closing_before_its_head_counts_as_connect() {
    let url = raw_backend(Vec::new(), false).await.url;
    let p = proxy(&config(), &[("b", url)]).await;
    let resp = p.post_chat(&client(), &chat("a", false)).await;
    assert_eq!(resp.status(), 502);
    let m = p.metrics().await;
    assert_eq!((reason(&m, "connect"), reason(&m, "protocol")), (1.0, 0.0));
}

/// A malformed chunked body of a non-streamed answer: 502, counted as `protocol`.
#[tokio::test]
async fn a_malformed_chunked_body_counts_as_protocol() {
    let c = client();
    const HEAD: &str =
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
    let json = r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}]}"#;
    for answer in [
        // A bare LF after the chunk's data.
        format!("{HEAD}{:x}\r\n{json}\n0\r\n\r\n", json.len()),
        // A size line that is no size.
        format!("{HEAD}2\r\n{{}}\r\nzz\r\n"),
        // A trailer line of only a CR does not end the body.
        format!("{HEAD}{:x}\r\n{json}\r\n0\r\n\r\r\n", json.len()),
    ] {
        let url = raw_backend(answer.clone(), false).await.url;
        let p = proxy(&config(), &[("b", url)]).await;
        let resp = p.post_chat(&c, &chat("a", false)).await;
        let (status, _, e) = error_of(resp).await;
        assert_eq!(
            (status, e["code"].as_str()),
            (502, Some("bad_gateway")),
            "{answer:?}"
        );
        let m = p.metrics().await;
        assert_eq!(reason(&m, "protocol"), 1.0, "{answer:?}");
        assert_eq!(reason(&m, "stream_broken") + reason(&m, "connect"), 0.0);
    }
}

/// A stream whose chunked body turns malformed after its first event: the client gets the
/// event, then the error event; counted as `protocol`. Cut instead, it is `stream_broken`.
#[tokio::test]
async fn a_stream_malformed_mid_way_counts_as_protocol_and_a_cut_one_as_broken() {
    let c = client();
    const HEAD: &str =
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
    const EVENT: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n";
    let first = format!("{HEAD}{:x}\r\n{EVENT}\r\n", EVENT.len());
    for (rest, counted, not) in [
        // Five bytes of data, then a CR that is not a CRLF.
        ("5\r\ndata:\r\r\n", "protocol", "stream_broken"),
        // A chunk of 0x40 bytes of which five arrive, then the connection closes.
        ("40\r\ndata:", "stream_broken", "protocol"),
    ] {
        let url = raw_backend(format!("{first}{rest}"), false).await.url;
        let p = proxy(&config(), &[("b", url)]).await;
        let resp = p.post_chat(&c, &chat("a", true)).await;
        assert_eq!(resp.status(), 200);
        let events = sse_payloads(resp).await;
        assert!(events[0].contains("\"hi\""), "{events:?}");
        let last: Value = serde_json::from_str(events.last().unwrap()).unwrap();
        assert_eq!(last["error"]["code"], "bad_gateway", "{events:?}");
        assert!(!events.iter().any(|e| e == "[DONE]"));
        let m = p.metrics().await;
        assert_eq!(reason(&m, counted), 1.0, "{counted}");
        assert_eq!(reason(&m, not), 0.0, "{counted}");
    }
}
