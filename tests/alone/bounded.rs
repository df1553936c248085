//! Memory per request is bounded whatever a backend sends: long answers nothing rewrites are
//! relayed as they come, those that must be held are refused past `answer_limit_bytes`, and a
//! stream event that never ends is cut at `event_limit_bytes` (hostile backends on loopback
//! generating hundreds of MiB; the proxy's resident memory is sampled while they send, one
//! test at a time).
use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{chat, client, fill, proxy, sample, within};
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MIB: usize = 1 << 20;
/// What each hostile backend sends.
const SENT: usize = 256 * MIB;
/// What the proxy may add to its resident memory while relaying it: the limits below, the
/// socket and allocator slack (without the limits it grows by the whole answer).
const GROWTH: usize = 48 * MIB;

/// Resident memory of this process (the proxy runs in it), in bytes.
fn rss() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// The largest resident memory seen while `f` runs, above what it was before.
async fn peak_growth<F: std::future::Future>(f: F) -> (F::Output, usize) {
    let base = rss();
    let done = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicUsize::new(base));
    let sampler = {
        let (done, peak) = (Arc::clone(&done), Arc::clone(&peak));
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                peak.fetch_max(rss(), Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let out = f.await;
    done.store(true, Ordering::SeqCst);
    sampler.join().unwrap();
    peak.fetch_max(rss(), Ordering::SeqCst);
    (out, peak.load(Ordering::SeqCst).saturating_sub(base))
}

/// A backend that reads a request, then answers with `head` and a chunked body of `total`
/// bytes of `piece` repeated (generated, never stored); counts the body bytes it could write
/// before the proxy stopped reading.
async fn flooding_backend(
    head: &'static str,
    piece: &'static [u8],
    total: usize,
) -> (String, Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let written = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&written);
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let count = Arc::clone(&count);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                if common::read_request(&mut tcp, &mut buf).await.is_none() {
                    return;
                }
                let out = format!("HTTP/1.1 200 OK\r\n{head}transfer-encoding: chunked\r\n\r\n")
                    .into_bytes();
                let block: Vec<u8> = piece.iter().copied().cycle().take(64 * 1024).collect();
                let frame = [
                    format!("{:x}\r\n", block.len()).into_bytes(),
                    block,
                    b"\r\n".to_vec(),
                ]
                .concat();
                if tcp.write_all(&out).await.is_err() {
                    return;
                }
                let mut sent = 0;
                while sent < total {
                    if tcp.write_all(&frame).await.is_err() {
                        return;
                    }
                    sent += frame.len();
                    count.store(sent as u64, Ordering::SeqCst);
                }
                let _ = tcp.write_all(b"0\r\n\r\n").await;
            });
        }
    });
    (url, written)
}

fn config(flavor: &str, server: &str) -> String {
    common::toml::Fleet::new()
        .server(server)
        .backend("b", flavor)
        .slots(4)
        .alias("a", "b")
        .model("up")
        .render()
}

