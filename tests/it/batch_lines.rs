//! A batch's lines as requests of the proxy: held to intake's limits as they are when they
//! run, taking no place of their client's `max_concurrent`, and their results held back by no
//! upload or download (one held at the database, then a kill -9 and a restart; one held at
//! the file system).

use crate::common;

use std::time::Duration;

use common::batch_api::{chat_lines, ids, Api};
use common::postgres::Postgres;
use common::served::Served;
use common::*;
use serde_json::json;
use switchboard_proxy::live::AppState;
use switchboard_sim::SimConfig;

fn keys() {
    std::env::set_var("SB_T_LINES_ANN", "ann-key");
    std::env::set_var("SB_T_LINES_BOB", "bob-key");
}

/// Clients `ann` (at most two requests at once) and `bob`, alias `a` on backend `gpu` of
/// `slots` slots at `gpu`, the ledger at `ledger`, and `[batches]` `batches`.
fn config(gpu: &str, slots: u32, ledger: &str, batches: &str) -> String {
    format!(
        "[backends.gpu]\nurl = \"{gpu}\"\nflavor = \"llamacpp\"\nslots = {slots}\n\
         [aliases.a]\nbackend = \"gpu\"\n\
         [clients.ann]\nkey_env = \"SB_T_LINES_ANN\"\nmax_concurrent = 2\n\
         [clients.bob]\nkey_env = \"SB_T_LINES_BOB\"\n\
         [ledger]\nurl = \"{ledger}\"\nbatch_interval_ms = 10\n[batches]\n{batches}\n"
    )
}

