//! Named clients through the real server: who goes first on a one-slot backend, which
//! aliases a client sees, its limits enforced before a backend sees the request, the
//! rate-limit headers, and reloads.
use crate::common;

use std::time::Duration;

use common::toml::Fleet;
use common::{client, proxy, read_request, sample, sim, within, Proxy};
use serde_json::{json, Value};
use switchboard_sim::SimConfig;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

/// A backend that answers GETs at once and holds each POST until the test releases it,
/// telling the test the first message's content of each, in the order they arrive.
struct Held {
    url: String,
    arrived: mpsc::UnboundedReceiver<(String, oneshot::Sender<()>)>,
}

impl Held {
    async fn start() -> Held {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (tx, arrived) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    while let Some(n) = read_request(&mut tcp, &mut buf).await {
                        let req: Vec<u8> = buf.drain(..n).collect();
                        let text = String::from_utf8_lossy(&req).to_string();
                        let body = if text.starts_with("POST") {
                            let json = &text[text.find("\r\n\r\n").unwrap() + 4..];
                            let v: Value = serde_json::from_str(json).unwrap();
                            let marker = v["messages"][0]["content"].as_str().unwrap().to_string();
                            let (go, wait) = oneshot::channel();
                            if tx.send((marker, go)).is_err() || wait.await.is_err() {
                                return;
                            }
                            json!({
                                "id": "x", "object": "chat.completion", "created": 1, "model": "m",
                                "choices": [{"index": 0, "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": "ok"}}],
                                "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
                            })
                            .to_string()
                        } else {
                            json!({"object": "list", "data": []}).to_string()
                        };
                        let head = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                            body.len()
                        );
                        if tcp.write_all(head.as_bytes()).await.is_err()
                            || tcp.write_all(body.as_bytes()).await.is_err()
                        {
                            return;
                        }
                    }
                });
            }
        });
        Held { url, arrived }
    }

    /// The next request to arrive: its marker and its release.
    async fn next(&mut self) -> (String, oneshot::Sender<()>) {
        within("a request at the backend", self.arrived.recv())
            .await
            .unwrap()
    }
}

/// One alias `a` on one backend `b` of one slot, with `clients` (TOML) added.
fn one_slot(clients: &str) -> String {
    one_slot_queue(64, clients)
}

fn set_key(var: &str, key: &str) {
    std::env::set_var(var, key);
}

/// Send a chat request with `key`, its first message `marker`, answered in the background.
fn send(p: &Proxy, key: &str, marker: &str) -> tokio::task::JoinHandle<reqwest::Response> {
    send_to(
        p,
        key,
        json!({"model": "a", "messages": [{"role": "user", "content": marker}]}),
    )
}

/// Send `body` with `key` to chat completions, answered in the background.
fn send_to(p: &Proxy, key: &str, body: Value) -> tokio::task::JoinHandle<reqwest::Response> {
    let url = p.url("/v1/chat/completions");
    let key = key.to_string();
    tokio::spawn(async move {
        client()
            .post(url)
            .bearer_auth(key)
            .json(&body)
            .send()
            .await
            .unwrap()
    })
}

/// Wait until the alias's queue gauge shows `n` waiting requests.
async fn queued(p: &Proxy, n: f64) {
    queued_on(p, "a", n).await
}

