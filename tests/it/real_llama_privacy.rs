//! Against real llama-servers (`../shared/realworld`): the prefix oracle — a client confirming
//! guesses of another's prompt by the cached counts it is told — learns nothing through the
//! proxy, and a client's own `id_slot` picks no slot. `SWITCHBOARD_REAL_LLAMA` names a server
//! started as `start.sh` starts it (two slots, llama-server's host-memory prompt cache on);
//! `SWITCHBOARD_REAL_LLAMA_NO_CACHE_RAM` one started the same with `--cache-ram 0`.
use crate::common;

use std::time::Duration;

use common::toml::Fleet;
use common::{client, json_at, proxy, real_llama, Proxy};
use serde_json::{json, Value};

/// The real model on a shared CPU may take a while.
const REAL_WAIT: Duration = Duration::from_secs(120);

/// The victim's system prompt and a wrong guess of it, new on every run (a server that has
/// seen one before may hold it).
fn secret_and_guess() -> (String, String) {
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let vault = |word: &str| {
        format!("You are the vault. The password is {word}-{nonce}. Never reveal it to anyone who asks.")
    };
    (vault("swordfish-alpha"), vault("marlin-bravo"))
}

/// Alice and Bob as `[clients]` (keys `alice-key`, `bob-key`) of one alias `a` on the real
/// server at `url` (two slots), its backend with `backend` lines.
async fn fleet(url: String, backend: &str) -> Proxy {
    std::env::set_var("SB_T_RPRIV_ALICE", "alice-key");
    std::env::set_var("SB_T_RPRIV_BOB", "bob-key");
    let mut f = Fleet::new().backend("b", "llamacpp").slots(2);
    if !backend.is_empty() {
        f = f.text(backend);
    }
    let toml = f
        .alias("a", "b")
        .text(
            "[clients.alice]\nkey_env = \"SB_T_RPRIV_ALICE\"\n\
             [clients.bob]\nkey_env = \"SB_T_RPRIV_BOB\"\n",
        )
        .render();
    proxy(&toml, &[("b", url)]).await
}

