//! Several Switchboard processes on one shared store (`server.shared_state`): the binary run
//! twice as child processes, a real `redis-server` started here on a free port, and a
//! backend that counts how many requests it holds at once. Together the processes keep to
//! the backend's slots and to a client's one budget; a killed process's slots come free
//! within the lease; a lost store leaves each process serving on its own counts, saying so,
//! until the store is back. Skipped, saying why, where `redis-server` is not installed
//! (Debian package `redis-server`), unless `SWITCHBOARD_TEST_NEED_REDIS` is set (as CI,
//! which installs it, sets it): then that fails.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::{get, post};
use tokio::process::{Child, Command};
use tokio::sync::watch;

/// Every wait here ends by this, so a bug fails instead of hanging.
const DEADLINE: Duration = Duration::from_secs(20);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `redis-server` on the PATH, or `None` (the test says it is skipped).
fn redis_binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("redis-server"))
        .find(|p| p.is_file())
}

/// Poll `cond` until it holds, failing with `what` after [`DEADLINE`].
async fn until<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !cond().await {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A redis-server of this test, without persistence.
struct Redis {
    bin: PathBuf,
    port: u16,
    child: Child,
}

impl Redis {
    async fn start(bin: &Path, port: u16) -> Redis {
        let child = Command::new(bin)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .kill_on_drop(true)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        until("redis-server to listen", || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        })
        .await;
        Redis {
            bin: bin.to_path_buf(),
            port,
            child,
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    async fn stop(&mut self) {
        self.child.kill().await.unwrap();
    }

    async fn restart(&mut self) {
        *self = Redis::start(&self.bin.clone(), self.port).await;
    }
}

/// A backend that answers chat completions after `hold` (or, while gated, when opened) and
/// counts the requests it holds now and at most.
#[derive(Clone)]
struct Counting {
    now: Arc<AtomicU32>,
    most: Arc<AtomicU32>,
    received: Arc<AtomicU32>,
    gate: watch::Sender<bool>,
    hold: Duration,
}

/// One request held by the backend: counted while its handler lives (a client that hangs up
/// ends it).
struct Held(Arc<AtomicU32>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Counting {
    async fn start(hold: Duration, gated: bool) -> (Counting, String) {
        let (gate, _) = watch::channel(!gated);
        let b = Counting {
            now: Arc::default(),
            most: Arc::default(),
            received: Arc::default(),
            gate,
            hold,
        };
        let answer = {
            let b = b.clone();
            move || {
                let b = b.clone();
                async move {
                    let n = b.now.fetch_add(1, Ordering::SeqCst) + 1;
                    let _held = Held(Arc::clone(&b.now));
                    b.most.fetch_max(n, Ordering::SeqCst);
                    b.received.fetch_add(1, Ordering::SeqCst);
                    let mut open = b.gate.subscribe();
                    let _ = open.wait_for(|o| *o).await;
                    // The work the backend does for a request.
                    tokio::time::sleep(b.hold).await;
                    axum::Json(serde_json::json!({
                        "id": "x", "object": "chat.completion", "created": 0, "model": "m",
                        "choices": [{"index": 0, "finish_reason": "stop",
                            "message": {"role": "assistant", "content": "ok"}}],
                        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}
                    }))
                }
            }
        };
        let models = || async {
            axum::Json(
                serde_json::json!({"object": "list", "data": [{"id": "m", "object": "model"}]}),
            )
        };
        let app = axum::Router::new()
            .route("/v1/chat/completions", post(answer))
            .route("/v1/models", get(models));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (b, url)
    }

    fn now(&self) -> u32 {
        self.now.load(Ordering::SeqCst)
    }

    fn most(&self) -> u32 {
        self.most.load(Ordering::SeqCst)
    }

    fn received(&self) -> u32 {
        self.received.load(Ordering::SeqCst)
    }

    fn open(&self) {
        self.gate.send_replace(true);
    }
}

/// A Switchboard process of this test.
struct Process {
    child: Child,
    base: String,
    log: PathBuf,
}

/// The config both processes run: one alias `a` on a 2-slot backend, the store at `store`,
/// a client `team` with `client` (its limits) when given.
fn config(port: u16, backend: &str, store: &str, client: &str) -> String {
    let clients = if client.is_empty() {
        String::new()
    } else {
        format!("[clients.team]\nkey_env = \"SB_T_SHARED_KEY\"\n{client}\n")
    };
    format!(
        r#"
[server]
listen = "127.0.0.1:{port}"
workers = 1
watch_config = false
queue_timeout_secs = 20
shared_state = "{store}"
shared_state_lease_ms = 1000
shared_state_timeout_ms = 200

[backends.b]
url = "{backend}"
flavor = "openai"
slots = 2
queue = 64

[aliases.a]
backend = "b"
upstream_model = "m"
context_window = 4096
{clients}"#
    )
}

impl Process {
    async fn start(dir: &Path, name: &str, toml: &str, port: u16) -> Process {
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, toml).unwrap();
        let log = dir.join(format!("{name}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_switchboard"))
            .args(["serve", "--config"])
            .arg(&path)
            .env("SB_T_SHARED_KEY", "sk-team")
            .kill_on_drop(true)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let p = Process {
            child,
            base: format!("http://127.0.0.1:{port}"),
            log,
        };
        let c = reqwest::Client::new();
        let health = format!("{}/health", p.base);
        until("the proxy to listen", || {
            let c = c.clone();
            let health = health.clone();
            async move { c.get(health).send().await.is_ok() }
        })
        .await;
        p
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn metrics(&self) -> String {
        match reqwest::get(format!("{}/metrics", self.base)).await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    /// The value of the first sample of `family` whose labels contain `labels`.
    async fn sample_of(&self, family: &str, labels: &str) -> Option<f64> {
        let text = self.metrics().await;
        text.lines()
            .filter(|l| l.starts_with(&format!("{family}{{")) && l.contains(labels))
            .find_map(|l| l.rsplit(' ').next()?.parse().ok())
    }

    /// The value of the first sample of `family`.
    async fn sample(&self, family: &str) -> Option<f64> {
        self.sample_of(family, "").await
    }

    /// Wait until `switchboard_shared_state_up` is `up`.
    async fn wait_store(&self, up: bool) {
        let want = if up { 1.0 } else { 0.0 };
        until(
            &format!("shared_state_up {want} at {}", self.base),
            || async { self.sample("switchboard_shared_state_up").await == Some(want) },
        )
        .await;
    }

    /// Wait until `n` requests of alias `a` wait for a slot.
    async fn wait_queued(&self, n: f64) {
        until(&format!("{n} queued at {}", self.base), || async {
            self.sample_of("switchboard_queued_requests", "alias=\"a\"")
                .await
                == Some(n)
        })
        .await;
    }

    /// Send one chat request (with the client's key) in a task of its own: its status.
    fn send(&self, c: &reqwest::Client) -> tokio::task::JoinHandle<u16> {
        tokio::spawn(chat(c.clone(), self.base.clone()))
    }
}

/// One chat request of client `team` to the process at `base`: its status (0: no answer).
async fn chat(c: reqwest::Client, base: String) -> u16 {
    let req = c
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth("sk-team")
        .json(&serde_json::json!({
            "model": "a", "max_tokens": 1,
            "messages": [{"role": "user", "content": "hi"}]
        }));
    match tokio::time::timeout(DEADLINE, req.send()).await {
        Ok(Ok(r)) => r.status().as_u16(),
        _ => 0,
    }
}

/// The store, the backend and two processes; `None` when redis-server is not installed.
struct Fleet {
    _dir: tempfile::TempDir,
    redis: Redis,
    backend: Counting,
    a: Process,
    b: Process,
}

async fn fleet(hold: Duration, gated: bool, client: &str) -> Option<Fleet> {
    let Some(bin) = redis_binary() else {
        // CI sets it: there the test must run.
        assert!(
            std::env::var_os("SWITCHBOARD_TEST_NEED_REDIS").is_none(),
            "redis-server is not installed (Debian package redis-server)"
        );
        eprintln!("skipped: redis-server is not installed (Debian package redis-server)");
        return None;
    };
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(&bin, free_port()).await;
    let (backend, url) = Counting::start(hold, gated).await;
    let (pa, pb) = (free_port(), free_port());
    let a = Process::start(dir.path(), "a", &config(pa, &url, &redis.url(), client), pa).await;
    let b = Process::start(dir.path(), "b", &config(pb, &url, &redis.url(), client), pb).await;
    a.wait_store(true).await;
    b.wait_store(true).await;
    Some(Fleet {
        _dir: dir,
        redis,
        backend,
        a,
        b,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_together_never_send_a_backend_more_than_its_slots() {
    let Some(f) = fleet(Duration::from_millis(20), false, "").await else {
        return;
    };
    let c = reqwest::Client::new();
    // 16 clients, 8 on each process, 3 requests each.
    let clients: Vec<_> = (0..16)
        .map(|i| {
            let p = if i % 2 == 0 { &f.a } else { &f.b };
            let (c, base) = (c.clone(), p.base.clone());
            tokio::spawn(async move {
                let mut got = Vec::new();
                for _ in 0..3 {
                    got.push(chat(c.clone(), base.clone()).await);
                }
                got
            })
        })
        .collect();
    for h in clients {
        assert_eq!(
            h.await.unwrap(),
            [200, 200, 200],
            "{}{}",
            f.a.log(),
            f.b.log()
        );
    }
    assert_eq!(f.backend.received(), 48);
    assert_eq!(
        f.backend.most(),
        2,
        "the backend held {} at once",
        f.backend.most()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_process_frees_its_slots_within_the_lease() {
    let Some(mut f) = fleet(Duration::ZERO, true, "").await else {
        return;
    };
    let c = reqwest::Client::new();
    // Process a holds both slots.
    let _held = [f.a.send(&c), f.a.send(&c)];
    until("the backend to hold two", || async { f.backend.now() == 2 }).await;
    // Process b's request waits: the store has no slot for it.
    let waiting = f.b.send(&c);
    f.b.wait_queued(1.0).await;
    assert_eq!(f.backend.received(), 2);
    // a dies holding its slots (its connections to the backend close with it).
    f.a.child.start_kill().unwrap();
    let killed = Instant::now();
    f.a.child.wait().await.unwrap();
    until("b's request to reach the backend", || async {
        f.backend.received() == 3
    })
    .await;
    let freed = killed.elapsed();
    // The lease is 1 s; renewal runs every third of it, so a lease lives at most 1 s past
    // the kill; the rest is b's pause between asks and a loaded machine's slack.
    assert!(freed < Duration::from_secs(3), "freed after {freed:?}");
    f.backend.open();
    assert_eq!(waiting.await.unwrap(), 200, "{}", f.b.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_store_leaves_each_process_on_its_own_counts_until_it_returns() {
    let Some(mut f) = fleet(Duration::ZERO, true, "").await else {
        return;
    };
    let c = reqwest::Client::new();
    f.redis.stop().await;
    // Both find it gone (their renewal or ping fails) and say so.
    f.a.wait_store(false).await;
    f.b.wait_store(false).await;
    for p in [&f.a, &f.b] {
        assert!(p.sample("switchboard_shared_state_fallbacks_total").await >= Some(1.0));
        assert!(p.log().contains("shared state unreachable"), "{}", p.log());
        let page = reqwest::get(format!("{}/", p.base)).await.unwrap();
        let page = page.text().await.unwrap();
        assert!(page.contains("unreachable"), "{page}");
    }
    // Each serves on its own counts: two each, four at the backend at once.
    let own: Vec<_> = (0..4)
        .map(|i| if i < 2 { f.a.send(&c) } else { f.b.send(&c) })
        .collect();
    until("the backend to hold four", || async {
        f.backend.now() == 4
    })
    .await;
    f.backend.open();
    for h in own {
        assert_eq!(h.await.unwrap(), 200);
    }
    // The store comes back: both use it again.
    f.redis.restart().await;
    f.a.wait_store(true).await;
    f.b.wait_store(true).await;
    for p in [&f.a, &f.b] {
        assert!(p.log().contains("shared state reachable"), "{}", p.log());
    }
    f.backend.gate.send_replace(false);
    let _held = [f.a.send(&c), f.a.send(&c)];
    until("the backend to hold two", || async { f.backend.now() == 2 }).await;
    let waiting = f.b.send(&c);
    f.b.wait_queued(1.0).await;
    assert_eq!(f.backend.now(), 2);
    f.backend.open();
    assert_eq!(waiting.await.unwrap(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_requests_per_minute_are_one_budget_across_processes() {
    let Some(f) = fleet(Duration::ZERO, false, "requests_per_minute = 4").await else {
        return;
    };
    let c = reqwest::Client::new();
    let mut got = Vec::new();
    for p in [&f.a, &f.b, &f.a, &f.b] {
        got.push(p.send(&c).await.unwrap());
    }
    assert_eq!(got, [200, 200, 200, 200]);
    // Each process alone would let four through; together the minute's four are spent.
    assert_eq!(f.a.send(&c).await.unwrap(), 429, "{}", f.a.log());
    assert_eq!(f.b.send(&c).await.unwrap(), 429, "{}", f.b.log());
    assert_eq!(f.backend.received(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_max_concurrent_counts_its_requests_in_every_process() {
    let Some(f) = fleet(Duration::ZERO, true, "max_concurrent = 1").await else {
        return;
    };
    let c = reqwest::Client::new();
    let first = f.a.send(&c);
    until("the backend to hold one", || async { f.backend.now() == 1 }).await;
    assert_eq!(f.b.send(&c).await.unwrap(), 429);
    f.backend.open();
    assert_eq!(first.await.unwrap(), 200);
    // Its place is given back with it.
    until("a's place to come free", || async {
        f.b.send(&c).await.unwrap() == 200
    })
    .await;
}
