//! Figures a backend reports of a request — its `usage` and llama.cpp's `timings` — that no
//! request could have taken, through the real server: a tiny scripted backend sends them, and
//! GPU accounting (charges, budgets, the ledger, the cost model, predicted waits) counts them
//! held to the request's size and its wall time on the backend.
use crate::common;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use common::toml::Fleet;
use common::*;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// A chat request whose body holds this is answered only once [`Scripted::release`] is told.
const HELD: &str = "hold this one";

/// A llama.cpp-like backend answering every chat request with one chat completion carrying
/// the `usage` and `timings` it was given (every other request gets `{}`), the chat requests
/// it has read counted in `arrived`.
struct Scripted {
    url: String,
    arrived: Arc<AtomicUsize>,
    release: Arc<Notify>,
}

impl Scripted {
    async fn start(usage: &str, timings: Option<&str>) -> Scripted {
        let timings = timings.map_or(String::new(), |t| format!(r#","timings":{t}"#));
        let body = format!(
            r#"{{"id":"c","object":"chat.completion","model":"m","choices":[{{"index":0,"message":{{"role":"assistant","content":"hi"}},"finish_reason":"stop"}}],"usage":{usage}{timings}}}"#
        );
        let chat = Arc::new(answer(&body));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let s = Scripted {
            url: format!("http://{}", listener.local_addr().unwrap()),
            arrived: Arc::default(),
            release: Arc::default(),
        };
        let (arrived, release) = (Arc::clone(&s.arrived), Arc::clone(&s.release));
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                let (chat, arrived) = (Arc::clone(&chat), Arc::clone(&arrived));
                let release = Arc::clone(&release);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    while let Some(len) = read_request(&mut tcp, &mut buf).await {
                        let request = String::from_utf8_lossy(&buf[..len]).into_owned();
                        buf.drain(..len);
                        let out = if request.starts_with("POST /v1/chat/completions") {
                            arrived.fetch_add(1, Ordering::SeqCst);
                            if request.contains(HELD) {
                                release.notified().await;
                            }
                            chat.as_slice().to_vec()
                        } else {
                            answer("{}")
                        };
                        if tcp.write_all(&out).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        s
    }
}

/// A 200 answer of JSON `body`.
fn answer(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Alias `a` of a 4,096-token window on llama.cpp backend `b` of `slots` slots, then `extra`.
fn fleet(slots: u32, extra: &str) -> String {
    Fleet::new()
        .backend("b", "llamacpp")
        .slots(slots)
        .alias("a", "b")
        .window(4096)
        .text(extra)
        .render()
}

fn one(db: &Path, sql: &str) -> f64 {
    let c = rusqlite::Connection::open(db).unwrap();
    c.query_row(sql, [], |r| r.get(0)).unwrap()
}

#[tokio::test]
async fn timings_no_request_could_take_are_charged_within_its_wall_time_and_spend_no_day() {
    std::env::set_var("SB_T_FIGURES_DAY", "day-key");
    // A prompt of 1e300 ms, a negative decode.
    let b = Scripted::start(
        r#"{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}"#,
        Some(
            r#"{"cache_n":0,"prompt_n":5,"prompt_ms":1e300,"predicted_n":1,"predicted_ms":-1e12}"#,
        ),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("usage.db");
    let config = fleet(
        2,
        &format!(
            "\n[clients.c]\nkey_env = \"SB_T_FIGURES_DAY\"\ngpu_seconds_per_day = 60\n\
             [ledger]\nurl = \"sqlite://{}\"\nbatch_interval_ms = 10\n",
            db.display()
        ),
    );
    let body =
        json!({"model": "a", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]});
    let ask = |p: &Proxy| {
        let r = client()
            .post(p.url("/v1/chat/completions"))
            .bearer_auth("day-key")
            .json(&body);
        async move { within("an answer", r.send()).await.unwrap() }
    };
    let started = Instant::now();
    let p = proxy(&config, &[("b", b.url.clone())]).await;
    let r = ask(&p).await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let written = p.state.metrics.ledger.written.clone();
    until("its row written", || written.get() >= 1).await;
    // Nothing on the backend took longer than the test has run, on each of its two slots.
    let most = started.elapsed().as_secs_f64() * 2.0;
    let beyond: Vec<String> = ["gpu_prefill_s", "gpu_decode_s", "charged_gpu_s"]
        .into_iter()
        .map(|column| (column, one(&db, &format!("SELECT {column} FROM requests"))))
        .filter(|(_, s)| !(0.0..=most).contains(s))
        .map(|(column, s)| format!("{column} = {s:e}"))
        .collect();
    assert!(beyond.is_empty(), "beyond 0 to {most} s: {beyond:?}");
    // The day is not spent, nor after a restart, which reads what was spent from the ledger.
    let r = ask(&p).await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    until("its row written", || written.get() >= 2).await;
    drop(p);
    let p = proxy(&config, &[("b", b.url.clone())]).await;
    let r = ask(&p).await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
}

#[tokio::test]
async fn a_prompt_count_no_window_holds_teaches_the_cost_model_no_impossible_rate() {
    // 1e15 prompt tokens read in a millisecond, of a request within a 4,096-token window.
    let b = Scripted::start(
        r#"{"prompt_tokens":1000000000000000,"completion_tokens":1,"total_tokens":1000000000000001}"#,
        Some(r#"{"cache_n":0,"prompt_n":1000000000000000,"prompt_ms":1.0,"predicted_n":1,"predicted_ms":1.0}"#),
    )
    .await;
    let p = proxy(&fleet(2, ""), &[("b", b.url.clone())]).await;
    let body =
        json!({"model": "a", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]});
    let r = p.post_chat(&client(), &body).await;
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    let m = p.metrics().await;
    // At most the window's tokens in the least time the model learns from (0.5 ms).
    let rate = sample(
        &m,
        "switchboard_backend_prefill_tokens_per_second{backend=\"b\"}",
    );
    assert!(
        rate > 0.0 && rate <= 4096.0 / 0.000_5,
        "{rate} prompt tokens a second"
    );
    let prompt = sample(&m, "switchboard_prompt_tokens_total{alias=\"a\"}");
    assert!(prompt <= 4096.0, "{prompt} prompt tokens counted");
}

#[tokio::test]
async fn an_answer_claiming_more_output_than_a_window_holds_leaves_later_requests_answered() {
    // 1e19 output tokens, no timings.
    let b = Scripted::start(
        r#"{"prompt_tokens":3,"completion_tokens":10000000000000000000,"total_tokens":10000000000000000003}"#,
        None,
    )
    .await;
    let p = proxy(&fleet(1, ""), &[("b", b.url.clone())]).await;
    let c = client();
    let ask = |text: &str| {
        let body = json!({"model": "a", "messages": [{"role": "user", "content": text}]});
        let r = c.post(p.url("/v1/chat/completions")).json(&body);
        async move {
            within("an answer", r.send())
                .await
                .map(|r| r.status().as_u16())
        }
    };
    assert_eq!(ask("first").await.unwrap(), 200);
    // The next request (no output limit: expected as long as that answer) holds the one slot,
    let held = tokio::spawn(ask(HELD));
    let arrived = Arc::clone(&b.arrived);
    until("the second request at the backend", || {
        arrived.load(Ordering::SeqCst) == 2
    })
    .await;
    // and a third waits behind it, its wait predicted from that work.
    let third = tokio::spawn(ask("third"));
    let slots = || p.state.live.load().replica("b").unwrap().slots.waiting();
    until("the third request queued, or ended", || {
        slots() == 1 || third.is_finished()
    })
    .await;
    b.release.notify_one();
    assert_eq!(held.await.unwrap().unwrap(), 200);
    let third = third.await.unwrap();
    assert_eq!(third.as_ref().ok(), Some(&200), "{third:?}");
}
