//! Test harness: the real proxy on 127.0.0.1:0 in front of simulated backends.

pub mod batch_api;
pub mod postgres;
pub mod served;
pub mod spec;
pub mod toml;

use std::net::SocketAddr;
use std::time::Duration;

use switchboard_proxy::live::AppState;
use switchboard_sim::{Sim, SimConfig};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Every wait in a test is bounded by this, so a bug fails instead of hanging.
pub const WAIT: Duration = Duration::from_secs(10);

/// A loopback port nothing listens on now (for a process started with it).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub async fn within<F: std::future::Future>(what: &str, f: F) -> F::Output {
    match tokio::time::timeout(WAIT, f).await {
        Ok(v) => v,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

pub struct Proxy {
    pub addr: SocketAddr,
    pub state: AppState,
    stop: Option<oneshot::Sender<()>>,
    pub task: JoinHandle<std::io::Result<()>>,
}

impl Proxy {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Begin graceful shutdown (as SIGTERM does).
    pub fn shutdown(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }

    /// POST `body` as JSON to the proxy's chat completions; the answer's head, within `WAIT`.
    pub async fn post_chat(
        &self,
        c: &reqwest::Client,
        body: &serde_json::Value,
    ) -> reqwest::Response {
        within(
            "the answer's head",
            c.post(self.url("/v1/chat/completions")).json(body).send(),
        )
        .await
        .unwrap()
    }

    /// GET `path` of the proxy, its answer read as JSON.
    pub async fn get_json(&self, path: &str) -> serde_json::Value {
        json_at(&self.url(path)).await
    }

    pub async fn metrics(&self) -> String {
        reqwest::get(self.url("/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

/// `toml` with `{name}` placeholders replaced by `urls`.
pub fn fill(toml: &str, urls: &[(&str, String)]) -> String {
    let mut text = toml.to_string();
    for (name, url) in urls {
        text = text.replace(&format!("{{{name}}}"), url);
    }
    text
}

/// Start the proxy with a TOML config; `{name}` placeholders in it are replaced by `urls`.
pub async fn proxy(toml: &str, urls: &[(&str, String)]) -> Proxy {
    let cfg = switchboard_proxy::config::from_toml(&fill(toml, urls)).expect("valid test config");
    start(AppState::new(cfg, None).expect("test config loads")).await
}

/// Start the proxy on an already built state.
pub async fn start(state: AppState) -> Proxy {
    let grace = state.live.load().config.server.shutdown_grace;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel();
    let st = state.clone();
    switchboard_proxy::http::batches::spawn_runner(&state);
    let task = tokio::spawn(async move {
        switchboard_proxy::http::server::run(
            listener,
            st,
            async move {
                let _ = rx.await;
            },
            grace,
            std::future::pending(),
        )
        .await
    });
    Proxy {
        addr,
        state,
        stop: Some(tx),
        task,
    }
}

/// The JSON a `GET` of `url` answers.
pub async fn json_at(url: &str) -> serde_json::Value {
    reqwest::get(url).await.unwrap().json().await.unwrap()
}

pub async fn sim(cfg: SimConfig) -> Sim {
    Sim::spawn(cfg).await.expect("simulator starts")
}

/// A simulator of `flavor` in GPU mode (`gpu`) with `slots` slots of 64k tokens each.
pub async fn gpu_sim(
    flavor: switchboard_wire::flavor::Flavor,
    slots: u32,
    gpu: switchboard_sim::GpuSim,
) -> Sim {
    sim(SimConfig {
        flavor,
        slots,
        slot_ctx: 65_536,
        gpu: Some(gpu),
        ..SimConfig::default()
    })
    .await
}

/// One alias `a` (old name `old-a`) on one backend `b` at `{b}`.
pub fn one_alias(flavor: &str, extra_server: &str, extra_alias: &str) -> String {
    toml::Fleet::new()
        .server(extra_server)
        .backend("b", flavor)
        .slots(8)
        .alias("a", "b")
        .model("up-model")
        .window(4096)
        .text("old_names = [\"old-a\"]")
        .text(extra_alias)
        .render()
}

/// Read one HTTP/1.1 request (its head, then the bytes its content-length says) from `tcp`
/// into `buf`; its length, or `None` when the connection ends first. Bytes of a next request
/// read with it stay in `buf` after it.
pub async fn read_request(tcp: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> Option<usize> {
    use tokio::io::AsyncReadExt;
    loop {
        if let Some(end) = buf
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map(|at| at + 4)
        {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            if buf.len() >= end + len {
                return Some(end + len);
            }
        }
        let mut chunk = [0u8; 4096];
        match tcp.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A backend over raw TCP ([`raw_backend`]): its URL, the connections it accepted and the
/// requests it read whole.
pub struct RawBackend {
    pub url: String,
    pub connections: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    pub requests: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// A backend that reads each request (head and content-length body) and answers it with
/// `answer`, byte for byte: every request of a connection while `keep`, else one, then it
/// closes the connection.
pub async fn raw_backend(answer: impl Into<Vec<u8>>, keep: bool) -> RawBackend {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::io::AsyncWriteExt;
    let answer = Arc::new(answer.into());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let b = RawBackend {
        url: format!("http://{}", listener.local_addr().unwrap()),
        connections: Arc::new(AtomicUsize::new(0)),
        requests: Arc::new(AtomicUsize::new(0)),
    };
    let (connections, requests) = (Arc::clone(&b.connections), Arc::clone(&b.requests));
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            connections.fetch_add(1, Ordering::SeqCst);
            let (requests, answer) = (Arc::clone(&requests), Arc::clone(&answer));
            tokio::spawn(async move {
                let mut buf = Vec::new();
                while let Some(len) = read_request(&mut tcp, &mut buf).await {
                    buf.drain(..len);
                    requests.fetch_add(1, Ordering::SeqCst);
                    if tcp.write_all(&answer).await.is_err() || !keep {
                        return;
                    }
                }
            });
        }
    });
    b
}

/// The URL of a loopback port nothing listens on (bound, then let go): connections are refused.
pub async fn dead_url() -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    format!("http://{}", l.local_addr().unwrap())
}

/// The tests on the real llama-server take turns: each runs alone on it, so one's requests
/// neither take another's slots nor slow the answers another times.
pub static ON_REAL_LLAMA: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The real llama-server's base URL, from `SWITCHBOARD_REAL_LLAMA` (the tests marked
/// `#[ignore]` that need one).
pub fn real_llama() -> String {
    std::env::var("SWITCHBOARD_REAL_LLAMA")
        .expect("SWITCHBOARD_REAL_LLAMA=http://127.0.0.1:PORT of a real llama-server")
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

pub fn chat(model: &str, stream: bool) -> serde_json::Value {
    serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "Hello there"}],
        "stream": stream,
        "max_tokens": 4,
    })
}

/// POST `body` as JSON and return the status.
pub async fn status(c: &reqwest::Client, url: &str, body: &serde_json::Value) -> u16 {
    c.post(url)
        .json(body)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Read an SSE body to its end, returning each `data:` payload.
pub async fn sse_payloads(resp: reqwest::Response) -> Vec<String> {
    let text = within("stream end", resp.text()).await.unwrap();
    text.split("\n\n")
        .filter_map(|ev| ev.strip_prefix("data: "))
        .map(String::from)
        .collect()
}

/// The value of a sample line `name{labels} value` in Prometheus text, or 0 when absent.
pub fn sample(text: &str, name_and_labels: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.strip_prefix(' '))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0.0)
}

/// About `n` bytes of prose-like text that does not repeat (words, numbers, punctuation and
/// newlines drawn by a xorshift from `seed`): no two long pieces of it are alike.
pub fn varied_text(n: usize, seed: u64) -> String {
    const WORDS: [&str; 16] = [
        "river", "Oslo", "the", "of", "and", "tokens", "über", "naïve", "x = 1;", "(a, b)", "fn",
        "count", "window", "a", "é", "end.",
    ];
    let mut s = String::with_capacity(n + 16);
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    while s.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push_str(WORDS[(x % 16) as usize]);
        match (x >> 8) % 16 {
            0 => s.push('\n'),
            1 => s.push_str(&(x >> 20).to_string()),
            2 => s.push_str(", "),
            _ => s.push(' '),
        }
    }
    s
}

/// `request` on the kept-alive `tcp`; the answer's status and body (by its content-length).
pub async fn send_on(tcp: &mut tokio::net::TcpStream, request: &[u8]) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    tcp.write_all(request).await.unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = within("an answer", tcp.read(&mut chunk)).await.unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&buf));
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).into_owned();
        let Some((head, body)) = text.split_once("\r\n\r\n") else {
            continue;
        };
        let len: usize = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().to_string())
            })
            .map_or(0, |v| v.parse().unwrap());
        if body.len() >= len {
            let status = head[9..12].parse().unwrap();
            return (status, body[..len].to_string());
        }
    }
}

/// Poll `cond` every 10 ms until it holds, failing after `WAIT`.
pub async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    within(what, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// Chat requests a simulator received whose body holds `marker`.
pub fn chats_with(s: &Sim, marker: &str) -> usize {
    s.recorder()
        .requests()
        .iter()
        .filter(|r| r.path == "/v1/chat/completions")
        .filter(|r| String::from_utf8_lossy(&r.body).contains(marker))
        .count()
}
