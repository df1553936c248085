//! Several Switchboard processes in front of the same replicas, as pods behind one Service:
//! each conversation gets the same replica from every one of them, and a replica the others
//! filled is seen full from the backend's own load report.

use crate::common;
use common::*;
use http::{HeaderMap, HeaderValue};
use serde_json::{json, Value};
use switchboard_proxy::fleet::balance::order;
use switchboard_proxy::fleet::conversation::{conversation_of, HARNESS_HEADERS, SESSION_HEADER};
use switchboard_sim::{Sim, SimConfig};
use switchboard_wire::flavor::Flavor;

/// Turn `n` of conversation `conv`: its leading messages the same every turn.
fn turn(conv: usize, n: usize) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": format!("task {conv} of the fleet")}),
    ];
    for i in 1..n {
        messages.push(json!({"role": "assistant", "content": format!("step {i}")}));
        messages.push(json!({"role": "user", "content": format!("go on {i}")}));
    }
    json!({"model": "m", "messages": messages, "max_tokens": 2})
}

/// Three replicas of two weights; `order` is how the alias lists them.
fn three_replicas(order: &[&str]) -> String {
    common::toml::Fleet::new()
        .backend("a", "llamacpp")
        .slots(2)
        .backend("b", "llamacpp")
        .slots(2)
        .backend("c", "llamacpp")
        .slots(4)
        .replicas("m", order)
        .render()
}

/// Three simulated backends, and their names and URLs as the configs of
/// [`three_replicas`] name them.
async fn three_sims() -> ([Sim; 3], [(&'static str, String); 3]) {
    let sims = [
        sim(SimConfig::default()).await,
        sim(SimConfig::default()).await,
        sim(SimConfig::default()).await,
    ];
    let urls = [
        ("a", sims[0].url()),
        ("b", sims[1].url()),
        ("c", sims[2].url()),
    ];
    (sims, urls)
}

#[tokio::test]
async fn two_processes_send_each_conversation_to_the_same_replica() {
    let (sims, urls) = three_sims().await;
    // Two processes, each with its own state; the second lists the replicas in another order.
    let procs = [
        proxy(&three_replicas(&["a", "b", "c"]), &urls).await,
        proxy(&three_replicas(&["c", "a", "b"]), &urls).await,
    ];
    let c = client();
    const CONVERSATIONS: usize = 12;
    const TURNS: usize = 4;
    for n in 1..=TURNS {
        for conv in 0..CONVERSATIONS {
            // The processes take turns, as a Service spreads requests.
            let p = &procs[(conv + n) % 2];
            assert_eq!(p.post_chat(&c, &turn(conv, n)).await.status(), 200);
        }
    }
    let mut used = [0; 3];
    for conv in 0..CONVERSATIONS {
        let marker = format!("task {conv} of the fleet");
        let on: Vec<usize> = sims.iter().map(|s| chats_with(s, &marker)).collect();
        let at = on.iter().position(|&k| k == TURNS);
        assert!(at.is_some(), "conversation {conv} split: {on:?}");
        used[at.unwrap()] += 1;
    }
    assert!(
        used.iter().filter(|&&k| k > 0).count() >= 2,
        "one replica took every conversation: {used:?}"
    );
    // Each process saw every conversation's turns go where it had sent the one before.
    for p in &procs {
        let m = p.metrics().await;
        assert_eq!(
            sample(
                &m,
                r#"switchboard_affinity_total{alias="m",result="moved"}"#
            ),
            0.0
        );
    }
}

/// The id a harness sends of its own accord (Claude Code's and Codex CLI's headers, a body's
/// `prompt_cache_key`) keeps a conversation on one replica though its messages differ from
/// request to request (by its leading messages alone, eight such requests would spread over
/// the three replicas).
#[tokio::test]
async fn each_harness_conversation_id_keeps_its_requests_on_one_replica() {
    let (sims, urls) = three_sims().await;
    let p = proxy(&three_replicas(&["a", "b", "c"]), &urls).await;
    let c = client();
    let sources = HARNESS_HEADERS
        .iter()
        .map(|h| Some(h.clone()))
        .chain([None]);
    for (i, header) in sources.enumerate() {
        let marker = format!("source {i}");
        for n in 0..8 {
            let text = format!("{marker}, task {n}");
            let mut body = json!({"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": text}]});
            let mut req = c.post(p.url("/v1/chat/completions"));
            match &header {
                Some(h) => req = req.header(h, format!("conversation-{i}")),
                None => body["prompt_cache_key"] = json!(format!("conversation-{i}")),
            }
            assert_eq!(req.json(&body).send().await.unwrap().status(), 200);
        }
        let on: Vec<usize> = sims.iter().map(|s| chats_with(s, &marker)).collect();
        assert!(on.contains(&8), "{header:?}: the conversation split {on:?}");
    }
}

