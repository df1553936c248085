//! Issue 2: the `switchboard` binary's config commands and exit codes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn switchboard() -> Command {
    Command::new(env!("CARGO_BIN_EXE_switchboard"))
}

fn write(dir: &tempfile::TempDir, text: &str) -> std::path::PathBuf {
    let p = dir.path().join("routes.toml");
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn r2_check_accepts_the_repo_config() {
    let out = switchboard()
        .args([
            "check",
            "--config",
            concat!(env!("CARGO_MANIFEST_DIR"), "/routes.toml"),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("ok (2 backends, 3 aliases)"), "{stdout}");
}

#[test]
fn r2_check_prints_every_error_once_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        &dir,
        r#"
[backends.b]
url = "ftp://h"
flavor = "vllm"
slots = 0
[aliases.a]
backend = "missing"
"#,
    );
    let out = switchboard()
        .args(["check", "--config"])
        .arg(&p)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("switchboard:").count(), 1, "{err}");
    assert!(err.contains("backends.b.url: \"ftp://h\""), "{err}");
    assert!(
        err.contains("aliases.a.backend: \"missing\" is not a defined backend"),
        "{err}"
    );
}

#[test]
fn r2_serve_refuses_a_bad_config() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(&dir, "[server]\nlisten = \"127.0.0.1:0\"\nbogus = 1\n");
    let out = switchboard()
        .args(["serve", "--config"])
        .arg(&p)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bogus"));
}

#[test]
fn r2_environment_overrides_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(&dir, "[server]\nlisten = \"127.0.0.1:7700\"\n");
    let out = switchboard()
        .args(["check", "--config"])
        .arg(&p)
        .env("SWITCHBOARD_SERVER__LISTEN", "not-an-address")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("server.listen: \"not-an-address\""), "{err}");
}

#[test]
fn r2_missing_config_file_is_a_clear_error() {
    let out = switchboard()
        .args(["check", "--config", "/nonexistent/routes.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such file"));
}

#[test]
fn r4_tokens_cli_prints_count_method_and_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let fx = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/qwen3");
    let p = write(
        &dir,
        &format!(
            r#"
[backends.b]
url = "http://127.0.0.1:9"
flavor = "llamacpp"
[aliases.q]
backend = "b"
context_window = 20
count = "local"
tokenizer = {{ file = "{fx}/tokenizer.json.gz", config = "{fx}/tokenizer_config.json.gz" }}
"#
        ),
    );
    let req = dir.path().join("req.json");
    // `single_user` of tests/fixtures/conversations.json: 13 tokens by llama-server.
    std::fs::write(
        &req,
        r#"{"model":"q","messages":[{"role":"user","content":"Hello! Say hi."}],"max_tokens":8}"#,
    )
    .unwrap();
    let out = switchboard()
        .args(["tokens", "--alias", "q", "--config"])
        .arg(&p)
        .arg(&req)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("count:        13 prompt tokens (local)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("verdict:      over the window (decided by local)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("you requested 21 tokens (13 in the messages, 8 in the completion)"),
        "{stdout}"
    );
}
