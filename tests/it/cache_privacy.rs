//! Whose prompt cache a request meets: the proxy alone picks a llama.cpp slot and whether
//! its cache is used, a client's own `id_slot` / `cache_prompt` / `cache_salt` never reach
//! the backend, each client's conversations are its own, and a request never reuses a prefix
//! another client's request left (unless the two are declared one cache group).
use crate::common;

use common::toml::Fleet;
use common::{client, gpu_sim, proxy, until, within, Proxy};
use serde_json::{json, Value};
use switchboard_sim::{GpuSim, Sim};
use switchboard_wire::flavor::Flavor;

fn fleet(flavor: &str, slots: u32, clients: &str) -> String {
    Fleet::new()
        .backend("b", flavor)
        .slots(slots)
        .alias("a", "b")
        .text(clients)
        .render()
}

/// A fast simulated GPU: prompts and answers take milliseconds.
fn fast() -> GpuSim {
    GpuSim {
        prefill_tps: 1e6,
        decode_tps: 1e4,
        ..GpuSim::default()
    }
}

/// `n` words of a text that starts with `topic`.
fn words(topic: &str, n: usize) -> String {
    (0..n).map(|i| format!("{topic}{i} ")).collect()
}

/// POST `body` (JSON text, sent as it is) to the chat endpoint with `key`.
async fn post(p: &Proxy, key: Option<&str>, body: String) -> reqwest::Response {
    let mut r = client()
        .post(p.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body);
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    within("an answer", r.send()).await.unwrap()
}

/// The top-level members of a JSON object as written, repeated keys kept.
fn members(body: &[u8]) -> Vec<(String, Value)> {
    let map: Vec<(String, Value)> = {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Vec<(String, Value)>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = m.next_entry::<String, Value>()? {
                    out.push((k, v));
                }
                Ok(out)
            }
        }
        use serde::Deserializer;
        serde_json::Deserializer::from_slice(body)
            .deserialize_map(V)
            .unwrap()
    };
    map
}

/// A long stream holding slot 0 of `s` (a llama.cpp simulator) until it is dropped.
async fn hold_a_slot(p: &Proxy, s: &Sim) -> reqwest::Response {
    let body = json!({"model": "a", "stream": true, "max_tokens": 100_000,
        "messages": [{"role": "user", "content": "hold"}]});
    let held = post(p, None, body.to_string()).await;
    assert_eq!(held.status(), 200);
    until("the holder runs", || !s.recorder().gpu_runs().is_empty()).await;
    held
}

#[tokio::test]
async fn a_clients_own_id_slot_never_overrides_the_proxys_however_spelled() {
    let slow = GpuSim {
        decode_tps: 100.0,
        ..fast()
    };
    let s = gpu_sim(Flavor::Llamacpp, 2, slow).await;
    let p = proxy(&fleet("llamacpp", 2, ""), &[("b", s.url())]).await;
    let held = hold_a_slot(&p, &s).await;
    let busy = s.recorder().gpu_runs()[0].slot;
    // Each asks for the busy slot after the proxy's choice (llama-server keeps the last of a
    // repeated member), one plainly, one with its key escaped, one with its cache members.
    let asks = [
        format!(
            r#"{{"model":"a","max_tokens":2,"messages":[{{"role":"user","content":"x"}}],"id_slot":{busy}}}"#
        ),
        format!(
            r#"{{"model":"a","max_tokens":2,"messages":[{{"role":"user","content":"y"}}],"id\u005fslot":{busy}}}"#
        ),
        format!(
            r#"{{"model":"a","max_tokens":2,"messages":[{{"role":"user","content":"z"}}],"cache_prompt":true,"cache_salt":"s","id_slot":{busy}}}"#
        ),
    ];
    for body in asks {
        let r = post(&p, None, body.clone()).await;
        assert_eq!(r.status(), 200, "{body}");
        let run = s.recorder().gpu_runs().last().cloned().unwrap();
        assert_ne!(run.slot, busy, "ran on the slot the client named: {body}");
        let sent = s.recorder().last().unwrap().body;
        let named: Vec<_> = members(&sent)
            .into_iter()
            .filter(|(k, _)| ["id_slot", "cache_prompt", "cache_salt"].contains(&k.as_str()))
            .collect();
        assert_eq!(
            named,
            vec![("id_slot".to_string(), json!(run.slot))],
            "{body}"
        );
    }
    drop(held);
}

