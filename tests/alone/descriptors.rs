//! The proxy out of file descriptors: its own want is no failure of a backend's. A health
//! probe that cannot open a socket leaves the backend's state as it was, and a request that
//! cannot open its backend connection gets a 503 without counting against the backend's
//! breaker. One test at a time: it lowers the process's descriptor limit.

use crate::common;
use common::*;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

/// A backend that answers every request (a probe's or a chat) with a chat completion and
/// closes the connection, so the proxy keeps none to reuse.
async fn closing_backend() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                if read_request(&mut tcp, &mut buf).await.is_none() {
                    return;
                }
                let body = r#"{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = tcp.write_all(answer.as_bytes()).await;
            });
        }
    });
    url
}

fn chat_request() -> Vec<u8> {
    let body = serde_json::to_vec(&chat("a", false)).unwrap();
    let mut req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(&body);
    req
}

/// Files opened until the process has no descriptor left (under a lowered soft limit).
fn exhaust() -> Vec<std::fs::File> {
    let mut held = Vec::new();
    loop {
        match std::fs::File::open("/dev/null") {
            Ok(f) => held.push(f),
            Err(e) if e.raw_os_error() == Some(24) => return held,
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test]
async fn out_of_descriptors_the_proxy_blames_no_backend() {
    let _one = crate::ONE_AT_A_TIME.lock().await;
    let url = closing_backend().await;
    let toml = one_alias("llamacpp", "breaker_failures = 1", "");
    let p = proxy(&toml, &[("b", url)]).await;
    switchboard_proxy::live::probes::probe_all(&p.state).await;
    assert_eq!(p.state.shown_state("b"), "up");
    let mut tcp = TcpStream::connect(p.addr).await.unwrap();
    assert_eq!(send_on(&mut tcp, &chat_request()).await.0, 200);

    let (soft, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap();
    rlimit::setrlimit(rlimit::Resource::NOFILE, 256, hard).unwrap();
    let held = exhaust();
    // No socket for the probe: the backend stays up.
    switchboard_proxy::live::probes::probe_all(&p.state).await;
    let state = p.state.shown_state("b");
    // No socket for the request: a 503 of the proxy's, twice, and the breaker (which one
    // counted failure would open) stays closed.
    let first = send_on(&mut tcp, &chat_request()).await;
    let second = send_on(&mut tcp, &chat_request()).await;
    drop(held);
    rlimit::setrlimit(rlimit::Resource::NOFILE, soft, hard).unwrap();

    assert_eq!(state, "up");
    for (status, body) in [first, second] {
        assert_eq!(status, 503, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["error"]["code"], "proxy_overloaded", "{v}");
    }
    assert_eq!(p.state.shown_state("b"), "up");
    let m = p.metrics().await;
    assert!(
        m.contains(r#"switchboard_breaker_state{backend="b",state="closed"} 1"#),
        "{m}"
    );
    assert!(
        m.contains(r#"switchboard_upstream_errors_total{alias="a",reason="connect"} 0"#),
        "{m}"
    );
    // Descriptors back, the backend serves again.
    assert_eq!(send_on(&mut tcp, &chat_request()).await.0, 200);
}