/// Regression: a non-streamed answer of hundreds of MiB was held whole before the
/// client got a byte (RSS grew by twice its size). One nothing rewrites now flows through.
#[tokio::test]
async fn a_long_answer_nothing_rewrites_is_relayed_as_it_comes() {
    let _one = crate::ONE_AT_A_TIME.lock().await;
    let (url, _) = flooding_backend("content-type: application/json\r\n", b"[0.125, ", SENT).await;
    let p = proxy(
        &config("vllm", "answer_limit_bytes = 4194304"),
        &[("b", url)],
    )
    .await;
    let c = client();
    let (got, growth) = peak_growth(async {
        let resp = c
            .post(p.url("/v1/embeddings"))
            .json(&json!({"model": "a", "input": "x"}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let mut body = resp.bytes_stream();
        let mut got = 0usize;
        while let Some(piece) = body.next().await {
            got += piece.unwrap().len();
        }
        got
    })
    .await;
    assert!(got >= SENT, "the whole answer came through ({got} bytes)");
    assert!(growth < GROWTH, "the proxy held {} MiB", growth / MIB);
}

/// Regression: a chat answer, which must be read whole to be rewritten, is refused
/// past `answer_limit_bytes` with the API's error, and the backend is left at once.
#[tokio::test]
async fn a_chat_answer_past_the_limit_is_refused_without_being_held() {
    let _one = crate::ONE_AT_A_TIME.lock().await;
    let (url, written) =
        flooding_backend("content-type: application/json\r\n", b"{\"a\": 1} ", SENT).await;
    let p = proxy(
        &config("vllm", "answer_limit_bytes = 4194304"),
        &[("b", url)],
    )
    .await;
    let c = client();
    let (resp, growth) = peak_growth(p.post_chat(&c, &chat("a", false))).await;
    assert_eq!(resp.status(), 502);
    let e: Value = resp.json().await.unwrap();
    assert_eq!(e["error"]["code"], "answer_too_large", "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("answer_limit_bytes"),
        "{e}"
    );
    assert!(growth < GROWTH, "the proxy held {} MiB", growth / MIB);
    assert!(
        written.load(Ordering::SeqCst) < (SENT / 2) as u64,
        "the backend was left early"
    );
    let m = p.metrics().await;
    let key = r#"switchboard_upstream_errors_total{alias="a",reason="too_large"}"#;
    assert_eq!(sample(&m, key), 1.0, "{m}");
}

/// Resident memory of process `pid`, in bytes.
fn rss_of(pid: u32) -> usize {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).unwrap_or_default();
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// A chat answer past a 64 MiB `answer_limit_bytes` is refused holding about the limit: the
/// pieces read are not gathered into a growing buffer (which, as the binary's allocator moves
/// it to a doubled block, held up to three times the limit). Measured on the binary itself,
/// with its own allocator, as a child process.
#[tokio::test]
async fn a_chat_answer_past_the_default_limit_holds_about_the_limit() {
    let _one = crate::ONE_AT_A_TIME.lock().await;
    let (url, _) =
        flooding_backend("content-type: application/json\r\n", b"{\"a\": 1} ", SENT).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("routes.toml");
    let server = format!("listen = \"127.0.0.1:{port}\"\nworkers = 1\nwatch_config = false");
    std::fs::write(&path, fill(&config("vllm", &server), &[("b", url)])).unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_switchboard"))
        .args(["serve", "--config"])
        .arg(&path)
        .kill_on_drop(true)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let c = client();
    let base = format!("http://127.0.0.1:{port}");
    within("the proxy to listen", async {
        while c.get(format!("{base}/health")).send().await.is_err() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let before = rss_of(pid);
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let done = Arc::clone(&done);
        std::thread::spawn(move || {
            let mut peak = 0;
            while !done.load(Ordering::SeqCst) {
                peak = peak.max(rss_of(pid));
                std::thread::sleep(Duration::from_millis(1));
            }
            peak
        })
    };
    let resp = c
        .post(format!("{base}/v1/chat/completions"))
        .json(&chat("a", false))
        .send()
        .await
        .unwrap();
    done.store(true, Ordering::SeqCst);
    let growth = sampler.join().unwrap().saturating_sub(before);
    assert_eq!(resp.status(), 502);
    let e: Value = resp.json().await.unwrap();
    assert_eq!(e["error"]["code"], "answer_too_large", "{e}");
    let _ = child.kill().await;
    assert!(
        growth < 64 * MIB + GROWTH,
        "the proxy held {} MiB for a limit of 64",
        growth / MIB
    );
}

/// Regression: an SSE event that never ends (lines with single newlines) was
/// gathered whole and searched again on every chunk. It is cut at `event_limit_bytes` with
/// the stream's error event.
#[tokio::test]
async fn an_event_that_never_ends_is_cut_at_the_limit() {
    let _one = crate::ONE_AT_A_TIME.lock().await;
    let (url, written) =
        flooding_backend("content-type: text/event-stream\r\n", b"data: x\n", SENT).await;
    let p = proxy(
        &config("vllm", "event_limit_bytes = 1048576"),
        &[("b", url)],
    )
    .await;
    let c = client();
    let (text, growth) = peak_growth(async {
        let resp = p.post_chat(&c, &chat("a", true)).await;
        assert_eq!(resp.status(), 200);
        common::within("the stream's end", resp.text())
            .await
            .unwrap()
    })
    .await;
    assert!(
        text.len() < 2 * MIB,
        "nothing of the endless event was sent on"
    );
    let last = text.lines().rfind(|l| l.starts_with("data: ")).unwrap();
    let e: Value = serde_json::from_str(&last["data: ".len()..]).unwrap();
    assert_eq!(e["error"]["code"], "event_too_large", "{e}");
    assert!(growth < GROWTH, "the proxy held {} MiB", growth / MIB);
    assert!(
        written.load(Ordering::SeqCst) < (SENT / 2) as u64,
        "the backend was left early"
    );
}

/// A long event under the limit, sent in small pieces, arrives whole and unchanged.
#[tokio::test]
async fn a_long_event_under_the_limit_arrives_whole() {
    let text = "y".repeat(2 * MIB);
    let event = format!(
        "data: {}\n\n",
        json!({"choices": [{"index": 0, "delta": {"content": text}}]})
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let body = event.clone() + "data: [DONE]\n\n";
    tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 65536];
        let mut head = Vec::new();
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = tcp.read(&mut buf).await.unwrap();
            head.extend_from_slice(&buf[..n]);
        }
        let mut out = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        for piece in body.as_bytes().chunks(2048) {
            out.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
            out.extend_from_slice(piece);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"0\r\n\r\n");
        tcp.write_all(&out).await.unwrap();
    });
    let p = proxy(&config("llamacpp", ""), &[("b", url)]).await;
    let c = client();
    let resp = p.post_chat(&c, &chat("a", true)).await;
    let got = common::within("the stream", resp.text()).await.unwrap();
    assert_eq!(got, event + "data: [DONE]\n\n");
}

