//! A backend that answers before it has read the request's body is heard,
//! and a request that may have reached a backend is never sent again — not on a new
//! connection, not to another replica or fallback. Raw-socket backends on 127.0.0.1:0 that
//! count the request heads they receive; 20 MiB bodies (made at test time), far more than the
//! kernel's socket buffers take at once.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::*;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What a backend does with a request once it has read its head.
#[derive(Clone, Copy, Debug)]
enum Reply {
    /// Answer 413 with a JSON error of its own and close, the body unread.
    Refuse,
    /// Read the body whole, answer 200 with a chat completion, keep the connection.
    Serve,
    /// Read 1 MiB of the body (or all of a smaller one), then close without a word.
    Cut,
    /// Read the body whole and never answer.
    Hold,
}

const REFUSAL: &str = r#"{"error":{"message":"request entity too large: 20971520 bytes over the limit of 1048576","type":"invalid_request_error","code":"payload_too_large"}}"#;

const COMPLETION: &str = r#"{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;

/// A backend on 127.0.0.1:0 that replies to its `n`-th request head (counted over all its
/// connections, from 0) with `script(n)`.
struct Backend {
    url: String,
    connections: Arc<AtomicUsize>,
    heads: Arc<AtomicUsize>,
}

impl Backend {
    async fn start(script: fn(usize) -> Reply) -> Backend {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let connections = Arc::new(AtomicUsize::new(0));
        let heads = Arc::new(AtomicUsize::new(0));
        let (conns, seen) = (Arc::clone(&connections), Arc::clone(&heads));
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                conns.fetch_add(1, Ordering::SeqCst);
                // Answers leave at once: a close with the body unread drops what is unsent.
                let _ = tcp.set_nodelay(true);
                tokio::spawn(serve(tcp, Arc::clone(&seen), script));
            }
        });
        Backend {
            url,
            connections,
            heads,
        }
    }

    fn heads(&self) -> usize {
        self.heads.load(Ordering::SeqCst)
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// One connection of a [`Backend`]: request after request, until a reply closes it.
async fn serve(mut tcp: TcpStream, heads: Arc<AtomicUsize>, script: fn(usize) -> Reply) {
    let mut buf = Vec::new();
    loop {
        let Some((head_len, body_len)) = read_head(&mut tcp, &mut buf).await else {
            return;
        };
        let n = heads.fetch_add(1, Ordering::SeqCst);
        buf.drain(..head_len);
        match script(n) {
            Reply::Refuse => {
                let answer = format!(
                    "HTTP/1.1 413 Payload Too Large\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\nconnection: close\r\n\r\n{REFUSAL}",
                    REFUSAL.len()
                );
                let _ = tcp.write_all(answer.as_bytes()).await;
                // Dropped with the body unread: the kernel resets the connection.
                return;
            }
            Reply::Cut => {
                let _ = read_body(&mut tcp, &mut buf, body_len.min(1 << 20)).await;
                return;
            }
            Reply::Hold => {
                let _ = read_body(&mut tcp, &mut buf, body_len).await;
                // Reads on, answering nothing, until the proxy goes away.
                let mut sink = [0u8; 4096];
                while matches!(tcp.read(&mut sink).await, Ok(n) if n > 0) {}
                return;
            }
            Reply::Serve => {
                if !read_body(&mut tcp, &mut buf, body_len).await {
                    return;
                }
                buf.drain(..body_len);
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\n\r\n{COMPLETION}",
                    COMPLETION.len()
                );
                if tcp.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Read until `buf` holds a whole head: its length and the body's `content-length`; `None`
/// when the connection ends first.
async fn read_head(tcp: &mut TcpStream, buf: &mut Vec<u8>) -> Option<(usize, usize)> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            return Some((end + 4, len));
        }
        let mut chunk = [0u8; 16 * 1024];
        match tcp.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Read until `buf` holds `len` bytes; false when the connection ends first.
async fn read_body(tcp: &mut TcpStream, buf: &mut Vec<u8>, len: usize) -> bool {
    let mut chunk = vec![0u8; 256 * 1024];
    while buf.len() < len {
        match tcp.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    true
}

/// A chat request for `model` whose one message is `size` bytes long.
fn big_chat(model: &str, size: usize) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "model": model,
        "messages": [{"role": "user", "content": "x".repeat(size)}],
    }))
    .unwrap()
}

const BIG: usize = 20 << 20;