/// A line stored while the body limit let it through is held to the limit as it is when it
/// runs: past a limit lowered since (a reload), it gets intake's 413 in the error file and
/// never reaches the backend.
#[tokio::test]
async fn a_line_past_a_body_limit_lowered_since_its_validation_fails_with_413() {
    keys();
    let gpu = sim(SimConfig {
        ttft: Duration::from_millis(1000),
        ..SimConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let ledger = format!("sqlite://{}", dir.path().join("usage.db").display());
    let path = dir.path().join("routes.toml");
    let toml = |limit: usize| {
        let rest = config(&gpu.url(), 1, &ledger, "max_concurrent = 1");
        format!("[server]\nbody_limit_bytes = {limit}\n{rest}")
    };
    std::fs::write(&path, toml(1 << 20)).unwrap();
    let cfg = switchboard_proxy::config::load(&path).unwrap();
    let p = start(AppState::new(cfg, Some(path.clone())).unwrap()).await;
    let api = Api::new(p.url(""));
    let big = json!({"custom_id": "big", "method": "POST", "url": "/v1/chat/completions",
                     "body": {"model": "a", "max_tokens": 3, "messages": [
                         {"role": "user", "content": format!("marker-big {}", "x".repeat(2000))}]}});
    let text = format!("{}{big}\n", chat_lines(1, "a"));
    let (_, file) = api.upload("bob-key", text).await;
    let (status, b) = api.create("bob-key", &file).await;
    assert_eq!(status, 200, "{b}");
    until("the first line to reach the backend", || {
        gpu.recorder().running() == 1
    })
    .await;
    std::fs::write(&path, toml(1000)).unwrap();
    switchboard_proxy::live::reload::reload(&p.state)
        .await
        .unwrap();
    let b = api.completed("bob-key", b["id"].as_str().unwrap()).await;
    assert_eq!(
        b["request_counts"],
        json!({"total": 2, "completed": 1, "failed": 1}),
        "{b}"
    );
    let errors = api.lines("bob-key", &b["error_file_id"]).await;
    assert_eq!(ids(&errors), ["big"]);
    let response = &errors[0]["response"];
    assert_eq!(response["status_code"], 413, "{response}");
    assert_eq!(response["body"]["error"]["code"], "request_too_large");
    assert_eq!(
        chats_with(&gpu, "marker-big"),
        0,
        "the backend never saw it"
    );
}

/// While lines of ann's batch wait for the one slot, as many requests of her own as her
/// `max_concurrent` allows are served at once: her batch holds none of those places (its lines
/// are bounded by `[batches]`), and the person's requests take the slot from the lines.
#[tokio::test]
async fn a_batch_takes_no_place_of_its_clients_max_concurrent() {
    keys();
    let gpu = sim(SimConfig {
        ttft: Duration::from_millis(300),
        ..SimConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let ledger = format!("sqlite://{}", dir.path().join("usage.db").display());
    let batches = "max_concurrent = 4\nmax_concurrent_per_client = 4";
    let p = proxy(&config(&gpu.url(), 1, &ledger, batches), &[]).await;
    let api = Api::new(p.url(""));
    let (_, file) = api.upload("ann-key", chat_lines(8, "a")).await;
    let (status, b) = api.create("ann-key", &file).await;
    assert_eq!(status, 200, "{b}");
    let queued = r#"switchboard_queued_requests{alias="a"}"#;
    within("a line to run and another to wait for the slot", async {
        while gpu.recorder().running() != 1 || sample(&p.metrics().await, queued) < 1.0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let ask = || {
        let r = api.c.post(p.url("/v1/chat/completions"));
        r.bearer_auth("ann-key").json(&chat("a", false)).send()
    };
    let (first, second) = within("ann's answers", async { tokio::join!(ask(), ask()) }).await;
    let statuses = [first.unwrap(), second.unwrap()].map(|r| r.status().as_u16());
    assert_eq!(statuses, [200, 200], "ann's own requests beside her batch");
    let done = api.completed("ann-key", b["id"].as_str().unwrap()).await;
    assert_eq!(
        done["request_counts"],
        json!({"total": 8, "completed": 8, "failed": 0}),
        "{done}"
    );
}

/// Lines of the batch `id` whose result is committed, read from the PostgreSQL database at
/// `url` by a session of the test's own.
async fn committed(url: &str, id: &str) -> i64 {
    let (url, id) = (url.to_string(), id.to_string());
    tokio::task::spawn_blocking(move || {
        let mut c = ::postgres::Client::connect(&url, ::postgres::NoTls).unwrap();
        let sql = "SELECT count(*) FROM batch_lines WHERE batch_id = $1 AND state = 'done'";
        c.query_one(sql, &[&id]).unwrap().get::<_, i64>(0)
    })
    .await
    .unwrap()
}

/// Sessions of the database at `url` waiting for a lock to write a file's content.
async fn uploads_waiting(url: &str) -> i64 {
    let url = url.to_string();
    tokio::task::spawn_blocking(move || {
        let mut c = ::postgres::Client::connect(&url, ::postgres::NoTls).unwrap();
        let sql = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                   AND query LIKE 'INSERT INTO batch_file_contents%'";
        c.query_one(sql, &[]).unwrap().get::<_, i64>(0)
    })
    .await
    .unwrap()
}

/// The table an upload writes its content to, locked by a session of the test's own until the
/// sender returned is dropped: an upload then waits at the database for as long as the test
/// wants, as a large one does while it is written.
fn hold_uploads(url: &str) -> std::sync::mpsc::Sender<()> {
    let url = url.to_string();
    let (locked, is_locked) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let mut c = ::postgres::Client::connect(&url, ::postgres::NoTls).unwrap();
        let mut tx = c.transaction().unwrap();
        tx.batch_execute("LOCK TABLE batch_file_contents IN ACCESS EXCLUSIVE MODE")
            .unwrap();
        locked.send(()).unwrap();
        let _ = released.recv();
        drop(tx);
    });
    is_locked.recv().unwrap();
    release
}

/// While another client's upload waits at the database, the lines answered meanwhile are
/// committed: after a kill -9 and a restart none of them runs again, and the backend ran each
/// line of the batch to its end once (the lines cut by the kill were cancelled there).
#[tokio::test]
async fn an_upload_held_at_the_database_holds_back_no_lines_result_through_a_kill() {
    let Some(pg) = Postgres::start() else {
        return;
    };
    keys();
    // Each line takes 1.5 s at the backend, two at once: the kill comes well inside one.
    let gpu = sim(SimConfig {
        ttft: Duration::from_millis(1500),
        slots: 2,
        ..SimConfig::default()
    })
    .await;
    let config = config(
        &gpu.url(),
        2,
        &pg.url(),
        "max_concurrent = 2\nlease_ms = 3000",
    );
    let first = Served::start(&config, &[]).await;
    let api = Api::new(first.base.clone());
    let (_, file) = api.upload("ann-key", chat_lines(8, "a")).await;
    let (_, b) = api.create("ann-key", &file).await;
    let id = b["id"].as_str().unwrap().to_string();
    api.until("ann-key", &id, |b| {
        b["request_counts"]["completed"].as_i64() >= Some(2)
    })
    .await;
    let release = hold_uploads(&pg.url());
    let upload = reqwest::multipart::Form::new()
        .text("purpose", "batch")
        .part(
            "file",
            reqwest::multipart::Part::bytes(chat_lines(1, "a").into_bytes()).file_name("in.jsonl"),
        );
    let upload = api
        .c
        .post(format!("{}/v1/files", api.base))
        .bearer_auth("bob-key")
        .multipart(upload)
        .send();
    let upload = tokio::spawn(upload);
    within("bob's upload to wait at the database", async {
        while uploads_waiting(&pg.url()).await == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let held_at = committed(&pg.url(), &id).await;
    within(
        "lines answered while the upload waits to be committed",
        async {
            while committed(&pg.url(), &id).await < held_at + 2 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        },
    )
    .await;
    // The next two lines are at the backend now, a second and more from their end.
    until("the next lines to reach the backend", || {
        gpu.recorder().running() == 2
    })
    .await;
    let mut first = first;
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    drop(release);
    assert!(upload.await.unwrap().is_err(), "bob's upload died with it");
    until("the cut lines to end at the backend", || {
        gpu.recorder().running() == 0
    })
    .await;
    let cut = gpu.recorder().cancelled();
    assert_eq!(cut, 2, "the two lines running were cut by the kill");
    let second = Served::start(&config, &[]).await;
    let api = Api::new(second.base.clone());
    let done = api.completed("ann-key", &id).await;
    assert_eq!(
        done["request_counts"],
        json!({"total": 8, "completed": 8, "failed": 0}),
        "{done}"
    );
    let out = api.lines("ann-key", &done["output_file_id"]).await;
    let want: Vec<String> = (0..8).map(|i| format!("l{i}")).collect();
    assert_eq!(ids(&out), want);
    assert_eq!(
        gpu.recorder().completed(),
        8,
        "each line ran to its end once"
    );
    for i in 0..8 {
        let marker = format!("\"marker-l{i}\"");
        assert!(chats_with(&gpu, &marker) <= 2, "{marker}");
    }
    assert_eq!(chats_with(&gpu, "marker-"), 8 + cut as usize);
}

/// Lines of the batch `id` whose result is committed, read from the SQLite file `db`.
fn committed_in(db: &std::path::Path, id: &str) -> i64 {
    let c = rusqlite::Connection::open(db).unwrap();
    let sql = "SELECT count(*) FROM batch_lines WHERE batch_id = ?1 AND state = 'done'";
    c.query_row(sql, [id], |r| r.get(0)).unwrap()
}

/// On a SQLite ledger, a download held at the file system (its file made a FIFO the test opens
/// for writing and writes nothing to, as a large file read whole holds the reader) holds back
/// no line's result.
#[tokio::test]
async fn a_download_held_at_the_file_system_holds_back_no_lines_result() {
    use std::os::unix::fs::OpenOptionsExt;
    keys();
    let gpu = sim(SimConfig {
        ttft: Duration::from_millis(300),
        ..SimConfig::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("usage.db");
    let ledger = format!("sqlite://{}", db.display());
    let p = proxy(&config(&gpu.url(), 1, &ledger, "max_concurrent = 1"), &[]).await;
    let api = Api::new(p.url(""));
    let (_, held) = api.upload("bob-key", chat_lines(1, "a")).await;
    let held = held["id"].as_str().unwrap().to_string();
    let fifo = dir.path().join("files").join(&held);
    std::fs::remove_file(&fifo).unwrap();
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    assert!(made.unwrap().success());
    let (_, file) = api.upload("ann-key", chat_lines(8, "a")).await;
    let (_, b) = api.create("ann-key", &file).await;
    let id = b["id"].as_str().unwrap().to_string();
    api.until("ann-key", &id, |b| {
        b["request_counts"]["completed"].as_i64() >= Some(1)
    })
    .await;
    let download = api
        .c
        .get(format!("{}/v1/files/{held}/content", api.base))
        .bearer_auth("bob-key")
        .send();
    let download = tokio::spawn(download);
    // Once the download has the FIFO open to read, a writer may open it without waiting.
    let writer = within("the download to open its file", async {
        loop {
            let mut open = std::fs::OpenOptions::new();
            match open.write(true).custom_flags(libc::O_NONBLOCK).open(&fifo) {
                Ok(w) => return w,
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    })
    .await;
    let held_at = committed_in(&db, &id);
    within(
        "lines answered while the download is held to be committed",
        async {
            while committed_in(&db, &id) < held_at + 2 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
    drop(writer);
    let r = within("the download's answer", download).await.unwrap();
    assert_eq!(r.unwrap().status(), 200);
    let done = api.completed("ann-key", &id).await;
    assert_eq!(
        done["request_counts"],
        json!({"total": 8, "completed": 8, "failed": 0}),
        "{done}"
    );
}
