//! The Batch API against a real llama-server (`../shared/realworld`, its URL in
//! `SWITCHBOARD_REAL_LLAMA`): a batch's lines run on the server's two slots in the time a
//! person leaves them, give their slot to the person's streamed and whole requests, and each
//! line is answered once, whole, in the output file.
use crate::common;

use std::time::Duration;

use common::batch_api::{ids, Api};
use common::toml::Fleet;
use common::*;
use serde_json::{json, Value};

/// The real model runs on a shared CPU: a request may wait a while for a slot.
const REAL_WAIT: Duration = Duration::from_secs(120);

/// Lines in the batch.
const LINES: usize = 24;

/// One of the person's requests, streamed or whole: its status and whether it came whole.
async fn ask(url: &str, i: usize, stream: bool) -> (u16, bool, String) {
    let body = json!({"model": "a", "stream": stream, "max_tokens": 12,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": format!("Person's question {i}?")}]});
    let r = client().post(url).bearer_auth("rb-person-key").json(&body);
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    let whole = match stream {
        true => text.contains("data: [DONE]"),
        false => serde_json::from_str::<Value>(&text).is_ok_and(|v| v["choices"].is_array()),
    };
    (status, whole, text)
}

/// Through the proxy on the server's two slots: a batch of [`LINES`] chat lines (one of them
/// too long for a slot's window) runs while a person sends streamed and whole requests two at
/// a time. Every request of the person is answered 200 and whole; the person's requests took
/// slots the batch's lines held (the lines ran again later); the batch completes with each
/// good line answered once in the output file with the server's own answer, the long one in
/// the error file with the proxy's context-length error; the ledger holds one answered row
/// per line; nothing stays in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real llama-server: SWITCHBOARD_REAL_LLAMA=http://127.0.0.1:PORT"]
async fn real_llama_a_batch_runs_beside_a_persons_mixed_requests_each_line_once() {
    let _alone = common::ON_REAL_LLAMA.lock().await;
    std::env::set_var("SB_T_RB_PERSON", "rb-person-key");
    std::env::set_var("SB_T_RB_BOB", "rb-bob-key");
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("usage.db");
    let cfg = Fleet::new()
        .backend("b", "llamacpp")
        .slots(2)
        .alias("a", "b")
        .text(&format!(
            "[clients.person]\nkey_env = \"SB_T_RB_PERSON\"\npriority = \"interactive\"\n\
             [clients.bob]\nkey_env = \"SB_T_RB_BOB\"\n\
             [ledger]\nurl = \"sqlite://{}\"\nbatch_interval_ms = 10\n\
             [batches]\nmax_concurrent = 2",
            db.display()
        ))
        .render();
    let p = proxy(&cfg, &[("b", real_llama())]).await;
    let api = Api::new(p.url(""));
    let mut text = String::new();
    for i in 0..LINES {
        let content = match i {
            // Longer than a slot's window (8,192 tokens over 2 slots).
            7 => format!("line {i}: {}", "many words ".repeat(3000)),
            _ => format!("Batch line {i}: name a colour."),
        };
        let line = json!({"custom_id": format!("l{i:02}"), "method": "POST",
            "url": "/v1/chat/completions",
            // Some 256 tokens each (a second or so on the shared CPU): the slots hold lines.
            "body": {"model": "a", "max_tokens": 256, "ignore_eos": true,
                     "messages": [{"role": "user", "content": content}]}});
        text += &(line.to_string() + "\n");
    }
    let (status, file) = api.upload("rb-bob-key", text).await;
    assert_eq!(status, 200, "{file}");
    let (status, b) = api.create("rb-bob-key", &file).await;
    assert_eq!(status, 200, "{b}");
    let id = b["id"].as_str().unwrap().to_string();
    api.until("rb-bob-key", &id, |b| b["status"] == "in_progress")
        .await;

    // The person asks once the lines hold both slots: two at a time, streamed and whole.
    let slots = std::sync::Arc::clone(&p.state.live.load().replica("b").unwrap().slots);
    until("lines in both slots", || slots.busy() == 2).await;
    let url = p.url("/v1/chat/completions");
    let person = (0..2).map(|w| {
        let url = url.clone();
        tokio::spawn(async move {
            let mut failed = Vec::new();
            for i in 0..6 {
                let (status, whole, text) = ask(&url, w * 10 + i, (i + w) % 2 == 0).await;
                if status != 200 || !whole {
                    failed.push(format!("person {w}/{i}: {status} {text:.300}"));
                }
            }
            failed
        })
    });
    let person: Vec<_> = person.collect();
    let mut failed = Vec::new();
    for w in person {
        failed.extend(
            tokio::time::timeout(REAL_WAIT * 2, w)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    assert!(failed.is_empty(), "{failed:#?}");

    let b = tokio::time::timeout(REAL_WAIT * 3, api.completed("rb-bob-key", &id))
        .await
        .expect("the batch completes");
    assert_eq!(
        b["request_counts"],
        json!({"total": LINES, "completed": LINES - 1, "failed": 1}),
        "{b}"
    );
    let out = api.lines("rb-bob-key", &b["output_file_id"]).await;
    let good: Vec<String> = (0..LINES)
        .filter(|&i| i != 7)
        .map(|i| format!("l{i:02}"))
        .collect();
    assert_eq!(ids(&out), good, "each good line answered once");
    for l in &out {
        let r = &l["response"];
        assert_eq!(r["status_code"], 200, "{l}");
        let body = &r["body"];
        assert_eq!(body["object"], "chat.completion", "{l}");
        assert!(body["choices"][0]["message"].is_object(), "{l}");
        assert!(body["usage"]["completion_tokens"].as_i64() > Some(0), "{l}");
        // The server's own account of its work came back with the answer.
        assert!(body["timings"]["prompt_n"].is_number(), "{l}");
    }
    let errors = api.lines("rb-bob-key", &b["error_file_id"]).await;
    assert_eq!(ids(&errors), ["l07"]);
    let refused = &errors[0]["response"];
    assert_eq!(refused["status_code"], 400, "{refused}");
    assert_eq!(
        refused["body"]["error"]["code"], "context_length_exceeded",
        "{refused}"
    );

    let m = p.metrics().await;
    let lines = |outcome: &str| {
        sample(
            &m,
            &format!(
                "switchboard_batch_lines_total{{alias=\"a\",client=\"bob\",outcome=\"{outcome}\"}}"
            ),
        )
    };
    assert_eq!(lines("completed"), (LINES - 1) as f64);
    assert_eq!(lines("failed"), 1.0);
    let yielded = sample(
        &m,
        "switchboard_preemptions_total{alias=\"a\",class=\"idle\"}",
    );
    eprintln!("lines that gave their slot to the person and ran again: {yielded}");
    assert!(yielded >= 1.0, "the person took a slot a line held");
    assert_eq!(
        sample(&m, "switchboard_inflight_requests{alias=\"a\"}"),
        0.0
    );

    // The ledger: one answered row per good line, and the lines cut for the person apart.
    let written = p.state.metrics.ledger.written.clone();
    let rows = LINES as u64 + 12;
    until("the rows of the lines and the person", || {
        written.get() >= rows
    })
    .await;
    let c = rusqlite::Connection::open(&db).unwrap();
    let one = |sql: &str| -> i64 { c.query_row(sql, [], |r| r.get(0)).unwrap() };
    assert_eq!(
        one(
            "SELECT count(*) FROM requests WHERE client = 'bob' AND status = 200 AND cancelled = 0"
        ),
        (LINES - 1) as i64
    );
    assert_eq!(
        one("SELECT count(*) FROM requests WHERE client = 'person' AND status = 200"),
        12
    );
}
