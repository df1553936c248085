//! Token counting and the context guard against counts real backends reported.
//!
//! `tests/fixtures/recorded_counts.json` holds, for every conversation of
//! `tests/fixtures/conversations.json`, the `usage.prompt_tokens` of a real llama-server and
//! the count of vLLM's preprocessing + HF transformers (`scripts/record_counts.py`). The local
//! counter must equal them exactly. Tests that need a live llama-server run only when
//! `SWITCHBOARD_LLAMA_URL` is set (e.g. `http://127.0.0.1:18080`); one of them also compares
//! 200 random conversations. The same random conversations are checked against the vLLM
//! reference with `TOKENS_DUMP=file cargo test --test it tokens::dump_random -- --ignored` and
//! `scripts/check_random_vllm.py`.
use crate::conversation_gen;

use conversation_gen::{files, fixtures};

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use switchboard_proxy::config::{CountKind, MediaCosts, TokenizerFiles};
use switchboard_proxy::guard::{self, GuardSpec, Verdict};
use switchboard_proxy::tokens::bound::PromptView;
use switchboard_proxy::tokens::local::LocalCounter;
use switchboard_proxy::tokens::{Counter, Method};
use switchboard_wire::flavor::Flavor;

fn counter(flavor: Flavor) -> &'static Arc<Counter> {
    static LLAMA: OnceLock<Arc<Counter>> = OnceLock::new();
    static VLLM: OnceLock<Arc<Counter>> = OnceLock::new();
    static SGLANG: OnceLock<Arc<Counter>> = OnceLock::new();
    let cell = match flavor {
        Flavor::Llamacpp => &LLAMA,
        Flavor::Sglang => &SGLANG,
        _ => &VLLM,
    };
    cell.get_or_init(|| {
        Arc::new(
            Counter::new(
                Some(CountKind::Local),
                Some(&files()),
                flavor,
                "http://127.0.0.1:1",
                "m",
            )
            .unwrap(),
        )
    })
}

fn local(flavor: Flavor) -> &'static LocalCounter {
    counter(flavor).local().unwrap()
}

/// (name, chat body) of every recorded conversation, the long one generated.
fn conversations() -> &'static Vec<(String, Value)> {
    static CONVS: OnceLock<Vec<(String, Value)>> = OnceLock::new();
    CONVS.get_or_init(|| {
        let raw = std::fs::read(fixtures().join("conversations.json")).unwrap();
        let list: Vec<Value> = serde_json::from_slice(&raw).unwrap();
        list.into_iter()
            .map(|c| {
                let name = c["name"].as_str().unwrap().to_string();
                let body = match c.get("body") {
                    Some(b) => b.clone(),
                    None => {
                        conversation_gen::body(&conversation_gen::Spec::from_json(&c["generate"]))
                    }
                };
                (name, body)
            })
            .collect()
    })
}

fn recorded() -> Vec<Value> {
    let raw = std::fs::read(fixtures().join("recorded_counts.json")).unwrap();
    let v: Value = serde_json::from_slice(&raw).unwrap();
    v["records"].as_array().unwrap().clone()
}

fn body_of(name: &str) -> Vec<u8> {
    let (_, body) = conversations().iter().find(|(n, _)| n == name).unwrap();
    serde_json::to_vec(body).unwrap()
}