/// Replicas `a` and `b` of `flavor` with `slots` each, under the `[server]` lines `server`.
fn two_replicas(server: &str, flavor: &str, slots: u32) -> String {
    common::toml::Fleet::new()
        .server(server)
        .backend("a", flavor)
        .slots(slots)
        .backend("b", flavor)
        .slots(slots)
        .replicas("m", &["a", "b"])
        .render()
}

/// Two replicas of two slots, their load read every 10 s.
fn read_replicas(flavor: &str) -> String {
    two_replicas("load_interval_ms = 10000", flavor, 2)
}

/// A stream sent straight to `s` (as another process would), held by its gate after its first
/// event.
async fn hold(c: &reqwest::Client, s: &Sim) -> reqwest::Response {
    let body =
        json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "held"}]});
    let r = c
        .post(format!("{}/v1/chat/completions", s.url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r
}

/// A session id whose conversation has replica `a` first of `a` and `b`.
fn session_first_on_a() -> HeaderValue {
    sessions_first_on_a().next().unwrap()
}

/// The session ids whose conversations have replica `a` first of `a` and `b`.
fn sessions_first_on_a() -> impl Iterator<Item = HeaderValue> {
    (0..)
        .map(|i| HeaderValue::try_from(format!("s{i}")).unwrap())
        .filter(|s| {
            let mut h = HeaderMap::new();
            h.insert(SESSION_HEADER, s.clone());
            let key = conversation_of("m", &h, b"{}").unwrap().key;
            order(key, &[("a", 2), ("b", 2)])[0] == 0
        })
}

/// Replica `a` of `flavor` is full with requests another process sent it (made directly to
/// it here): once its load is read, both processes send a conversation whose first replica it
/// is to `b`, though neither has a request of its own on `a`; once it reports free again,
/// back to `a`.
async fn a_replica_full_by_its_report_is_passed_over(flavor: Flavor) {
    let gated = SimConfig {
        flavor,
        gate: true,
        slots: 2,
        ..SimConfig::default()
    };
    let a = sim(gated).await;
    let b = sim(SimConfig {
        flavor,
        ..SimConfig::default()
    })
    .await;
    let config = read_replicas(flavor.as_str());
    let urls = [("a", a.url()), ("b", b.url())];
    let procs = [proxy(&config, &urls).await, proxy(&config, &urls).await];
    let c = client();
    let held = [hold(&c, &a).await, hold(&c, &a).await];
    until("both of a's slots busy", || a.recorder().running() == 2).await;
    for p in &procs {
        within(
            "the load read",
            switchboard_proxy::live::probes::read_loads(&p.state),
        )
        .await;
    }
    let session = session_first_on_a();
    let ask = |p: &Proxy, n: usize| {
        let body = json!({"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": format!("turn {n}")}]});
        c.post(p.url("/v1/chat/completions"))
            .header(SESSION_HEADER, session.clone())
            .json(&body)
            .send()
    };
    for (n, p) in procs.iter().enumerate() {
        let r = within("the answer", ask(p, n)).await.unwrap();
        assert_eq!(r.status(), 200);
        // Its own count of a's slots says free: only the backend's report says full.
        assert_eq!(p.state.live.load().replica("a").unwrap().slots.free(), 2);
    }
    assert_eq!((chats_with(&a, "turn"), chats_with(&b, "turn")), (0, 2));

    a.release();
    drop(held);
    until("a's slots free", || a.recorder().running() == 0).await;
    for p in &procs {
        within(
            "the load read",
            switchboard_proxy::live::probes::read_loads(&p.state),
        )
        .await;
    }
    for (n, p) in procs.iter().enumerate() {
        let r = within("the answer", ask(p, n + 2)).await.unwrap();
        assert_eq!(r.status(), 200);
    }
    assert_eq!((chats_with(&a, "turn"), chats_with(&b, "turn")), (2, 2));
}