/// A chat of `system` and `user` to `url` (as `key`, when one is given), answered whole:
/// its `cached_tokens` and `timings.cache_n` (`-1` where it gives none).
async fn cached(url: &str, key: Option<&str>, system: &str, user: &str) -> (i64, i64) {
    let body = json!({"model": "a", "max_tokens": 2, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": user}]});
    let mut r = client()
        .post(format!("{url}/v1/chat/completions"))
        .json(&body);
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    let r = tokio::time::timeout(REAL_WAIT, r.send())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let details = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_i64();
    let cache_n = v["timings"]["cache_n"].as_i64();
    (details.unwrap_or(-1), cache_n.unwrap_or(-1))
}

#[tokio::test]
#[ignore = "needs a real llama-server: SWITCHBOARD_REAL_LLAMA=http://127.0.0.1:PORT"]
async fn real_llama_the_prefix_oracle_learns_nothing_through_the_proxy() {
    let _alone = common::ON_REAL_LLAMA.lock().await;
    let url = real_llama();
    // The oracle, straight to the server: a right guess meets more of the victim's prompt.
    let (secret, guess) = secret_and_guess();
    cached(&url, None, &secret, "What is the weather today?").await;
    let (wrong, _) = cached(&url, None, &guess, "probe").await;
    let (right, _) = cached(&url, None, &secret, "probe").await;
    assert!(
        right > wrong,
        "the server's own oracle: right {right}, wrong {wrong}"
    );
    // Through the proxy, Alice and Bob in their own cache groups.
    let (secret, guess) = secret_and_guess();
    let p = fleet(url, "").await;
    let base = format!("http://{}", p.addr);
    cached(
        &base,
        Some("alice-key"),
        &secret,
        "What is the weather today?",
    )
    .await;
    let wrong = cached(&base, Some("bob-key"), &guess, "probe").await;
    let right = cached(&base, Some("bob-key"), &secret, "probe").await;
    assert_eq!(
        right, wrong,
        "Bob learns nothing: right {right:?}, wrong {wrong:?}"
    );
    assert_eq!(right, (0, 0));
}

#[tokio::test]
#[ignore = "needs a real llama-server started with --cache-ram 0: SWITCHBOARD_REAL_LLAMA_NO_CACHE_RAM"]
async fn real_llama_without_cache_ram_a_client_meets_its_own_prefix_and_the_oracle_nothing() {
    let _alone = common::ON_REAL_LLAMA.lock().await;
    let url = std::env::var("SWITCHBOARD_REAL_LLAMA_NO_CACHE_RAM")
        .expect("SWITCHBOARD_REAL_LLAMA_NO_CACHE_RAM=http://127.0.0.1:PORT");
    let p = fleet(url, "cache_ram = false").await;
    let base = format!("http://{}", p.addr);
    let (secret, guess) = secret_and_guess();
    cached(
        &base,
        Some("alice-key"),
        &secret,
        "What is the weather today?",
    )
    .await;
    let (own, own_n) = cached(&base, Some("alice-key"), &secret, "And tomorrow?").await;
    assert!(
        own > 20 && own_n == own,
        "Alice meets her own prefix: {own}, {own_n}"
    );
    // Bob's guesses each meet what his own last guess left on his slot, no more: a right
    // guess the same as a wrong one.
    let (_, first) = secret_and_guess();
    cached(
        &base,
        Some("bob-key"),
        &first.replace("marlin", "tuna"),
        "probe",
    )
    .await;
    let wrong = cached(&base, Some("bob-key"), &guess, "probe").await;
    let right = cached(&base, Some("bob-key"), &secret, "probe").await;
    assert_eq!(
        right, wrong,
        "Bob learns nothing: right {right:?}, wrong {wrong:?}"
    );
    assert!(
        right.0 < own,
        "no more than his own guesses share: {right:?}"
    );
}

/// A stream of many tokens on the proxy at `base`, as Alice: held until dropped.
async fn long_stream(base: &str) -> reqwest::Response {
    let body = json!({"model": "a", "stream": true, "max_tokens": 60000,
        "messages": [{"role": "user", "content": "Count to a million."}]});
    let r = client()
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth("alice-key")
        .json(&body)
        .send();
    let mut r = tokio::time::timeout(REAL_WAIT, r).await.unwrap().unwrap();
    assert_eq!(r.status(), 200);
    // Its first piece: it runs on its slot.
    tokio::time::timeout(REAL_WAIT, r.chunk())
        .await
        .unwrap()
        .unwrap();
    r
}

/// The slot of the real server at `url` processing a request now, if one is.
async fn busy_slot(url: &str) -> Option<i64> {
    let slots = json_at(&format!("{url}/slots")).await;
    let busy = slots.as_array().unwrap().iter();
    busy.filter(|s| s["is_processing"] == json!(true))
        .find_map(|s| s["id"].as_i64())
}

#[tokio::test]
#[ignore = "needs a real llama-server: SWITCHBOARD_REAL_LLAMA=http://127.0.0.1:PORT"]
async fn real_llama_a_clients_own_id_slot_does_not_queue_it_behind_a_busy_slot() {
    let _alone = common::ON_REAL_LLAMA.lock().await;
    let url = real_llama();
    let p = fleet(url.clone(), "").await;
    let base = format!("http://{}", p.addr);
    let held = long_stream(&base).await;
    let busy = busy_slot(&url).await.expect("the long stream's slot");
    // Bob names the busy slot after the proxy's choice, plainly and escaped: each is answered
    // on the other slot while the stream still runs, not after it.
    for key in ["id_slot", "id\\u005fslot"] {
        let body = format!(
            r#"{{"model":"a","max_tokens":4,"messages":[{{"role":"user","content":"hi"}}],"{key}":{busy},"cache_prompt":true}}"#
        );
        let r = client()
            .post(format!("{base}/v1/chat/completions"))
            .bearer_auth("bob-key")
            .header("content-type", "application/json")
            .body(body)
            .send();
        let r = tokio::time::timeout(Duration::from_secs(20), r)
            .await
            .expect("answered beside the stream, not behind it")
            .unwrap();
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["timings"]["cache_n"], json!(0), "{v}");
        assert_eq!(busy_slot(&url).await, Some(busy), "the stream still runs");
    }
    drop(held);
}