fn check_recorded(flavor: Flavor, key: &str) {
    let lc = local(flavor);
    let records = recorded();
    assert!(records.len() >= 30, "only {} recordings", records.len());
    let mut mismatches = Vec::new();
    for rec in &records {
        let name = rec["name"].as_str().unwrap();
        let Some(want) = rec[key].as_u64() else {
            continue;
        };
        let got = lc.count(&body_of(name), &MediaCosts::default()).unwrap();
        if u64::from(got) != want {
            mismatches.push(format!("{name}: local {got}, {key} {want}"));
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

#[test]
fn recorded_llamacpp_counts_match_local() {
    check_recorded(Flavor::Llamacpp, "llamacpp");
}

#[test]
fn recorded_vllm_counts_match_local() {
    check_recorded(Flavor::Vllm, "vllm");
}

#[test]
fn recordings_cover_every_conversation_and_the_100k_one() {
    let records = recorded();
    for (name, _) in conversations() {
        let rec = records.iter().find(|r| r["name"] == name.as_str());
        let rec = rec.unwrap_or_else(|| panic!("{name} was not recorded"));
        assert_eq!(rec["llamacpp"], rec["llamacpp_apply_template"], "{name}");
    }
    let long = records.iter().find(|r| r["name"] == "long_100k").unwrap();
    assert!(long["llamacpp"].as_u64().unwrap() > 100_000);
}

#[test]
fn bound_is_never_below_the_recorded_counts() {
    for rec in recorded() {
        let name = rec["name"].as_str().unwrap();
        let view = PromptView::parse(&body_of(name)).unwrap();
        let bound = view.prompt_bound(&MediaCosts::default());
        for key in ["llamacpp", "vllm"] {
            if let Some(n) = rec[key].as_u64() {
                assert!(bound >= n, "{name}: bound {bound} < {key} {n}");
            }
        }
    }
}

#[test]
fn warm_count_of_a_grown_conversation_equals_a_cold_one() {
    let lc = local(Flavor::Vllm);
    let mut body: Value = serde_json::from_slice(&body_of("long_100k")).unwrap();
    let first = lc
        .count(&serde_json::to_vec(&body).unwrap(), &MediaCosts::default())
        .unwrap();
    let cached = lc.cached();
    let messages = body["messages"].as_array_mut().unwrap();
    messages.push(
        json!({"role": "assistant", "content": "A new answer, with <think>tags</think> inside."}),
    );
    messages.push(json!({"role": "user", "content": "And a new question — ça va?"}));
    let bytes = serde_json::to_vec(&body).unwrap();
    let warm = lc.count(&bytes, &MediaCosts::default()).unwrap();
    assert!(warm > first);
    assert!(
        lc.cached() <= cached + 8,
        "a new turn added {} fragments",
        lc.cached() - cached
    );
    let fresh = LocalCounter::load(&files(), Flavor::Vllm).unwrap();
    assert_eq!(fresh.count(&bytes, &MediaCosts::default()).unwrap(), warm);
}

#[test]
fn cutting_long_fragments_keeps_counts_exact() {
    for flavor in [Flavor::Llamacpp, Flavor::Vllm] {
        let whole = LocalCounter::load(&files(), flavor)
            .unwrap()
            .with_chunk_bytes(usize::MAX);
        let cut = LocalCounter::load(&files(), flavor)
            .unwrap()
            .with_chunk_bytes(64);
        assert!(
            cut.chunks(),
            "{flavor}: the Qwen3 tokenizer should allow cuts"
        );
        for rec in recorded() {
            let name = rec["name"].as_str().unwrap();
            if name == "long_100k" {
                continue;
            }
            let body = body_of(name);
            let want = whole.count(&body, &MediaCosts::default()).unwrap();
            assert_eq!(
                cut.count(&body, &MediaCosts::default()).unwrap(),
                want,
                "{flavor} {name}"
            );
        }
        let mut text = String::new();
        for i in 0..2000 {
            text.push_str(
                [
                    "line ",
                    "  indented ",
                    "\n",
                    "e\u{301} ",
                    "<b>",
                    "x = 1;\n",
                    "Über ",
                    "\r\n",
                ][i % 8],
            );
            text.push_str(&format!("{i}\nWord{} ", i * 7));
        }
        let body =
            serde_json::to_vec(&json!({"messages": [{"role": "tool", "content": text}]})).unwrap();
        let want = whole.count(&body, &MediaCosts::default()).unwrap();
        assert_eq!(
            cut.count(&body, &MediaCosts::default()).unwrap(),
            want,
            "{flavor}"
        );
        assert!(cut.cached() > 100, "{flavor}: {} fragments", cut.cached());
    }
}

/// Random text over the characters that decide the Qwen3 pre-tokenizer's splits (letters,
/// digits, runs of spaces, tabs and newlines, punctuation, an apostrophe, combining and
/// multi-byte letters), cut into pieces of a few bytes wherever the chunker cuts: the sum of
/// the pieces' counts is the tokenizer's count of the whole text, for both normalizers.
#[test]
fn cutting_at_spaces_newlines_and_digits_keeps_counts_exact() {
    const ATOMS: [&str; 24] = [
        "a", "Zq", "word", " ", " ", "  ", "\n", "\n\n", "\t", "\r\n", "1", "42", "9", ".", ",",
        "'s", "'", "é", "e\u{301}", "\u{301}", "€", "_", "(x)", "Ü",
    ];
    for flavor in [Flavor::Llamacpp, Flavor::Vllm] {
        let whole = LocalCounter::load(&files(), flavor)
            .unwrap()
            .with_chunk_bytes(usize::MAX);
        let cut = LocalCounter::load(&files(), flavor)
            .unwrap()
            .with_chunk_bytes(8);
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for case in 0..150 {
            let mut text = String::new();
            while text.len() < 600 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                text.push_str(ATOMS[(x % ATOMS.len() as u64) as usize]);
            }
            assert_eq!(
                cut.count_text(&text).unwrap(),
                whole.count_text(&text).unwrap(),
                "{flavor} case {case}: {text:?}"
            );
        }
    }
}

#[test]
fn llamacpp_and_hf_differ_where_the_backends_do() {
    // `e` + U+0301: llama.cpp skips tokenizer.json's NFC normalizer, HF applies it.
    let body = br#"{"messages":[{"role":"user","content":"e\u0301"}]}"#;
    let llama = local(Flavor::Llamacpp)
        .count(body, &MediaCosts::default())
        .unwrap();
    let hf = local(Flavor::Vllm)
        .count(body, &MediaCosts::default())
        .unwrap();
    assert_eq!(llama, hf + 1);
}

#[test]
fn media_parts_cost_their_configured_tokens() {
    let body = br#"{"messages":[{"role":"user","content":[{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}},{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}]}]}"#;
    let text_only = br#"{"messages":[{"role":"user","content":"what is this?"}]}"#;
    let media = MediaCosts {
        image: 300,
        audio: 50,
    };
    for flavor in [Flavor::Llamacpp, Flavor::Vllm] {
        let with = local(flavor).count(body, &media).unwrap();
        let without = local(flavor).count(text_only, &media).unwrap();
        assert_eq!(with, without + 350, "{flavor}");
    }
}

#[test]
fn sglang_flattens_parts_with_spaces() {
    let parts = br#"{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}"#;
    let spaced = br#"{"messages":[{"role":"user","content":"a b"}]}"#;
    let lc = local(Flavor::Sglang);
    let r = lc.render(parts).unwrap();
    assert!(
        r.prompt.contains("<|im_start|>user\na b<|im_end|>"),
        "{}",
        r.prompt
    );
    assert_eq!(
        lc.count(parts, &MediaCosts::default()).unwrap(),
        lc.count(spaced, &MediaCosts::default()).unwrap()
    );
}

fn spec(counter: Arc<Counter>, window: u32, clamp: bool) -> GuardSpec {
    GuardSpec::with_counter(counter, window, clamp)
}

#[tokio::test]
async fn guard_passes_counts_rejects_and_clamps() {
    let client = switchboard_upstream::Client::default();
    let c = counter(Flavor::Llamacpp).clone();
    let small = br#"{"model":"m","messages":[{"role":"user","content":"Hello! Say hi."}],"max_tokens":100}"#;
    assert_eq!(
        guard::check(&spec(c.clone(), 4096, false), &client, small)
            .await
            .unwrap(),
        Verdict::Pass {
            method: Method::Bound
        }
    );
    // 13 prompt tokens (recorded): the bound cannot clear a 200-token window, the count can.
    assert_eq!(
        guard::check(&spec(c.clone(), 200, false), &client, small)
            .await
            .unwrap(),
        Verdict::Pass {
            method: Method::Local
        }
    );
    let v = guard::check(&spec(c.clone(), 100, false), &client, small)
        .await
        .unwrap();
    assert_eq!(
        v,
        Verdict::Over {
            prompt: 13,
            completion: Some(100),
            method: Method::Local,
            estimate: false
        }
    );
    let e = v.into_error(100).unwrap();
    assert_eq!(e.to_string(), "This model's maximum context length is 100 tokens. However, you requested 113 tokens (13 in the messages, 100 in the completion). Please reduce the length of the messages or completion.");
    assert_eq!(
        guard::check(&spec(c.clone(), 100, true), &client, small)
            .await
            .unwrap(),
        Verdict::Clamp {
            max_tokens: 87,
            method: Method::Local
        }
    );
    let clamped = guard::clamp_body(small, 87).unwrap();
    assert_eq!(
        guard::check(&spec(c.clone(), 100, true), &client, &clamped)
            .await
            .unwrap(),
        Verdict::Pass {
            method: Method::Local
        }
    );
    // Without max_tokens the prompt alone must stay below the window.
    let no_max = br#"{"model":"m","messages":[{"role":"user","content":"Hello! Say hi."}]}"#;
    assert_eq!(
        guard::check(&spec(c.clone(), 13, true), &client, no_max)
            .await
            .unwrap(),
        Verdict::Over {
            prompt: 13,
            completion: None,
            method: Method::Local,
            estimate: false
        }
    );
    assert_eq!(
        guard::check(&spec(c.clone(), 14, false), &client, no_max)
            .await
            .unwrap(),
        Verdict::Pass {
            method: Method::Local
        }
    );
    let err = guard::check(&spec(c.clone(), 14, false), &client, b"{nope")
        .await
        .unwrap_err();
    assert_eq!(err.parts().3, Some("invalid_json"));
}

#[tokio::test]
async fn the_long_conversation_is_rejected_exactly_at_its_count() {
    let client = switchboard_upstream::Client::default();
    let c = counter(Flavor::Llamacpp).clone();
    let rec = recorded()
        .into_iter()
        .find(|r| r["name"] == "long_100k")
        .unwrap();
    let n = u32::try_from(rec["llamacpp"].as_u64().unwrap()).unwrap();
    let body = body_of("long_100k");
    assert_eq!(
        guard::check(&spec(c.clone(), n + 1, false), &client, &body)
            .await
            .unwrap(),
        Verdict::Pass {
            method: Method::Local
        }
    );
    assert_eq!(
        guard::check(&spec(c, n, false), &client, &body)
            .await
            .unwrap(),
        Verdict::Over {
            prompt: n,
            completion: None,
            method: Method::Local,
            estimate: false
        }
    );
}

#[tokio::test]
async fn estimate_never_rejects_what_fits() {
    let client = switchboard_upstream::Client::default();
    let est = Arc::new(Counter::new(None, None, Flavor::Vllm, "http://127.0.0.1:1", "m").unwrap());
    assert_eq!(est.kind(), Method::Estimate);
    for rec in recorded() {
        let name = rec["name"].as_str().unwrap();
        let n = u32::try_from(rec["vllm"].as_u64().unwrap()).unwrap();
        let v = guard::check(&spec(est.clone(), n + 1, false), &client, &body_of(name))
            .await
            .unwrap();
        assert!(!matches!(v, Verdict::Over { .. }), "{name}: {v:?}");
    }
    let v = guard::check(
        &spec(est.clone(), 1000, false),
        &client,
        &body_of("long_100k"),
    )
    .await
    .unwrap();
    let Verdict::Over { estimate: true, .. } = v else {
        panic!("{v:?}")
    };
    assert!(v
        .into_error(1000)
        .unwrap()
        .to_string()
        .ends_with("(token count is an estimate)"));
}

#[tokio::test]
async fn counting_endpoints() {
    let client = switchboard_upstream::Client::default();
    let s = spec(counter(Flavor::Llamacpp).clone(), 4096, false);
    let at = |path| switchboard_wire::Endpoint::from_path(path).adapter();
    let llamacpp = switchboard_wire::Converter::Llamacpp;
    let chat = body_of("system_user");
    let req = |adapter, body| guard::Counted {
        adapter,
        body,
        converter: llamacpp,
        who: None,
    };
    let (v, fallback) = guard::count_response(&s, &client, req(at("/tokenize"), &chat))
        .await
        .unwrap();
    assert_eq!(fallback, None);
    assert_eq!(
        v,
        json!({"count": 23, "max_model_len": 4096, "method": "local"})
    );
    let anthropic = json!({
        "model": "m",
        "system": "You are a test.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello! Say hi."}]}]
    });
    let body = serde_json::to_vec(&anthropic).unwrap();
    let messages = at("/v1/messages/count_tokens");
    let (v, _) = guard::count_response(&s, &client, req(messages, &body))
        .await
        .unwrap();
    assert_eq!(v, json!({"input_tokens": 23}));
}