#[tokio::test]
async fn a_clients_cache_salt_never_reaches_vllm() {
    let s = gpu_sim(Flavor::Vllm, 2, fast()).await;
    let p = proxy(&fleet("vllm", 2, ""), &[("b", s.url())]).await;
    let body = r#"{"model":"a","max_tokens":2,"messages":[{"role":"user","content":"x"}],"cache_salt":"someone-elses"}"#;
    assert_eq!(post(&p, None, body.into()).await.status(), 200);
    let sent: Value = serde_json::from_slice(&s.recorder().last().unwrap().body).unwrap();
    assert!(sent.get("cache_salt").is_none(), "{sent}");
}

/// `[clients]` Alice and Bob (keys `alice-key`, `bob-key`), with `extra` lines for each.
fn alice_and_bob(extra: &str) -> String {
    std::env::set_var("SB_T_PRIV_ALICE", "alice-key");
    std::env::set_var("SB_T_PRIV_BOB", "bob-key");
    format!(
        "[clients.alice]\nkey_env = \"SB_T_PRIV_ALICE\"\n{extra}\n\
         [clients.bob]\nkey_env = \"SB_T_PRIV_BOB\"\n{extra}\n"
    )
}

/// A chat of `content` with `x-switchboard-session: session`, as `key`; its answer's status.
async fn in_session(p: &Proxy, key: &str, session: &str, content: &str) -> u16 {
    let body = json!({"model": "a", "max_tokens": 4,
        "messages": [{"role": "user", "content": content}]});
    let r = client()
        .post(p.url("/v1/chat/completions"))
        .bearer_auth(key)
        .header("x-switchboard-session", session)
        .json(&body)
        .send();
    within("an answer", r).await.unwrap().status().as_u16()
}

#[tokio::test]
async fn another_clients_session_id_does_not_join_its_conversation() {
    let s = gpu_sim(Flavor::Llamacpp, 2, fast()).await;
    let p = proxy(&fleet("llamacpp", 2, &alice_and_bob("")), &[("b", s.url())]).await;
    let secret = words("alice-secret", 500);
    assert_eq!(in_session(&p, "alice-key", "s1", &secret).await, 200);
    // Bob sends Alice's session id and her text: not her conversation, not her slot.
    assert_eq!(in_session(&p, "bob-key", "s1", &secret).await, 200);
    let runs = s.recorder().gpu_runs();
    assert_eq!(runs.len(), 2);
    assert_ne!(runs[1].slot, runs[0].slot, "{runs:?}");
    assert_eq!(runs[1].cached, 0, "{runs:?}");
}

/// A fleet of one `flavor` backend `b` with `slots`, its `backend` lines, and Alice and Bob
/// with `client` lines each.
fn isolated(flavor: &str, slots: u32, backend: &str, client: &str) -> String {
    let mut f = Fleet::new().backend("b", flavor).slots(slots);
    if !backend.is_empty() {
        f = f.text(backend);
    }
    f.alias("a", "b").text(&alice_and_bob(client)).render()
}

/// A chat of `content` as `key` (its own conversation); the simulator's run of it.
async fn run(p: &Proxy, s: &Sim, key: &str, content: &str) -> switchboard_sim::GpuRun {
    let body = json!({"model": "a", "max_tokens": 4,
        "messages": [{"role": "user", "content": content}]});
    let r = client()
        .post(p.url("/v1/chat/completions"))
        .bearer_auth(key)
        .json(&body)
        .send();
    assert_eq!(within("an answer", r).await.unwrap().status(), 200);
    s.recorder().gpu_runs().last().cloned().unwrap()
}

/// The body the simulator got last, as JSON.
fn sent(s: &Sim) -> Value {
    serde_json::from_slice(&s.recorder().last().unwrap().body).unwrap()
}

