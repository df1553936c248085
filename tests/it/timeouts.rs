//! Timeouts on both sides: a stalled stream, a client trickling its headers, an idle
//! kept-alive connection — through the real server on loopback.

use crate::common;
use std::time::{Duration, Instant};

use common::*;
use switchboard_sim::SimConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn a_stalled_stream_ends_at_the_idle_limit_with_an_error_event() {
    let s = sim(SimConfig {
        stall_after: Some(2),
        ..SimConfig::default()
    })
    .await;
    let toml = r#"
[backends.b]
url = "{b}"
flavor = "llamacpp"
slots = 1
stream_idle_timeout_ms = 400
[aliases.a]
backend = "b"
"#;
    let p = proxy(toml, &[("b", s.url())]).await;
    let c = client();
    let started = Instant::now();
    let r = p.post_chat(&c, &chat("a", true)).await;
    assert_eq!(r.status(), 200);
    let events = sse_payloads(r).await;
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(400), "{took:?}");
    // The idle limit ended it (the event names it), within `WAIT` of the stall.
    let last = events.last().unwrap();
    assert!(last.starts_with("{\"error\""), "{events:?}");
    assert!(last.contains("upstream_timeout"), "{last}");
    assert!(last.contains("did not answer within 400ms"), "{last}");
    assert!(!events.iter().any(|e| e == "[DONE]"));
    // The slot and the in-flight count are free already.
    let snap = p.state.live.load_full();
    assert_eq!(snap.replica("b").unwrap().slots.free(), 1);
    let m = p.metrics().await;
    assert_eq!(
        sample(&m, r#"switchboard_inflight_requests{alias="a"}"#),
        0.0
    );
    assert_eq!(
        sample(
            &m,
            r#"switchboard_upstream_errors_total{alias="a",reason="timeout"}"#
        ),
        1.0
    );
    // The one slot serves the next request at once (no 429 after a queue wait).
    let s2 = p.post_chat(&c, &chat("a", false)).await;
    assert_eq!(s2.status(), 200);
}

/// How long until the proxy closes `tcp` (reads give 0 or an error), writing `trickle`
/// every 50 ms meanwhile; failing if it is still open after `WAIT` (the tests set the limit
/// not under test beyond it, so only the limit under test can close the connection in time).
async fn closed_after(mut tcp: tokio::net::TcpStream, trickle: Option<&[u8]>) -> Duration {
    let started = Instant::now();
    within("the proxy to close the connection", async {
        let mut buf = [0u8; 1024];
        loop {
            if let Some(bytes) = trickle {
                if tcp.write_all(bytes).await.is_err() {
                    return;
                }
            }
            let read = tokio::time::timeout(Duration::from_millis(50), tcp.read(&mut buf)).await;
            if let Ok(Ok(0) | Err(_)) = read {
                return;
            }
        }
    })
    .await;
    started.elapsed()
}

/// A chat request (streamed or not) written on a new raw connection to the proxy.
async fn post_raw(p: &Proxy, stream: bool) -> tokio::net::TcpStream {
    let mut tcp = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    let body = serde_json::to_vec(&chat("a", stream)).unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(&body).await.unwrap();
    tcp
}

/// Read from `tcp` into `answer` until `done` says it holds `what`; the connection must not
/// close first.
async fn read_until(
    tcp: &mut tokio::net::TcpStream,
    answer: &mut Vec<u8>,
    what: &str,
    done: impl Fn(&[u8]) -> bool,
) {
    let mut buf = [0u8; 4096];
    while !done(answer) {
        let n = within(what, tcp.read(&mut buf)).await.unwrap();
        assert!(n > 0, "closed before {what}");
        answer.extend_from_slice(&buf[..n]);
    }
}

#[tokio::test]
async fn a_client_trickling_headers_is_cut_off_at_the_header_limit() {
    let s = sim(SimConfig::default()).await;
    let toml = one_alias(
        "llamacpp",
        "client_header_timeout_ms = 400\nclient_idle_timeout_ms = 60000",
        "",
    );
    let p = proxy(&toml, &[("b", s.url())]).await;
    let mut tcp = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    tcp.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let took = closed_after(tcp, Some(b"x-slow: 1\r\n")).await;
    assert!(took >= Duration::from_millis(350), "{took:?}");
    // A client that sends its request in time is served on the same settings.
    assert_eq!(
        p.post_chat(&client(), &chat("a", false)).await.status(),
        200
    );
}

#[tokio::test]
async fn an_idle_connection_is_closed_at_the_idle_limit() {
    let s = sim(SimConfig::default()).await;
    let toml = one_alias(
        "llamacpp",
        "client_header_timeout_ms = 60000\nclient_idle_timeout_ms = 400",
        "",
    );
    let p = proxy(&toml, &[("b", s.url())]).await;
    // Kept alive after an answer, then idle.
    let mut tcp = post_raw(&p, false).await;
    let mut answer = Vec::new();
    read_until(&mut tcp, &mut answer, "the answer", |a| {
        String::from_utf8_lossy(a).contains("\"choices\"")
    })
    .await;
    // Counted from the answer's end, which came before the client read it: half the limit
    // leaves room for the test being scheduled late.
    let took = closed_after(tcp, None).await;
    assert!(took >= Duration::from_millis(200), "{took:?}");
}

#[tokio::test]
async fn an_answer_longer_than_the_idle_limit_is_served_whole_and_the_limit_counts_from_its_end() {
    let s = sim(SimConfig {
        gate: true,
        ..SimConfig::default()
    })
    .await;
    let toml = one_alias(
        "llamacpp",
        "client_header_timeout_ms = 60000\nclient_idle_timeout_ms = 300",
        "",
    );
    let p = proxy(&toml, &[("b", s.url())]).await;
    let mut tcp = post_raw(&p, true).await;
    let mut answer = Vec::new();
    read_until(&mut tcp, &mut answer, "the first event", |a| {
        String::from_utf8_lossy(a).contains("data: ")
    })
    .await;
    let mut buf = [0u8; 4096];
    // The backend holds the answer for more than twice the idle limit: the connection
    // stays open meanwhile.
    let held = Instant::now();
    while held.elapsed() < Duration::from_millis(800) {
        let read = tokio::time::timeout(Duration::from_millis(50), tcp.read(&mut buf)).await;
        if let Ok(read) = read {
            let n = read.unwrap();
            assert!(n > 0, "closed while the answer was held");
            answer.extend_from_slice(&buf[..n]);
        }
    }
    s.release();
    read_until(&mut tcp, &mut answer, "the rest of the answer", |a| {
        a.ends_with(b"0\r\n\r\n")
    })
    .await;
    assert!(String::from_utf8_lossy(&answer).contains("data: [DONE]"));
    // Closed after the answer's end (counted from the request, it would close at once):
    // half the limit leaves room for the test being scheduled late.
    let took = closed_after(tcp, None).await;
    assert!(took >= Duration::from_millis(150), "{took:?}");
}
