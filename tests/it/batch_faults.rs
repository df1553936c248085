//! The Files and Batch APIs under faults, against the built binary: a form field far larger
//! than the memory the process may take, an upload that fails part way (the disk refuses its
//! file, its client goes away), and PostgreSQL stopped and started under a running proxy.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::batch_api::Api;
use common::served::{metrics_at, Served};
use common::*;
use serde_json::{json, Value};
use switchboard_sim::SimConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MIB: u64 = 1 << 20;

/// A proxy's config: one key (`SB_T_FAULT_KEYS`), one alias on `gpu`, its ledger at `ledger`.
fn config(gpu: &str, ledger: &str, batches: &str) -> String {
    format!(
        "[server]\napi_keys_env = \"SB_T_FAULT_KEYS\"\n[backends.gpu]\nurl = \"{gpu}\"\n\
         flavor = \"llamacpp\"\n[aliases.a]\nbackend = \"gpu\"\n[ledger]\nurl = \"{ledger}\"\n\
         batch_interval_ms = 10\n[batches]\n{batches}\n"
    )
}

const KEYS: [(&str, &str); 1] = [("SB_T_FAULT_KEYS", "k1")];

/// A chat line of a batch input file.
fn line(id: &str) -> String {
    json!({"custom_id": id, "method": "POST", "url": "/v1/chat/completions",
           "body": {"model": "a", "max_tokens": 3,
                    "messages": [{"role": "user", "content": format!("marker-{id}")}]}})
    .to_string()
}

/// A part's head in a form whose boundary is `XX`.
fn part(name: &str, file: bool) -> String {
    let filename = if file { "; filename=\"in.jsonl\"" } else { "" };
    format!("--XX\r\ncontent-disposition: form-data; name=\"{name}\"{filename}\r\n\r\n")
}

const END: &str = "\r\n--XX--\r\n";

/// `POST /v1/files` with key `k1` over a socket of its own: its body of `length` bytes written
/// piece by piece (each piece made as it is sent) until the proxy answers or stops reading.
/// The answer's status and JSON body, or `None` when the connection ended without one.
async fn post_form(
    base: &str,
    length: u64,
    pieces: impl Iterator<Item = Vec<u8>> + Send + 'static,
) -> Option<(u16, Value)> {
    let tcp = tokio::net::TcpStream::connect(base.trim_start_matches("http://"))
        .await
        .unwrap();
    let (mut rd, mut wr) = tcp.into_split();
    let head = format!(
        "POST /v1/files HTTP/1.1\r\nhost: x\r\nauthorization: Bearer k1\r\n\
         content-type: multipart/form-data; boundary=XX\r\ncontent-length: {length}\r\n\r\n"
    );
    let writer = tokio::spawn(async move {
        wr.write_all(head.as_bytes()).await?;
        for p in pieces {
            wr.write_all(&p).await?;
        }
        Ok::<_, std::io::Error>(wr)
    });
    let mut raw = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let answer = loop {
        match rd.read(&mut buf).await {
            Ok(0) | Err(_) => break None,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
        }
        let text = String::from_utf8_lossy(&raw).into_owned();
        let Some((head, body)) = text.split_once("\r\n\r\n") else {
            continue;
        };
        let len: usize = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse().unwrap())
            })
            .unwrap_or(0);
        if body.len() >= len {
            let status = head[9..12].parse().unwrap();
            break Some((status, serde_json::from_str(&body[..len]).unwrap()));
        }
    };
    writer.abort();
    answer
}

/// The address space of `s`'s process capped at 512 MiB more than it holds now.
fn capped(s: &Served) {
    let pid = s.child.id();
    let cap = address_space(pid) + 512 * MIB;
    let set = std::process::Command::new("prlimit")
        .args(["--pid", &pid.to_string(), &format!("--as={cap}")])
        .status()
        .unwrap();
    assert!(set.success());
}

/// `n` pieces of 1 MiB of `byte`.
fn mebibytes(n: u64, byte: u8) -> impl Iterator<Item = Vec<u8>> + Send + 'static {
    (0..n).map(move |_| vec![byte; MIB as usize])
}

/// The process's address space now (`VmSize`), in bytes.
fn address_space(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .map(|v| v.trim().trim_end_matches("kB").trim().parse().unwrap())
        .unwrap();
    kib * 1024
}

/// The envelope of an answer: OpenAI's, with its `code`.
fn code(e: &Value) -> &str {
    assert!(e["error"]["message"].is_string(), "{e}");
    assert!(e["error"]["type"].is_string(), "{e}");
    e["error"]["code"].as_str().unwrap()
}

