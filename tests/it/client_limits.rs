//! What a slow or greedy client can hold: a request body stalled or trickled is cut at its
//! limit with a 408 in the API's envelope and the connection closed; connections past
//! `max_connections` are refused at once while the clients already connected are served.

use crate::common;
use common::*;
use switchboard_sim::SimConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Everything `tcp` sends until it closes.
async fn read_to_close(tcp: &mut TcpStream) -> String {
    let mut answer = Vec::new();
    within("the connection to close", tcp.read_to_end(&mut answer))
        .await
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// The JSON body of a whole HTTP answer `raw`.
fn body_of(raw: &str) -> serde_json::Value {
    let (_, body) = raw.split_once("\r\n\r\n").expect("an answer head");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {raw}"))
}

async fn head_only(p: &Proxy, path: &str, declared: usize, first: &[u8]) -> TcpStream {
    let mut tcp = TcpStream::connect(p.addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {declared}\r\n\r\n"
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(first).await.unwrap();
    tcp
}

#[tokio::test]
async fn a_stalled_body_gets_408_in_each_apis_envelope_and_the_connection_closes() {
    let s = sim(SimConfig::default()).await;
    let toml = one_alias(
        "llamacpp",
        "client_body_timeout_ms = 300\nclient_idle_timeout_ms = 60000",
        "",
    );
    let p = proxy(&toml, &[("b", s.url())]).await;
    // Four of a hundred declared bytes, then nothing.
    let mut tcp = head_only(&p, "/v1/chat/completions", 100, b"{\"mo").await;
    let raw = read_to_close(&mut tcp).await;
    assert!(raw.starts_with("HTTP/1.1 408 "), "{raw}");
    assert!(
        raw.to_ascii_lowercase().contains("connection: close"),
        "{raw}"
    );
    let e = body_of(&raw);
    assert_eq!(e["error"]["code"], "request_timeout", "{e}");
    assert_eq!(e["error"]["type"], "invalid_request_error", "{e}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("stalled"),
        "{e}"
    );

    let mut tcp = head_only(&p, "/v1/messages", 100, b"{\"mo").await;
    let raw = read_to_close(&mut tcp).await;
    assert!(raw.starts_with("HTTP/1.1 408 "), "{raw}");
    let e = body_of(&raw);
    assert_eq!(e["type"], "error", "{e}");
    assert!(e["error"]["message"].is_string(), "{e}");

    // A chunked body stalled mid-chunk: the same.
    let mut tcp = TcpStream::connect(p.addr).await.unwrap();
    tcp.write_all(
        b"POST /v1/responses HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n40\r\n{\"model\"",
    )
    .await
    .unwrap();
    let raw = read_to_close(&mut tcp).await;
    assert!(raw.starts_with("HTTP/1.1 408 "), "{raw}");
    assert_eq!(body_of(&raw)["error"]["code"], "request_timeout");
    assert!(
        s.recorder().requests().is_empty(),
        "nothing reached the backend"
    );
}

#[tokio::test]
async fn a_trickling_body_is_cut_at_the_total_limit() {
    let s = sim(SimConfig::default()).await;
    let toml = one_alias(
        "llamacpp",
        "client_body_timeout_ms = 5000\nclient_body_total_timeout_ms = 600",
        "",
    );
    let p = proxy(&toml, &[("b", s.url())]).await;
    let mut tcp = head_only(&p, "/v1/chat/completions", 10_000, b"{").await;
    // One byte every 50 ms, well within the idle limit, until the proxy answers and closes.
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let raw = within("the answer to a trickled body", async {
        loop {
            tokio::select! {
                n = tcp.read(&mut buf) => {
                    let n = n.unwrap();
                    if n == 0 {
                        break String::from_utf8_lossy(&answer).into_owned();
                    }
                    answer.extend_from_slice(&buf[..n]);
                }
                () = tokio::time::sleep(std::time::Duration::from_millis(50)) => {
                    // The proxy may have closed its side already: a failed write ends nothing.
                    let _ = tcp.write_all(b" ").await;
                }
            }
        }
    })
    .await;
    assert!(raw.starts_with("HTTP/1.1 408 "), "{raw}");
    let e = body_of(&raw);
    assert_eq!(e["error"]["code"], "request_timeout");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not received within 600ms"),
        "{e}"
    );
}

/// A keep-alive GET on `tcp`; the answer's status and body.
async fn get_on(tcp: &mut TcpStream, path: &str) -> (u16, String) {
    let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n");
    send_on(tcp, req.as_bytes()).await
}

fn gauge(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no {name} in the scrape"))
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn connections_past_the_cap_are_refused_at_once_and_the_connected_are_served() {
    let s = sim(SimConfig::default()).await;
    let toml = one_alias("llamacpp", "max_connections = 8", "");
    let p = proxy(&toml, &[("b", s.url())]).await;
    // A client connected before the flood.
    let mut normal = TcpStream::connect(p.addr).await.unwrap();
    assert_eq!(get_on(&mut normal, "/health").await.0, 200);
    // Seven connections that send nothing fill the cap (accepted in the order they came).
    let mut flood = Vec::new();
    for _ in 0..7 {
        flood.push(TcpStream::connect(p.addr).await.unwrap());
    }
    // Every one past it is answered 503 and closed at once.
    for _ in 0..20 {
        let mut extra = TcpStream::connect(p.addr).await.unwrap();
        let raw = read_to_close(&mut extra).await;
        assert!(raw.starts_with("HTTP/1.1 503 "), "{raw}");
        let e = body_of(&raw);
        assert_eq!(e["error"]["code"], "too_many_connections", "{e}");
        assert!(raw.to_ascii_lowercase().contains("retry-after: 1"), "{raw}");
    }
    // Meanwhile the connected client is served: a chat and the scrape.
    let body = serde_json::to_vec(&chat("a", false)).unwrap();
    let mut request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(&body);
    let (status, answer) = send_on(&mut normal, &request).await;
    assert_eq!(status, 200, "{answer}");
    let (status, metrics) = get_on(&mut normal, "/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(gauge(&metrics, "switchboard_client_connections"), 8.0);
    assert_eq!(
        gauge(&metrics, "switchboard_connections_refused_total"),
        20.0
    );
    // The flood gone, its places come back.
    drop(flood);
    within("the flood's connections to be released", async {
        loop {
            let (_, metrics) = get_on(&mut normal, "/metrics").await;
            if gauge(&metrics, "switchboard_client_connections") == 1.0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    let mut again = TcpStream::connect(p.addr).await.unwrap();
    assert_eq!(get_on(&mut again, "/health").await.0, 200);
}

/// A body nesting 5,000 arrays deep in `tools` (which the proxy forwards unread) is refused
/// with a 400 in each API's envelope before any backend sees it, however often it comes: the
/// backend's breaker never hears of it and the alias keeps serving.
#[tokio::test]
async fn a_body_nested_past_the_limit_never_reaches_a_backend_nor_its_breaker() {
    let s = sim(SimConfig::default()).await;
    let toml = one_alias("llamacpp", "breaker_failures = 2", "");
    let p = proxy(&toml, &[("b", s.url())]).await;
    let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
    let c = client();
    for (path, anthropic) in [
        ("/v1/chat/completions", false),
        ("/v1/responses", false),
        ("/v1/messages", true),
        ("/v1/messages/count_tokens", true),
        ("/v1/completions", false),
    ] {
        for _ in 0..3 {
            let body = format!(
                r#"{{"model":"a","max_tokens":4,"messages":[{{"role":"user","content":"hi"}}],"input":"hi","prompt":"hi","tools":{deep}}}"#
            );
            let r = c
                .post(p.url(path))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 400, "{path}");
            let v: serde_json::Value = r.json().await.unwrap();
            if anthropic {
                assert_eq!(v["type"], "error", "{v}");
                assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
            } else {
                assert_eq!(v["error"]["code"], "json_too_deep", "{v}");
            }
            let message = v["error"]["message"].as_str().unwrap();
            assert!(message.contains("more than 64 deep"), "{v}");
        }
    }
    assert!(
        s.recorder().requests().is_empty(),
        "a backend saw a refused body"
    );
    // Nesting within the limit passes.
    let body = serde_json::json!({
        "model": "a", "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "array", "items": {"type": "object"}}}
        }}}],
    });
    assert_eq!(status(&c, &p.url("/v1/chat/completions"), &body).await, 200);
    let m = p.metrics().await;
    assert!(
        m.contains(r#"switchboard_breaker_state{backend="b",state="closed"} 1"#),
        "{m}"
    );
}
