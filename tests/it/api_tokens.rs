//! Token counts of Anthropic Messages and OpenAI Responses requests against the counts real
//! backends reported.
//!
//! `tests/fixtures/recorded_messages.json` and `recorded_responses.json` hold request bodies of
//! the shapes harnesses send (system blocks, tools, tool use and results, thinking and
//! reasoning in history, long conversations) with, for each, what a real llama-server answered
//! on its counting endpoint and in the usage of a real answer, and the count of vLLM's own
//! conversion + chat preprocessing + HF transformers (`scripts/record_api_counts.py`). The
//! local count of the request's chat form, as each backend converts it, must equal them.
use crate::common;

use crate::conversation_gen;

use conversation_gen::{files, fixtures};

use serde_json::Value;
use switchboard_proxy::config::MediaCosts;
use switchboard_proxy::tokens::local::LocalCounter;
use switchboard_wire::flavor::Flavor;
use switchboard_wire::{self as wire, Converter, Endpoint};

fn recorded(kind: &str) -> Vec<Value> {
    let raw = std::fs::read(fixtures().join(format!("recorded_{kind}.json"))).unwrap();
    let v: Value = serde_json::from_slice(&raw).unwrap();
    v["records"].as_array().unwrap().clone()
}

fn endpoint(kind: &str) -> Endpoint {
    match kind {
        "messages" => Endpoint::from_path("/v1/messages"),
        _ => Endpoint::from_path("/v1/responses"),
    }
}

/// The local count of a recorded body, converted as `flavor` converts it.
fn local(kind: &str, flavor: Flavor, lc: &LocalCounter, body: &Value) -> u32 {
    let adapter = wire::adapter(endpoint(kind));
    let bytes = serde_json::to_vec(body).unwrap();
    let chat = adapter.to_chat(&bytes, Converter::native(flavor)).unwrap();
    lc.count(&chat, &MediaCosts::default()).unwrap()
}

