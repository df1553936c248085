//! Token counts of Anthropic Messages and OpenAI Responses requests against the counts real
//! backends reported.
//!
//! `tests/fixtures/recorded_messages.json` and `recorded_responses.json` hold request bodies of
//! the shapes harnesses send (system blocks, tools, tool use and results, thinking and
//! reasoning in history, long conversations) with, for each, what a real llama-server answered
//! on its counting endpoint and in the usage of a real answer, and the count of vLLM's own
//! conversion + chat preprocessing + HF transformers (`scripts/record_api_counts.py`). The
//! local count of the request's chat form, as each backend converts it, must equal them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "fixtures/conversation_gen.rs"]
#[allow(dead_code)]
mod conversation_gen;

use conversation_gen::{files, fixtures};

use serde_json::Value;
use switchboard::flavor::Flavor;
use switchboard::tokens::local::LocalCounter;
use switchboard::tokens::MediaCosts;
use switchboard::wire::{self, Endpoint};

fn recorded(kind: &str) -> Vec<Value> {
    let raw = std::fs::read(fixtures().join(format!("recorded_{kind}.json"))).unwrap();
    let v: Value = serde_json::from_slice(&raw).unwrap();
    v["records"].as_array().unwrap().clone()
}

fn endpoint(kind: &str) -> Endpoint {
    match kind {
        "messages" => Endpoint::messages,
        _ => Endpoint::responses,
    }
}

/// The local count of a recorded body, converted as `flavor` converts it.
fn local(kind: &str, flavor: Flavor, lc: &LocalCounter, body: &Value) -> u32 {
    let adapter = wire::adapter(endpoint(kind));
    let bytes = serde_json::to_vec(body).unwrap();
    let chat = adapter.prompt_for_count(&bytes, flavor).unwrap();
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
            let bound = switchboard::guard::raw_bound(&bytes, &media);
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
