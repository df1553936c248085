//! The `switchboard` binary's config commands and exit codes.
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
fn check_accepts_the_repo_config() {
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
fn check_prints_every_error_once_and_exits_2() {
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
fn serve_refuses_a_bad_config() {
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
fn environment_overrides_the_file() {
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
fn missing_config_file_is_a_clear_error() {
    let out = switchboard()
        .args(["check", "--config", "/nonexistent/routes.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such file"));
}

#[test]
fn tokens_cli_prints_count_method_and_verdict() {
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

/// A config whose backend and client keys come from `SB_T17_B_KEY` and `SB_T17_CLIENT_KEYS`.
const KEYED: &str = r#"
[server]
api_keys_env = "SB_T17_CLIENT_KEYS"
[backends.b]
url = "http://127.0.0.1:9"
flavor = "vllm"
api_key_env = "SB_T17_B_KEY"
[aliases.a]
backend = "b"
"#;

/// Run `command` on [`KEYED`] with the two key variables set; a run that has not ended
/// within 30 s (a `serve` that accepted the config) is killed and fails the test.
fn with_keys(command: &str, backend_key: &str, client_keys: &str) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let p = write(&dir, KEYED);
    let child = switchboard()
        .args([command, "--config"])
        .arg(&p)
        .env("SB_T17_B_KEY", backend_key)
        .env("SB_T17_CLIENT_KEYS", client_keys)
        .env("SWITCHBOARD_SERVER__LISTEN", "127.0.0.1:0")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(std::time::Duration::from_secs(30)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").arg(pid.to_string()).status();
            panic!("{command} kept running with key {backend_key:?}");
        }
    }
}

/// Regression: a backend key with a trailing CR passed `check` and was then
/// dropped from every request without a word. `check` and `serve` refuse it, naming the
/// variable and never the key.
#[test]
fn check_and_serve_refuse_a_key_that_cannot_be_sent() {
    let ok = with_keys("check", "sk-backend-7", "sk-team-1,sk-team-2");
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    for (backend_key, client_keys, key, what) in [
        (
            "sk-backend-7\r",
            "sk-team-1",
            "backends.b.api_key_env: \"SB_T17_B_KEY\"",
            "a line break (CR or LF)",
        ),
        (
            "sk-backend-7\u{1b}[0m",
            "sk-team-1",
            "backends.b.api_key_env: \"SB_T17_B_KEY\"",
            "a control character",
        ),
        (
            "sk-backend-7",
            "sk-team-1,sk-t\u{e9}am-2",
            "server.api_keys_env: \"SB_T17_CLIENT_KEYS\" key 2 of 2",
            "not ASCII",
        ),
    ] {
        for command in ["check", "serve"] {
            let out = with_keys(command, backend_key, client_keys);
            assert_eq!(out.status.code(), Some(2), "{command} {backend_key:?}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains(key) && err.contains(what), "{command}: {err}");
            assert!(
                !err.contains("sk-backend") && !err.contains("sk-t"),
                "{err}"
            );
            assert!(!String::from_utf8_lossy(&out.stdout).contains("sk-"));
        }
    }
}

/// `check` on `config`; a run that has not ended within 60 s (a read that blocks or runs on)
/// is killed and fails the test.
fn check_within(config: &std::path::Path) -> std::process::Output {
    let child = switchboard()
        .args(["check", "--config"])
        .arg(config)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(std::time::Duration::from_secs(60)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("check kept running on {}", config.display());
        }
    }
}

/// A config of one llama.cpp alias `x` counting with `tokenizer` (a TOML inline table).
fn with_tokenizer(dir: &tempfile::TempDir, tokenizer: &str) -> std::path::PathBuf {
    write(
        dir,
        &format!(
            "[backends.b]\nurl = \"http://127.0.0.1:9\"\nflavor = \"llamacpp\"\n\
             [aliases.x]\nbackend = \"b\"\ncontext_window = 100\ncount = \"local\"\ntokenizer = {tokenizer}\n"
        ),
    )
}

/// `check` of `config` fails (exit 2) with an error holding every one of `words`.
fn refused(config: &std::path::Path, words: &[&str]) {
    let out = check_within(config);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for w in words {
        assert!(err.contains(w), "no {w:?} in: {err}");
    }
}

fn fifo(dir: &tempfile::TempDir, name: &str) -> std::path::PathBuf {
    let p = dir.path().join(name);
    assert!(Command::new("mkfifo").arg(&p).status().unwrap().success());
    p
}

const QWEN3: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/qwen3");

/// Regression: a FIFO as `tokenizer.file` made `check` wait forever in the open.
#[test]
fn a_fifo_as_a_tokenizer_file_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let f = fifo(&dir, "tokenizer.json");
    let p = with_tokenizer(
        &dir,
        &format!(
            "{{ file = \"{}\", config = \"{QWEN3}/tokenizer_config.json.gz\" }}",
            f.display()
        ),
    );
    let what = format!("{} is not a regular file (a FIFO)", f.display());
    refused(&p, &["aliases.x.tokenizer", &what]);
}

/// Regression: a FIFO as a backend's `ca_file` made `check` wait forever in the open.
#[test]
fn a_fifo_as_a_ca_file_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let f = fifo(&dir, "ca.pem");
    let p = write(
        &dir,
        &format!(
            "[backends.b]\nurl = \"https://gpu-box.fleet:8443\"\nflavor = \"vllm\"\nca_file = \"{}\"\n\
             [aliases.x]\nbackend = \"b\"\n",
            f.display()
        ),
    );
    let key = format!("backends.b.ca_file: \"{}\"", f.display());
    refused(&p, &[&key, "is not a regular file (a FIFO)"]);
}

/// Regression: `/dev/zero` as `tokenizer.file` was read until memory ran out.
#[test]
fn a_device_as_a_tokenizer_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = with_tokenizer(
        &dir,
        &format!("{{ file = \"/dev/zero\", config = \"{QWEN3}/tokenizer_config.json.gz\" }}"),
    );
    refused(
        &p,
        &[
            "aliases.x.tokenizer",
            "/dev/zero is not a regular file (a character device)",
        ],
    );
}