#[tokio::test]
async fn a_request_never_meets_a_prefix_another_clients_request_left_on_llamacpp() {
    let s = gpu_sim(Flavor::Llamacpp, 1, fast()).await;
    let p = proxy(&isolated("llamacpp", 1, "", ""), &[("b", s.url())]).await;
    let secret = words("the-password-is-swordfish", 400);
    run(&p, &s, "alice-key", &secret).await;
    // Bob guesses Alice's prompt and more: he meets none of it.
    let probe = run(&p, &s, "bob-key", &format!("{secret} and more")).await;
    assert_eq!(probe.cached, 0, "{probe:?}");
    assert_eq!(sent(&s)["cache_prompt"], json!(false));
    assert_eq!(sent(&s)["id_slot"], json!(probe.slot));
    // llama-server keeps prompts in host memory across slots by default (`cache_ram`): no
    // request meets a cached prefix, Alice's own next turn neither.
    let again = run(&p, &s, "alice-key", &format!("{secret} again")).await;
    assert_eq!(again.cached, 0, "{again:?}");
}

#[tokio::test]
async fn without_cache_ram_a_client_meets_its_own_slots_prefix_and_no_other() {
    let s = gpu_sim(Flavor::Llamacpp, 1, fast()).await;
    let fleet = isolated("llamacpp", 1, "cache_ram = false", "");
    let p = proxy(&fleet, &[("b", s.url())]).await;
    let secret = words("alice-prompt", 400);
    run(&p, &s, "alice-key", &secret).await;
    let own = run(&p, &s, "alice-key", &format!("{secret} next")).await;
    assert!(own.cached >= 400, "her own slot's prefix: {own:?}");
    assert!(sent(&s).get("cache_prompt").is_none(), "{}", sent(&s));
    let probe = run(&p, &s, "bob-key", &format!("{secret} guess")).await;
    assert_eq!(probe.cached, 0, "{probe:?}");
    assert_eq!(sent(&s)["cache_prompt"], json!(false));
    // The slot now holds Bob's prompt: Alice's next request there is cold too.
    let after = run(&p, &s, "alice-key", &format!("{secret} later")).await;
    assert_eq!(after.cached, 0, "{after:?}");
}

#[tokio::test]
async fn a_request_prefers_a_slot_its_own_cache_group_left() {
    let s = gpu_sim(Flavor::Llamacpp, 2, fast()).await;
    let fleet = isolated("llamacpp", 2, "cache_ram = false", "");
    let p = proxy(&fleet, &[("b", s.url())]).await;
    let alice = run(&p, &s, "alice-key", &words("alice-system", 300)).await;
    let bob = run(&p, &s, "bob-key", &words("bob-system", 300)).await;
    assert_ne!(
        alice.slot, bob.slot,
        "a slot nobody used before, not Alice's"
    );
    // A new conversation of Alice's with the same system prompt: on her slot, warm.
    let next = run(
        &p,
        &s,
        "alice-key",
        &format!("{} new", words("alice-system", 300)),
    )
    .await;
    assert_eq!(next.slot, alice.slot);
    assert!(next.cached >= 300, "{next:?}");
}

#[tokio::test]
async fn clients_of_one_cache_group_share_their_prefixes() {
    let s = gpu_sim(Flavor::Llamacpp, 1, fast()).await;
    let fleet = isolated(
        "llamacpp",
        1,
        "cache_ram = false",
        "cache_group = \"swarm\"",
    );
    let p = proxy(&fleet, &[("b", s.url())]).await;
    let system = words("the-swarms-system-prompt", 400);
    run(&p, &s, "alice-key", &format!("{system} task one")).await;
    let bob = run(&p, &s, "bob-key", &format!("{system} task two")).await;
    assert!(bob.cached >= 400, "{bob:?}");
}

#[tokio::test]
async fn each_cache_group_has_its_own_salt_on_vllm() {
    let s = gpu_sim(Flavor::Vllm, 2, fast()).await;
    let p = proxy(&isolated("vllm", 2, "", ""), &[("b", s.url())]).await;
    let secret = words("alice-on-vllm", 400);
    run(&p, &s, "alice-key", &secret).await;
    let alice_salt = sent(&s)["cache_salt"].clone();
    let own = run(&p, &s, "alice-key", &format!("{secret} next")).await;
    assert!(own.cached >= 384, "{own:?}");
    let probe = run(&p, &s, "bob-key", &format!("{secret} guess")).await;
    assert_eq!(probe.cached, 0, "{probe:?}");
    assert!(alice_salt.is_string());
    assert_ne!(sent(&s)["cache_salt"], alice_salt);
}

