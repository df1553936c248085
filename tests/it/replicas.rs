//! Replicas and the fleet changing under the proxy: replicas, conversation affinity, fallbacks,
//! the circuit breaker, failing fast — through the real server against simulators.

use crate::common;
use common::toml::Fleet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use switchboard_sim::{Sim, SimConfig};

/// Chat requests a simulator received.
fn chats(s: &Sim) -> usize {
    s.recorder()
        .requests()
        .iter()
        .filter(|r| r.path == "/v1/chat/completions")
        .count()
}

fn paced() -> SimConfig {
    SimConfig {
        token_delay: Duration::from_millis(2),
        completion_tokens: 6,
        ..SimConfig::default()
    }
}

/// A simulator again on the address of one that was shut down.
async fn restart(addr: SocketAddr, cfg: SimConfig) -> Sim {
    let l = within("the port again", async {
        loop {
            match tokio::net::TcpListener::bind(addr).await {
                Ok(l) => break l,
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    })
    .await;
    Sim::spawn_on(cfg, l).await.unwrap()
}

/// Replicas `a` and `b` of alias `m`, a breaker opening after two failures for 200 ms, with
/// the `[server]` lines `server` besides.
fn two_replicas(server: &str) -> String {
    Fleet::new()
        .server("breaker_failures = 2\nbreaker_open_ms = 200")
        .text(server)
        .backend("a", "llamacpp")
        .slots(4)
        .backend("b", "llamacpp")
        .slots(4)
        .replicas("m", &["a", "b"])
        .render()
}

/// What the traffic of one client loop saw.
#[derive(Default)]
struct Tally {
    ok: AtomicUsize,
    failed: AtomicUsize,
    /// Failures that were a 502 (a request the killed backend had, not sent elsewhere).
    bad_gateway: AtomicUsize,
    /// Streams that ended with an error event (their backend was killed).
    cut: AtomicUsize,
    /// Streams that ended with neither `[DONE]` nor an error event.
    lost: AtomicUsize,
}

async fn traffic(url: String, stream: bool, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    let c = client();
    while !stop.load(Ordering::SeqCst) {
        let resp = c.post(&url).json(&chat("m", stream)).send().await;
        let Ok(resp) = resp else {
            tally.failed.fetch_add(1, Ordering::SeqCst);
            continue;
        };
        if resp.status() != 200 {
            tally.failed.fetch_add(1, Ordering::SeqCst);
            if resp.status() == 502 {
                tally.bad_gateway.fetch_add(1, Ordering::SeqCst);
            }
            continue;
        }
        if !stream {
            let whole = resp.json::<Value>().await;
            let counter = if whole.is_ok() {
                &tally.ok
            } else {
                &tally.failed
            };
            counter.fetch_add(1, Ordering::SeqCst);
            continue;
        }
        let events = sse_payloads(resp).await;
        let counter = if events.last().is_some_and(|e| e == "[DONE]") {
            &tally.ok
        } else if events.iter().any(|e| e.starts_with("{\"error\"")) {
            &tally.cut
        } else {
            &tally.lost
        };
        counter.fetch_add(1, Ordering::SeqCst);
    }
}

/// Two replicas under six client loops (four non-streaming, two streaming); one killed once
/// both serve, restarted once the other takes it all. What the loops saw, non-streaming and
/// streams; the in-flight gauge is back at 0.
async fn kill_one_replica(config: &str) -> (Arc<Tally>, Arc<Tally>) {
    let a = sim(paced()).await;
    let b = sim(paced()).await;
    let a_addr = a.addr();
    let p = proxy(config, &[("a", a.url()), ("b", b.url())]).await;
    let stop = Arc::new(AtomicBool::new(false));
    let (plain, streams) = (Arc::new(Tally::default()), Arc::new(Tally::default()));
    let mut loops = Vec::new();
    for i in 0..6 {
        let tally = if i < 4 { &plain } else { &streams };
        let url = p.url("/v1/chat/completions");
        loops.push(tokio::spawn(traffic(
            url,
            i >= 4,
            Arc::clone(&stop),
            Arc::clone(tally),
        )));
    }
    until("both replicas serving", || chats(&a) >= 5 && chats(&b) >= 5).await;
    a.shutdown().await;
    let before = chats(&b);
    until("the other replica taking it all", || {
        chats(&b) >= before + 30
    })
    .await;
    let a = restart(a_addr, paced()).await;
    until("traffic back on the restarted replica", || chats(&a) >= 5).await;
    stop.store(true, Ordering::SeqCst);
    for l in loops {
        within("the client loops", l).await.unwrap();
    }
    assert_eq!(
        streams.lost.load(Ordering::SeqCst),
        0,
        "streams without an end"
    );
    assert!(plain.ok.load(Ordering::SeqCst) > 30);
    let m = p.metrics().await;
    assert_eq!(
        sample(&m, r#"switchboard_inflight_requests{alias="m"}"#),
        0.0
    );
    (plain, streams)
}

/// With `resend_unanswered = false`, a killed replica drops the requests it had: each is a
/// 502, not sent to the other replica
/// (it may have run them). Every request it had not been sent goes to the other.
#[tokio::test]
async fn with_resend_unanswered_off_a_killed_replica_loses_only_the_requests_it_had() {
    let config = two_replicas("resend_unanswered = false");
    let (plain, streams) = kill_one_replica(&config).await;
    // A request fails only on a connection the proxy had to the killed replica, and a failed
    // connection is not used again: at most one failure for each of the 6 client loops, and
    // one for a connection a health probe may have left in the pool.
    let failed = plain.failed.load(Ordering::SeqCst) + streams.failed.load(Ordering::SeqCst);
    let bad_gateway =
        plain.bad_gateway.load(Ordering::SeqCst) + streams.bad_gateway.load(Ordering::SeqCst);
    assert_eq!(failed, bad_gateway, "failures other than a 502");
    assert!(failed <= 7, "{failed} requests failed");
}

/// By default the requests a killed replica had go to the other: not one fails (streams it
/// had begun end with an error event), and the killed replica gets traffic back.
#[tokio::test]
async fn a_killed_replica_loses_no_request_by_default() {
    let (plain, streams) = kill_one_replica(&two_replicas("")).await;
    assert_eq!(plain.failed.load(Ordering::SeqCst), 0, "failed requests");
    assert_eq!(streams.failed.load(Ordering::SeqCst), 0, "failed streams");
}

#[tokio::test]
async fn the_least_loaded_replica_takes_requests_while_the_other_is_full() {
    let a = sim(SimConfig::default()).await;
    let b = sim(SimConfig::default()).await;
    let p = proxy(&two_replicas(""), &[("a", a.url()), ("b", b.url())]).await;
    let snap = p.state.live.load_full();
    let slots = Arc::clone(&snap.replica("a").unwrap().slots);
    let held: Vec<_> = (0..4).map(|_| slots.try_acquire().unwrap()).collect();
    let c = client();
    // Conversations of their own, whichever replica comes first in their order.
    let one = |i: usize| json!({"model": "m", "messages": [{"role": "user", "content": format!("q{i}")}]});
    for i in 0..6 {
        assert_eq!(p.post_chat(&c, &one(i)).await.status(), 200);
    }
    assert_eq!((chats(&a), chats(&b)), (0, 6));
    drop(held);
    // Requests of no conversation (a legacy completion's prompt): equally loaded, in turn.
    for i in 0..6 {
        let body = json!({"model": "m", "prompt": format!("p{i}"), "max_tokens": 2});
        let url = p.url("/v1/completions");
        assert_eq!(status(&c, &url, &body).await, 200);
    }
    let completions = |s: &Sim| {
        s.recorder()
            .requests()
            .iter()
            .filter(|r| r.path == "/v1/completions")
            .count()
    };
    assert_eq!((completions(&a), completions(&b)), (3, 3));
}

fn turn(conversation: &str, n: usize) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": format!("task of {conversation}")}),
    ];
    for i in 1..n {
        messages.push(json!({"role": "assistant", "content": format!("step {i}")}));
        messages.push(json!({"role": "user", "content": format!("go on {i}")}));
    }
    json!({"model": "m", "messages": messages, "max_tokens": 2})
}

#[tokio::test]
async fn a_conversation_stays_on_its_replica_and_moves_when_it_dies() {
    let a = sim(SimConfig::default()).await;
    let b = sim(SimConfig::default()).await;
    let p = proxy(&two_replicas(""), &[("a", a.url()), ("b", b.url())]).await;
    let c = client();
    for n in 1..=10 {
        for conv in ["first", "second"] {
            let r = p.post_chat(&c, &turn(conv, n)).await;
            assert_eq!(r.status(), 200);
        }
    }
    // Each conversation's ten turns all on one replica.
    for conv in ["first", "second"] {
        let marker = format!("task of {conv}");
        let on = (chats_with(&a, &marker), chats_with(&b, &marker));
        assert!(on == (10, 0) || on == (0, 10), "{conv}: {on:?}");
    }
    let m = p.metrics().await;
    assert_eq!(
        sample(&m, r#"switchboard_affinity_total{alias="m",result="hit"}"#),
        18.0
    );
    assert_eq!(
        sample(&m, r#"switchboard_affinity_total{alias="m",result="new"}"#),
        2.0
    );

    // The first conversation's replica dies (its probe says so): its next turns move to the
    // other and stay.
    let (dying, staying) = if chats_with(&a, "task of first") > 0 {
        (a, b)
    } else {
        (b, a)
    };
    dying.shutdown().await;
    within(
        "probes",
        switchboard_proxy::live::probes::probe_all(&p.state),
    )
    .await;
    for n in 11..=13 {
        assert_eq!(p.post_chat(&c, &turn("first", n)).await.status(), 200);
    }
    assert_eq!(chats_with(&staying, "task of first"), 3);
    let m = p.metrics().await;
    assert_eq!(
        sample(
            &m,
            r#"switchboard_affinity_total{alias="m",result="moved"}"#
        ),
        1.0
    );
}

/// Alias `p` on backend `primary`, falling back to alias `f` on backend `spare`, with the
/// `[server]` lines `server`.
fn fallbacks(server: &str) -> String {
    Fleet::new()
        .server(server)
        .backend("primary", "llamacpp")
        .backend("spare", "llamacpp")
        .alias("p", "primary")
        .text("fallbacks = [\"f\"]")
        .alias("f", "spare")
        .model("spare-model")
        .render()
}

/// The proxy with `primary` in front of a good `spare`; one request's alias header and the
/// fallbacks counter of `reason`.
async fn fall_back(primary: String, stream: bool, reason: &str) -> (String, f64, Sim, Vec<String>) {
    let spare = sim(SimConfig::default()).await;
    let p = proxy(
        &fallbacks(""),
        &[("primary", primary), ("spare", spare.url())],
    )
    .await;
    let r = p.post_chat(&client(), &chat("p", stream)).await;
    assert_eq!(r.status(), 200);
    let served = r.headers()["x-switchboard-alias"]
        .to_str()
        .unwrap()
        .to_string();
    let events = if stream {
        sse_payloads(r).await
    } else {
        Vec::new()
    };
    let m = p.metrics().await;
    let key = format!(r#"switchboard_fallbacks_total{{alias="p",to="f",reason="{reason}"}}"#);
    (served, sample(&m, &key), spare, events)
}

#[tokio::test]
async fn falls_back_on_refused_loading_and_a_500_before_the_first_byte_not_after_it() {
    let (served, n, spare, _) = fall_back(dead_url().await, false, "connect").await;
    assert_eq!((served.as_str(), n), ("f", 1.0));
    assert!(
        String::from_utf8_lossy(&spare.recorder().last().unwrap().body).contains("spare-model")
    );

    let loading = sim(SimConfig {
        loading: Duration::from_secs(3600),
        ..SimConfig::default()
    })
    .await;
    let (served, n, _, _) = fall_back(loading.url(), false, "loading").await;
    assert_eq!((served.as_str(), n), ("f", 1.0));

    let failing = sim(SimConfig {
        fail_status: Some(500),
        ..SimConfig::default()
    })
    .await;
    let (served, n, _, events) = fall_back(failing.url(), true, "status_5xx").await;
    assert_eq!((served.as_str(), n), ("f", 1.0));
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));

    // Broken after its first events: the client has bytes, so no fallback.
    let broken = sim(SimConfig {
        fail_after: Some(2),
        ..SimConfig::default()
    })
    .await;
    let spare = sim(SimConfig::default()).await;
    let p = proxy(
        &fallbacks(""),
        &[("primary", broken.url()), ("spare", spare.url())],
    )
    .await;
    let r = p.post_chat(&client(), &chat("p", true)).await;
    assert_eq!(r.headers()["x-switchboard-alias"], "p");
    let events = sse_payloads(r).await;
    assert!(
        events.last().unwrap().starts_with("{\"error\""),
        "{events:?}"
    );
    assert!(!events.iter().any(|e| e == "[DONE]"));
    assert_eq!(chats(&spare), 0);
}

#[tokio::test]
async fn the_breaker_opens_after_failures_and_a_half_open_trial_closes_it() {
    let s = sim(SimConfig {
        fail_status: Some(500),
        ..SimConfig::default()
    })
    .await;
    let toml = one_alias(
        "llamacpp",
        "breaker_failures = 3\nbreaker_open_ms = 1000",
        "",
    );
    let p = proxy(&toml, &[("b", s.url())]).await;
    let c = client();
    for _ in 0..3 {
        assert_eq!(p.post_chat(&c, &chat("a", false)).await.status(), 500);
    }
    assert_eq!(chats(&s), 3);
    let r = p.post_chat(&c, &chat("a", false)).await;
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "no_backend");
    assert_eq!(p.state.shown_state("b"), "breaker_open");
    let models: Value = p.get_json("/v1/models").await;
    assert_eq!(models["data"][0]["status"], "breaker_open");
    let m = p.metrics().await;
    assert_eq!(
        sample(&m, r#"switchboard_breaker_state{backend="b",state="open"}"#),
        1.0
    );

    // The backend recovers; nothing reaches it until the back-off is over, then one trial.
    s.fail_with(None);
    within("the half-open trial", async {
        loop {
            match p.post_chat(&c, &chat("a", false)).await.status().as_u16() {
                200 => break,
                503 => {}
                other => panic!("status {other}"),
            }
            assert_eq!(chats(&s), 3, "a request reached the backend while open");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(chats(&s), 4);
    assert_eq!(p.state.shown_state("b"), "unknown");
    assert_eq!(p.post_chat(&c, &chat("a", false)).await.status(), 200);
    let m = p.metrics().await;
    assert_eq!(
        sample(
            &m,
            r#"switchboard_breaker_state{backend="b",state="closed"}"#
        ),
        1.0
    );
}

#[tokio::test]
async fn no_usable_backend_is_a_503_with_retry_after_without_being_tried() {
    let loading = sim(SimConfig {
        flavor: switchboard_wire::flavor::Flavor::Vllm,
        loading: Duration::from_secs(3600),
        ..SimConfig::default()
    })
    .await;
    let toml = Fleet::new()
        .server("health_interval_secs = 1")
        .backend("dead", "llamacpp")
        .backend("loading", "vllm")
        .alias("d", "dead")
        .alias("l", "loading")
        .render();
    let p = proxy(
        &toml,
        &[("dead", dead_url().await), ("loading", loading.url())],
    )
    .await;
    within(
        "probes",
        switchboard_proxy::live::probes::probe_all(&p.state),
    )
    .await;
    let c = client();
    // Answered from what the probes found, each within `WAIT` (`post_chat`): a request sent
    // on to the loading vLLM would be held for its hour of loading.
    let r = p.post_chat(&c, &chat("d", false)).await;
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "no_backend");
    // A loading vLLM would hold the request until it is up: it is answered at once too.
    let r = p.post_chat(&c, &chat("l", false)).await;
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "model_loading");
    assert_eq!(chats(&loading), 0);
    // The dead backend was not tried either: no connect error.
    let m = p.metrics().await;
    assert_eq!(
        sample(
            &m,
            r#"switchboard_upstream_errors_total{alias="d",reason="connect"}"#
        ),
        0.0
    );
}

#[tokio::test]
async fn a_queue_wait_that_runs_out_is_a_503_and_a_full_queue_a_429() {
    let s = sim(SimConfig {
        gate: true,
        ..SimConfig::default()
    })
    .await;
    let toml = Fleet::new()
        .server("queue_timeout_secs = 1")
        .backend("b", "llamacpp")
        .slots(1)
        .queue(1)
        .alias("a", "b")
        .render();
    let p = proxy(&toml, &[("b", s.url())]).await;
    let c = client();
    let held = p.post_chat(&c, &chat("a", true)).await;
    assert_eq!(held.status(), 200);
    let url = p.url("/v1/chat/completions");
    let (c2, url2) = (c.clone(), url.clone());
    let waiting = tokio::spawn(async move { c2.post(url2).json(&chat("a", false)).send().await });
    let snap = p.state.live.load_full();
    until("a request in the queue", || {
        snap.replica("b").unwrap().slots.load() == 2
    })
    .await;
    let full = p.post_chat(&c, &chat("a", false)).await;
    assert_eq!(full.status(), 429);
    let waited = within("the queue wait", waiting).await.unwrap().unwrap();
    assert_eq!(waited.status(), 503);
    let v: Value = waited.json().await.unwrap();
    assert_eq!(v["error"]["code"], "queue_timeout");
    s.release();
    drop(held);
}

/// A body that breaks off after its head is not sent elsewhere, whatever the resend policy:
/// the backend answered, and nothing is retried once its answer is under way; a connection
/// refused is (`falls_back_on_refused_…` above).
#[tokio::test]
async fn a_body_broken_after_the_head_goes_to_no_fallback() {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let primary = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let mut buf = Vec::new();
            if read_request(&mut tcp, &mut buf).await.is_some() {
                let _ = tcp
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{\"cut\":")
                    .await;
            }
        }
    });
    let spare = sim(SimConfig::default()).await;
    let toml = fallbacks("resend_unanswered = true");
    let p = proxy(&toml, &[("primary", primary), ("spare", spare.url())]).await;
    let r = p.post_chat(&client(), &chat("p", false)).await;
    assert_eq!(r.status(), 502);
    assert!(spare.recorder().last().is_none(), "the spare was asked");
    let m = p.metrics().await;
    assert_eq!(
        sample(
            &m,
            r#"switchboard_upstream_errors_total{alias="p",reason="stream_broken"}"#
        ),
        1.0,
        "{m}"
    );
}