/// How many uploads [`large_uploads_are_each_held_once`] sends at once, and how large.
const UPLOADS: usize = 10;
const UPLOAD: usize = 60 * MIB;

/// A chat request of `UPLOAD` bytes, generated as it is sent.
fn large_upload() -> reqwest::Body {
    let open = br#"{"model":"a","messages":[{"role":"user","content":""#;
    let close = br#""}]}"#;
    let text = UPLOAD - open.len() - close.len();
    let piece = bytes::Bytes::from(vec![b'x'; 64 * 1024]);
    let pieces = (0..text.div_ceil(piece.len())).map(move |i| {
        let n = piece.len().min(text - i * piece.len());
        piece.slice(..n)
    });
    let parts = std::iter::once(bytes::Bytes::from_static(open))
        .chain(pieces)
        .chain(std::iter::once(bytes::Bytes::from_static(close)))
        .map(Ok::<_, std::io::Error>);
    reqwest::Body::wrap_stream(futures_util::stream::iter(parts))
}

/// A backend that reads each request's body to its end (keeping none of it), waits until
/// `UPLOADS` requests are in, notes the process's resident memory then, and answers.
async fn draining_backend(at_peak: Arc<AtomicUsize>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let all_in = Arc::new(tokio::sync::Barrier::new(UPLOADS));
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let (all_in, at_peak) = (Arc::clone(&all_in), Arc::clone(&at_peak));
            tokio::spawn(async move {
                let mut buf = vec![0u8; 256 * 1024];
                let mut head = Vec::new();
                let end = loop {
                    let n = tcp.read(&mut buf).await.unwrap();
                    assert!(n > 0, "the request came whole");
                    head.extend_from_slice(&buf[..n]);
                    if let Some(p) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                        break p + 4;
                    }
                };
                let text = String::from_utf8_lossy(&head[..end]).to_ascii_lowercase();
                let length: usize = text
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .expect("a declared length")
                    .trim()
                    .parse()
                    .unwrap();
                let mut left = length - (head.len() - end);
                drop(head);
                while left > 0 {
                    let n = tcp.read(&mut buf).await.unwrap();
                    assert!(n > 0, "the body came whole");
                    left -= n;
                }
                if all_in.wait().await.is_leader() {
                    at_peak.store(rss(), Ordering::SeqCst);
                }
                let answer =
                    json!({"id": "x", "object": "chat.completion", "choices": [{"index": 0,
                    "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
                    .to_string();
                let out = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
                    answer.len()
                );
                let _ = tcp.write_all(out.as_bytes()).await;
            });
        }
    });
    url
}

