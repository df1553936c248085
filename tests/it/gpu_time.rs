//! GPU time through the real server and the simulator's GPU mode: a conversation sent to the
//! llama.cpp slot that holds it (`id_slot`), two clients sharing a slot by GPU-seconds, the
//! cost model learning the backend's speed, GPU budgets.
use crate::common;

use common::toml::Fleet;
use common::{client, gpu_sim, proxy, sample, within, Proxy};
use serde_json::{json, Value};
use switchboard_sim::GpuSim;
use switchboard_wire::flavor::Flavor;

fn fleet(flavor: &str, slots: u32, server: &str, clients: &str) -> String {
    Fleet::new()
        .server(server)
        .backend("b", flavor)
        .slots(slots)
        .alias("a", "b")
        .text(clients)
        .render()
}

/// `n` words of a text that starts with `topic`.
fn words(topic: &str, n: usize) -> String {
    (0..n).map(|i| format!("{topic}{i} ")).collect()
}

/// A chat answer's text (its request sent with `key`, when one is given).
async fn ask(p: &Proxy, key: Option<&str>, body: &Value) -> reqwest::Response {
    let mut r = client().post(p.url("/v1/chat/completions")).json(body);
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    within("an answer", r.send()).await.unwrap()
}

#[tokio::test]
async fn a_conversation_goes_to_the_llamacpp_slot_that_holds_it_and_meets_its_prefix() {
    let fast = GpuSim {
        prefill_tps: 1e6,
        decode_tps: 1e5,
        ..GpuSim::default()
    };
    let s = gpu_sim(Flavor::Llamacpp, 2, fast).await;
    let p = proxy(&fleet("llamacpp", 2, "", ""), &[("b", s.url())]).await;
    let mut messages = vec![json!({"role": "user", "content": words("history", 2000)})];
    for turn in 0..3 {
        let body = json!({"model": "a", "messages": messages, "max_tokens": 8});
        let r = ask(&p, None, &body).await;
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.unwrap();
        let text = v["choices"][0]["message"]["content"].as_str().unwrap();
        messages.push(json!({"role": "assistant", "content": text}));
        messages.push(json!({"role": "user", "content": format!("next {turn}")}));
    }
    let runs = s.recorder().gpu_runs();
    assert_eq!(runs.len(), 3);
    // Every turn named its slot; the later ones the same as the first, and met its prefix.
    assert!(
        runs.iter().all(|r| r.id_slot == Some(runs[0].slot as i64)),
        "{runs:?}"
    );
    assert_eq!(runs[0].cached, 0);
    assert!(runs[1..].iter().all(|r| r.cached > 2000), "{runs:?}");
    let m = p.metrics().await;
    let cached = sample(&m, "switchboard_prompt_cached_tokens_total{alias=\"a\"}");
    assert_eq!(cached, f64::from(runs[1].cached + runs[2].cached));
    // The cost model learned from the timings.
    assert!(sample(&m, "switchboard_gpu_seconds_total{alias=\"a\",backend=\"b\",client=\"-\",phase=\"prefill\"}") > 0.0);
}