/// A proxy whose address space may grow by 512 MiB (`RLIMIT_AS`, set on the running process):
/// a `purpose` field of 2 GiB is refused with a 413 in OpenAI's envelope once it passes its
/// small bound, the process lives on and serves the next upload; a form of many small fields
/// is bounded as a whole.
#[tokio::test]
async fn a_form_field_far_past_the_memory_cap_is_refused_and_the_proxy_serves_on() {
    let gpu = sim(SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let ledger = format!("sqlite://{}", dir.path().join("usage.db").display());
    let cfg = config(&gpu.url(), &ledger, "max_file_bytes = 1048576");
    let mut s = Served::start(&cfg, &KEYS).await;
    capped(&s);

    let head = part("purpose", false);
    let huge = 2048 * MIB;
    let length = head.len() as u64 + huge + END.len() as u64;
    let pieces = std::iter::once(head.into_bytes())
        .chain(mebibytes(huge / MIB, b'b'))
        .chain(std::iter::once(END.as_bytes().to_vec()));
    let answered =
        tokio::time::timeout(Duration::from_secs(300), post_form(&s.base, length, pieces))
            .await
            .expect("the huge field's answer");
    let Some((status, e)) = answered else {
        let mut exited = None;
        until("the proxy's end", || {
            exited = s.child.try_wait().unwrap();
            exited.is_some()
        })
        .await;
        let log = s.log();
        let tail = &log[log.len().saturating_sub(300)..];
        panic!("no answer: the proxy ended ({exited:?}) with {tail}");
    };
    assert_eq!((status, code(&e)), (413, "request_too_large"), "{e}");
    let exited = s.child.try_wait().unwrap();
    assert!(exited.is_none(), "the proxy exited: {exited:?}");

    // Another request still works: an upload of a small file.
    let api = Api::new(s.base.clone());
    let (status, file) = api.upload("k1", line("l0")).await;
    assert_eq!(status, 200, "{file}");

    // A body that is no form is told so in the envelope.
    let r = api.c.post(format!("{}/v1/files", s.base)).bearer_auth("k1");
    let r = r.json(&json!({"purpose": "batch"})).send().await.unwrap();
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert_eq!(code(&e), "invalid_request", "{e}");

    // Many fields, each small, past the whole form's bound (max_file_bytes and its heads).
    let fields: Vec<u8> = (0..2000)
        .flat_map(|i| {
            format!("{}{}\r\n", part(&format!("x{i}"), false), "y".repeat(1000)).into_bytes()
        })
        .collect();
    let form = [
        part("purpose", false) + "batch\r\n",
        String::from_utf8(fields).unwrap(),
    ]
    .concat()
        + &part("file", true)
        + &line("l1")
        + END;
    let length = form.len() as u64;
    let (status, e) = post_form(&s.base, length, std::iter::once(form.into_bytes()))
        .await
        .unwrap();
    assert_eq!((status, code(&e)), (413, "request_too_large"), "{e}");
    assert!(s.child.try_wait().unwrap().is_none());
}

/// The `.part` files in `dir`.
fn parts(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".part"))
        .collect()
}