/// Regression: ten concurrent 60 MB uploads grew the proxy by 2.7 times their
/// bytes: the body was held as read and again as sent (the model spliced into a copy). Now
/// the body sent is the client's bytes with the splice between them: each is held once.
///
/// A test of memory, not of time: in a debug build on a loaded machine each 60 MiB body takes
/// seconds of CPU to read and check, and while the proxy works on some bodies the others' TCP
/// windows stay closed for longer than reqwest's default `TCP_USER_TIMEOUT` of 30 s, after
/// which the client's kernel drops the connection (`ETIMEDOUT`, seen by the proxy as a body
/// that failed to arrive). The client here has none, and the runtime two threads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_uploads_are_each_held_once() {
    let _one = crate::ONE_AT_A_TIME.lock().await;
    let at_peak = Arc::new(AtomicUsize::new(0));
    let url = draining_backend(Arc::clone(&at_peak)).await;
    let p = proxy(
        &config("llamacpp", "body_limit_bytes = 67108864")
            .replace("slots = 4", &format!("slots = {UPLOADS}")),
        &[("b", url)],
    )
    .await;
    let c = reqwest::Client::builder()
        .no_proxy()
        .tcp_user_timeout(None)
        .build()
        .unwrap();
    let base = rss();
    let uploads = (0..UPLOADS).map(|_| {
        c.post(p.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .header("content-length", UPLOAD)
            .body(large_upload())
            .send()
    });
    for resp in futures_util::future::join_all(uploads).await {
        let resp = resp.unwrap();
        assert_eq!(resp.status(), 200);
        let answer: Value = resp.json().await.unwrap();
        assert_eq!(answer["choices"][0]["message"]["content"], "ok");
    }
    let growth = at_peak.load(Ordering::SeqCst).saturating_sub(base);
    let bytes = UPLOADS * UPLOAD;
    assert!(
        growth < bytes + bytes / 4,
        "the proxy held {} MiB for {} MiB of uploads",
        growth / MIB,
        bytes / MIB
    );
}

/// Alias `a` counting with the fixtures' Qwen3 tokenizer (a window the byte bound of these
/// requests cannot clear) on a backend nothing is sent to.
fn counting_config(server: &str) -> String {
    let fx = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/qwen3");
    format!(
        r#"
[server]
{server}
[backends.b]
url = "http://127.0.0.1:9"
flavor = "llamacpp"
slots = 4
[aliases.a]
backend = "b"
upstream_model = "up"
context_window = 1000000
tokenizer = {{ file = "{fx}/tokenizer.json.gz", config = "{fx}/tokenizer_config.json.gz" }}
"#
    )
}

/// A Messages count request of one user message of `text`.
fn count_request(text: &str) -> Value {
    json!({"model": "a", "messages": [{"role": "user", "content": text}]})
}

/// POST a count request: status, answer and the growth of the process's memory meanwhile.
async fn count_growth(p: &common::Proxy, body: &Value) -> (u16, Value, usize) {
    let c = client();
    let bytes = serde_json::to_vec(body).unwrap();
    let (resp, growth) = peak_growth(async {
        let r = c
            .post(p.url("/v1/messages/count_tokens"))
            .header("content-type", "application/json")
            .body(bytes)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json::<Value>().await.unwrap())
    })
    .await;
    (resp.0, resp.1, growth)
}

