//! Https backends through the one upstream client, against a local TLS backend whose
//! CA is made at test time (a TLS front on 127.0.0.1:0 in front of the simulator).
use crate::common;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::*;
use serde_json::Value;
use switchboard_proxy::fleet::health::BackendState;
use switchboard_proxy::live::AppState;
use switchboard_sim::{Sim, SimConfig};
use switchboard_wire::flavor::Flavor;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

/// A CA made at test time and a server certificate it signed.
mod test_ca {
    include!("common/test_ca.rs");
}

/// The fleet's CA.
fn fleet() -> test_ca::TestCa {
    test_ca::test_ca("test fleet CA")
}

/// An https backend: TLS ends on 127.0.0.1:0, the bytes go on to the simulator. Counts the
/// TCP connections it accepts.
struct TlsBackend {
    port: u16,
    accepted: Arc<AtomicUsize>,
    sim: Sim,
}

async fn tls_backend(server: Arc<rustls::ServerConfig>, flavor: Flavor) -> TlsBackend {
    let sim = sim(SimConfig {
        flavor,
        model: "up-model".into(),
        ..SimConfig::default()
    })
    .await;
    let to = sim.addr();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    let acceptor = TlsAcceptor::from(server);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Ok(mut plain) = TcpStream::connect(to).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    TlsBackend {
        port,
        accepted,
        sim,
    }
}

/// One alias `a` on the https backend `b` at `localhost:port`, trusting `ca_file` if given.
fn config(port: u16, flavor: Flavor, ca_file: Option<&Path>) -> String {
    let ca = ca_file.map_or(String::new(), |p| {
        format!("ca_file = {:?}\n", p.display().to_string())
    });
    format!(
        r#"
[backends.b]
url = "https://localhost:{port}"
flavor = "{flavor}"
slots = 8
{ca}
[aliases.a]
backend = "b"
upstream_model = "up-model"
context_window = 4096
"#,
        flavor = flavor.as_str()
    )
}

async fn tls_proxy(text: &str) -> Proxy {
    let cfg = switchboard_proxy::config::from_toml(text).expect("valid test config");
    start(AppState::new(cfg, None).expect("CA file loads")).await
}

#[tokio::test]
async fn tls_chat_goes_through_the_proxy() {
    let fleet = fleet();
    let b = tls_backend(Arc::clone(&fleet.server), Flavor::Llamacpp).await;
    let p = tls_proxy(&config(b.port, Flavor::Llamacpp, Some(&fleet.ca_file))).await;
    let r = p.post_chat(&client(), &chat("a", false)).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion");
    let seen = b.sim.recorder().last().unwrap();
    assert_eq!(seen.path, "/v1/chat/completions");
    let sent: Value = serde_json::from_slice(&seen.body).unwrap();
    assert_eq!(sent["model"], "up-model");
    assert_eq!(seen.headers["host"], format!("localhost:{}", b.port));
}

#[tokio::test]
async fn tls_streams_go_through_the_proxy() {
    let fleet = fleet();
    let b = tls_backend(Arc::clone(&fleet.server), Flavor::Vllm).await;
    let p = tls_proxy(&config(b.port, Flavor::Vllm, Some(&fleet.ca_file))).await;
    let r = p.post_chat(&client(), &chat("a", true)).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let events = sse_payloads(r).await;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert!(chunks.len() > 1, "{events:?}");
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
}

/// The pool keeps TLS connections alive: requests in a row, whole answers and streams, take
/// one connection to the backend.
#[tokio::test]
async fn tls_connections_are_kept_alive_across_requests() {
    let fleet = fleet();
    let b = tls_backend(Arc::clone(&fleet.server), Flavor::Vllm).await;
    let p = tls_proxy(&config(b.port, Flavor::Vllm, Some(&fleet.ca_file))).await;
    let c = client();
    for i in 0..5 {
        let r = p.post_chat(&c, &chat("a", i % 2 == 1)).await;
        assert_eq!(r.status(), 200);
        within("the answer's end", r.bytes()).await.unwrap();
    }
    assert_eq!(b.accepted.load(Ordering::SeqCst), 1);
}

/// A certificate that no trusted CA signed: 502, the message naming TLS and the reason, not
/// the backend's host or port; counted as a connect failure.
#[tokio::test]
async fn tls_untrusted_certificate_is_a_502_that_says_why() {
    let fleet = fleet();
    let b = tls_backend(Arc::clone(&fleet.server), Flavor::Llamacpp).await;
    let p = tls_proxy(&config(b.port, Flavor::Llamacpp, None)).await;
    let r = p.post_chat(&client(), &chat("a", false)).await;
    assert_eq!(r.status(), 502);
    let v: Value = r.json().await.unwrap();
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with("upstream b is unreachable: tls handshake failed"),
        "{msg}"
    );
    assert!(msg.contains("not signed by a trusted CA"), "{msg}");
    assert!(
        !msg.contains("localhost") && !msg.contains(&b.port.to_string()),
        "{msg}"
    );
    assert_eq!(v["error"]["code"], "bad_gateway");
    assert!(b.sim.recorder().last().is_none());
    let m = p.metrics().await;
    assert_eq!(
        sample(
            &m,
            r#"switchboard_upstream_errors_total{alias="a",reason="connect"}"#
        ),
        1.0
    );
}