/// Regression: a tokenizer file of any size was read whole; one over the documented limit
/// (64 MiB for `tokenizer.file`, a sparse file here) is refused, naming the limit.
#[test]
fn a_tokenizer_file_over_its_limit_is_refused_naming_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("tokenizer.json");
    let size = (64u64 << 20) + 1;
    std::fs::File::create(&big).unwrap().set_len(size).unwrap();
    let p = with_tokenizer(
        &dir,
        &format!(
            "{{ file = \"{}\", config = \"{QWEN3}/tokenizer_config.json.gz\" }}",
            big.display()
        ),
    );
    let what = format!(
        "{} is larger than its limit of 64 MiB ({size} bytes)",
        big.display()
    );
    refused(&p, &["aliases.x.tokenizer", &what]);
}

/// Regression: a chat template looping 10⁴ × 10⁴ times passed `check` after many seconds
/// of rendering its test conversations; it now runs out of its render budget at once.
#[test]
fn a_chat_template_that_loops_too_long_fails_check_with_its_budget() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("tokenizer_config.json");
    let template = "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}{{ messages[0].content }}";
    std::fs::write(
        &cfg,
        serde_json::json!({ "chat_template": template }).to_string(),
    )
    .unwrap();
    let p = with_tokenizer(
        &dir,
        &format!(
            "{{ file = \"{QWEN3}/tokenizer.json.gz\", config = \"{}\" }}",
            cfg.display()
        ),
    );
    refused(
        &p,
        &[
            "aliases.x.tokenizer",
            "chat template exceeded its render budget (1000000 steps)",
        ],
    );
}