/// Wait until the queue gauge of `alias` shows `n` waiting requests.
async fn queued_on(p: &Proxy, alias: &str, n: f64) {
    let name = format!("switchboard_queued_requests{{alias=\"{alias}\"}}");
    within("the queue to fill", async {
        loop {
            let m = p.metrics().await;
            if sample(&m, &name) == n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}

#[tokio::test]
async fn an_interactive_request_runs_before_queued_batch_ones() {
    set_key("SB_T_PRIO_BATCH", "batch-key");
    set_key("SB_T_PRIO_INTER", "inter-key");
    let mut b = Held::start().await;
    let cfg = one_slot(
        "[clients.agents]\nkey_env = \"SB_T_PRIO_BATCH\"\npriority = \"batch\"\n\
         [clients.person]\nkey_env = \"SB_T_PRIO_INTER\"\npriority = \"interactive\"",
    );
    let p = proxy(&cfg, &[("b", b.url.clone())]).await;
    let first = send(&p, "batch-key", "running");
    let (m, release) = b.next().await;
    assert_eq!(m, "running");
    let mut all = vec![first];
    for i in 0..8 {
        all.push(send(&p, "batch-key", &format!("batch{i}")));
    }
    queued(&p, 8.0).await;
    all.push(send(&p, "inter-key", "interactive"));
    queued(&p, 9.0).await;
    release.send(()).unwrap();
    let (m, release) = b.next().await;
    assert_eq!(m, "interactive", "the interactive request runs next");
    release.send(()).unwrap();
    let mut order = Vec::new();
    for _ in 0..8 {
        let (m, release) = b.next().await;
        order.push(m);
        release.send(()).unwrap();
    }
    assert_eq!(
        order,
        (0..8).map(|i| format!("batch{i}")).collect::<Vec<_>>()
    );
    for r in all {
        assert_eq!(within("an answer", r).await.unwrap().status(), 200);
    }
    let m = p.metrics().await;
    assert_eq!(
        sample(
            &m,
            "switchboard_client_requests_total{client=\"agents\",status=\"200\"}"
        ),
        9.0
    );
}

#[tokio::test]
async fn a_client_with_one_queued_request_is_not_put_behind_ten_of_another() {
    set_key("SB_T_FAIR_MANY", "many-key");
    set_key("SB_T_FAIR_ONE", "one-key");
    let mut b = Held::start().await;
    let cfg = one_slot(
        "[clients.many]\nkey_env = \"SB_T_FAIR_MANY\"\npriority = \"batch\"\n\
         [clients.one]\nkey_env = \"SB_T_FAIR_ONE\"\npriority = \"batch\"",
    );
    let p = proxy(&cfg, &[("b", b.url.clone())]).await;
    let mut all = vec![send(&p, "many-key", "running")];
    let (_, mut release) = b.next().await;
    for i in 0..10 {
        all.push(send(&p, "many-key", &format!("many{i}")));
    }
    queued(&p, 10.0).await;
    all.push(send(&p, "one-key", "one"));
    queued(&p, 11.0).await;
    let mut order = Vec::new();
    for _ in 0..11 {
        release.send(()).unwrap();
        let (m, r) = b.next().await;
        order.push(m);
        release = r;
    }
    release.send(()).unwrap();
    // At most one service time: it runs first or second of the eleven waiting.
    let at = order.iter().position(|m| m == "one").unwrap();
    assert!(at <= 1, "{order:?}");
    for r in all {
        assert_eq!(within("an answer", r).await.unwrap().status(), 200);
    }
}

#[tokio::test]
async fn a_batch_request_past_its_max_wait_takes_turns_with_newer_interactive_ones() {
    set_key("SB_T_AGE_BATCH", "age-batch");
    set_key("SB_T_AGE_INTER", "age-inter");
    let mut b = Held::start().await;
    let cfg = one_slot(
        "[clients.agents]\nkey_env = \"SB_T_AGE_BATCH\"\npriority = \"batch\"\n\
         [clients.person]\nkey_env = \"SB_T_AGE_INTER\"\npriority = \"interactive\"\n\
         [priority.batch]\nmax_wait_ms = 1",
    );
    let p = proxy(&cfg, &[("b", b.url.clone())]).await;
    let mut all = vec![send(&p, "age-inter", "running")];
    let (_, release) = b.next().await;
    all.push(send(&p, "age-batch", "old-batch"));
    queued(&p, 1.0).await;
    // Its 1 ms of max_wait is over (this is the time that must pass, not a synchronisation).
    tokio::time::sleep(Duration::from_millis(5)).await;
    all.push(send(&p, "age-inter", "new-inter-1"));
    all.push(send(&p, "age-inter", "new-inter-2"));
    queued(&p, 3.0).await;
    let mut order = Vec::new();
    let mut release = release;
    for _ in 0..3 {
        release.send(()).unwrap();
        let (m, r) = b.next().await;
        order.push(m);
        release = r;
    }
    release.send(()).unwrap();
    // Lifted into the interactive class's turn: before the second of the newer ones.
    let at = order.iter().position(|m| m == "old-batch").unwrap();
    assert!(at <= 1, "{order:?}");
    for r in all {
        assert_eq!(within("an answer", r).await.unwrap().status(), 200);
    }
}

/// Alias `a` on a held backend of one slot and a queue of `queue`, with `clients` (TOML).
fn one_slot_queue(queue: u32, clients: &str) -> String {
    Fleet::new()
        .backend("b", "openai")
        .slots(1)
        .queue(queue)
        .alias("a", "b")
        .text(clients)
        .render()
}

/// One alias `a` on one backend `b` of one slot whose predicted prefill is long (a seed of a
/// token a second), interactive requests preempting after 50 ms, with `clients` added.
fn slow_slot(clients: &str) -> String {
    Fleet::new()
        .server("preempt_after_ms = 50")
        .backend("b", "openai")
        .slots(1)
        .set("prefill_tokens_per_s", 1.0)
        .alias("a", "b")
        .text(clients)
        .render()
}

#[tokio::test]
async fn a_batch_request_that_sent_nothing_gives_its_slot_to_an_interactive_one_and_is_answered_200(
) {
    set_key("SB_T_PREEMPT_BATCH", "pre-batch-key");
    set_key("SB_T_PREEMPT_INTER", "pre-inter-key");
    let mut b = Held::start().await;
    let cfg = slow_slot(
        "[clients.agents]\nkey_env = \"SB_T_PREEMPT_BATCH\"\npriority = \"batch\"\n\
         [clients.person]\nkey_env = \"SB_T_PREEMPT_INTER\"\npriority = \"interactive\"",
    );
    let p = proxy(&cfg, &[("b", b.url.clone())]).await;
    let batch = send(&p, "pre-batch-key", "compaction");
    let (m, _first_try) = b.next().await;
    assert_eq!(m, "compaction");
    let person = send(&p, "pre-inter-key", "question");
    // The batch request is dropped at the backend and the person's reaches it.
    let (m, release) = b.next().await;
    assert_eq!(m, "question", "the interactive request takes the slot");
    release.send(()).unwrap();
    assert_eq!(answered(person).await.0, 200);
    // The batch request, back first in its queue, is sent again and answered.
    let (m, release) = b.next().await;
    assert_eq!(m, "compaction");
    release.send(()).unwrap();
    assert_eq!(answered(batch).await.0, 200);
    let m = p.metrics().await;
    assert_eq!(
        sample(
            &m,
            "switchboard_preemptions_total{alias=\"a\",class=\"batch\"}"
        ),
        1.0
    );
    assert_eq!(
        sample(&m, "switchboard_inflight_requests{alias=\"a\"}"),
        0.0
    );
}

#[tokio::test]
async fn a_request_whose_predicted_wait_passes_its_deadline_gets_503_and_retry_after_in_each_apis_envelope(
) {
    set_key("SB_T_DEADLINE", "deadline-key");
    let mut b = Held::start().await;
    let cfg = slow_slot(
        "[clients.hurried]\nkey_env = \"SB_T_DEADLINE\"\npriority = \"batch\"\nmax_queue_wait_ms = 60000",
    );
    let p = proxy(&cfg, &[("b", b.url.clone())]).await;
    let running = send(&p, "deadline-key", "running");
    let (_, release) = b.next().await;
    let asks = [
        (
            "/v1/chat/completions",
            json!({"model": "a", "messages": [{"role": "user", "content": "q"}]}),
        ),
        ("/v1/responses", json!({"model": "a", "input": "q"})),
        (
            "/v1/messages",
            json!({"model": "a", "max_tokens": 8, "messages": [{"role": "user", "content": "q"}]}),
        ),
    ];
    for (path, body) in asks {
        // Its client's own limit (a minute) holds; the request's header asks for less.
        let r = client()
            .post(p.url(path))
            .bearer_auth("deadline-key")
            .header("x-switchboard-max-wait-ms", "1000")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 503, "{path}");
        let retry: u64 = r.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(retry > 1, "{path}: the predicted wait, {retry} s");
        let v: Value = r.json().await.unwrap();
        if path == "/v1/messages" {
            assert_eq!(v["type"], "error", "{v}");
            assert_eq!(v["error"]["type"], "overloaded_error", "{v}");
        } else {
            assert_eq!(v["error"]["code"], "wait_too_long", "{v}");
        }
        assert!(v.to_string().contains("predicted"), "{v}");
    }
    // A header that is no number is the client's 400.
    let r = client()
        .post(p.url("/v1/chat/completions"))
        .bearer_auth("deadline-key")
        .header("x-switchboard-max-wait-ms", "soon")
        .json(&json!({"model": "a", "messages": [{"role": "user", "content": "q"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    release.send(()).unwrap();
    assert_eq!(answered(running).await.0, 200);
}

/// The status and body of a request sent in the background.
async fn answered(r: tokio::task::JoinHandle<reqwest::Response>) -> (u16, Value) {
    let r = within("an answer", r).await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn an_interactive_request_takes_the_place_of_the_newest_queued_batch_one() {
    set_key("SB_T_TAKE_BATCH", "take-batch");
    set_key("SB_T_TAKE_INTER", "take-inter");
    let mut b = Held::start().await;
    let cfg = one_slot_queue(
        8,
        "[clients.agents]\nkey_env = \"SB_T_TAKE_BATCH\"\npriority = \"batch\"\n\
         [clients.person]\nkey_env = \"SB_T_TAKE_INTER\"\npriority = \"interactive\"",
    );
    let p = proxy(&cfg, &[("b", b.url.clone())]).await;
    let mut batch = vec![send(&p, "take-batch", "running")];
    let (_, release) = b.next().await;
    for i in 0..8 {
        batch.push(send(&p, "take-batch", &format!("batch{i}")));
        queued(&p, f64::from(i + 1)).await;
    }
    let inter = send(&p, "take-inter", "interactive");
    // The newest batch request gives its place: the 429 of a full queue, in its envelope.
    let (st, v) = answered(batch.pop().unwrap()).await;
    assert_eq!(st, 429, "{v}");
    assert_eq!(v["error"]["code"], "overloaded", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("queue is full"),
        "{v}"
    );
    queued(&p, 8.0).await;
    release.send(()).unwrap();
    let (m, release) = b.next().await;
    assert_eq!(m, "interactive");
    release.send(()).unwrap();
    assert_eq!(answered(inter).await.0, 200);
    for i in 0..7 {
        let (m, release) = b.next().await;
        assert_eq!(m, format!("batch{i}"));
        release.send(()).unwrap();
    }
    for r in batch {
        assert_eq!(answered(r).await.0, 200);
    }
    queued(&p, 0.0).await;
}

#[tokio::test]
async fn a_client_holding_a_whole_queue_gives_its_newest_place_to_another() {
    set_key("SB_T_PART_MANY", "part-many");
    set_key("SB_T_PART_ONE", "part-one");
    let mut b = Held::start().await;
    let cfg = one_slot_queue(
        4,
        "[clients.many]\nkey_env = \"SB_T_PART_MANY\"\n\
         [clients.one]\nkey_env = \"SB_T_PART_ONE\"",
    );
    let p = proxy(&cfg, &[("b", b.url.clone())]).await;
    let mut many = vec![send(&p, "part-many", "running")];
    let (_, release) = b.next().await;
    for i in 0..4 {
        many.push(send(&p, "part-many", &format!("many{i}")));
        queued(&p, f64::from(i + 1)).await;
    }
    // Over its part (2 of 4 with two clients waiting), `many` loses its newest place.
    let one = send(&p, "part-one", "one");
    let (st, v) = answered(many.pop().unwrap()).await;
    assert_eq!(st, 429, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("queue is full"),
        "{v}"
    );
    queued(&p, 4.0).await;
    // And its next request is refused at once: the queue is full and it holds more than its part.
    let (st, _) = answered(send(&p, "part-many", "more")).await;
    assert_eq!(st, 429);
    let mut order = Vec::new();
    let mut release = release;
    for _ in 0..4 {
        release.send(()).unwrap();
        let (m, r) = b.next().await;
        order.push(m);
        release = r;
    }
    release.send(()).unwrap();
    assert_eq!(order.iter().position(|m| m == "one"), Some(1), "{order:?}");
    assert_eq!(answered(one).await.0, 200);
    for r in many {
        assert_eq!(answered(r).await.0, 200);
    }
    queued(&p, 0.0).await;
}

#[tokio::test]
async fn an_aged_flood_does_not_go_ahead_of_later_normal_and_interactive_requests() {
    set_key("SB_T_FLOOD_BATCH", "flood-batch");
    set_key("SB_T_FLOOD_NORMAL", "flood-normal");
    set_key("SB_T_FLOOD_INTER", "flood-inter");
    let mut b = Held::start().await;
    let cfg = one_slot(
        "[clients.flood]\nkey_env = \"SB_T_FLOOD_BATCH\"\npriority = \"batch\"\n\
         [clients.later]\nkey_env = \"SB_T_FLOOD_NORMAL\"\n\
         [clients.person]\nkey_env = \"SB_T_FLOOD_INTER\"\npriority = \"interactive\"\n\
         [priority.batch]\nmax_wait_ms = 1",
    );
    let p = proxy(&cfg, &[("b", b.url.clone())]).await;
    let mut all = vec![send(&p, "flood-batch", "running")];
    let (_, mut release) = b.next().await;
    for i in 0..6 {
        all.push(send(&p, "flood-batch", &format!("flood{i}")));
    }
    queued(&p, 6.0).await;
    // The flood's 1 ms of max_wait is over (the time that must pass, not a synchronisation).
    tokio::time::sleep(Duration::from_millis(5)).await;
    all.push(send(&p, "flood-normal", "normal"));
    all.push(send(&p, "flood-inter", "interactive"));
    queued(&p, 8.0).await;
    let mut order = Vec::new();
    for _ in 0..8 {
        release.send(()).unwrap();
        let (m, r) = b.next().await;
        order.push(m);
        release = r;
    }
    release.send(()).unwrap();
    let at = |m: &str| order.iter().position(|o| o == m).unwrap();
    assert!(at("interactive") <= 1, "{order:?}");
    assert!(at("normal") <= 3, "{order:?}");
    for r in all {
        assert_eq!(answered(r).await.0, 200);
    }
}

#[tokio::test]
async fn a_request_may_lower_its_priority_but_not_raise_it() {
    set_key("SB_T_LOWER_A", "lower-a");
    set_key("SB_T_LOWER_B", "lower-b");
    let mut b = Held::start().await;
    let cfg = one_slot(
        "[clients.a]\nkey_env = \"SB_T_LOWER_A\"\npriority = \"normal\"\n\
         [clients.b]\nkey_env = \"SB_T_LOWER_B\"\npriority = \"batch\"",
    );
    let p = proxy(&cfg, &[("b", b.url.clone())]).await;
    let mut all = vec![send(&p, "lower-a", "running")];
    let (_, release) = b.next().await;
    let url = p.url("/v1/chat/completions");
    let with_header = |key: &'static str, marker: &'static str, class: &'static str| {
        let url = url.clone();
        tokio::spawn(async move {
            client()
                .post(url)
                .bearer_auth(key)
                .header("x-switchboard-priority", class)
                .json(&json!({"model": "a", "messages": [{"role": "user", "content": marker}]}))
                .send()
                .await
                .unwrap()
        })
    };
    // Normal lowered to batch, queued first; then batch asking for interactive (stays batch,
    // and waits behind the one before it in turn); then a plain normal one, which goes first.
    all.push(with_header("lower-a", "lowered", "batch"));
    queued(&p, 1.0).await;
    all.push(with_header("lower-b", "raised", "interactive"));
    queued(&p, 2.0).await;
    all.push(send(&p, "lower-a", "normal"));
    queued(&p, 3.0).await;
    release.send(()).unwrap();
    let (m, release) = b.next().await;
    assert_eq!(m, "normal");
    release.send(()).unwrap();
    for _ in 0..2 {
        let (m, release) = b.next().await;
        assert!(m == "lowered" || m == "raised", "{m}");
        release.send(()).unwrap();
    }
    for r in all {
        assert_eq!(within("an answer", r).await.unwrap().status(), 200);
    }
    let bad = client()
        .post(p.url("/v1/chat/completions"))
        .bearer_auth("lower-a")
        .header("x-switchboard-priority", "urgent")
        .json(&json!({"model": "a", "messages": [{"role": "user", "content": "x"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
}

/// Two aliases on one simulator; client `only-a` may use `a` alone.
async fn two_aliases(extra: &str) -> (switchboard_sim::Sim, Proxy) {
    let s = sim(SimConfig::default()).await;
    let mut fleet = Fleet::new().backend("b", "llamacpp").slots(4);
    for alias in ["a", "hidden"] {
        fleet = fleet
            .alias(alias, "b")
            .model("sim-model")
            .window(4096)
            .set("count", "\"estimate\"");
    }
    let cfg = fleet.text(extra).render();
    let p = proxy(&cfg, &[("b", s.url())]).await;
    (s, p)
}

async fn post(
    p: &Proxy,
    path: &str,
    key: &str,
    body: Value,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let r = within(
        "an answer",
        client()
            .post(p.url(path))
            .bearer_auth(key)
            .json(&body)
            .send(),
    )
    .await
    .unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let v = r.json().await.unwrap_or(Value::Null);
    (status, headers, v)
}

fn chat_body(model: &str, max_tokens: u32) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": max_tokens})
}

fn messages_body(model: &str) -> Value {
    json!({"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "Hello"}]})
}

fn responses_body(model: &str) -> Value {
    json!({"model": model, "input": "Hello", "max_output_tokens": 4})
}

#[tokio::test]
async fn a_client_sees_and_uses_only_its_aliases_on_every_api() {
    set_key("SB_T_ALLOW", "allow-key");
    let (s, p) = two_aliases("[clients.only-a]\nkey_env = \"SB_T_ALLOW\"\naliases = [\"a\"]").await;
    let k = "allow-key";
    // Allowed: served.
    assert_eq!(
        post(&p, "/v1/chat/completions", k, chat_body("a", 4))
            .await
            .0,
        200
    );
    assert_eq!(post(&p, "/v1/messages", k, messages_body("a")).await.0, 200);
    assert_eq!(
        post(&p, "/v1/responses", k, responses_body("a")).await.0,
        200
    );
    let before = s.recorder().received();
    // Not allowed: as if it did not exist, in each API's envelope.
    let (st, _, v) = post(&p, "/v1/chat/completions", k, chat_body("hidden", 4)).await;
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (404, Some("model_not_found"))
    );
    assert!(
        !v["error"]["message"].as_str().unwrap().contains("hidden,"),
        "{v}"
    );
    let (st, _, v) = post(&p, "/v1/responses", k, responses_body("hidden")).await;
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (404, Some("model_not_found"))
    );
    let (st, _, v) = post(&p, "/v1/messages", k, messages_body("hidden")).await;
    assert_eq!((st, v["type"].as_str()), (404, Some("error")));
    assert_eq!(v["error"]["type"], "not_found_error");
    for path in ["/v1/messages/count_tokens", "/v1/responses/input_tokens"] {
        let body = if path.contains("messages") {
            messages_body("hidden")
        } else {
            responses_body("hidden")
        };
        assert_eq!(post(&p, path, k, body).await.0, 404, "{path}");
        let body = if path.contains("messages") {
            messages_body("a")
        } else {
            responses_body("a")
        };
        assert_eq!(post(&p, path, k, body).await.0, 200, "{path}");
    }
    assert_eq!(
        s.recorder().received(),
        before,
        "the backend saw nothing of them"
    );
    // The model list shows it only its alias; the other is not found.
    let models: Value = client()
        .get(p.url("/v1/models"))
        .bearer_auth(k)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["a"]);
    let one = client()
        .get(p.url("/v1/models/hidden"))
        .bearer_auth(k)
        .send()
        .await
        .unwrap();
    assert_eq!(one.status(), 404);
    let m = p.metrics().await;
    assert_eq!(
        sample(
            &m,
            "switchboard_client_refusals_total{client=\"only-a\",reason=\"not_allowed\"}"
        ),
        5.0
    );
}

#[tokio::test]
async fn an_unknown_key_is_refused_in_each_apis_envelope() {
    set_key("SB_T_UNKNOWN", "known-key");
    let (s, p) = two_aliases("[clients.c]\nkey_env = \"SB_T_UNKNOWN\"").await;
    let (st, _, v) = post(&p, "/v1/chat/completions", "wrong", chat_body("a", 4)).await;
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (401, Some("invalid_api_key"))
    );
    let (st, _, v) = post(&p, "/v1/responses", "wrong", responses_body("a")).await;
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (401, Some("invalid_api_key"))
    );
    let (st, _, v) = post(&p, "/v1/messages", "wrong", messages_body("a")).await;
    assert_eq!(
        (st, v["error"]["type"].as_str()),
        (401, Some("authentication_error"))
    );
    let r = client().get(p.url("/v1/models")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    // Anthropic's key header works as well.
    let r = client()
        .post(p.url("/v1/messages"))
        .header("x-api-key", "known-key")
        .json(&messages_body("a"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(s.recorder().received(), 1);
}

#[tokio::test]
async fn a_tokens_per_minute_limit_refuses_before_the_backend_and_counts_down() {
    set_key("SB_T_TPM", "tpm-key");
    let (s, p) = two_aliases("[clients.metered]\nkey_env = \"SB_T_TPM\"\ntokens_per_minute = 100\nrequests_per_minute = 50").await;
    let k = "tpm-key";
    // More than the whole minute's budget: refused as never fitting, no retry invited.
    let (st, h, v) = post(&p, "/v1/chat/completions", k, chat_body("a", 500)).await;
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (429, Some("rate_limit_exceeded"))
    );
    assert!(h.get("retry-after").is_none());
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("can never fit"),
        "{v}"
    );
    assert_eq!(s.recorder().received(), 0);
    // One that fits: served, the headers counting down.
    let (st, h, _) = post(&p, "/v1/chat/completions", k, chat_body("a", 60)).await;
    assert_eq!(st, 200);
    assert_eq!(h["x-ratelimit-limit-tokens"], "100");
    assert_eq!(h["x-ratelimit-limit-requests"], "50");
    let requests_left: u64 = h["x-ratelimit-remaining-requests"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(requests_left, 49);
    let tokens_left: u64 = h["x-ratelimit-remaining-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(tokens_left < 40, "{tokens_left}");
    // The one that would pass what is left (60 reserved of 100 are still held or charged):
    // refused before the backend, with a retry-after.
    let seen = s.recorder().received();
    let (st, h, v) = post(&p, "/v1/chat/completions", k, chat_body("a", 95)).await;
    assert_eq!(
        (st, v["error"]["type"].as_str()),
        (429, Some("rate_limit_error"))
    );
    let retry: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    assert!(h.contains_key("x-ratelimit-remaining-tokens"));
    assert_eq!(s.recorder().received(), seen, "the backend saw nothing");
    // On /v1/messages: Anthropic's envelope and header names.
    let (st, h, v) = post(
        &p,
        "/v1/messages",
        k,
        json!({"model": "a", "max_tokens": 95, "messages": [{"role": "user", "content": "Hello"}]}),
    )
    .await;
    assert_eq!(
        (st, v["error"]["type"].as_str()),
        (429, Some("rate_limit_error"))
    );
    assert!(h.contains_key("retry-after"));
    assert_eq!(h["anthropic-ratelimit-tokens-limit"], "100");
    assert!(h.contains_key("anthropic-ratelimit-requests-remaining"));
    // The counting endpoint and the model list carry them too; a count is one request.
    let (st, h, _) = post(&p, "/v1/messages/count_tokens", k, messages_body("a")).await;
    assert_eq!(st, 200);
    assert_eq!(h["anthropic-ratelimit-tokens-limit"], "100");
    // 48 left (refilled to 49 on a slow run): the count took one request, no tokens.
    let left = |v: &reqwest::header::HeaderValue| v.to_str().unwrap().parse::<u64>().unwrap();
    assert!((48..=49).contains(&left(&h["anthropic-ratelimit-requests-remaining"])));
    let r = client()
        .get(p.url("/v1/models"))
        .bearer_auth(k)
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-ratelimit-limit-requests"], "50");
    assert!((48..=49).contains(&left(&r.headers()["x-ratelimit-remaining-requests"])));
    let m = p.metrics().await;
    assert_eq!(
        sample(
            &m,
            "switchboard_client_refusals_total{client=\"metered\",reason=\"rate_limit\"}"
        ),
        3.0
    );
}

/// The tokens left of a day's quota, as the answer's header gives them.
fn tokens_left(h: &reqwest::header::HeaderMap) -> i64 {
    h["x-ratelimit-remaining-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// Wait until the client's record of `n` answered requests is written (its charge settled).
async fn settled(p: &Proxy, client: &str, n: f64) {
    within("the charge to settle", async {
        loop {
            let m = p.metrics().await;
            let series =
                format!("switchboard_client_requests_total{{client=\"{client}\",status=\"200\"}}");
            if sample(&m, &series) >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}

#[tokio::test]
async fn the_reservation_is_refunded_from_the_usage_whole_and_streamed() {
    set_key("SB_T_REFUND", "refund-key");
    let mut held = Held::start().await;
    let streams = sim(SimConfig::default()).await;
    let gated = sim(SimConfig {
        gate: true,
        ..SimConfig::default()
    })
    .await;
    let cfg = Fleet::new()
        .backend("held", "openai")
        .slots(1)
        .backend("sim", "llamacpp")
        .slots(4)
        .backend("gated", "llamacpp")
        .slots(4)
        .alias("a", "held")
        .alias("s", "sim")
        .model("sim-model")
        .alias("g", "gated")
        .model("sim-model")
        .text("[clients.day]\nkey_env = \"SB_T_REFUND\"\ntokens_per_day = 10000")
        .render();
    let urls = [
        ("held", held.url.clone()),
        ("sim", streams.url()),
        ("gated", gated.url()),
    ];
    let p = proxy(&cfg, &urls).await;
    let k = "refund-key";
    // Whole: 1000 reserved, the usage's 10 charged.
    let answer = tokio::spawn({
        let url = p.url("/v1/chat/completions");
        async move {
            client()
                .post(url)
                .bearer_auth(k)
                .json(&chat_body("a", 1000))
                .send()
                .await
                .unwrap()
        }
    });
    let (_, release) = held.next().await;
    release.send(()).unwrap();
    let r = within("the answer", answer).await.unwrap();
    let left1 = tokens_left(r.headers());
    assert!(
        left1 <= 10000 - 1000,
        "the prompt and max_tokens are held: {left1}"
    );
    let reserved = 10000 - left1;
    assert_eq!(
        r.json::<Value>().await.unwrap()["usage"]["total_tokens"],
        10
    );
    settled(&p, "day", 1.0).await;
    // Streamed: the usage of the stream's end (7 prompt + 20 generated) is charged.
    let mut body = chat_body("s", 20);
    body["stream"] = json!(true);
    let r = client()
        .post(p.url("/v1/chat/completions"))
        .bearer_auth(k)
        .json(&body)
        .send()
        .await
        .unwrap();
    let left2 = tokens_left(r.headers());
    // After the whole answer: its 10 charged, the rest of what it held given back.
    let after_first = 10000 - 10;
    let held_now = after_first - left2;
    assert!(held_now > 20 && held_now < reserved, "{held_now}");
    let events = common::sse_payloads(r).await;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    settled(&p, "day", 2.0).await;
    let standing = |p: &Proxy| {
        let url = p.url("/v1/chat/completions");
        async move {
            let r = client()
                .post(url)
                .bearer_auth(k)
                .json(&chat_body("s", 1))
                .send()
                .await
                .unwrap();
            tokens_left(r.headers())
        }
    };
    let left3 = standing(&p).await;
    let charged = 10000 - 10 - 27;
    // left3 is after this probe's own reservation (prompt + 1): within a few tokens.
    assert!(
        (charged - 12..=charged + 2).contains(&left3),
        "{charged} {left3}"
    );
    settled(&p, "day", 3.0).await;
    let probe = (10000 - 10 - 27) - left3;
    let left4 = standing(&p).await;
    settled(&p, "day", 4.0).await;
    // A stream cut short: charged its prompt and the one token it had sent.
    let mut body = chat_body("g", 500);
    body["stream"] = json!(true);
    let r = client()
        .post(p.url("/v1/chat/completions"))
        .bearer_auth(k)
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut events = r.bytes_stream();
    use futures_util::StreamExt;
    within("the first event", events.next())
        .await
        .unwrap()
        .unwrap();
    drop(events);
    within("the cancel to be recorded", async {
        loop {
            let m = p.metrics().await;
            if sample(&m, "switchboard_client_cancels_total{alias=\"g\"}") >= 1.0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let left5 = standing(&p).await;
    // Between the probes: this one's own charge (probe-sized: prompt + 1 token each), not 500.
    let spent = left4 - left5;
    assert!(
        spent >= probe && spent < probe + 20,
        "{left4} {left5} {probe}"
    );
    gated.release();
}

#[tokio::test]
async fn a_spent_days_quota_is_insufficient_quota() {
    set_key("SB_T_QUOTA", "quota-key");
    let (_s, p) = two_aliases("[clients.q]\nkey_env = \"SB_T_QUOTA\"\ntokens_per_day = 100").await;
    let (st, _, _) = post(&p, "/v1/chat/completions", "quota-key", chat_body("a", 80)).await;
    assert_eq!(st, 200);
    let (st, _, v) = post(&p, "/v1/chat/completions", "quota-key", chat_body("a", 80)).await;
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (429, Some("insufficient_quota"))
    );
}

#[tokio::test]
async fn max_concurrent_refuses_the_request_past_it() {
    set_key("SB_T_CONC", "conc-key");
    let mut b = Held::start().await;
    let p = proxy(
        &one_slot("[clients.c]\nkey_env = \"SB_T_CONC\"\nmax_concurrent = 1"),
        &[("b", b.url.clone())],
    )
    .await;
    let first = send(&p, "conc-key", "first");
    let (_, release) = b.next().await;
    let second = within("the refusal", send(&p, "conc-key", "second"))
        .await
        .unwrap();
    assert_eq!(second.status(), 429);
    assert!(second.headers().contains_key("retry-after"));
    release.send(()).unwrap();
    assert_eq!(within("the first", first).await.unwrap().status(), 200);
    let m = p.metrics().await;
    assert_eq!(
        sample(
            &m,
            "switchboard_client_refusals_total{client=\"c\",reason=\"concurrency\"}"
        ),
        1.0
    );
}

#[tokio::test]
async fn a_reload_keeps_counters_and_queued_requests_and_drops_a_removed_key_at_once() {
    set_key("SB_T_RELOAD_A", "reload-a");
    set_key("SB_T_RELOAD_B", "reload-b");
    let mut b = Held::start().await;
    let both = "[clients.a]\nkey_env = \"SB_T_RELOAD_A\"\ntokens_per_day = 1000\n\
                [clients.b]\nkey_env = \"SB_T_RELOAD_B\"";
    let url = b.url.clone();
    let p = proxy(&one_slot(both), &[("b", url.clone())]).await;
    let first = send(&p, "reload-a", "first");
    let (_, release) = b.next().await;
    let waiting = send(&p, "reload-b", "waiting");
    queued(&p, 1.0).await;
    // The same clients, a's limit raised: its one request so far stays counted.
    let raised = both.replace("tokens_per_day = 1000", "tokens_per_day = 2000");
    let cfg = switchboard_proxy::config::from_toml(&common::fill(
        &one_slot(&raised),
        &[("b", url.clone())],
    ))
    .unwrap();
    p.state.swap(cfg).unwrap();
    release.send(()).unwrap();
    let r = within("the first", first).await.unwrap();
    assert_eq!(r.status(), 200);
    let (m, release) = b.next().await;
    assert_eq!(m, "waiting", "the queued request was kept and served");
    release.send(()).unwrap();
    assert_eq!(
        within("the queued one", waiting).await.unwrap().status(),
        200
    );
    let third = send(&p, "reload-a", "third");
    let (_, release) = b.next().await;
    release.send(()).unwrap();
    let r = within("the third", third).await.unwrap();
    // The first requests' tokens (their usage) still counted under the raised limit; this
    // one's prompt and the default output (1,024: it sets no max_tokens) reserved.
    assert_eq!(r.headers()["x-ratelimit-limit-tokens"], "2000");
    let left = tokens_left(r.headers());
    assert!((946..=966).contains(&left), "{left}");
    // b's key removed: refused on its next request.
    let only_a = "[clients.a]\nkey_env = \"SB_T_RELOAD_A\"\ntokens_per_day = 2000";
    let cfg = switchboard_proxy::config::from_toml(&common::fill(&one_slot(only_a), &[("b", url)]))
        .unwrap();
    p.state.swap(cfg).unwrap();
    let r = within("the refusal", send(&p, "reload-b", "gone"))
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}

#[tokio::test]
async fn the_status_page_shows_a_client_only_its_own_section_and_an_admin_all() {
    set_key("SB_T_PAGE_OPS", "page-ops");
    set_key("SB_T_PAGE_LIM", "page-limited");
    set_key("SB_T_PAGE_ADMIN", "page-admin");
    let (_s, p) = two_aliases(
        "[clients.ops]\nkey_env = \"SB_T_PAGE_OPS\"\n\
         [clients.limited]\nkey_env = \"SB_T_PAGE_LIM\"\naliases = [\"a\"]\ntokens_per_minute = 500\n\
         [server]\nadmin_keys_env = \"SB_T_PAGE_ADMIN\"",
    )
    .await;
    let page = |key: &'static str| {
        let url = p.url("/");
        async move {
            let resp = client().get(url).bearer_auth(key).send().await.unwrap();
            (resp.status().as_u16(), resp.text().await.unwrap())
        }
    };
    assert_eq!(
        post(&p, "/v1/chat/completions", "page-ops", chat_body("a", 4))
            .await
            .0,
        200
    );
    let (status, all) = page("page-admin").await;
    assert_eq!(status, 200);
    assert!(all.contains("<h2>Clients</h2>"), "{all}");
    // The alias's five minutes as inline SVG charts: a bar for the request.
    assert!(
        all.contains("<svg class=\"chart\"") && all.contains("<rect ") && all.contains("1 req"),
        "{all}"
    );
    assert!(all.contains("<td>limited</td>") && all.contains("<td>ops</td>"));
    // The page escapes every value as minijinja does, the label's `/` as `&#x2f;`.
    let limit = "tokens &#x2f; min: 500 / 500";
    assert!(all.contains(limit), "{all}");
    assert!(
        all.contains("data-alias=\"hidden\""),
        "an admin sees every alias"
    );
    assert!(
        !all.contains("page-ops") && !all.contains("page-limited") && !all.contains("page-admin"),
        "no key is shown"
    );
    // A client allowed every alias sees them all, but of the clients only its own section.
    let (_, ops) = page("page-ops").await;
    assert!(ops.contains("data-alias=\"hidden\""), "{ops}");
    assert!(
        ops.contains("<td>ops</td>") && !ops.contains("<td>limited</td>"),
        "another client's limits and usage are not shown: {ops}"
    );
    assert!(!ops.contains(limit), "{ops}");
    // Its tokens of the last five minutes: the usage of its one request (a client without
    // limits is counted all the same).
    let row = "<td>ops</td><td>normal</td><td>all</td><td class=\"n\">0</td><td class=\"n\">0</td><td class=\"n\">";
    let at = ops.find(row).expect("the ops row") + row.len();
    let tokens: u64 = ops[at..].split('<').next().unwrap().parse().unwrap();
    assert!(tokens > 0, "{ops}");
    let (_, mine) = page("page-limited").await;
    assert!(
        !mine.contains("data-alias=\"hidden\"") && mine.contains("data-alias=\"a\""),
        "{mine}"
    );
    assert!(mine.contains("<td>limited</td>") && !mine.contains("<td>ops</td>"));
    // An admin key is no client key, and a wrong one opens nothing.
    assert_eq!(
        post(&p, "/v1/chat/completions", "page-admin", chat_body("a", 4))
            .await
            .0,
        401
    );
    assert_eq!(page("wrong").await.0, 401);
}

#[tokio::test]
async fn a_client_allowed_every_alias_sees_no_other_clients_section() {
    set_key("SB_T_OWN_ALL", "own-all");
    set_key("SB_T_OWN_OTHER", "own-other");
    let (_s, p) = two_aliases(
        "[clients.everything]\nkey_env = \"SB_T_OWN_ALL\"\n\
         [clients.other]\nkey_env = \"SB_T_OWN_OTHER\"\ntokens_per_day = 777",
    )
    .await;
    let resp = client()
        .get(p.url("/"))
        .bearer_auth("own-all")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let page = resp.text().await.unwrap();
    assert!(page.contains("<td>everything</td>"), "{page}");
    // The other client's limit as the page writes a limit (`remaining / limit`): a bare
    // `777` may be in the page's random nonce.
    assert!(
        !page.contains("<td>other</td>") && !page.contains(" / 777"),
        "another client's section: {page}"
    );
}

/// `cheap` on a held backend of one slot and a queue of one, falling back to `premium` on a
/// simulator (and over its window to `big`, there too); client `only-cheap` may use `cheap`
/// alone, client `every` any alias.
async fn cheap_and_premium(var_only: &str, var_every: &str) -> (Held, switchboard_sim::Sim, Proxy) {
    let held = Held::start().await;
    let s = sim(SimConfig::default()).await;
    let cfg = Fleet::new()
        .backend("b", "openai")
        .slots(1)
        .queue(1)
        .backend("s", "llamacpp")
        .slots(4)
        .alias("cheap", "b")
        .text("fallbacks = [\"premium\"]")
        .alias("premium", "s")
        .model("sim-model")
        .alias("small", "s")
        .model("sim-model")
        .window(64)
        .text("count = \"estimate\"\ncontext_fallback = \"big\"")
        .alias("big", "s")
        .model("sim-model")
        .text(&format!(
            "[clients.only-cheap]\nkey_env = \"{var_only}\"\naliases = [\"cheap\", \"small\"]\n\
             [clients.every]\nkey_env = \"{var_every}\""
        ))
        .render();
    let p = proxy(&cfg, &[("b", held.url.clone()), ("s", s.url())]).await;
    (held, s, p)
}

fn chat_to(model: &str, content: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": content}]})
}

#[tokio::test]
async fn a_fallback_the_client_may_not_use_is_skipped() {
    set_key("SB_T_FB_ONLY", "fb-only-key");
    set_key("SB_T_FB_EVERY", "fb-every-key");
    let (mut b, s, p) = cheap_and_premium("SB_T_FB_ONLY", "SB_T_FB_EVERY").await;
    let running = send_to(&p, "fb-only-key", chat_to("cheap", "running"));
    let (m, release) = b.next().await;
    assert_eq!(m, "running");
    let waiting = send_to(&p, "fb-only-key", chat_to("cheap", "waiting"));
    queued_on(&p, "cheap", 1.0).await;
    // Slot and queue full: the client's fallback is one it may not use, so it is not one.
    let path = "/v1/chat/completions";
    let (st, h, v) = post(&p, path, "fb-only-key", chat_to("cheap", "third")).await;
    assert_eq!(st, 429, "{v}");
    assert!(h.get("retry-after").is_some());
    let all = format!("{h:?} {v}");
    assert!(!all.contains("premium"), "the hidden alias shows: {all}");
    assert_eq!(s.recorder().received(), 0, "the hidden alias served it");
    // A client that may use it falls back to it.
    let (st, h, v) = post(&p, path, "fb-every-key", chat_to("cheap", "fourth")).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(h["x-switchboard-alias"], "premium");
    release.send(()).unwrap();
    let (m, release) = b.next().await;
    assert_eq!(m, "waiting");
    release.send(()).unwrap();
    for r in [running, waiting] {
        assert_eq!(within("an answer", r).await.unwrap().status(), 200);
    }
}

#[tokio::test]
async fn a_context_fallback_the_client_may_not_use_is_no_fallback() {
    set_key("SB_T_CFB_ONLY", "cfb-only-key");
    set_key("SB_T_CFB_EVERY", "cfb-every-key");
    let (_b, s, p) = cheap_and_premium("SB_T_CFB_ONLY", "SB_T_CFB_EVERY").await;
    let long = "many words in a row ".repeat(100);
    let path = "/v1/chat/completions";
    let (st, h, v) = post(&p, path, "cfb-only-key", chat_to("small", &long)).await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    let all = format!("{h:?} {v}");
    assert!(!all.contains("big"), "the hidden alias shows: {all}");
    assert_eq!(s.recorder().received(), 0, "the hidden alias served it");
    let (st, h, v) = post(&p, path, "cfb-every-key", chat_to("small", &long)).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(h["x-switchboard-alias"], "big");
    // Over the window on /v1/messages too: that API's own 400.
    let body = json!({"model": "small", "max_tokens": 4,
        "messages": [{"role": "user", "content": long}]});
    let (st, _, v) = post(&p, "/v1/messages", "cfb-only-key", body).await;
    assert_eq!(
        (st, v["error"]["type"].as_str()),
        (400, Some("invalid_request_error")),
        "{v}"
    );
    assert_eq!(s.recorder().received(), 1);
}

#[tokio::test]
async fn a_request_that_never_reached_a_backend_is_charged_no_tokens() {
    set_key("SB_T_NEVER", "never-key");
    let mut b = Held::start().await;
    let s = sim(SimConfig::default()).await;
    let cfg = Fleet::new()
        .backend("b", "openai")
        .slots(1)
        .queue(1)
        .backend("sim", "llamacpp")
        .slots(4)
        .alias("a", "b")
        .alias("s", "sim")
        .model("sim-model")
        .text("[clients.n]\nkey_env = \"SB_T_NEVER\"\ntokens_per_day = 100000")
        .render();
    let p = proxy(&cfg, &[("b", b.url.clone()), ("sim", s.url())]).await;
    let k = "never-key";
    let probe = || async {
        let (st, h, _) = post(&p, "/v1/chat/completions", k, chat_body("s", 1)).await;
        assert_eq!(st, 200);
        tokens_left(&h)
    };
    let before = probe().await;
    settled(&p, "n", 1.0).await;
    // Prompts of about 1,000 tokens (their bytes over four: alias a has no guard).
    let long = |marker: &str| format!("{marker} {}", "word ".repeat(800));
    let first = send(&p, k, &long("first"));
    let (_, release) = b.next().await;
    let waiting = send(&p, k, &long("waiting"));
    queued(&p, 1.0).await;
    let refused = within("the refusal", send(&p, k, &long("refused")))
        .await
        .unwrap();
    assert_eq!(refused.status(), 429, "the queue is full");
    // The queued one is cancelled by its client.
    waiting.abort();
    queued(&p, 0.0).await;
    within("the cancel to be recorded", async {
        let series = r#"switchboard_client_requests_total{client="n",status="429"}"#;
        while sample(&p.metrics().await, series) < 1.0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let after = probe().await;
    // Only the first (at the backend still: its prompt and the default 1,024 for its output
    // reserved) and the probes: the refused and the cancelled prompts are given back.
    let spent = before - after;
    assert!((2000..2100).contains(&spent), "spent {spent}");
    release.send(()).unwrap();
    assert_eq!(within("the first", first).await.unwrap().status(), 200);
}

/// The status page as the client of `key` sees it.
async fn status_page(p: &Proxy, key: &str) -> String {
    let resp = client().get(p.url("/")).bearer_auth(key).send().await;
    resp.unwrap().text().await.unwrap()
}

#[tokio::test]
async fn the_status_page_shows_who_holds_the_slot_and_who_waits_for_it() {
    set_key("SB_T_SLOTS_ANN", "slots-ann");
    set_key("SB_T_SLOTS_BOB", "slots-bob");
    let mut b = Held::start().await;
    let clients = "[clients.ann]\nkey_env = \"SB_T_SLOTS_ANN\"\n\
                   [clients.bob]\nkey_env = \"SB_T_SLOTS_BOB\"\npriority = \"batch\"";
    let p = proxy(&one_slot(clients), &[("b", b.url.clone())]).await;
    let first = send(&p, "slots-ann", "first");
    let (_, release_first) = b.next().await;
    let second = send(&p, "slots-bob", "second");
    queued(&p, 1.0).await;
    // Bob sees himself waiting behind another client holding the slot; Ann sees herself
    // holding it, another client waiting.
    let bob = status_page(&p, "slots-bob").await;
    assert!(bob.contains("<li>bob · batch · waited "), "{bob}");
    assert!(
        bob.contains("<li>slot 0 · another client · normal · "),
        "{bob}"
    );
    assert!(
        bob.contains("<title>slot 0: another client · holding it "),
        "{bob}"
    );
    let ann = status_page(&p, "slots-ann").await;
    assert!(
        ann.contains("<li>another client · batch · waited "),
        "{ann}"
    );
    assert!(ann.contains("<li>slot 0 · ann · normal · "), "{ann}");
    assert!(
        ann.contains("<title>slot 0: ann · normal · holding it "),
        "{ann}"
    );
    release_first.send(()).unwrap();
    assert_eq!(within("the first", first).await.unwrap().status(), 200);
    let (_, release_second) = b.next().await;
    release_second.send(()).unwrap();
    assert_eq!(within("the second", second).await.unwrap().status(), 200);
    queued(&p, 0.0).await;
    // Each answer a bar on slot 0, in its client's colour: named to its own client, grey and
    // unnamed to the other.
    within("both bars", async {
        loop {
            let ann = status_page(&p, "slots-ann").await;
            if ann.contains("<title>slot 0: ann · a · 7 prompt + 3 output tokens")
                && ann.contains("<title>slot 0: another client</title>")
            {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    let bob = status_page(&p, "slots-bob").await;
    assert!(bob.contains("<title>slot 0: bob · a · "), "{bob}");
    assert!(
        !bob.contains("ann"),
        "bob's page names no other client: {bob}"
    );
}
