//! The pipeline's decisions run whole — choose, the attempt loop, the breaker, the queue —
//! against backends scripted through the [`Exchange`] seam: no sockets, tokio's clock paused.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::StreamExt;

use super::{handle, Incoming};
use crate::error::ProxyError;
use crate::fleet::breaker::BreakerState;
use crate::live::AppState;
use crate::observe::record::Record;
use crate::upstream::exchange::{Answer, Exchange, Outbound};
use crate::upstream::failure::{Kind, Limit, Stage, UpstreamError};
use crate::wire::{self, Endpoint};

/// What a scripted backend does with one request.
#[derive(Clone, Copy, Debug)]
enum Does {
    /// Answers with this status (a chat completion on 200, an error body otherwise).
    Answer(u16),
    /// Fails so.
    Fail(Stage, Kind, bool),
}

const OK: Does = Does::Answer(200);
/// Refused: nothing of the request reached the backend.
const REFUSED: Does = Does::Fail(Stage::Connect, Kind::Unreachable, false);
/// The backend took the request and closed the connection without a byte of answer.
const HUNG_UP: Does = Does::Fail(Stage::Head, Kind::Broken, true);
/// The backend took the request and gave no head in time: it may be running there.
const SILENT: Does = Does::Fail(Stage::Head, Kind::TimedOut(Limit::FirstByte), true);
/// The proxy could not open a socket.
const NO_DESCRIPTORS: Does = Does::Fail(Stage::Connect, Kind::Local, false);

/// Backends by name, each with what it does with its next requests (answering 200 once its
/// script is spent), and the backends the requests reached, in order.
#[derive(Debug, Default)]
struct Script {
    plans: Mutex<HashMap<String, VecDeque<Does>>>,
    reached: Mutex<Vec<String>>,
}

impl Script {
    fn new(plans: &[(&str, &[Does])]) -> Arc<Script> {
        let plans = plans
            .iter()
            .map(|(b, d)| (b.to_string(), d.iter().copied().collect()))
            .collect();
        Arc::new(Script {
            plans: Mutex::new(plans),
            reached: Mutex::default(),
        })
    }

    /// The backends reached since the last call.
    fn reached(&self) -> Vec<String> {
        std::mem::take(&mut *self.reached.lock().unwrap())
    }
}

impl Exchange for Script {
    fn post<'a>(&'a self, to: Outbound<'a>) -> BoxFuture<'a, Result<Answer, UpstreamError>> {
        let name = to.backend.name.to_string();
        self.reached.lock().unwrap().push(name.clone());
        let does = self
            .plans
            .lock()
            .unwrap()
            .get_mut(&name)
            .and_then(VecDeque::pop_front)
            .unwrap_or(OK);
        Box::pin(async move {
            match does {
                Does::Answer(status) => Ok(answer(status)),
                Does::Fail(stage, kind, reached) => Err(UpstreamError {
                    backend: name,
                    stage,
                    kind,
                    reached,
                    detail: "scripted".into(),
                    elapsed: Duration::ZERO,
                }),
            }
        })
    }
}

fn answer(status: u16) -> Answer {
    let body = if status == 200 {
        r#"{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#
    } else {
        r#"{"error":{"message":"scripted failure"}}"#
    };
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Answer {
        status: StatusCode::from_u16(status).unwrap(),
        headers,
        body: futures_util::stream::once(async move { Ok(Bytes::from_static(body.as_bytes())) })
            .boxed(),
    }
}

/// Alias `x` on replicas `a` and `b` (one slot each, a queue of one) falling back to `y` on
/// `c`; breakers open after two failures, for ten seconds.
const FLEET: &str = r#"
[server]
breaker_failures = 2
breaker_open_ms = 10000
queue_timeout_secs = 5
[backends.a]
url = "http://127.0.0.1:9"
flavor = "llamacpp"
slots = 1
queue = 1
[backends.b]
url = "http://127.0.0.1:9"
flavor = "llamacpp"
slots = 1
queue = 1
[backends.c]
url = "http://127.0.0.1:9"
flavor = "vllm"
slots = 1
queue = 1
[aliases.x]
backends = ["a", "b"]
fallbacks = ["y"]
[aliases.y]
backend = "c"
"#;

fn state(script: &Arc<Script>) -> AppState {
    let config = crate::config::from_toml(FLEET).unwrap();
    let exchange: Arc<dyn Exchange> = Arc::clone(script) as _;
    AppState::new(config, None).unwrap().with_exchange(exchange)
}

/// One chat request for `model` (no conversation: the least loaded replica, ties in turn).
async fn ask(state: &AppState, model: &str) -> Result<u16, ProxyError> {
    let snap = state.live.load_full();
    let endpoint = Endpoint::chat_completions;
    let mut rec = Record::start(
        snap.unknown_metrics(),
        endpoint,
        HeaderValue::from_static("t"),
    );
    let body = format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#);
    let req = Incoming {
        adapter: wire::adapter(endpoint),
        path: "/v1/chat/completions".into(),
        headers: HeaderMap::new(),
        body: Bytes::from(body),
        caller: None,
        idle: false,
    };
    let answered = handle(state, &snap, &mut rec, req).await;
    answered.map(|r| r.status().as_u16())
}

fn breaker(state: &AppState, backend: &str) -> BreakerState {
    let snap = state.live.load_full();
    let r = snap.replica(backend).unwrap();
    r.breaker.state(crate::fleet::breaker::now())
}

