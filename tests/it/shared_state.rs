//! Several Switchboard processes on one shared store (`server.shared_state`): the binary run
//! twice as child processes, a real `redis-server` started here on a free port, and a
//! backend that counts how many requests it holds at once. Together the processes keep to
//! the backend's slots and to a client's one budget; a killed process's slots come free
//! within the lease; a lost store leaves each process serving on its own counts, saying so,
//! until the store is back. Skipped, saying why, where `redis-server` is not installed
//! (Debian package `redis-server`), unless `SWITCHBOARD_TEST_NEED_REDIS` is set (as CI,
//! which installs it, sets it): then that fails.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::{get, post};
use tokio::process::{Child, Command};
use tokio::sync::watch;

use common::free_port;

/// Every wait here ends by this, so a bug fails instead of hanging.
const DEADLINE: Duration = Duration::from_secs(20);

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
    /// A redis-server on `port`, or, when another process holds that port (a free port found
    /// earlier may be taken by the time the server binds it), on another free one.
    async fn start(bin: &Path, port: u16) -> Redis {
        let mut port = port;
        for _ in 0..5 {
            let mut child = Command::new(bin)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .kill_on_drop(true)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            // It answers PING on its port, or it exited (the port was taken).
            let ours = async {
                loop {
                    if child.try_wait().unwrap().is_some() {
                        return false;
                    }
                    let url = format!("redis://127.0.0.1:{port}/0");
                    let client = redis::Client::open(url).unwrap();
                    if let Ok(mut c) = client.get_multiplexed_async_connection().await {
                        let pong: redis::RedisResult<String> =
                            redis::cmd("PING").query_async(&mut c).await;
                        if pong.is_ok() {
                            return child.try_wait().unwrap().is_none();
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            };
            let ours = tokio::time::timeout(DEADLINE, ours).await;
            if ours == Ok(true) {
                return Redis {
                    bin: bin.to_path_buf(),
                    port,
                    child,
                };
            }
            let _ = child.kill().await;
            port = free_port();
        }
        panic!("redis-server did not start on any of five free ports");
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    async fn stop(&mut self) {
        self.child.kill().await.unwrap();
    }

    /// Send the server `signal` (`STOP` pauses it as a stalled store, `CONT` resumes it).
    fn signal(&self, signal: &str) {
        let pid = self.child.id().unwrap().to_string();
        let ok = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .unwrap();
        assert!(ok.success(), "kill -{signal} {pid}");
    }

    /// A connection of the test's own, straight to the server.
    async fn conn(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// The leases held in the store for the backend at `url`.
    async fn leases(&self, url: &str) -> u64 {
        let mut c = self.conn().await;
        redis::cmd("ZCARD")
            .arg(format!("switchboard:slots:{url}"))
            .query_async(&mut c)
            .await
            .unwrap()
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
    /// Each request's first message, in the order they arrived.
    seen: Arc<std::sync::Mutex<Vec<String>>>,
    gate: watch::Sender<bool>,
    hold: Duration,
    url: String,
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
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let b = Counting {
            now: Arc::default(),
            most: Arc::default(),
            received: Arc::default(),
            seen: Arc::default(),
            gate,
            hold,
            url: url.clone(),
        };
        let answer = {
            let b = b.clone();
            move |axum::Json(body): axum::Json<serde_json::Value>| {
                let b = b.clone();
                async move {
                    let said = body["messages"][0]["content"].as_str().unwrap_or("");
                    b.seen.lock().unwrap().push(said.to_string());
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

/// What a process of a test is configured with beside its addresses.
#[derive(Clone, Copy)]
struct Setup<'a> {
    /// The `[clients.*]` tables.
    clients: &'a str,
    lease_ms: u64,
    slots: u32,
}

/// A process's config: one alias `a` on backend `b` at `backend` (its slots, a queue of
/// 64), the store at `store`.
fn config_of(port: u16, backend: &str, store: &str, setup: Setup<'_>) -> String {
    let Setup {
        clients,
        lease_ms,
        slots,
    } = setup;
    format!(
        r#"
[server]
listen = "127.0.0.1:{port}"
workers = 1
watch_config = false
queue_timeout_secs = 20
shared_state = "{store}"
shared_state_lease_ms = {lease_ms}
shared_state_timeout_ms = 200

[backends.b]
url = "{backend}"
flavor = "openai"
slots = {slots}
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
            .env("SB_T_FLOOD_KEY", "sk-flood")
            .env("SB_T_VICTIM_KEY", "sk-victim")
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
    chat_as(c, base, "sk-team", "hi").await
}

/// One chat request with `key` saying `said` to the process at `base`: its status.
async fn chat_as(c: reqwest::Client, base: String, key: &str, said: &str) -> u16 {
    let req = c
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(key)
        .json(&serde_json::json!({
            "model": "a", "max_tokens": 1,
            "messages": [{"role": "user", "content": said}]
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

/// Both processes: a 2-slot backend, a lease of 1 s, a client `team` with `client` (its
/// limits) when given.
async fn fleet(hold: Duration, gated: bool, client: &str) -> Option<Fleet> {
    let clients = if client.is_empty() {
        String::new()
    } else {
        format!("[clients.team]\nkey_env = \"SB_T_SHARED_KEY\"\n{client}\n")
    };
    let setup = Setup {
        clients: &clients,
        lease_ms: 1000,
        slots: 2,
    };
    fleet_of(hold, gated, [setup, setup]).await
}

/// `redis-server` on the PATH, or `None` after saying the test is skipped (a failure where
/// `SWITCHBOARD_TEST_NEED_REDIS` is set).
fn need_redis() -> Option<PathBuf> {
    let Some(bin) = redis_binary() else {
        // CI sets it: there the test must run.
        assert!(
            std::env::var_os("SWITCHBOARD_TEST_NEED_REDIS").is_none(),
            "redis-server is not installed (Debian package redis-server)"
        );
        eprintln!("skipped: redis-server is not installed (Debian package redis-server)");
        return None;
    };
    Some(bin)
}

/// The store, the backend and two processes configured with `setups`.
async fn fleet_of(hold: Duration, gated: bool, setups: [Setup<'_>; 2]) -> Option<Fleet> {
    let bin = need_redis()?;
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(&bin, free_port()).await;
    let (backend, url) = Counting::start(hold, gated).await;
    let (pa, pb) = (free_port(), free_port());
    let store = redis.url();
    let a = Process::start(dir.path(), "a", &config_of(pa, &url, &store, setups[0]), pa).await;
    let b = Process::start(dir.path(), "b", &config_of(pb, &url, &store, setups[1]), pb).await;
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

/// Wait up to `within` for the store to hold `want` leases of the backend: what it holds at
/// the end.
async fn leases_reach(redis: &Redis, url: &str, want: u64, within: Duration) -> u64 {
    let start = Instant::now();
    loop {
        let n = redis.leases(url).await;
        if n == want || start.elapsed() >= within {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_store_keeps_no_lease_past_its_request_once_it_answers() {
    // A lease of 20 s: what the store would hold a lost release's lease for.
    let setup = Setup {
        clients: "",
        lease_ms: 20_000,
        slots: 3,
    };
    let Some(f) = fleet_of(Duration::ZERO, true, [setup, setup]).await else {
        return;
    };
    let c = reqwest::Client::new();
    let url = f.backend.url.clone();
    let held = [f.a.send(&c), f.a.send(&c)];
    until("the backend to hold two", || async { f.backend.now() == 2 }).await;
    assert_eq!(leases_reach(&f.redis, &url, 2, DEADLINE).await, 2);
    // The store stalls: an ask of each process times out (each goes on with its own slot and
    // marks the store down; the asks still run when the store resumes), and every request
    // ends while it cannot answer.
    f.redis.signal("STOP");
    let stalled = [f.a.send(&c), f.b.send(&c)];
    until("the backend to hold four", || async {
        f.backend.now() == 4
    })
    .await;
    f.backend.open();
    for h in held.into_iter().chain(stalled) {
        assert_eq!(h.await.unwrap(), 200);
    }
    f.redis.signal("CONT");
    // Nothing runs: once the store answers, it holds no lease (within its round trip and
    // the release task's retry, far inside the 20 s a lost release would hold one).
    let left = leases_reach(&f.redis, &url, 0, Duration::from_secs(5)).await;
    assert_eq!(left, 0, "the store held {left} leases with nothing running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_waiting_through_another_process_gets_its_turn_before_a_flood() {
    let clients = "[clients.flood]\nkey_env = \"SB_T_FLOOD_KEY\"\n\
        [clients.victim]\nkey_env = \"SB_T_VICTIM_KEY\"\n";
    let setup = Setup {
        clients,
        lease_ms: 1000,
        slots: 1,
    };
    let Some(f) = fleet_of(Duration::from_millis(20), true, [setup, setup]).await else {
        return;
    };
    let c = reqwest::Client::new();
    // The flooder's eight through a: one at the backend, seven in a's queue.
    let flood: Vec<_> = (0..8)
        .map(|_| {
            let (c, base) = (c.clone(), f.a.base.clone());
            tokio::spawn(async move { chat_as(c, base, "sk-flood", "flood").await })
        })
        .collect();
    until("the backend to hold one", || async { f.backend.now() == 1 }).await;
    f.a.wait_queued(7.0).await;
    // The victim's one through b waits in the store's queue.
    let victim = {
        let (c, base) = (c.clone(), f.b.base.clone());
        tokio::spawn(async move { chat_as(c, base, "sk-victim", "victim").await })
    };
    f.b.wait_queued(1.0).await;
    f.backend.open();
    assert_eq!(victim.await.unwrap(), 200, "{}", f.b.log());
    for h in flood {
        assert_eq!(h.await.unwrap(), 200);
    }
    let seen = f.backend.seen.lock().unwrap().clone();
    let at = seen.iter().position(|s| s == "victim").unwrap();
    // Within a process it would go second (the flooder's first is running); across the
    // store it may take one more turn of the flooder's that was granted as it queued.
    assert!(
        at <= 2,
        "the victim went {}th of {}: {seen:?}",
        at + 1,
        seen.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_configured_with_different_slots_keep_to_the_least() {
    let four = Setup {
        clients: "",
        lease_ms: 1000,
        slots: 4,
    };
    let one = Setup { slots: 1, ..four };
    let Some(f) = fleet_of(Duration::ZERO, true, [four, one]).await else {
        return;
    };
    let c = reqwest::Client::new();
    let first = f.b.send(&c);
    until("the backend to hold one", || async { f.backend.now() == 1 }).await;
    // a has four slots of its own, but the backend has one for every process: a's four wait.
    let more: Vec<_> = (0..4).map(|_| f.a.send(&c)).collect();
    f.a.wait_queued(4.0).await;
    assert_eq!(f.backend.now(), 1);
    let told = "slots differ between processes sharing the store";
    assert!(f.a.log().contains(told), "{}", f.a.log());
    f.backend.open();
    for h in more.into_iter().chain([first]) {
        assert_eq!(h.await.unwrap(), 200);
    }
    assert_eq!(
        f.backend.most(),
        1,
        "the backend held {} at once",
        f.backend.most()
    );
}

/// A TCP proxy that delays every byte by `delay` each way (in order, as a long link does:
/// the delay is latency, not a limit on throughput): its port.
async fn delaying(to: u16, delay: Duration) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            let Ok(outbound) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await else {
                continue;
            };
            let (ri, wi) = inbound.into_split();
            let (ro, wo) = outbound.into_split();
            tokio::spawn(late(ri, wo, delay));
            tokio::spawn(late(ro, wi, delay));
        }
    });
    port
}

/// Copy `from` to `to`, each chunk `delay` after it was read.
async fn late(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    tokio::spawn(async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
    });
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0
            || tx
                .send((tokio::time::Instant::now() + delay, buf[..n].to_vec()))
                .is_err()
        {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_does_not_wait_behind_other_store_calls_on_a_slow_link() {
    use switchboard_proxy::shared::buckets::Spec;
    use switchboard_proxy::shared::lease::Take;
    use switchboard_proxy::shared::places::Places;
    use switchboard_proxy::shared::{Signals, Store};
    let Some(bin) = need_redis() else {
        return;
    };
    let redis = Redis::start(&bin, free_port()).await;
    // 50 ms each way: a round trip of 100 ms.
    let port = delaying(redis.port, Duration::from_millis(50)).await;
    let settings = switchboard_proxy::config::SharedState {
        url: format!("redis://127.0.0.1:{port}/0"),
        lease: Duration::from_secs(10),
        timeout: Duration::from_secs(2),
    };
    let store = Store::start(&settings, Signals::default()).unwrap();
    until("the store to answer", || async { store.up() }).await;
    let places = Places::new("slots", "http://slow-link");
    let mut asking = store.ask(&places, None);
    assert_eq!(asking.take(4).await, Take::Taken);
    let lease = asking.hold();
    // A token bucket with a window of a day, so large that its refill in the test's time is far under one settle.
    let day = Some(Spec {
        capacity: 1_000_000_000,
        window: Duration::from_secs(86_400),
    });
    let specs = [None, day];
    let key = Store::key("client", "slow-link");
    let base = store.reserve(&key, &specs, 500_000_000).await.unwrap();
    let base = base.levels[1].unwrap();
    // Ten settles queued (each a round trip, in turn), then, once two have landed (so the
    // rest are under way), the release.
    for _ in 0..10 {
        store.settle(&key, &specs, 1_000_000);
    }
    let mut direct = redis.conn().await;
    let settled = |level: Option<String>| {
        let l: f64 = level.and_then(|l| l.parse().ok()).unwrap_or(base);
        ((l - base) / 1_000_000.0).floor() as u64
    };
    until("two settles to land", || {
        let mut c = direct.clone();
        let key = key.to_string();
        async move {
            let l: Option<String> = redis::cmd("HGET")
                .arg(&key)
                .arg("tl")
                .query_async(&mut c)
                .await
                .unwrap();
            settled(l) >= 2
        }
    })
    .await;
    drop(lease);
    until("the lease to be released", || async {
        redis.leases("http://slow-link").await == 0
    })
    .await;
    let level: Option<String> = redis::cmd("HGET")
        .arg(key.as_ref())
        .arg("tl")
        .query_async(&mut direct)
        .await
        .unwrap();
    let before = settled(level);
    assert!(
        before < 10,
        "the release landed after all {before} settles queued before it"
    );
}