/// Every record with a count under `key` equals the local count; returns how many there were.
fn check(kind: &str, flavor: Flavor, key: &str) -> usize {
    let lc = LocalCounter::load(&files(), flavor).unwrap();
    let mut checked = 0;
    let mut mismatches = Vec::new();
    for rec in recorded(kind) {
        let Some(want) = rec[key].as_u64() else {
            continue;
        };
        checked += 1;
        let got = local(kind, flavor, &lc, &rec["body"]);
        if u64::from(got) != want {
            mismatches.push(format!("{}: local {got}, {key} {want}", rec["name"]));
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    checked
}

#[test]
fn recorded_llamacpp_messages_counts_match_local() {
    assert!(check("messages", Flavor::Llamacpp, "llamacpp_count") >= 30);
    assert!(check("messages", Flavor::Llamacpp, "llamacpp_usage") >= 30);
}

#[test]
fn recorded_llamacpp_responses_counts_match_local() {
    assert!(check("responses", Flavor::Llamacpp, "llamacpp_count") >= 20);
    assert!(check("responses", Flavor::Llamacpp, "llamacpp_usage") >= 20);
}

#[test]
fn recorded_vllm_messages_counts_match_local() {
    assert!(check("messages", Flavor::Vllm, "vllm") >= 30);
}

#[test]
fn recorded_vllm_responses_counts_match_local() {
    assert!(check("responses", Flavor::Vllm, "vllm") >= 20);
}

/// The byte bound of the guard is never below a recorded count (what the backend counted).
#[test]
fn the_raw_bound_is_never_below_the_recorded_counts() {
    let media = MediaCosts::default();
    for kind in ["messages", "responses"] {
        for rec in recorded(kind) {
            let bytes = serde_json::to_vec(&rec["body"]).unwrap();
            let bound = switchboard_proxy::guard::raw_bound(&bytes, &media);
            for key in ["llamacpp_count", "llamacpp_usage", "vllm"] {
                if let Some(n) = rec[key].as_u64() {
                    assert!(
                        bound >= n,
                        "{kind} {}: bound {bound} < {key} {n}",
                        rec["name"]
                    );
                }
            }
        }
    }
}

/// The live llama-server of the ignored tests (run them with `-- --ignored`).
fn llama_url() -> String {
    std::env::var("SWITCHBOARD_LLAMA_URL").unwrap_or_else(|_| "http://127.0.0.1:18080".into())
}

async fn post_json(url: &str, body: &Value) -> (u16, Value) {
    let r = common::client().post(url).json(body).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Opt-in: the live llama-server's counting endpoints equal the local count of every recorded
/// request (the recordings re-checked against the server as it runs now).
#[tokio::test]
#[ignore = "needs a live llama-server: SWITCHBOARD_LLAMA_URL=http://127.0.0.1:18080 cargo test --test it api_tokens:: -- --ignored"]
async fn live_llama_server_counts_match_local() {
    let lc = LocalCounter::load(&files(), Flavor::Llamacpp).unwrap();
    let base = llama_url();
    let mut checked = 0;
    for (kind, path) in [
        ("messages", "/v1/messages/count_tokens"),
        ("responses", "/v1/responses/input_tokens"),
    ] {
        for rec in recorded(kind) {
            if rec["llamacpp_count"].is_null() {
                continue;
            }
            let (status, v) = post_json(&format!("{base}{path}"), &rec["body"]).await;
            assert_eq!(status, 200, "{}: {v}", rec["name"]);
            let local = local(kind, Flavor::Llamacpp, &lc, &rec["body"]);
            assert_eq!(v["input_tokens"], local, "{kind} {}", rec["name"]);
            checked += 1;
        }
    }
    assert!(checked >= 50, "{checked}");
}

/// A prompt of about 5000 tokens: over the live server's 4096-token slot.
fn long_prompt() -> String {
    "word ".repeat(5000)
}

/// Opt-in: through the proxy, the live server's own over-context error on each endpoint reaches
/// the client in that API's words, and the guard answers the same before sending.
#[tokio::test]
#[ignore = "needs a live llama-server: SWITCHBOARD_LLAMA_URL=http://127.0.0.1:18080 cargo test --test it api_tokens:: -- --ignored"]
async fn live_llama_server_context_errors_reach_clients_in_their_apis_words() {
    let toml = |extra: &str| {
        format!(
            "[backends.b]\nurl = \"{}\"\nflavor = \"llamacpp\"\n[aliases.a]\nbackend = \"b\"\nupstream_model = \"tiny-qwen3\"\n{extra}\n",
            llama_url()
        )
    };
    let messages = serde_json::json!({"model": "a", "max_tokens": 4,
        "messages": [{"role": "user", "content": long_prompt()}]});
    let responses =
        serde_json::json!({"model": "a", "max_output_tokens": 4, "input": long_prompt()});
    // The server's n_prompt_tokens, as its counting endpoint gives it.
    let mut raw = messages.clone();
    raw["model"] = "tiny-qwen3".into();
    let (_, n) = post_json(&format!("{}/v1/messages/count_tokens", llama_url()), &raw).await;
    let n = n["input_tokens"].as_u64().unwrap();
    for (extra, window) in [("", 4096), ("context_window = 64\ncount = \"backend\"", 64)] {
        let p = common::proxy(&toml(extra), &[]).await;
        let (status, v) = post_json(&p.url("/v1/messages"), &messages).await;
        assert_eq!(status, 400, "{v}");
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(
            v["error"]["message"],
            format!("prompt is too long: {n} tokens > {window} maximum")
        );
        let mut stream = messages.clone();
        stream["stream"] = true.into();
        let (status, v) = post_json(&p.url("/v1/messages"), &stream).await;
        assert_eq!(status, 400, "{v}");
        assert_eq!(v["type"], "error");
        let (status, v) = post_json(&p.url("/v1/responses"), &responses).await;
        assert_eq!(status, 400, "{v}");
        assert_eq!(v["error"]["code"], "context_length_exceeded");
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("maximum context length is {window} tokens")));
    }
}