#[tokio::test(start_paused = true)]
async fn a_5xx_goes_to_the_next_replica_then_the_fallback_whose_answer_is_the_clients() {
    let script = Script::new(&[
        ("a", &[Does::Answer(500)]),
        ("b", &[Does::Answer(502)]),
        ("c", &[Does::Answer(500)]),
    ]);
    let state = state(&script);
    assert_eq!(ask(&state, "x").await.unwrap(), 500);
    assert_eq!(script.reached(), ["a", "b", "c"]);
}

#[tokio::test(start_paused = true)]
async fn a_refused_replica_is_passed_over_for_the_next() {
    let script = Script::new(&[("a", &[REFUSED])]);
    let state = state(&script);
    assert_eq!(ask(&state, "x").await.unwrap(), 200);
    assert_eq!(script.reached(), ["a", "b"]);
}

#[tokio::test(start_paused = true)]
async fn a_hang_up_is_sent_on_once_and_a_second_is_the_clients_error() {
    let script = Script::new(&[("a", &[HUNG_UP]), ("b", &[HUNG_UP])]);
    let state = state(&script);
    let e = ask(&state, "x").await.unwrap_err();
    assert!(matches!(e, ProxyError::UpstreamProtocol { .. }), "{e:?}");
    // The fallback never sees a request two backends took and dropped.
    assert_eq!(script.reached(), ["a", "b"]);
    // A hang-up is not held against the backend.
    assert_eq!(breaker(&state, "a"), BreakerState::closed);
}

#[tokio::test(start_paused = true)]
async fn a_request_that_may_be_running_on_its_backend_goes_nowhere_else() {
    let script = Script::new(&[("a", &[SILENT])]);
    let state = state(&script);
    let e = ask(&state, "x").await.unwrap_err();
    assert!(matches!(e, ProxyError::UpstreamTimeout { .. }), "{e:?}");
    assert_eq!(script.reached(), ["a"]);
}

#[tokio::test(start_paused = true)]
async fn the_proxys_own_want_of_descriptors_is_the_answer_at_once() {
    let script = Script::new(&[("a", &[NO_DESCRIPTORS])]);
    let state = state(&script);
    let e = ask(&state, "x").await.unwrap_err();
    assert!(matches!(e, ProxyError::ProxyExhausted { .. }), "{e:?}");
    assert_eq!(script.reached(), ["a"]);
    assert_eq!(breaker(&state, "a"), BreakerState::closed);
}

#[tokio::test(start_paused = true)]
async fn an_open_breaker_is_passed_over_until_its_time_is_out_then_a_trial_closes_it() {
    let script = Script::new(&[("a", &[REFUSED, REFUSED])]);
    let state = state(&script);
    // Each refusal goes on to b; the second opens a's breaker.
    let mut reached = Vec::new();
    for _ in 0..4 {
        assert_eq!(ask(&state, "x").await.unwrap(), 200);
        reached.extend(script.reached());
    }
    assert_eq!(
        reached.iter().filter(|b| *b == "a").count(),
        2,
        "{reached:?}"
    );
    assert_eq!(breaker(&state, "a"), BreakerState::open);
    for _ in 0..3 {
        assert_eq!(ask(&state, "x").await.unwrap(), 200);
        assert_eq!(script.reached(), ["b"], "a's breaker is open");
    }
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(breaker(&state, "a"), BreakerState::half_open);
    let mut reached = Vec::new();
    for _ in 0..2 {
        assert_eq!(ask(&state, "x").await.unwrap(), 200);
        reached.extend(script.reached());
    }
    assert!(reached.contains(&"a".to_string()), "{reached:?}");
    assert_eq!(breaker(&state, "a"), BreakerState::closed);
}

#[tokio::test(start_paused = true)]
async fn a_replica_down_by_its_probe_is_passed_over_and_a_loading_alias_says_so() {
    use crate::fleet::health::BackendState;
    let script = Script::new(&[]);
    let state = state(&script);
    state.health.set("a", BackendState::down);
    for _ in 0..2 {
        assert_eq!(ask(&state, "x").await.unwrap(), 200);
        assert_eq!(script.reached(), ["b"]);
    }
    state.health.set("b", BackendState::loading);
    state.health.set("c", BackendState::loading);
    let e = ask(&state, "x").await.unwrap_err();
    assert!(matches!(e, ProxyError::UpstreamLoading { .. }), "{e:?}");
    assert!(script.reached().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_full_alias_waits_its_queue_timeout_then_goes_to_its_fallback() {
    let script = Script::new(&[]);
    let state = state(&script);
    let snap = state.live.load_full();
    let held: Vec<_> = ["a", "b"]
        .iter()
        .map(|b| snap.replica(b).unwrap().slots.try_acquire().unwrap())
        .collect();
    let started = tokio::time::Instant::now();
    assert_eq!(ask(&state, "x").await.unwrap(), 200);
    // The least loaded replica's queue was waited in for the whole queue timeout.
    assert_eq!(started.elapsed(), Duration::from_secs(5));
    assert_eq!(script.reached(), ["c"]);
    drop(held);
}

#[tokio::test(start_paused = true)]
async fn every_replica_and_fallback_failing_leaves_the_last_failure() {
    let script = Script::new(&[("a", &[REFUSED]), ("b", &[REFUSED]), ("c", &[REFUSED])]);
    let state = state(&script);
    let e = ask(&state, "x").await.unwrap_err();
    assert!(matches!(e, ProxyError::UpstreamConnect { .. }), "{e:?}");
    assert_eq!(script.reached(), ["a", "b", "c"]);
}
