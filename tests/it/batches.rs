//! The Batch API from outside: files uploaded as multipart forms, batches validated, run to
//! their end through the whole pipeline against a simulator, their output and error files
//! read back; ownership, bounds, cancellation, the idle class giving its slot to a person,
//! and a kill -9 of the binary mid-batch.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::batch_api::{ids, Api, BATCH_WAIT};
use common::*;
use serde_json::{json, Value};
use switchboard_sim::SimConfig;

fn config(db: &Path, slots: u32, batches: &str) -> String {
    format!(
        r#"
[server]
admin_keys_env = "SB_T_BATCH_ADMIN"
[backends.gpu]
url = "{{gpu}}"
flavor = "llamacpp"
slots = {slots}
[aliases.a]
backend = "gpu"
[aliases.secret]
backend = "gpu"
[clients.ann]
key_env = "SB_T_BATCH_ANN"
aliases = ["a"]
[clients.bob]
key_env = "SB_T_BATCH_BOB"
[ledger]
url = "sqlite://{}"
batch_interval_ms = 10
[batches]
{batches}
"#,
        db.display()
    )
}

fn keys() {
    std::env::set_var("SB_T_BATCH_ADMIN", "admin-key");
    std::env::set_var("SB_T_BATCH_ANN", "ann-key");
    std::env::set_var("SB_T_BATCH_BOB", "bob-key");
}

/// A chat line.
fn line(id: &str, model: &str, max_tokens: i64) -> String {
    json!({"custom_id": id, "method": "POST", "url": "/v1/chat/completions",
           "body": {"model": model, "max_tokens": max_tokens,
                    "messages": [{"role": "user", "content": format!("marker-{id}")}]}})
    .to_string()
}

/// A chat line longer than the simulator's window: the backend refuses it (400).
fn too_long(id: &str) -> String {
    let content = format!("marker-{id} {}", "word ".repeat(3000));
    json!({"custom_id": id, "method": "POST", "url": "/v1/chat/completions",
           "body": {"model": "a", "max_tokens": 5,
                    "messages": [{"role": "user", "content": content}]}})
    .to_string()
}

/// `n` chat lines `l0`, `l1`, … (numbers `width` digits wide).
fn numbered(n: usize, width: usize) -> String {
    (0..n)
        .map(|i| line(&format!("l{i:0width$}"), "a", 3) + "\n")
        .collect()
}

/// `done`, a batch of `n` numbered lines (`width` digits), completed with each answered once
/// in its output file as `api` reads it.
async fn all_answered(api: &Api, key: &str, done: &Value, n: usize, width: usize) {
    assert_eq!(
        done["request_counts"],
        json!({"total": n, "completed": n, "failed": 0}),
        "{done}"
    );
    let out = api.lines(key, &done["output_file_id"]).await;
    let want: Vec<String> = (0..n).map(|i| format!("l{i:0width$}")).collect();
    assert_eq!(ids(&out), want);
}