/// `k` blocks of a short varied run of words and a 20 kB word: the chunker cuts a long text
/// of them at each block's start (the space before its first word), so its pieces repeat.
fn blocks(k: usize) -> String {
    let block = format!(
        " {}{}",
        common::varied_text(200, 5).replace('\n', " "),
        "x".repeat(20_000)
    );
    block.repeat(k)
}

/// Counting a 32 MiB text held a structure per token of it (3 GB). It is counted in pieces:
/// the process grows by a small multiple of the body, and the count is the tokenizer's (one
/// block more adds one block's tokens).
#[tokio::test]
async fn a_32_mib_count_is_held_in_a_small_multiple_of_its_body() {
    let _one = crate::ONE_AT_A_TIME.lock().await;
    let p = proxy(&counting_config("count_limit_bytes = 67108864"), &[]).await;
    let k = (32 * MIB).div_ceil(blocks(1).len());
    let (status, one, _) = count_growth(&p, &count_request(&blocks(1))).await;
    assert_eq!(status, 200, "{one}");
    let (_, two, _) = count_growth(&p, &count_request(&blocks(2))).await;
    let body = count_request(&blocks(k));
    let (status, v, growth) = count_growth(&p, &body).await;
    assert_eq!(status, 200, "{v}");
    let per_block = two["input_tokens"].as_u64().unwrap() - one["input_tokens"].as_u64().unwrap();
    let want = one["input_tokens"].as_u64().unwrap() + (k as u64 - 1) * per_block;
    assert_eq!(v["input_tokens"].as_u64().unwrap(), want);
    eprintln!("MEASURE 32 MiB blocks: growth {} MiB", growth / MIB);
    assert!(
        growth < 10 * 32 * MIB,
        "the proxy held {} MiB",
        growth / MIB
    );
}

/// Text that does not repeat is tokenized in pieces too: 2 MiB of it grows the process by a
/// small multiple of the body, not by a structure per token.
#[tokio::test]
async fn a_count_of_varied_text_is_held_in_a_small_multiple_of_its_body() {
    let _one = crate::ONE_AT_A_TIME.lock().await;
    let p = proxy(&counting_config(""), &[]).await;
    let (status, v, growth) =
        count_growth(&p, &count_request(&common::varied_text(2 * MIB, 9))).await;
    assert_eq!(status, 200, "{v}");
    assert!(v["input_tokens"].as_u64().unwrap() > 400_000, "{v}");
    eprintln!("MEASURE 2 MiB varied: growth {} MiB", growth / MIB);
    // Counted whole, as one fragment, this text took about 330 MiB; cut, 7 to 15 MiB were
    // measured (allocator and thread slack vary from run to run).
    assert!(
        growth < 10 * 2 * MIB + 16 * MIB,
        "the proxy held {} MiB",
        growth / MIB
    );
}

/// A 32 MiB text that does not repeat is past the default `count_limit_bytes`: refused with
/// 413 before any of it is tokenized, the process grown by a small multiple of the body.
#[tokio::test]
async fn a_32_mib_count_past_the_limit_is_refused_in_a_small_multiple_of_its_body() {
    let _one = crate::ONE_AT_A_TIME.lock().await;
    let p = proxy(&counting_config(""), &[]).await;
    let body = count_request(&common::varied_text(32 * MIB, 21));
    let (status, v, growth) = count_growth(&p, &body).await;
    assert_eq!(status, 413, "{v}");
    assert_eq!(v["error"]["type"], "request_too_large", "{v}");
    eprintln!(
        "MEASURE 32 MiB varied past the limit: growth {} MiB",
        growth / MIB
    );
    assert!(
        growth < 10 * 32 * MIB,
        "the proxy held {} MiB",
        growth / MIB
    );
}