/// How long a `BIG` request may take, against `WAIT` for a small one: in a debug build on a
/// loaded machine, reading, checking and sending 20 MiB on to two backends in turn took over
/// 10 s. Still a bound, so a hang fails.
const BIG_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// POST `body` to the proxy's chat completions: status and body.
async fn post(p: &Proxy, c: &reqwest::Client, body: Vec<u8>) -> (u16, Vec<u8>) {
    let exchange = async {
        let r = c
            .post(p.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.bytes().await.unwrap().to_vec())
    };
    tokio::time::timeout(BIG_WAIT, exchange)
        .await
        .expect("the proxy's answer within BIG_WAIT")
}

/// One alias `a` on the backend `b`.
const ONE: &str = r#"
[backends.b]
url = "{b}"
flavor = "llamacpp"
[aliases.a]
backend = "b"
"#;

/// The backend's 413, sent after the head and before the body is read, then the connection
/// reset: the client gets that 413 and its body (it used to get a 502 "connection reset").
#[tokio::test]
async fn a_413_sent_before_the_body_is_read_reaches_the_client() {
    let b = Backend::start(|_| Reply::Refuse).await;
    let p = proxy(ONE, &[("b", b.url.clone())]).await;
    let c = client();
    let (status, body) = post(&p, &c, big_chat("a", BIG)).await;
    assert_eq!(status, 413, "{}", String::from_utf8_lossy(&body));
    assert_eq!(String::from_utf8_lossy(&body), REFUSAL);
    assert_eq!((b.heads(), b.connections()), (1, 1));
    // Small requests are refused just the same, each on a connection of its own.
    let (status, body) = post(&p, &c, big_chat("a", 10)).await;
    assert_eq!(
        (status, String::from_utf8_lossy(&body).as_ref()),
        (413, REFUSAL)
    );
    assert_eq!((b.heads(), b.connections()), (2, 2));
}

/// A request written on a kept-alive connection that the backend resets halfway through
/// the body, before a byte of answer: sent once more on a new connection, and answered (the
/// backend never had it whole, and answered nothing on the connection it cut).
#[tokio::test]
async fn a_request_a_pooled_connection_loses_mid_body_goes_once_more_on_a_new_one() {
    let b = Backend::start(|n| if n == 1 { Reply::Cut } else { Reply::Serve }).await;
    let p = proxy(ONE, &[("b", b.url.clone())]).await;
    let c = client();
    // Made before the first request: the connection it leaves is pooled for 3 s only, so
    // the body is no larger than needed (the backend cuts after 1 MiB) to be read in time.
    let big = big_chat("a", 4 << 20);
    let (status, _) = post(&p, &c, big_chat("a", 10)).await;
    assert_eq!(status, 200);
    let (status, body) = post(&p, &c, big).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!((b.heads(), b.connections()), (3, 2));
    let m = p.metrics().await;
    assert_eq!(
        sample(
            &m,
            r#"switchboard_upstream_retries_total{backend="b",reason="reset"}"#
        ),
        1.0
    );
}

/// A request a new connection loses mid-body: 502, and it is not written again (a new
/// connection is no kept one the backend may have closed as the request arrived).
#[tokio::test]
async fn a_request_a_new_connection_loses_is_never_sent_again() {
    let b = Backend::start(|n| if n == 0 { Reply::Cut } else { Reply::Serve }).await;
    let p = proxy(ONE, &[("b", b.url.clone())]).await;
    let c = client();
    let (status, body) = post(&p, &c, big_chat("a", BIG)).await;
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status, 502, "{v}");
    assert_eq!(v["error"]["type"], "server_error", "{v}");
    assert_eq!(v["error"]["code"], "bad_gateway", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("upstream b failed: "), "{message}");
    assert_eq!(
        (b.heads(), b.connections()),
        (1, 1),
        "the request was sent again"
    );
    // The next request has a new connection and is served.
    let (status, _) = post(&p, &c, big_chat("a", 10)).await;
    assert_eq!((status, b.heads(), b.connections()), (200, 2, 2));
}