/// A one-slot simulator answering each request after `ttft`, a proxy in front of it (its
/// SQLite ledger in a temp dir, one line of a batch at a time), and a batch of `n` lines of
/// bob's created there.
struct OneSlot {
    gpu: switchboard_sim::Sim,
    p: Proxy,
    api: Api,
    id: String,
    db: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

async fn one_slot(ttft: Duration, n: usize) -> OneSlot {
    keys();
    let gpu = sim(SimConfig {
        ttft,
        ..SimConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("usage.db");
    let p = proxy(&config(&db, 1, "max_concurrent = 1"), &[("gpu", gpu.url())]).await;
    let api = Api::new(p.url(""));
    let (_, file) = api.upload("bob-key", numbered(n, 2)).await;
    let (_, b) = api.create("bob-key", &file).await;
    assert_eq!(
        b["expires_at"].as_i64().unwrap() - b["created_at"].as_i64().unwrap(),
        86_400
    );
    let id = b["id"].as_str().unwrap().to_string();
    OneSlot {
        gpu,
        p,
        api,
        id,
        db,
        _dir: dir,
    }
}

#[tokio::test]
async fn a_batch_runs_to_completed_with_every_custom_id_answered_once_and_only_its_owner_sees_it() {
    keys();
    let gpu = sim(SimConfig {
        slot_ctx: 1024,
        ..SimConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let toml = config(&dir.path().join("usage.db"), 2, "max_concurrent = 3");
    let p = proxy(&toml, &[("gpu", gpu.url())]).await;
    let api = Api::new(p.url(""));
    let bad: Vec<String> = (0..5).map(|i| format!("bad-{i}")).collect();
    let good: Vec<String> = (0..35).map(|i| format!("good-{i:02}")).collect();
    let mut text: String = good.iter().map(|id| line(id, "a", 5) + "\n").collect();
    text.extend(bad.iter().map(|id| too_long(id) + "\n"));
    let (status, file) = api.upload("ann-key", text).await;
    assert_eq!(status, 200, "{file}");
    assert_eq!(
        (file["object"].as_str(), file["purpose"].as_str()),
        (Some("file"), Some("batch"))
    );
    let (status, b) = api.create("ann-key", &file).await;
    assert_eq!(status, 200, "{b}");
    assert_eq!(b["status"], "validating");
    let id = b["id"].as_str().unwrap().to_string();
    let b = api.completed("ann-key", &id).await;
    assert_eq!(
        b["request_counts"],
        json!({"total": 40, "completed": 35, "failed": 5}),
        "{b}"
    );
    assert_eq!(b["metadata"], json!({"run": "t"}));
    for at in ["in_progress_at", "finalizing_at", "completed_at"] {
        assert!(b[at].as_i64().is_some(), "{at}: {b}");
    }
    let out = api.lines("ann-key", &b["output_file_id"]).await;
    assert_eq!(ids(&out), good);
    for l in &out {
        assert_eq!(l["response"]["status_code"], 200, "{l}");
        assert_eq!(l["response"]["body"]["object"], "chat.completion", "{l}");
        assert!(l["response"]["request_id"]
            .as_str()
            .is_some_and(|r| !r.is_empty()));
        assert!(l["id"].as_str().unwrap().starts_with("batch_req_"));
        assert_eq!(l["error"], Value::Null);
        // The body the backend got is the line's own.
        let marker = format!("marker-{}", l["custom_id"].as_str().unwrap());
        assert_eq!(chats_with(&gpu, &format!("\"{marker}\"")), 1, "{marker}");
    }
    let errors = api.lines("ann-key", &b["error_file_id"]).await;
    assert_eq!(ids(&errors), bad);
    for l in &errors {
        assert_eq!(l["response"]["status_code"], 400, "{l}");
        let code = &l["response"]["body"]["error"]["code"];
        assert_eq!(code, "context_length_exceeded", "{l}");
    }
    // Another client sees none of it; an admin key sees all of it.
    let path = format!("/v1/batches/{id}");
    assert_eq!(api.get("bob-key", &path).await.0, 404);
    let output = format!(
        "/v1/files/{}/content",
        b["output_file_id"].as_str().unwrap()
    );
    let r = api
        .c
        .get(format!("{}{output}", api.base))
        .bearer_auth("bob-key");
    assert_eq!(r.send().await.unwrap().status(), 404);
    let cancel = format!("/v1/batches/{id}/cancel");
    assert_eq!(api.post("bob-key", &cancel, &json!({})).await.0, 404);
    // A batch that has completed cannot be cancelled.
    let (status, e) = api.post("ann-key", &cancel, &json!({})).await;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (400, Some("invalid_request")),
        "{e}"
    );
    let (_, listed) = api.get("bob-key", "/v1/batches").await;
    assert_eq!(listed["data"], json!([]));
    let (_, files) = api.get("bob-key", "/v1/files").await;
    assert_eq!(files["data"], json!([]));
    assert_eq!(api.get("admin-key", &path).await.1["id"], id.as_str());
    assert_eq!(
        api.get("admin-key", "/v1/files").await.1["data"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    // Each run is counted, and the ledger has the lines as ann's requests.
    let m = p.metrics().await;
    let completed = r#"switchboard_batch_lines_total{alias="a",client="ann",outcome="completed"}"#;
    assert_eq!(sample(&m, completed), 35.0);
    let failed = r#"switchboard_batch_lines_total{alias="a",client="ann",outcome="failed"}"#;
    assert_eq!(sample(&m, failed), 5.0);
    let waits = "switchboard_batch_line_queue_wait_seconds_count";
    assert_eq!(
        sample(&m, waits),
        40.0,
        "each line's run waited for its slot once"
    );
    // The gauge of batches by status follows the ledger within the runner's next look.
    let by_status = r#"switchboard_batches{status="completed"}"#;
    let counted = async {
        while sample(&p.metrics().await, by_status) != 1.0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(BATCH_WAIT, counted).await.unwrap();
}

#[tokio::test]
async fn a_file_with_bad_lines_fails_its_batch_at_validation_naming_each_line() {
    keys();
    let gpu = sim(SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let p = proxy(
        &config(&dir.path().join("usage.db"), 2, ""),
        &[("gpu", gpu.url())],
    )
    .await;
    let api = Api::new(p.url(""));
    // ann may not use `secret`; the third line repeats the first's custom_id.
    let text = [
        line("x", "a", 5),
        "{oops".to_string(),
        line("x", "a", 5),
        line("y", "secret", 5),
        line("z", "a", 5).replace("/v1/chat/completions", "/v1/embeddings"),
    ]
    .join("\n");
    let (_, file) = api.upload("ann-key", text).await;
    let (_, b) = api.create("ann-key", &file).await;
    let id = b["id"].as_str().unwrap();
    let b = api.until("ann-key", id, |b| b["status"] == "failed").await;
    let errors: Vec<(String, i64)> = b["errors"]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["code"].as_str().unwrap().to_string(),
                e["line"].as_i64().unwrap(),
            )
        })
        .collect();
    let want = [
        ("invalid_json_line", 2),
        ("duplicate_custom_id", 3),
        ("model_not_found", 4),
        ("invalid_url", 5),
    ];
    let want: Vec<(String, i64)> = want.iter().map(|(c, l)| (c.to_string(), *l)).collect();
    assert_eq!(errors, want, "{b}");
    assert_eq!(b["errors"]["object"], "list");
    assert!(b["failed_at"].as_i64().is_some());
    assert_eq!(
        gpu.recorder().received(),
        0,
        "nothing of a failed batch runs"
    );
    // What create itself refuses, in OpenAI's envelope.
    let wrong = json!({"input_file_id": file["id"], "endpoint": "/v1/images",
                       "completion_window": "24h"});
    let (status, e) = api.post("ann-key", "/v1/batches", &wrong).await;
    assert_eq!(
        (status, e["error"]["param"].as_str()),
        (400, Some("endpoint")),
        "{e}"
    );
    let (status, e) = api.post("bob-key", "/v1/batches", &json!({
        "input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"
    })).await;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (404, Some("not_found")),
        "{e}"
    );
}

/// An upload is a request body like any other: one that stalls is cut at the client's body
/// time with a 408 in OpenAI's envelope and the connection closed, and no file is kept.
#[tokio::test]
async fn an_upload_that_stalls_is_cut_at_the_body_timeout_and_keeps_no_file() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    keys();
    let gpu = sim(SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir.path().join("usage.db"), 1, "")
        .replace("[server]\n", "[server]\nclient_body_timeout_ms = 300\n");
    let p = proxy(&cfg, &[("gpu", gpu.url())]).await;
    let mut tcp = tokio::net::TcpStream::connect(p.addr).await.unwrap();
    // The purpose field and the start of the file's part, of 10,000 declared bytes; then nothing.
    let part = "--XX\r\ncontent-disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
                --XX\r\ncontent-disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\
                content-type: application/jsonl\r\n\r\n{\"custom_id\": \"l0\", ";
    let head = format!(
        "POST /v1/files HTTP/1.1\r\nhost: x\r\nauthorization: Bearer bob-key\r\n\
         content-type: multipart/form-data; boundary=XX\r\ncontent-length: 10000\r\n\r\n{part}"
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    within("the stalled upload's answer", tcp.read_to_end(&mut raw))
        .await
        .unwrap();
    let raw = String::from_utf8_lossy(&raw);
    assert!(raw.starts_with("HTTP/1.1 408 "), "{raw}");
    assert!(
        raw.to_ascii_lowercase().contains("connection: close"),
        "{raw}"
    );
    let (_, body) = raw.split_once("\r\n\r\n").unwrap();
    let e: Value = serde_json::from_str(body).unwrap();
    assert_eq!(e["error"]["code"], "request_timeout", "{e}");
    assert_eq!(e["error"]["type"], "invalid_request_error", "{e}");
    let (status, files) = Api::new(p.url("")).get("bob-key", "/v1/files").await;
    assert_eq!(status, 200);
    assert_eq!(files["data"], json!([]), "{files}");
}

#[tokio::test]
async fn a_clients_files_bytes_and_batches_in_progress_are_bounded() {
    keys();
    let gpu = sim(SimConfig {
        ttft: Duration::from_secs(30),
        ..SimConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let bounds = "files_per_client = 2\nbytes_per_client = 600\nbatches_in_progress_per_client = 1\nmax_file_bytes = 600";
    let p = proxy(
        &config(&dir.path().join("usage.db"), 1, bounds),
        &[("gpu", gpu.url())],
    )
    .await;
    let api = Api::new(p.url(""));
    let (status, e) = api.upload("ann-key", "x".repeat(601)).await;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (413, Some("request_too_large")),
        "{e}"
    );
    let (_, first) = api.upload("ann-key", line("a", "a", 5)).await;
    let (_, second) = api.upload("ann-key", line("b", "a", 5)).await;
    let (status, e) = api.upload("ann-key", line("c", "a", 5)).await;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (400, Some("limit_exceeded")),
        "{e}"
    );
    // Another client's bounds are its own.
    assert_eq!(api.upload("bob-key", line("c", "a", 5)).await.0, 200);
    let r = api.c.delete(format!(
        "{}/v1/files/{}",
        api.base,
        second["id"].as_str().unwrap()
    ));
    let deleted: Value = r
        .bearer_auth("ann-key")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(deleted["deleted"], true);
    let (status, e) = api.upload("ann-key", "y".repeat(500)).await;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (400, Some("limit_exceeded")),
        "{e}"
    );
    assert_eq!(api.create("ann-key", &first).await.0, 200);
    let (status, e) = api.create("ann-key", &first).await;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (400, Some("limit_exceeded")),
        "{e}"
    );
}

#[tokio::test]
async fn cancelling_a_batch_stops_its_lines_and_keeps_what_was_done() {
    let one = one_slot(Duration::from_millis(150), 40).await;
    let (gpu, api, id) = (&one.gpu, &one.api, one.id.as_str());
    api.until("bob-key", id, |b| {
        b["request_counts"]["completed"].as_i64() >= Some(2)
    })
    .await;
    // The status page lists it, with its progress, to its client and not to another.
    let page = |key: &'static str| {
        let r = api.c.get(format!("{}/", api.base)).bearer_auth(key).send();
        async move { r.await.unwrap().text().await.unwrap() }
    };
    let shown = page("bob-key").await;
    assert!(
        shown.contains("Batches in progress") && shown.contains(id),
        "{shown}"
    );
    assert!(shown.contains(" of 40 done · "), "{shown}");
    assert!(!page("ann-key").await.contains(id));
    let (status, b) = api
        .post("bob-key", &format!("/v1/batches/{id}/cancel"), &json!({}))
        .await;
    assert_eq!(status, 200, "{b}");
    assert!(
        b["status"] == "cancelling" || b["status"] == "cancelled",
        "{b}"
    );
    let b = api
        .until("bob-key", id, |b| b["status"] == "cancelled")
        .await;
    let counts = &b["request_counts"];
    let (done, failed) = (
        counts["completed"].as_i64().unwrap(),
        counts["failed"].as_i64().unwrap(),
    );
    assert_eq!(done + failed, 40, "{b}");
    assert!(done < 40, "{b}");
    let out = api.lines("bob-key", &b["output_file_id"]).await;
    let errors = api.lines("bob-key", &b["error_file_id"]).await;
    assert_eq!(out.len() as i64, done);
    assert_eq!(errors.len() as i64, failed);
    assert!(
        errors
            .iter()
            .all(|e| e["error"]["code"] == "batch_cancelled"),
        "{errors:?}"
    );
    let mut all = ids(&out);
    all.extend(ids(&errors));
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 40);
    assert!(b["cancelling_at"].as_i64().is_some() && b["cancelled_at"].as_i64().is_some());
    // The line running when it was cancelled was cut at the backend; nothing runs after.
    until("the cut line to end", || gpu.recorder().running() == 0).await;
    let received = chats_with(gpu, "marker-");
    assert!(
        received as i64 <= done + 1,
        "{received} received, {done} done"
    );
    // Cancelling it again answers it as it is.
    let (status, again) = api
        .post("bob-key", &format!("/v1/batches/{id}/cancel"), &json!({}))
        .await;
    assert_eq!(
        (status, &again["status"]),
        (200, &json!("cancelled")),
        "{again}"
    );
}

/// A batch whose 24-hour window ends (its `expires_at` moved into the past in its database)
/// ends as `expired`: what was done is in its output file, the rest in its error file.
#[tokio::test]
async fn a_batch_past_its_window_expires_with_what_was_done_kept() {
    let one = one_slot(Duration::from_millis(150), 30).await;
    let (api, id, db) = (&one.api, one.id.as_str(), &one.db);
    api.until("bob-key", id, |b| {
        b["request_counts"]["completed"].as_i64() >= Some(2)
    })
    .await;
    let c = rusqlite::Connection::open(db).unwrap();
    c.busy_timeout(Duration::from_secs(10)).unwrap();
    c.execute("UPDATE batches SET expires_at = 0 WHERE id = ?1", [id])
        .unwrap();
    let b = api.until("bob-key", id, |b| b["status"] == "expired").await;
    let counts = &b["request_counts"];
    let (done, failed) = (
        counts["completed"].as_i64().unwrap(),
        counts["failed"].as_i64().unwrap(),
    );
    assert_eq!(
        (done + failed, counts["total"].as_i64()),
        (30, Some(30)),
        "{b}"
    );
    assert!((2..30).contains(&done), "{b}");
    assert!(b["expired_at"].as_i64().is_some());
    let out = api.lines("bob-key", &b["output_file_id"]).await;
    let errors = api.lines("bob-key", &b["error_file_id"]).await;
    assert_eq!((out.len() as i64, errors.len() as i64), (done, failed));
    assert!(
        errors.iter().all(|e| e["error"]["code"] == "batch_expired"),
        "{errors:?}"
    );
}

/// A person's request waiting for the one slot a batch line holds takes it at once: the line
/// is cut at the backend and runs again later; the batch still completes, every line once.
#[tokio::test]
async fn a_person_takes_the_slot_a_batch_line_holds_and_the_line_runs_again_later() {
    let one = one_slot(Duration::from_millis(400), 3).await;
    let (gpu, p, api, id) = (&one.gpu, &one.p, &one.api, one.id.as_str());
    until("a line to hold the slot", || gpu.recorder().running() == 1).await;
    let person = api
        .c
        .post(format!("{}/v1/chat/completions", api.base))
        .bearer_auth("ann-key")
        .json(&chat("a", false));
    let r = within("the person's answer", person.send()).await.unwrap();
    assert_eq!(r.status(), 200);
    let m = p.metrics().await;
    assert_eq!(
        sample(
            &m,
            r#"switchboard_preemptions_total{alias="a",class="idle"}"#
        ),
        1.0
    );
    let b = api.completed("bob-key", id).await;
    assert_eq!(
        b["request_counts"],
        json!({"total": 3, "completed": 3, "failed": 0})
    );
    let out = api.lines("bob-key", &b["output_file_id"]).await;
    assert_eq!(ids(&out), ["l00", "l01", "l02"]);
    // Three lines and the person's request ran to their end; the cut one did not.
    assert_eq!(gpu.recorder().completed(), 4);
    assert_eq!(gpu.recorder().cancelled(), 1);
}

/// kill -9 of the binary mid-batch, then a start on the same ledger: the batch completes, each
/// line's answer once in its output, and the backend ran each line to its end once (a line
/// cut by the kill was cancelled at the backend, not finished).
#[tokio::test]
async fn a_batch_killed_mid_way_completes_after_a_restart_without_running_a_line_twice() {
    keys();
    // Each line takes 1.5 s at the backend, two at once: the kill comes well inside one.
    let gpu = sim(SimConfig {
        ttft: Duration::from_millis(1500),
        slots: 2,
        ..SimConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let toml = config(&dir.path().join("usage.db"), 2, "max_concurrent = 2").replace(
        "[server]",
        &format!("[server]\nlisten = \"127.0.0.1:{port}\"\nworkers = 1"),
    );
    let path = dir.path().join("routes.toml");
    std::fs::write(&path, fill(&toml, &[("gpu", gpu.url())])).unwrap();
    let start = || {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_switchboard"))
            .args(["serve", "--config"])
            .arg(&path)
            .kill_on_drop(true)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let api = Api::new(format!("http://127.0.0.1:{port}"));
    let up = || async {
        tokio::time::timeout(BATCH_WAIT, async {
            while api
                .c
                .get(format!("{}/health", api.base))
                .send()
                .await
                .is_err()
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the proxy listens");
    };
    let mut first = start();
    up().await;
    let text = numbered(8, 1);
    let (_, file) = api.upload("ann-key", text).await;
    let (_, b) = api.create("ann-key", &file).await;
    let id = b["id"].as_str().unwrap().to_string();
    api.until("ann-key", &id, |b| {
        b["request_counts"]["completed"].as_i64() >= Some(2)
    })
    .await;
    // The next two lines are at the backend now, a second and more from their end.
    until("the next lines to reach the backend", || {
        gpu.recorder().running() == 2
    })
    .await;
    first.start_kill().unwrap();
    first.wait().await.unwrap();
    until("the cut lines to end at the backend", || {
        gpu.recorder().running() == 0
    })
    .await;
    let cut = gpu.recorder().cancelled();
    assert_eq!(cut, 2, "the two lines running were cut by the kill");
    let _second = start();
    up().await;
    let b = api.completed("ann-key", &id).await;
    all_answered(&api, "ann-key", &b, 8, 1).await;
    assert_eq!(
        gpu.recorder().completed(),
        8,
        "each line ran to its end once"
    );
    assert_eq!(chats_with(&gpu, "marker-"), 8 + cut as usize);
}

/// A PostgreSQL server of the test's own (`None`: skipped without one), a four-slot simulator
/// answering after `ttft`, and two binaries with their ledger in that database (`[batches]`
/// `max_concurrent = 2` and `batches` more).
async fn two_on_postgres(
    ttft: Duration,
    batches: &str,
) -> Option<(
    common::postgres::Postgres,
    switchboard_sim::Sim,
    common::served::Served,
    common::served::Served,
)> {
    let pg = common::postgres::Postgres::start()?;
    keys();
    let gpu = sim(SimConfig {
        ttft,
        slots: 4,
        ..SimConfig::default()
    })
    .await;
    let config = format!(
        "[backends.gpu]\nurl = \"{}\"\nflavor = \"llamacpp\"\nslots = 4\n[aliases.a]\n\
         backend = \"gpu\"\n[clients.ann]\nkey_env = \"SB_T_BATCH_ANN\"\n[ledger]\n\
         url = \"{}\"\nbatch_interval_ms = 10\n[batches]\nmax_concurrent = 2\n{batches}",
        gpu.url(),
        pg.url()
    );
    let (a, b) = tokio::join!(
        common::served::Served::start(&config, &[]),
        common::served::Served::start(&config, &[])
    );
    Some((pg, gpu, a, b))
}

/// Two binaries on one PostgreSQL database: a batch created through one is run by both, each
/// line once (the backend ran 60 to their end for 60 lines), its files' contents kept in the
/// database so either serves them.
#[tokio::test]
async fn two_processes_on_one_postgres_run_each_line_of_a_batch_once() {
    let Some((_pg, gpu, a, b)) = two_on_postgres(Duration::from_millis(100), "").await else {
        return;
    };
    let (api_a, api_b) = (Api::new(a.base.clone()), Api::new(b.base.clone()));
    let text = numbered(60, 2);
    let (status, file) = api_a.upload("ann-key", text).await;
    assert_eq!(status, 200, "{file}");
    let (_, created) = api_a.create("ann-key", &file).await;
    let id = created["id"].as_str().unwrap();
    let done = api_b.completed("ann-key", id).await;
    all_answered(&api_a, "ann-key", &done, 60, 2).await;
    all_answered(&api_b, "ann-key", &done, 60, 2).await;
    assert_eq!(
        gpu.recorder().completed(),
        60,
        "each line ran to its end once"
    );
    assert_eq!(chats_with(&gpu, "marker-"), 60, "and was sent once");
    // Both processes ran some of them.
    let ran = |m: String| {
        sample(
            &m,
            r#"switchboard_batch_lines_total{alias="a",client="ann",outcome="completed"}"#,
        )
    };
    let (by_a, by_b) = (
        ran(common::served::metrics_at(&a.base).await),
        ran(common::served::metrics_at(&b.base).await),
    );
    assert_eq!(by_a + by_b, 60.0);
    assert!(by_a > 0.0 && by_b > 0.0, "a ran {by_a}, b ran {by_b}");
}

/// Of two binaries on one PostgreSQL database, one is killed (-9) while it runs lines: the
/// other takes them over once their lease (`batches.lease_ms`) runs out, and the batch
/// completes with each line run to its end once.
#[tokio::test]
async fn the_lines_of_a_process_killed_mid_batch_are_taken_over_by_another_after_their_lease() {
    let Some((_pg, gpu, mut a, b)) =
        two_on_postgres(Duration::from_millis(1500), "lease_ms = 3000\n").await
    else {
        return;
    };
    let api = Api::new(b.base.clone());
    let text = numbered(8, 1);
    let (_, file) = api.upload("ann-key", text).await;
    let (_, created) = api.create("ann-key", &file).await;
    let id = created["id"].as_str().unwrap();
    // Both run two lines: each claim's answer is 1.5 s away.
    until("both processes to run lines", || {
        gpu.recorder().running() == 4
    })
    .await;
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let done = api.completed("ann-key", id).await;
    all_answered(&api, "ann-key", &done, 8, 1).await;
    let cut = gpu.recorder().cancelled();
    assert_eq!(
        cut, 2,
        "the killed process's two lines were cut at the backend"
    );
    assert_eq!(
        gpu.recorder().completed(),
        8,
        "each line ran to its end once"
    );
    assert_eq!(chats_with(&gpu, "marker-"), 8 + cut as usize);
}

/// A backend failing with a 5xx makes a line run again after `retry_after_ms`, up to
/// `line_retries` times, and then go to the error file with the last answer; once the backend
/// answers again, the lines still being retried complete.
#[tokio::test]
async fn lines_a_backend_fails_run_again_up_to_their_retries() {
    keys();
    let gpu = sim(SimConfig {
        fail_status: Some(500),
        ..SimConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("usage.db");
    let bounds = "line_retries = 2\nretry_after_ms = 20\nmax_concurrent = 1";
    let p = proxy(&config(&db, 1, bounds), &[("gpu", gpu.url())]).await;
    let api = Api::new(p.url(""));
    let (_, file) = api.upload("bob-key", numbered(2, 1)).await;
    let (_, b) = api.create("bob-key", &file).await;
    let b = api.completed("bob-key", b["id"].as_str().unwrap()).await;
    assert_eq!(
        b["request_counts"],
        json!({"total": 2, "completed": 0, "failed": 2})
    );
    let errors = api.lines("bob-key", &b["error_file_id"]).await;
    for e in &errors {
        let status = e["response"]["status_code"].as_u64().unwrap();
        assert!((500..600).contains(&status), "{e}");
    }
    let m = p.metrics().await;
    let of = |outcome: &str| {
        let name = format!(
            r#"switchboard_batch_lines_total{{alias="a",client="bob",outcome="{outcome}"}}"#
        );
        sample(&m, &name)
    };
    assert_eq!(
        (of("retried"), of("failed")),
        (4.0, 2.0),
        "each line ran three times"
    );
    // With retries to spare, a backend that recovers completes the batch.
    let bounds = "line_retries = 1000\nretry_after_ms = 20\nmax_concurrent = 1";
    let dir = tempfile::tempdir().unwrap();
    let p = proxy(
        &config(&dir.path().join("usage.db"), 1, bounds),
        &[("gpu", gpu.url())],
    )
    .await;
    let api = Api::new(p.url(""));
    let (_, file) = api.upload("bob-key", numbered(2, 1)).await;
    let (_, b) = api.create("bob-key", &file).await;
    let retried = r#"switchboard_batch_lines_total{alias="a",client="bob",outcome="retried"}"#;
    let failing = async {
        while sample(&p.metrics().await, retried) < 3.0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(BATCH_WAIT, failing).await.unwrap();
    gpu.fail_with(None);
    let b = api.completed("bob-key", b["id"].as_str().unwrap()).await;
    assert_eq!(
        b["request_counts"],
        json!({"total": 2, "completed": 2, "failed": 0})
    );
}

/// A batch's lines are charged to their client's budgets like its other requests: once bob's
/// day is spent, his own request and his lines are refused alike, and the lines wait for the
/// day's reset (the refusal's `Retry-After`) without counting against their retries; none goes
/// to the error file.
#[tokio::test]
async fn lines_spend_their_clients_day_and_wait_for_its_reset_once_it_is_spent() {
    keys();
    let gpu = sim(SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("usage.db");
    // A zone where it is about noon: the day's reset is hours away whenever the test runs.
    let hour = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 3600
        % 24;
    let ahead = 12 - hour as i64;
    let zone = match ahead {
        0 => "Etc/GMT".to_string(),
        // Etc/GMT-3 is three hours ahead of UTC.
        a => format!("Etc/GMT{:+}", -a),
    };
    let cfg = config(&db, 1, "max_concurrent = 1")
        .replace(
            "[server]\n",
            &format!("[server]\nbudget_timezone = \"{zone}\"\n"),
        )
        .replace(
            "key_env = \"SB_T_BATCH_BOB\"\n",
            "key_env = \"SB_T_BATCH_BOB\"\ntokens_per_day = 30\n",
        );
    let p = proxy(&cfg, &[("gpu", gpu.url())]).await;
    let api = Api::new(p.url(""));
    let (_, file) = api.upload("bob-key", numbered(8, 1)).await;
    let (status, b) = api.create("bob-key", &file).await;
    assert_eq!(status, 200, "{b}");
    let id = b["id"].as_str().unwrap().to_string();
    let deferred = "switchboard_batch_lines_total{alias=\"a\",client=\"bob\",outcome=\"deferred\"}";
    within("a line deferred on the spent day", async {
        while sample(&p.metrics().await, deferred) < 1.0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    // bob's own request meets the same spent day.
    let r = client()
        .post(p.url("/v1/chat/completions"))
        .bearer_auth("bob-key")
        .json(&json!({"model": "a", "max_tokens": 3,
                      "messages": [{"role": "user", "content": "mine"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let retry_after: i64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry_after > 3600, "the reset is hours away: {retry_after}");
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "insufficient_quota", "{e}");

    let (_, b) = api.get("bob-key", &format!("/v1/batches/{id}")).await;
    assert_eq!(b["status"], "in_progress", "{b}");
    let done = b["request_counts"]["completed"].as_i64().unwrap();
    assert!((1..8).contains(&done), "{b}");
    assert_eq!(b["request_counts"]["failed"], 0, "{b}");
    // Each line refused waits for the reset, its retries untouched.
    let c = rusqlite::Connection::open(&db).unwrap();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let (waiting, soonest, attempts): (i64, i64, i64) = c
        .query_row(
            "SELECT count(*), min(not_before), max(attempts) FROM batch_lines \
             WHERE batch_id = ?1 AND state = 'pending' AND not_before > 0",
            [&id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert!(waiting >= 1);
    assert!(soonest > now_ms + 3_600_000, "{soonest} vs {now_ms}");
    assert_eq!(attempts, 0);
    // What the lines were charged is the day's spending.
    let charged: i64 = c
        .query_row(
            "SELECT sum(charged_tokens) FROM requests WHERE client = 'bob' AND status = 200",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(charged > 0 && charged <= 30, "{charged}");
}

/// The usage `key` reads at `/v1/usage` for the last hour: its requests, all buckets summed.
async fn usage_of(api: &Api, key: &str) -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 3600;
    let path = format!("/v1/usage?start_time={since}&bucket_width=1m&limit=61");
    let (status, page) = api.get(key, &path).await;
    assert_eq!(status, 200, "{page}");
    let buckets = page["data"].as_array().unwrap();
    let results = buckets
        .iter()
        .flat_map(|b| b["results"].as_array().unwrap());
    results
        .map(|r| r["num_model_requests"].as_i64().unwrap())
        .sum()
}

/// Each key of `server.api_keys_env` owns its own files, batches and their output, named in
/// the database by a hash of the key (never the key): another key's ids are 404s as if they
/// did not exist, its lists are empty, the status page shows it none of them, and each key's
/// `/v1/usage` is its own requests. Both keys stay the one client `anonymous` of the limits
/// and metrics.
#[tokio::test]
async fn each_key_of_api_keys_env_owns_its_files_batches_and_usage() {
    std::env::set_var("SB_T_BATCH_KEYS", "key-one,key-two");
    std::env::set_var("SB_T_BATCH_ADMIN", "admin-key");
    let gpu = sim(SimConfig {
        ttft: Duration::from_millis(500),
        ..SimConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("usage.db");
    let toml = format!(
        "[server]\napi_keys_env = \"SB_T_BATCH_KEYS\"\nadmin_keys_env = \"SB_T_BATCH_ADMIN\"\n\
         [backends.gpu]\nurl = \"{{gpu}}\"\nflavor = \"llamacpp\"\n[aliases.a]\nbackend = \"gpu\"\n\
         [ledger]\nurl = \"sqlite://{}\"\nbatch_interval_ms = 10\n",
        db.display()
    );
    let p = proxy(&toml, &[("gpu", gpu.url())]).await;
    let api = Api::new(p.url(""));
    let (status, file) = api.upload("key-one", numbered(2, 1)).await;
    assert_eq!(status, 200, "{file}");
    let (status, b) = api.create("key-one", &file).await;
    assert_eq!(status, 200, "{b}");
    let id = b["id"].as_str().unwrap();
    // While it runs, the status page lists it to its key, not to the other.
    let page = |key: &'static str| {
        let r = api.c.get(format!("{}/", api.base)).bearer_auth(key).send();
        async move { r.await.unwrap().text().await.unwrap() }
    };
    let listed = async {
        while !page("key-one").await.contains(id) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(BATCH_WAIT, listed).await.unwrap();
    assert!(!page("key-two").await.contains(id));
    let done = api.completed("key-one", id).await;
    all_answered(&api, "key-one", &done, 2, 1).await;

    let output = done["output_file_id"].as_str().unwrap();
    let input = file["id"].as_str().unwrap();
    for path in [
        format!("/v1/files/{input}"),
        format!("/v1/files/{input}/content"),
        format!("/v1/files/{output}/content"),
        format!("/v1/batches/{id}"),
    ] {
        let r = api
            .c
            .get(format!("{}{path}", api.base))
            .bearer_auth("key-two");
        let r = r.send().await.unwrap();
        assert_eq!(r.status(), 404, "key-two reads {path}");
    }
    let cancel = format!("/v1/batches/{id}/cancel");
    assert_eq!(api.post("key-two", &cancel, &json!({})).await.0, 404);
    let r = api.c.delete(format!("{}/v1/files/{input}", api.base));
    assert_eq!(r.bearer_auth("key-two").send().await.unwrap().status(), 404);
    assert_eq!(api.get("key-two", "/v1/files").await.1["data"], json!([]));
    assert_eq!(api.get("key-two", "/v1/batches").await.1["data"], json!([]));
    assert_eq!(
        api.get("key-one", &format!("/v1/files/{input}")).await.0,
        200
    );
    assert_eq!(
        api.get("admin-key", &format!("/v1/batches/{id}")).await.0,
        200
    );

    // The owner the database holds is a hash of the key, the same for its files and batch.
    let c = rusqlite::Connection::open(&db).unwrap();
    let owners: Vec<String> = c
        .prepare("SELECT client FROM batch_files UNION SELECT client FROM batches")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(owners.len(), 1, "{owners:?}");
    let hex = owners[0].strip_prefix("key-").unwrap_or_default();
    assert!(
        hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
        "{owners:?}"
    );

    // Usage: the batch's two lines are key-one's, a chat of key-two's is its own.
    let chat = api.c.post(format!("{}/v1/chat/completions", api.base));
    let r = chat
        .bearer_auth("key-two")
        .json(&common::chat("a", false))
        .send();
    assert_eq!(r.await.unwrap().status(), 200);
    let all = async {
        while usage_of(&api, "admin-key").await < 3 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(BATCH_WAIT, all).await.unwrap();
    assert_eq!(usage_of(&api, "key-one").await, 2);
    assert_eq!(usage_of(&api, "key-two").await, 1);
    // One client of the limits and metrics.
    let m = p.metrics().await;
    let lines =
        r#"switchboard_batch_lines_total{alias="a",client="anonymous",outcome="completed"}"#;
    assert_eq!(sample(&m, lines), 2.0, "{m}");
}