#[tokio::test]
async fn a_vllm_backend_is_not_told_a_slot() {
    let s = gpu_sim(
        Flavor::Vllm,
        2,
        GpuSim {
            prefill_tps: 1e6,
            decode_tps: 1e5,
            ..GpuSim::default()
        },
    )
    .await;
    let p = proxy(&fleet("vllm", 2, "", ""), &[("b", s.url())]).await;
    let body =
        json!({"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
    assert_eq!(ask(&p, None, &body).await.status(), 200);
    assert_eq!(s.recorder().gpu_runs()[0].id_slot, None);
    let sent: Value = serde_json::from_slice(&s.recorder().last().unwrap().body).unwrap();
    assert!(sent.get("id_slot").is_none(), "{sent}");
}

/// Two clients on one slot, each with requests always waiting (two of `big`'s, four of
/// `small`'s): `big` sends long prompts (8,000 words, some 8k tokens), `small` short ones, each
/// asking for 4 tokens, until `big` has had `rounds` answered. The GPU is slow enough (20k
/// prompt tokens and 80 generated a second: 0.45 s a long request, 0.05 s a short one) that
/// the proxy's and the simulator's own work between requests is small beside it. Their
/// GPU-seconds as the proxy counted them, and the order they ran in at the backend: `B` long,
/// `s` short.
async fn share(schedule: &str, rounds: usize) -> (f64, f64, String) {
    std::env::set_var("SB_T_GPU_BIG", "big-key");
    std::env::set_var("SB_T_GPU_SMALL", "small-key");
    let gpu = GpuSim {
        prefill_tps: 20_000.0,
        decode_tps: 80.0,
        ..GpuSim::default()
    };
    let s = gpu_sim(Flavor::Llamacpp, 1, gpu).await;
    let clients = "[clients.big]\nkey_env = \"SB_T_GPU_BIG\"\npriority = \"batch\"\n\
                   [clients.small]\nkey_env = \"SB_T_GPU_SMALL\"\npriority = \"batch\"";
    let server = format!("schedule = \"{schedule}\"");
    let p = std::sync::Arc::new(
        proxy(&fleet("llamacpp", 1, &server, clients), &[("b", s.url())]).await,
    );
    let big_done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for (key, size, loops) in [("big-key", 8_000usize, 2), ("small-key", 20, 4)] {
        for i in 0..loops {
            let (p, done) = (std::sync::Arc::clone(&p), std::sync::Arc::clone(&big_done));
            tasks.push(tokio::spawn(async move {
                let mut n = 0;
                while done.load(std::sync::atomic::Ordering::SeqCst) < rounds {
                    // Fresh prompts: nothing cached.
                    let text = words(&format!("{key}{i}x{n}w"), size);
                    let body = json!({"model": "a", "max_tokens": 4,
                        "messages": [{"role": "user", "content": text}]});
                    assert_eq!(ask(&p, Some(key), &body).await.status(), 200);
                    if key == "big-key" {
                        done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    n += 1;
                }
            }));
        }
    }
    // Some 8 s of the simulated GPU's time, as long again on a loaded machine: bounded by a
    // minute rather than a request's wait.
    for t in tasks {
        tokio::time::timeout(std::time::Duration::from_secs(60), t)
            .await
            .expect("the clients' loops end within a minute")
            .unwrap();
    }
    let m = p.metrics().await;
    let runs = s.recorder().gpu_runs();
    let order: String = runs
        .iter()
        .map(|r| if r.prompt_n > 1000 { 'B' } else { 's' })
        .collect();
    let of = |client: &str| {
        ["prefill", "decode"]
            .iter()
            .map(|phase| {
                sample(&m, &format!("switchboard_gpu_seconds_total{{alias=\"a\",backend=\"b\",client=\"{client}\",phase=\"{phase}\"}}"))
            })
            .sum::<f64>()
    };
    (of("big"), of("small"), order)
}

/// The short requests run between each two long ones, but the first such run (while the
/// cost model learns the backend from the seed's guess) and the last (the loops stopping).
fn between(order: &str) -> Vec<usize> {
    let parts: Vec<&str> = order.split('B').collect();
    parts[2..parts.len() - 2].iter().map(|p| p.len()).collect()
}

#[tokio::test]
async fn two_clients_one_sending_compactions_and_one_short_turns_get_equal_gpu_seconds() {
    // By work, a long request (0.45 s) is a turn as long as nine short ones (0.05 s each):
    // between two long ones run eight to ten short (a tie of start tags goes either way).
    let (big, small, order) = share("work", 8).await;
    assert!(
        between(&order).iter().all(|n| (8..=10).contains(n)),
        "by work: {order}"
    );
    // Start-time fair queuing keeps two backlogged clients within a request of each other
    // (0.45 + 0.05 s); when the loops stop, each adds what it had queued (one long request,
    // four short): the GPU-seconds counted are within 1.15 s, of some 4 s each.
    assert!(big > 3.0, "{big}");
    assert!(
        (big - small).abs() <= 1.15,
        "by work: big {big:.2} s, small {small:.2} s"
    );
    // By requests, the clients alternate: one short request between two long ones, and the
    // one with short requests gets a ninth of the other's GPU time.
    let (big, small, order) = share("requests", 8).await;
    assert!(
        between(&order).iter().all(|n| *n == 1),
        "by requests: {order}"
    );
    assert!(
        small / big < 0.2,
        "by requests: big {big:.2} s, small {small:.2} s"
    );
}

#[tokio::test]
async fn a_client_past_its_gpu_budget_gets_429_and_the_headers_tell_it() {
    std::env::set_var("SB_T_GPU_BUDGET", "budget-key");
    let gpu = GpuSim {
        prefill_tps: 1e6,
        decode_tps: 100.0,
        ..GpuSim::default()
    };
    let s = gpu_sim(Flavor::Llamacpp, 1, gpu).await;
    let clients = "[clients.thrifty]\nkey_env = \"SB_T_GPU_BUDGET\"\ngpu_seconds_per_minute = 1";
    let config = fleet("llamacpp", 1, "", clients).replace(
        "slots = 1",
        "slots = 1\nprefill_tokens_per_s = 1e6\ndecode_tokens_per_s = 100",
    );
    let p = proxy(&config, &[("b", s.url())]).await;
    // 60 tokens at 100 a second: 0.6 GPU-seconds measured.
    let body =
        json!({"model": "a", "max_tokens": 60, "messages": [{"role": "user", "content": "q"}]});
    let r = ask(&p, Some("budget-key"), &body).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["x-switchboard-ratelimit-limit-gpu-seconds"],
        "1.000"
    );
    // Its 60 tokens reserved again: 0.6 s more does not fit.
    let r = ask(&p, Some("budget-key"), &body).await;
    assert_eq!(r.status(), 429, "{:?}", r.headers());
    let remaining: f64 = r.headers()["x-switchboard-ratelimit-remaining-gpu-seconds"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(remaining < 0.6, "{remaining}");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "rate_limit_exceeded", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("GPU-seconds per minute"),
        "{v}"
    );
}

#[tokio::test]
async fn a_history_of_one_token_answers_lets_no_long_requests_past_a_gpu_budget() {
    std::env::set_var("SB_T_GPU_HISTORY", "history-key");
    // Decode at 100 tokens a second, as the backend's seed says: a request for 150 tokens is
    // 1.5 GPU-seconds, of a budget of 2 a minute.
    let gpu = GpuSim {
        prefill_tps: 1e6,
        decode_tps: 100.0,
        ..GpuSim::default()
    };
    let s = gpu_sim(Flavor::Llamacpp, 8, gpu).await;
    let clients = "[clients.terse]\nkey_env = \"SB_T_GPU_HISTORY\"\ngpu_seconds_per_minute = 2";
    let config = fleet("llamacpp", 8, "", clients).replace(
        "slots = 8",
        "slots = 8\nprefill_tokens_per_s = 1e6\ndecode_tokens_per_s = 100",
    );
    let p = proxy(&config, &[("b", s.url())]).await;
    // Eight answers of one token each: its recent answers are all that short.
    for i in 0..8 {
        let body = json!({"model": "a", "max_tokens": 1,
            "messages": [{"role": "user", "content": format!("short {i}")}]});
        assert_eq!(ask(&p, Some("history-key"), &body).await.status(), 200);
    }
    // Then eight at once, each asking for 150 tokens.
    let long = (0..8).map(|i| {
        let body = json!({"model": "a", "max_tokens": 150,
            "messages": [{"role": "user", "content": format!("long {i}")}]});
        let p = &p;
        async move { ask(p, Some("history-key"), &body).await }
    });
    let answers = futures_util::future::join_all(long).await;
    let admitted = answers.iter().filter(|r| r.status() == 200).count();
    // 1.5 GPU-seconds each: one fits the 2 of the minute (less the eight short ones), the
    // others are refused with the budget's headers.
    assert_eq!(
        admitted,
        1,
        "{:?}",
        answers.iter().map(|r| r.status()).collect::<Vec<_>>()
    );
    for r in answers.iter().filter(|r| r.status() != 200) {
        assert_eq!(r.status(), 429);
        assert_eq!(
            r.headers()["x-switchboard-ratelimit-limit-gpu-seconds"],
            "2.000"
        );
        assert!(r
            .headers()
            .contains_key("x-switchboard-ratelimit-remaining-gpu-seconds"));
    }
    for r in answers {
        let v: Value = r.json().await.unwrap();
        if let Some(e) = v.get("error") {
            assert_eq!(e["code"], "rate_limit_exceeded", "{v}");
        }
    }
    // What was admitted ran within the budget: the GPU time the client was measured.
    let m = p.metrics().await;
    let used: f64 = ["prefill", "decode"]
        .iter()
        .map(|phase| {
            sample(&m, &format!("switchboard_gpu_seconds_total{{alias=\"a\",backend=\"b\",client=\"terse\",phase=\"{phase}\"}}"))
        })
        .sum();
    assert!(used <= 2.0, "{used} GPU-seconds measured of a budget of 2");
}
