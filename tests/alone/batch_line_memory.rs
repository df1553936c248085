//! A batch line over `server.body_limit_bytes` fails its batch's validation like any request
//! over the limit, and costs no more memory than the input file it is in: it is never copied
//! out of the file, stored or sent. The bytes the process holds are counted by the test
//! binary's allocator (`tests/alone`, one test at a time), so no other test's allocations are
//! counted with them.

use crate::common;

use common::batch_api::{chat_line, Api};
use common::*;
use peak_alloc::PeakAlloc;
use serde_json::json;
use switchboard_sim::SimConfig;

/// The test binary's allocator: the system's, counting what it holds.
#[global_allocator]
static HELD: PeakAlloc = PeakAlloc;

const BODY_LIMIT: usize = 1 << 20;

#[tokio::test]
async fn a_batch_line_over_the_body_limit_fails_validation_and_is_never_copied() {
    let _one = crate::ONE_AT_A_TIME.lock().await;
    std::env::set_var("SB_T_MEMORY_ANN", "ann-key");
    let gpu = sim(SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[server]\nbody_limit_bytes = {BODY_LIMIT}\n[backends.gpu]\nurl = \"{{gpu}}\"\n\
         flavor = \"llamacpp\"\nslots = 1\n[aliases.a]\nbackend = \"gpu\"\n[clients.ann]\n\
         key_env = \"SB_T_MEMORY_ANN\"\n[ledger]\nurl = \"sqlite://{}\"\nbatch_interval_ms = 10\n",
        dir.path().join("usage.db").display()
    );
    let p = proxy(&config, &[("gpu", gpu.url())]).await;
    let api = Api::new(p.url(""));
    // Its second line is 32 times the body limit.
    let huge = json!({"custom_id": "huge", "method": "POST", "url": "/v1/chat/completions",
                      "body": {"model": "a", "max_tokens": 3,
                               "messages": [{"role": "user", "content": "x".repeat(32 * BODY_LIMIT)}]}})
    .to_string();
    let size = huge.len();
    let text = [chat_line("first", "a", 3), huge, chat_line("last", "a", 3)].join("\n");
    let (status, file) = api.upload("ann-key", text).await;
    assert_eq!(status, 200, "{file}");

    HELD.reset_peak_usage();
    let before = HELD.current_usage();
    let (status, b) = api.create("ann-key", &file).await;
    assert_eq!(status, 200, "{b}");
    let id = b["id"].as_str().unwrap();
    let b = api
        .until("ann-key", id, |b| {
            ["failed", "completed"].contains(&b["status"].as_str().unwrap_or_default())
        })
        .await;
    let grown = HELD.peak_usage() - before;
    eprintln!("a line of {size} bytes: {grown} bytes more held at the peak");
    // The input file is read whole once; a copy of the line more would pass this.
    assert!(
        grown < size * 3 / 2,
        "validating a batch with a line of {size} bytes held {grown} bytes more at its peak"
    );
    assert_eq!(b["status"], "failed", "{b}");
    let errors = &b["errors"]["data"];
    assert_eq!(errors.as_array().map(Vec::len), Some(1), "{b}");
    assert_eq!(errors[0]["code"], "request_too_large", "{b}");
    assert_eq!(errors[0]["line"], 2, "{b}");
    assert_eq!(errors[0]["param"], "body", "{b}");
    let message = errors[0]["message"].as_str().unwrap();
    assert!(message.contains(&BODY_LIMIT.to_string()), "{message}");
    assert_eq!(gpu.recorder().received(), 0, "nothing of the batch ran");
}