#[tokio::test]
async fn an_isolated_llamacpp_messages_request_is_translated_to_run_on_its_slot() {
    let s = gpu_sim(Flavor::Llamacpp, 1, fast()).await;
    let p = proxy(&isolated("llamacpp", 1, "", ""), &[("b", s.url())]).await;
    let body = json!({"model": "a", "max_tokens": 4,
        "messages": [{"role": "user", "content": "hello"}]});
    let r = client()
        .post(p.url("/v1/messages"))
        .header("x-api-key", "bob-key")
        .header("anthropic-version", "2023-06-01")
        .json(&body)
        .send();
    let r = within("an answer", r).await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "message", "{v}");
    assert_eq!(s.recorder().last().unwrap().path, "/v1/chat/completions");
    assert_eq!(sent(&s)["cache_prompt"], json!(false));
    assert_eq!(s.recorder().gpu_runs()[0].id_slot, Some(0));
}

#[tokio::test]
async fn a_request_for_several_answers_uses_no_cache_and_leaves_no_slot_known() {
    let s = gpu_sim(Flavor::Llamacpp, 2, fast()).await;
    let fleet = isolated("llamacpp", 2, "cache_ram = false", "");
    let p = proxy(&fleet, &[("b", s.url())]).await;
    let system = words("alice-system", 300);
    run(&p, &s, "alice-key", &system).await;
    // llama-server runs the second answer on another idle slot, which the proxy cannot know.
    let body = json!({"model": "a", "max_tokens": 4, "n": 2,
        "messages": [{"role": "user", "content": format!("{system} twice")}]});
    let r = client()
        .post(p.url("/v1/chat/completions"))
        .bearer_auth("bob-key")
        .json(&body)
        .send();
    assert_eq!(within("an answer", r).await.unwrap().status(), 200);
    assert_eq!(sent(&s)["cache_prompt"], json!(false));
    // Every slot's group is unknown since: Alice's next request there is cold too.
    let next = run(&p, &s, "alice-key", &format!("{system} again")).await;
    assert_eq!(next.cached, 0, "{next:?}");
    assert_eq!(sent(&s)["cache_prompt"], json!(false));
}

#[tokio::test]
async fn each_key_of_api_keys_env_is_a_cache_group_of_its_own() {
    std::env::set_var("SB_T_PRIV_KEYS", "key-one,key-two");
    let s = gpu_sim(Flavor::Llamacpp, 1, fast()).await;
    let fleet = Fleet::new()
        .server("api_keys_env = \"SB_T_PRIV_KEYS\"")
        .backend("b", "llamacpp")
        .slots(1)
        .text("cache_ram = false")
        .alias("a", "b")
        .render();
    let p = proxy(&fleet, &[("b", s.url())]).await;
    let secret = words("key-ones-prompt", 400);
    run(&p, &s, "key-one", &secret).await;
    let own = run(&p, &s, "key-one", &format!("{secret} next")).await;
    assert!(own.cached >= 400, "{own:?}");
    let probe = run(&p, &s, "key-two", &format!("{secret} guess")).await;
    assert_eq!(probe.cached, 0, "{probe:?}");
}

#[tokio::test]
async fn another_keys_session_id_does_not_join_its_conversation() {
    std::env::set_var("SB_T_PRIV_SESSION_KEYS", "key-three,key-four");
    let s = gpu_sim(Flavor::Llamacpp, 2, fast()).await;
    let fleet = Fleet::new()
        .server("api_keys_env = \"SB_T_PRIV_SESSION_KEYS\"")
        .backend("b", "llamacpp")
        .slots(2)
        .alias("a", "b")
        .render();
    let p = proxy(&fleet, &[("b", s.url())]).await;
    let secret = words("key-threes-secret", 500);
    assert_eq!(in_session(&p, "key-three", "s1", &secret).await, 200);
    assert_eq!(in_session(&p, "key-four", "s1", &secret).await, 200);
    let runs = s.recorder().gpu_runs();
    assert_ne!(runs[1].slot, runs[0].slot, "{runs:?}");
}