/// An upload whose file the disk refuses part way (the process may write files of 2 MiB at
/// most, `RLIMIT_FSIZE`, and ignores `SIGXFSZ`) is answered with an error in OpenAI's envelope
/// and leaves no `.part` file; nor does one whose client goes away mid-file; neither is listed.
#[tokio::test]
async fn a_failed_upload_leaves_no_part_file_whatever_the_failure() {
    let gpu = sim(SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let files = dir.path().join("files");
    let ledger = format!("sqlite://{}", dir.path().join("usage.db").display());
    let cfg = config(&gpu.url(), &ledger, "max_file_bytes = 16777216");
    let launcher = [
        "sh",
        "-c",
        "trap '' XFSZ; exec prlimit --fsize=2097152 -- \"$@\"",
        "sh",
    ];
    let s = Served::start_under(&cfg, &KEYS, &launcher).await;

    // The disk refuses the file's third MiB.
    let (head, body) = (
        part("purpose", false) + "batch\r\n" + &part("file", true),
        4 * MIB,
    );
    let length = head.len() as u64 + body + END.len() as u64;
    let pieces = std::iter::once(head.clone().into_bytes())
        .chain(mebibytes(body / MIB, b'z'))
        .chain(std::iter::once(END.as_bytes().to_vec()));
    let (status, e) = within(
        "the refused upload's answer",
        post_form(&s.base, length, pieces),
    )
    .await
    .expect("an answer");
    assert!(status >= 500, "{status} {e}");
    code(&e);
    assert_eq!(parts(&files), Vec::<String>::new(), "a .part file is left");

    // The client goes away after 1 MiB of its file.
    let mut tcp = tokio::net::TcpStream::connect(s.base.trim_start_matches("http://"))
        .await
        .unwrap();
    let start = format!(
        "POST /v1/files HTTP/1.1\r\nhost: x\r\nauthorization: Bearer k1\r\n\
         content-type: multipart/form-data; boundary=XX\r\ncontent-length: {length}\r\n\r\n{head}"
    );
    tcp.write_all(start.as_bytes()).await.unwrap();
    tcp.write_all(&vec![b'z'; MIB as usize]).await.unwrap();
    until("the upload's .part file", || !parts(&files).is_empty()).await;
    drop(tcp);
    until("the .part file gone with its client", || {
        parts(&files).is_empty()
    })
    .await;

    let (status, listed) = Api::new(s.base.clone()).get("k1", "/v1/files").await;
    assert_eq!((status, &listed["data"]), (200, &json!([])), "{listed}");
}

/// PostgreSQL stopped and started again under a running proxy: while it is down the Files and
/// Batch APIs answer 503 in OpenAI's envelope and `switchboard_batch_db_up` is 0; once it is
/// back they reconnect (as the usage ledger does): the file uploaded before is served, a batch
/// over it runs to completed, the gauge is 1 again and the log says both.
#[tokio::test]
async fn after_postgresql_restarts_the_files_and_batch_apis_reconnect() {
    let Some(pg) = common::postgres::Postgres::start() else {
        return;
    };
    let gpu = sim(SimConfig::default()).await;
    let s = Served::start(&config(&gpu.url(), &pg.url(), ""), &KEYS).await;
    let api = Api::new(s.base.clone());
    let (status, file) = api.upload("k1", line("l0") + "\n" + &line("l1")).await;
    assert_eq!(status, 200, "{file}");
    let up = || async { sample(&metrics_at(&s.base).await, "switchboard_batch_db_up") };

    pg.stop();
    let (status, e) = api.get("k1", "/v1/files").await;
    assert_eq!((status, code(&e)), (503, "ledger_unavailable"), "{e}");
    assert_eq!(up().await, 0.0);

    pg.ctl_start();
    let path = format!("/v1/files/{}", file["id"].as_str().unwrap());
    let back = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if api.get("k1", &path).await.0 == 200 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    back.await
        .expect("the Files API answers within 60 s of PostgreSQL's restart");
    let (status, b) = api.create("k1", &file).await;
    assert_eq!(status, 200, "{b}");
    let done = api.completed("k1", b["id"].as_str().unwrap()).await;
    assert_eq!(done["request_counts"]["completed"], 2, "{done}");
    assert_eq!(up().await, 1.0);
    let log = s.log();
    assert!(
        log.contains("Batch API: the ledger's database failed"),
        "{log}"
    );
    assert!(
        log.contains("Batch API: the ledger's database answers again"),
        "{log}"
    );
}

#[tokio::test]
async fn a_batch_line_far_past_the_body_limit_fails_validation_under_a_memory_cap() {
    let gpu = sim(SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let ledger = format!("sqlite://{}", dir.path().join("usage.db").display());
    let cfg = config(&gpu.url(), &ledger, "max_file_bytes = 1073741824")
        .replace("[server]\n", "[server]\nbody_limit_bytes = 1048576\n");
    let mut s = Served::start(&cfg, &KEYS).await;
    capped(&s);

    // One line of 300 MiB (its body 300 times the limit), then a line of its own size.
    let big = 300 * MIB;
    let (open, close) = (
        r#"{"custom_id":"big","method":"POST","url":"/v1/chat/completions","body":{"model":"a","messages":[{"role":"user","content":""#,
        "\"}]}}\n",
    );
    let head = part("purpose", false) + "batch\r\n" + &part("file", true) + open;
    let tail = format!("{close}{}{END}", line("small"));
    let length = head.len() as u64 + big + tail.len() as u64;
    let pieces = std::iter::once(head.into_bytes())
        .chain(mebibytes(big / MIB, b'x'))
        .chain(std::iter::once(tail.into_bytes()));
    let (status, file) = post_form(&s.base, length, pieces).await.expect("an answer");
    assert_eq!(status, 200, "{file}");
    let api = Api::new(s.base.clone());
    let (status, batch) = api.create("k1", &file).await;
    assert_eq!(status, 200, "{batch}");
    let id = batch["id"].as_str().unwrap().to_string();
    let ended = api.until("k1", &id, |b| b["status"] != "validating").await;
    let exited = s.child.try_wait().unwrap();
    assert!(exited.is_none(), "the proxy exited: {exited:?}");
    assert_eq!(ended["status"], "failed", "{ended}");
    assert_eq!(
        ended["errors"]["data"][0]["code"], "request_too_large",
        "{ended}"
    );
    assert_eq!(ended["errors"]["data"][0]["line"], 1, "{ended}");
}