/// What a stub backend saw.
#[derive(Default, Clone)]
struct Seen(Arc<Mutex<Vec<(String, Value)>>>);

async fn stub(flavor: Flavor, seen: Seen) -> SocketAddr {
    let record = |path: &'static str, seen: Seen, reply: fn(&Value) -> Value| {
        post(move |Json(v): Json<Value>| {
            let seen = seen.clone();
            async move {
                seen.0.lock().unwrap().push((path.to_string(), v.clone()));
                Json(reply(&v))
            }
        })
    };
    let app = match flavor {
        Flavor::Llamacpp => Router::new()
            .route(
                "/apply-template",
                record(
                    "/apply-template",
                    seen.clone(),
                    |_| json!({"prompt": "<|im_start|>user\nhi<|im_end|>\n"}),
                ),
            )
            .route(
                "/tokenize",
                record(
                    "/tokenize",
                    seen.clone(),
                    |_| json!({"tokens": [1, 2, 3, 4, 5]}),
                ),
            ),
        Flavor::Vllm => Router::new().route(
            "/tokenize",
            record(
                "/tokenize",
                seen.clone(),
                |_| json!({"count": 42, "max_model_len": 8192, "tokens": []}),
            ),
        ),
        _ => Router::new().route(
            "/v1/tokenize",
            record(
                "/v1/tokenize",
                seen.clone(),
                |_| json!({"tokens": [1, 2, 3], "count": 3, "max_model_len": 8192}),
            ),
        ),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

#[tokio::test]
async fn backend_strategy_speaks_each_flavour() {
    let client = switchboard_upstream::Client::default();
    let body = br#"{"model":"alias","messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"x"}}]}],"tools":[],"chat_template_kwargs":{"enable_thinking":false},"temperature":0.1}"#;
    let media = MediaCosts {
        image: 10,
        audio: 0,
    };
    for (flavor, want) in [
        (Flavor::Llamacpp, 15),
        (Flavor::Vllm, 52),
        (Flavor::Sglang, 13),
    ] {
        let seen = Seen::default();
        let addr = stub(flavor, seen.clone()).await;
        let c = Counter::new(
            Some(CountKind::Backend),
            None,
            flavor,
            &format!("http://{addr}/"),
            "upstream-m",
        )
        .unwrap();
        assert_eq!(c.kind(), Method::Backend);
        let n = tokio::time::timeout(
            Duration::from_secs(10),
            c.count_prompt(&client, body, &media),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(n, want, "{flavor}");
        let seen = seen.0.lock().unwrap().clone();
        let first = &seen[0].1;
        assert_eq!(first["model"], "upstream-m", "{flavor}");
        assert_eq!(
            first["messages"][0]["content"],
            json!([{"type": "text", "text": "hi"}])
        );
        match flavor {
            Flavor::Llamacpp => {
                assert_eq!(seen[1].0, "/tokenize");
                assert_eq!(
                    seen[1].1,
                    json!({"content": "<|im_start|>user\nhi<|im_end|>\n", "add_special": false, "parse_special": true})
                );
            }
            Flavor::Vllm => {
                assert_eq!(first["add_generation_prompt"], true);
                assert_eq!(
                    first["chat_template_kwargs"],
                    json!({"enable_thinking": false})
                );
                assert!(first.get("temperature").is_none());
            }
            _ => assert_eq!(seen[0].0, "/v1/tokenize"),
        }
    }
    assert!(Counter::new(
        Some(CountKind::Backend),
        None,
        Flavor::Openai,
        "http://127.0.0.1:1",
        "m"
    )
    .is_err());
    let dead = Counter::new(
        Some(CountKind::Backend),
        None,
        Flavor::Vllm,
        "http://127.0.0.1:9",
        "m",
    )
    .unwrap();
    let err = dead.count_prompt(&client, body, &media).await.unwrap_err();
    assert!(matches!(
        guard::count_error(err),
        switchboard_wire::error::ProxyError::UpstreamConnect { .. }
    ));
}

#[test]
fn counter_new_names_what_is_wrong() {
    let missing = TokenizerFiles {
        file: "/nonexistent/tokenizer.json".into(),
        config: files().config,
    };
    let err = Counter::new(None, Some(&missing), Flavor::Vllm, "http://x", "m")
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("/nonexistent/tokenizer.json"), "{err}");
    let err = Counter::new(Some(CountKind::Local), None, Flavor::Vllm, "http://x", "m")
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("tokenizer"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("tokenizer_config.json");
    std::fs::write(
        &cfg,
        r#"{"chat_template": "{% for m in messages %}{{ m.content "}"#,
    )
    .unwrap();
    let bad = TokenizerFiles {
        file: files().file,
        config: cfg,
    };
    let err = Counter::new(None, Some(&bad), Flavor::Vllm, "http://x", "m")
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("does not compile"), "{err}");
}

/// The live llama-server of the ignored tests (run them with `-- --ignored`).
fn llama_url() -> String {
    std::env::var("SWITCHBOARD_LLAMA_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .expect(
            "set SWITCHBOARD_LLAMA_URL to a running llama-server (../shared/realworld/start.sh)",
        )
}

/// Opt-in: the backend strategy against a live llama-server equals the recorded counts.
#[tokio::test]
#[ignore = "needs a live llama-server: SWITCHBOARD_LLAMA_URL=http://127.0.0.1:18080 cargo test --test it tokens:: -- --ignored"]
async fn live_llama_server_backend_counts_match_recordings() {
    let url = llama_url();
    let client = switchboard_upstream::Client::default();
    let c = Counter::new(
        Some(CountKind::Backend),
        None,
        Flavor::Llamacpp,
        &url,
        "tiny-qwen3",
    )
    .unwrap();
    for rec in recorded() {
        let name = rec["name"].as_str().unwrap();
        let Some(want) = rec["llamacpp"].as_u64() else {
            continue;
        };
        let got = c
            .count_prompt(&client, &body_of(name), &MediaCosts::default())
            .await
            .unwrap();
        assert_eq!(u64::from(got), want, "{name}");
    }
}

/// Opt-in: a live llama-server's context error is rewritten to the canonical 400.
#[tokio::test]
#[ignore = "needs a live llama-server: SWITCHBOARD_LLAMA_URL=http://127.0.0.1:18080 cargo test --test it tokens:: -- --ignored"]
async fn live_llama_server_context_error_is_canonicalised() {
    let url = llama_url();
    let client = reqwest::Client::new();
    let props: Value = client
        .get(format!("{url}/props"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let n_ctx = u32::try_from(
        props["default_generation_settings"]["n_ctx"]
            .as_u64()
            .unwrap(),
    )
    .unwrap();
    let words = "hello ".repeat(usize::try_from(n_ctx).unwrap() + 10);
    let body = json!({"model": "tiny-qwen3", "messages": [{"role": "user", "content": words}], "max_tokens": 1});
    let resp = client
        .post(format!("{url}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.bytes().await.unwrap();
    let err = guard::canonical::from_backend_error(status, &bytes, 1).expect("recognised");
    let switchboard_wire::error::ProxyError::ContextLengthExceeded { window, prompt, .. } = err
    else {
        panic!()
    };
    assert_eq!(window, n_ctx);
    let local = local(Flavor::Llamacpp)
        .count(&serde_json::to_vec(&body).unwrap(), &MediaCosts::default())
        .unwrap();
    assert_eq!(prompt, local);
}

/// Random conversations for differential checks against a live backend.
fn random_conversation(seed: u64) -> Value {
    let mut state = seed;
    let mut rnd = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    const PIECES: [&str; 40] = [
        "hello",
        " world",
        "\n",
        "\n\n",
        "  ",
        "\t",
        "\r\n",
        "e\u{301}",
        "A\u{30a}",
        "東京",
        "한글",
        "\u{1112}\u{1161}\u{11ab}",
        "👨\u{200d}👩\u{200d}👧",
        "🇳🇴",
        "<|im_end|>",
        "<think>",
        "</think>",
        "<tool_call>",
        "{\"a\": 1}",
        "1234567",
        "3.14159",
        "don't",
        "'ll",
        "x=y+z;",
        "```",
        "#",
        "---",
        "ça",
        "naïve",
        "\u{a0}",
        "\u{2028}",
        "\\",
        "\"",
        "<b>",
        "Ω",
        "ß",
        "İ",
        "ﬁ",
        "①",
        "\u{feff}",
    ];
    let text = |n: u64, rnd: &mut dyn FnMut() -> u64| {
        let mut s = String::new();
        for _ in 0..(rnd() % n) {
            s.push_str(PIECES[(rnd() % PIECES.len() as u64) as usize]);
        }
        s
    };
    let mut messages = Vec::new();
    if rnd() % 2 == 0 {
        messages.push(json!({"role": "system", "content": text(20, &mut rnd)}));
    }
    let turns = 1 + rnd() % 6;
    let mut call = 0;
    for _ in 0..turns {
        messages.push(match rnd() % 3 {
            0 => json!({"role": "user", "content": [{"type": "text", "text": text(10, &mut rnd)}, {"type": "text", "text": text(10, &mut rnd)}]}),
            _ => json!({"role": "user", "content": text(30, &mut rnd)}),
        });
        if rnd() % 2 == 0 {
            call += 1;
            let args = json!({"q": text(8, &mut rnd), "n": rnd() % 1000, "f": (rnd() % 100_000) as f64 / 64.0, "big": 1.5e20, "small": 2.5e-6, "list": [true, null, 0.1]});
            messages.push(json!({"role": "assistant", "content": text(5, &mut rnd), "reasoning_content": text(6, &mut rnd),
                "tool_calls": [{"id": format!("c{call}"), "type": "function", "function": {"name": "search_docs", "arguments": args.to_string()}}]}));
            messages.push(json!({"role": "tool", "tool_call_id": format!("c{call}"), "content": text(12, &mut rnd)}));
        }
        messages.push(json!({"role": "assistant", "content": text(30, &mut rnd)}));
    }
    messages.push(json!({"role": "user", "content": text(20, &mut rnd)}));
    let tools = conversations()
        .iter()
        .find(|(n, _)| n == "tools_multiple_nonascii")
        .unwrap()
        .1["tools"]
        .clone();
    if rnd() % 2 == 0 {
        json!({"model": "tiny-qwen3", "messages": messages, "tools": tools})
    } else {
        json!({"model": "tiny-qwen3", "messages": messages})
    }
}

/// Opt-in: random conversations counted locally equal a live llama-server's count.
#[tokio::test]
#[ignore = "needs a live llama-server: SWITCHBOARD_LLAMA_URL=http://127.0.0.1:18080 cargo test --test it tokens:: -- --ignored"]
async fn live_llama_server_random_conversations_match_local() {
    let url = llama_url();
    let client = switchboard_upstream::Client::default();
    let backend = Counter::new(
        Some(CountKind::Backend),
        None,
        Flavor::Llamacpp,
        &url,
        "tiny-qwen3",
    )
    .unwrap();
    let mut mismatches = Vec::new();
    for seed in 0..200u64 {
        let body = serde_json::to_vec(&random_conversation(seed)).unwrap();
        let want = backend
            .count_prompt(&client, &body, &MediaCosts::default())
            .await
            .unwrap();
        let got = local(Flavor::Llamacpp)
            .count(&body, &MediaCosts::default())
            .unwrap();
        if got != want {
            mismatches.push(format!("seed {seed}: local {got}, llama-server {want}"));
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

#[test]
#[ignore = "writes random conversations and local vLLM counts for an external cross-check"]
fn dump_random_for_vllm_check() {
    let out: Vec<Value> = (0..200u64)
        .map(|seed| {
            let body = random_conversation(seed);
            let n = local(Flavor::Vllm)
                .count(&serde_json::to_vec(&body).unwrap(), &MediaCosts::default())
                .unwrap();
            json!({"seed": seed, "body": body, "local": n})
        })
        .collect();
    std::fs::write(
        std::env::var("TOKENS_DUMP").unwrap(),
        serde_json::to_vec(&out).unwrap(),
    )
    .unwrap();
}