/// Two replicas that each cut a request mid-body, then a fallback that serves, under the
/// `[server]` lines `server`; one large request sent. What the client got, and the request
/// heads each backend saw (a, b, fallback), and the proxy's metrics.
async fn cut_by_both_replicas(server: &str) -> (u16, Vec<u8>, (usize, usize, usize), String) {
    cut_by(server, r#"["a", "b"]"#).await
}

/// Replicas `a` and `b` that cut every request, and `f`, the fallback's, that serves it; the
/// alias `m` on `replicas` of them.
async fn cut_by(server: &str, replicas: &str) -> (u16, Vec<u8>, (usize, usize, usize), String) {
    let a = Backend::start(|_| Reply::Cut).await;
    let b = Backend::start(|_| Reply::Cut).await;
    let f = Backend::start(|_| Reply::Serve).await;
    let toml = format!(
        r#"
[server]
{server}
[backends.a]
url = "{{a}}"
flavor = "llamacpp"
[backends.b]
url = "{{b}}"
flavor = "llamacpp"
[backends.f]
url = "{{f}}"
flavor = "llamacpp"
[aliases.m]
backends = {replicas}
fallbacks = ["spare"]
[aliases.spare]
backend = "f"
"#
    );
    let urls = [
        ("a", a.url.clone()),
        ("b", b.url.clone()),
        ("f", f.url.clone()),
    ];
    let p = proxy(&toml, &urls).await;
    let (status, body) = post(&p, &client(), big_chat("m", BIG)).await;
    (
        status,
        body,
        (a.heads(), b.heads(), f.heads()),
        p.metrics().await,
    )
}

/// With `resend_unanswered = false`, two replicas, then a fallback: the replica that got the
/// request resets it mid-body, and the request goes to no other backend (each would cut it
/// too, or serve it, and count it).
#[tokio::test]
async fn with_resend_unanswered_off_a_request_cut_mid_body_goes_nowhere_else() {
    let (status, body, (a, b, f), m) = cut_by_both_replicas("resend_unanswered = false").await;
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status, 502, "{v}");
    assert_eq!(v["error"]["code"], "bad_gateway", "{v}");
    assert_eq!(a + b + f, 1, "the request went on");
    assert!(!m.contains("switchboard_fallbacks_total{"), "{m}");
}

/// By default a chat a replica took and closed without a word (a backend killed
/// mid-request) goes on, once: to the fallback, which serves it.
#[tokio::test]
async fn a_chat_dropped_unanswered_is_sent_on_by_default() {
    let (status, body, heads, m) = cut_by("", r#"["a"]"#).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(heads, (1, 0, 1));
    let line = m
        .lines()
        .find(|l| l.starts_with("switchboard_fallbacks_total{") && l.contains(r#"to="spare""#))
        .unwrap_or_default();
    assert!(line.contains(r#"reason="connect""#), "{m}");
    // A hang-up is not the backend failing on its own: its breaker stays closed.
    assert!(
        m.contains(r#"switchboard_breaker_state{backend="a",state="closed"} 1"#),
        "{m}"
    );
}

/// Only once, even with `resend_unanswered = true`: a request each replica hangs up on (one
/// that makes backends fail, say) reaches two backends, not every one.
#[tokio::test]
async fn a_request_dropped_unanswered_is_sent_on_only_once() {
    for server in ["", "resend_unanswered = true"] {
        let (status, body, heads, m) = cut_by_both_replicas(server).await;
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(status, 502, "{v}");
        assert_eq!(v["error"]["code"], "bad_gateway", "{v}");
        assert_eq!(heads, (1, 1, 0), "{server}");
        assert!(!m.contains("switchboard_fallbacks_total{"), "{m}");
        for backend in ["a", "b"] {
            let closed =
                format!(r#"switchboard_breaker_state{{backend="{backend}",state="closed"}} 1"#);
            assert!(m.contains(&closed), "{m}");
        }
    }
}

/// A replica that read the whole request and gives no head within the first-byte limit may
/// be running it: 504, and the other replica does not get it too.
#[tokio::test]
async fn a_request_that_timed_out_on_a_replica_is_not_sent_to_another() {
    let a = Backend::start(|_| Reply::Hold).await;
    let b = Backend::start(|_| Reply::Hold).await;
    // Not even with `resend_unanswered`: no answer in time is not a closed connection.
    let toml = r#"
[server]
header_timeout_secs = 1
resend_unanswered = true
[backends.a]
url = "{a}"
flavor = "llamacpp"
[backends.b]
url = "{b}"
flavor = "llamacpp"
[aliases.m]
backends = ["a", "b"]
"#;
    let p = proxy(toml, &[("a", a.url.clone()), ("b", b.url.clone())]).await;
    let (status, body) = post(&p, &client(), big_chat("m", 10)).await;
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (504, Some("upstream_timeout"))
    );
    assert_eq!(a.heads() + b.heads(), 1, "the request went on");
}