#[tokio::test]
async fn a_llamacpp_replica_busy_by_its_slots_is_passed_over_by_every_process() {
    a_replica_full_by_its_report_is_passed_over(Flavor::Llamacpp).await;
}

#[tokio::test]
async fn a_vllm_replica_busy_by_its_metrics_is_passed_over_by_every_process() {
    a_replica_full_by_its_report_is_passed_over(Flavor::Vllm).await;
}

#[tokio::test]
async fn a_sglang_replica_busy_by_its_metrics_is_passed_over_by_every_process() {
    a_replica_full_by_its_report_is_passed_over(Flavor::Sglang).await;
}

/// A reading that still counts other processes' requests that have ended (a conversation's own
/// last turn, sent by the other process) does not move the conversation: the replica that
/// looks full by it is read again first, and found free.
#[tokio::test]
async fn a_replica_full_only_by_a_stale_reading_is_read_again_before_a_conversation_moves() {
    let a = sim(SimConfig {
        gate: true,
        slots: 2,
        ..SimConfig::default()
    })
    .await;
    let b = sim(SimConfig::default()).await;
    let config = read_replicas("llamacpp");
    let p = proxy(&config, &[("a", a.url()), ("b", b.url())]).await;
    let c = client();
    let held = [hold(&c, &a).await, hold(&c, &a).await];
    until("both of a's slots busy", || a.recorder().running() == 2).await;
    within(
        "the load read",
        switchboard_proxy::live::probes::read_loads(&p.state),
    )
    .await;
    a.release();
    drop(held);
    until("a's slots free", || a.recorder().running() == 0).await;
    // The reading (interval 10 s) still says a is full.
    let body =
        json!({"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "turn"}]});
    let r = c
        .post(p.url("/v1/chat/completions"))
        .header(SESSION_HEADER, session_first_on_a())
        .json(&body)
        .send();
    assert_eq!(within("the answer", r).await.unwrap().status(), 200);
    assert_eq!((chats_with(&a, "turn"), chats_with(&b, "turn")), (1, 0));
}

/// Two replicas of one slot each, counted by this process alone, with `spill_wait_ms`.
fn one_slot_each(spill_wait_ms: u64) -> String {
    let server = format!("load_interval_ms = 0\nspill_wait_ms = {spill_wait_ms}");
    two_replicas(&server, "llamacpp", 1)
}

/// A turn of the conversation `session` names: its first (one user message) or a later one
/// (the model's answer and a second user message after it), marked by `marker`.
fn session_turn(
    c: &reqwest::Client,
    p: &Proxy,
    session: &HeaderValue,
    later: bool,
    stream: bool,
    marker: &str,
) -> reqwest::RequestBuilder {
    let mut messages = vec![json!({"role": "user", "content": format!("start {marker}")})];
    if later {
        messages.push(json!({"role": "assistant", "content": "done"}));
        messages.push(json!({"role": "user", "content": format!("next {marker}")}));
    }
    let body = json!({"model": "m", "max_tokens": 2, "stream": stream, "messages": messages});
    c.post(p.url("/v1/chat/completions"))
        .header(SESSION_HEADER, session.clone())
        .json(&body)
}

/// Replica `a` (gated) and `b` behind one process with `spill_wait_ms`, and a stream holding
/// `a`'s one slot: of another conversation first on `a` too, or of `session`'s own.
struct HeldOnA {
    a: Sim,
    b: Sim,
    p: Proxy,
    c: reqwest::Client,
    session: HeaderValue,
    held: Option<reqwest::Response>,
}

impl HeldOnA {
    /// `a` held by another conversation than `session`'s.
    async fn start(spill_wait_ms: u64) -> HeldOnA {
        HeldOnA::held_by(spill_wait_ms, false).await
    }

    /// `a` held by `session`'s own conversation when `own`, else by another one.
    async fn held_by(spill_wait_ms: u64, own: bool) -> HeldOnA {
        let a = sim(SimConfig {
            gate: true,
            ..SimConfig::default()
        })
        .await;
        let b = sim(SimConfig::default()).await;
        let p = proxy(
            &one_slot_each(spill_wait_ms),
            &[("a", a.url()), ("b", b.url())],
        )
        .await;
        let c = client();
        let mut sessions = sessions_first_on_a();
        let session = sessions.next().unwrap();
        let holder = if own {
            session.clone()
        } else {
            sessions.next().unwrap()
        };
        let turn = session_turn(&c, &p, &holder, false, true, "held");
        let held = within("the held stream", turn.send()).await.unwrap();
        assert_eq!(held.status(), 200);
        until("a's slot busy", || a.recorder().running() == 1).await;
        HeldOnA {
            a,
            b,
            p,
            c,
            session,
            held: Some(held),
        }
    }

    fn turn(&self, later: bool, marker: &str) -> reqwest::RequestBuilder {
        session_turn(&self.c, &self.p, &self.session, later, false, marker)
    }

    /// Chats holding `marker` that `a` and `b` received.
    fn on(&self, marker: &str) -> (usize, usize) {
        (chats_with(&self.a, marker), chats_with(&self.b, marker))
    }

    /// `a`'s gate opened and the held stream dropped: its slot comes free.
    fn release(&mut self) {
        self.a.release();
        self.held.take();
    }
}

/// A later turn whose first replica is full by this process's own request (of another
/// conversation) waits for it there,
/// where its prefix is cached, rather than moving to the free replica; a first turn (nothing
/// cached anywhere yet) takes the free one at once.
#[tokio::test]
async fn a_later_turn_waits_for_its_first_replica_rather_than_moving() {
    let mut h = HeldOnA::start(60_000).await;
    let later = tokio::spawn(h.turn(true, "later").send());
    let waiting = || h.p.state.live.load().replica("a").unwrap().slots.waiting();
    until("the later turn waiting for a", || waiting() == 1).await;
    let first = within("a first turn", h.turn(false, "first").send()).await;
    assert_eq!(first.unwrap().status(), 200);
    assert_eq!(h.on("first"), (0, 1));
    assert_eq!(h.on("later"), (0, 0));

    h.release();
    let later = within("the later turn", later).await.unwrap().unwrap();
    assert_eq!(later.status(), 200);
    assert_eq!(h.on("later"), (1, 0));
}

/// Once its wait runs out (or with no wait configured), a later turn goes to the next replica
/// of its order.
#[tokio::test]
async fn a_later_turn_moves_once_its_wait_for_the_first_replica_runs_out() {
    for wait in [0, 50] {
        let mut h = HeldOnA::start(wait).await;
        let later = within("the later turn", h.turn(true, "later").send()).await;
        assert_eq!(later.unwrap().status(), 200, "spill_wait_ms = {wait}");
        assert_eq!(h.on("later"), (0, 1), "spill_wait_ms = {wait}");
        h.release();
    }
}

/// A later turn does not wait for a replica its own conversation holds mostly (a flood of one
/// session would wait for none but itself while the other replica idles): it spills at once.
#[tokio::test]
async fn a_later_turn_does_not_wait_for_a_replica_its_own_conversation_holds() {
    let mut h = HeldOnA::held_by(60_000, true).await;
    let later = within("the later turn", h.turn(true, "later").send()).await;
    assert_eq!(later.unwrap().status(), 200);
    assert_eq!(h.on("later"), (0, 1));
    h.release();
}

/// Two user messages are no later turn: nothing of the model's is cached anywhere yet, so it
/// takes the free replica at once rather than waiting for its first.
#[tokio::test]
async fn two_user_messages_are_not_a_later_turn() {
    let mut h = HeldOnA::start(60_000).await;
    let body = json!({"model": "m", "max_tokens": 2, "messages": [
        {"role": "user", "content": "users"},
        {"role": "user", "content": "users again"},
    ]});
    let r =
        h.c.post(h.p.url("/v1/chat/completions"))
            .header(SESSION_HEADER, h.session.clone())
            .json(&body)
            .send();
    let r = within("the second user message", r).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(h.on("users"), (0, 1));
    h.release();
}