#[tokio::test]
async fn tls_health_probe_sees_the_backend_up() {
    let fleet = fleet();
    let b = tls_backend(Arc::clone(&fleet.server), Flavor::Llamacpp).await;
    let p = tls_proxy(&config(b.port, Flavor::Llamacpp, Some(&fleet.ca_file))).await;
    within(
        "probes",
        switchboard_proxy::live::probes::probe_all(&p.state),
    )
    .await;
    assert_eq!(p.state.health.get("b"), Some(BackendState::up));
    assert_eq!(b.sim.recorder().last().unwrap().path, "/health");
    // Not trusted: down.
    let untrusted = tls_proxy(&config(b.port, Flavor::Llamacpp, None)).await;
    within(
        "probes",
        switchboard_proxy::live::probes::probe_all(&untrusted.state),
    )
    .await;
    assert_eq!(untrusted.state.health.get("b"), Some(BackendState::down));
}

/// A CA file that cannot be read is refused by `switchboard check`, at start-up and on
/// reload, by its key; the running config stays.
#[tokio::test]
async fn tls_unusable_ca_file_is_reported_by_its_key() {
    let fleet = fleet();
    let b = tls_backend(Arc::clone(&fleet.server), Flavor::Llamacpp).await;
    let missing = fleet.dir.path().join("missing.pem");
    let want = format!(
        "backends.b.ca_file: {:?} cannot be read",
        missing.display().to_string()
    );

    let bad = config(b.port, Flavor::Llamacpp, Some(&missing));
    let cfg = switchboard_proxy::config::from_toml(&bad).expect("validation reads no file");
    let err = AppState::new(cfg, None).unwrap_err().to_string();
    assert!(err.starts_with(&want), "{err}");

    let path = fleet.dir.path().join("routes.toml");
    std::fs::write(&path, &bad).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchboard"))
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&want), "{stderr}");

    std::fs::write(
        &path,
        config(b.port, Flavor::Llamacpp, Some(&fleet.ca_file)),
    )
    .unwrap();
    let cfg = switchboard_proxy::config::load(&path).unwrap();
    let p = start(AppState::new(cfg, Some(path.clone())).unwrap()).await;
    std::fs::write(&path, &bad).unwrap();
    let err = switchboard_proxy::live::reload::reload(&p.state)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains(&want), "{err}");
    let r = p.post_chat(&client(), &chat("a", false)).await;
    assert_eq!(r.status(), 200);
}

/// An https backend that answers 413 once it has the head, before reading the
/// 20 MiB body, and closes: the client gets that 413 and its body, and the backend saw the
/// request once.
#[tokio::test]
async fn tls_a_413_sent_before_the_body_is_read_reaches_the_client() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const REFUSAL: &str = r#"{"error":{"message":"too large","type":"invalid_request_error"}}"#;
    let fleet = fleet();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let heads = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&heads);
    let acceptor = TlsAcceptor::from(Arc::clone(&fleet.server));
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            // The answer leaves at once: a close with the body unread drops what is unsent.
            let _ = tcp.set_nodelay(true);
            let (acceptor, seen) = (acceptor.clone(), Arc::clone(&seen));
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let (mut head, mut buf) = (Vec::new(), [0u8; 4096]);
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                seen.fetch_add(1, Ordering::SeqCst);
                let answer = format!(
                    "HTTP/1.1 413 Payload Too Large\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\nconnection: close\r\n\r\n{REFUSAL}",
                    REFUSAL.len()
                );
                let _ = tls.write_all(answer.as_bytes()).await;
                let _ = tls.flush().await;
                // Dropped with the body unread: the kernel resets the connection.
            });
        }
    });
    let text = config(port, Flavor::Llamacpp, Some(&fleet.ca_file));
    let p = tls_proxy(&text.replace("context_window = 4096\n", "")).await;
    let body = serde_json::json!({
        "model": "a",
        "messages": [{"role": "user", "content": "x".repeat(20 << 20)}],
    });
    let r = within(
        "the proxy's answer",
        client()
            .post(p.url("/v1/chat/completions"))
            .json(&body)
            .send(),
    )
    .await
    .unwrap();
    let status = r.status();
    let text = within("its body", r.text()).await.unwrap();
    assert_eq!((status.as_u16(), text.as_str()), (413, REFUSAL));
    assert_eq!(heads.load(Ordering::SeqCst), 1);
}
