//! Traces through the real proxy, exported to a real OTLP/HTTP receiver in the test that
//! decodes each export with `opentelemetry-proto`: the spans and GenAI attributes of a
//! streamed chat, a Messages request translated for a chat-only backend, a context rejection,
//! a fallback after a dead backend and a cancelled stream; the client's `traceparent`
//! continued and the attempt's sent on; sampling (a client's flag never past the ratio); no
//! span for a request refused at auth; captured content and exports bounded in bytes; a
//! collector that hangs or is down.
use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::json;
use switchboard_sim::SimConfig;
use switchboard_wire::flavor::Flavor;
use tokio::io::AsyncWriteExt;
use tokio::sync::Notify;

/// A client's trace: what it sends as `traceparent`.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

fn traceparent(sampled: bool) -> String {
    format!("00-{TRACE_ID}-{PARENT_ID}-0{}", u8::from(sampled))
}

/// How the receiver answers.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Answer,
    /// Reads the export and never answers.
    Hang,
}

/// An OTLP/HTTP receiver on loopback: every export decoded, its spans kept.
#[derive(Clone)]
struct Receiver {
    url: String,
    spans: Arc<Mutex<Vec<Span>>>,
    /// `service.name` of the exports' resources.
    services: Arc<Mutex<Vec<String>>>,
    exports: Arc<Mutex<usize>>,
    /// The body size of each export, in bytes.
    sizes: Arc<Mutex<Vec<usize>>>,
    changed: Arc<Notify>,
}

impl Receiver {
    async fn start(mode: Mode) -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let r = Receiver {
            url: format!("http://{}", listener.local_addr().unwrap()),
            spans: Arc::default(),
            services: Arc::default(),
            exports: Arc::default(),
            sizes: Arc::default(),
            changed: Arc::default(),
        };
        let me = r.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                tokio::spawn(me.clone().serve(tcp, mode));
            }
        });
        r
    }

    async fn serve(self, mut tcp: tokio::net::TcpStream, mode: Mode) {
        let mut buf = Vec::new();
        while let Some(end) = read_request(&mut tcp, &mut buf).await {
            let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
            let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
            assert!(head.starts_with("POST /v1/traces "), "{head}");
            assert!(
                head.to_ascii_lowercase()
                    .contains("content-type: application/x-protobuf"),
                "{head}"
            );
            let req = ExportTraceServiceRequest::decode(&buf[head_end..end]).unwrap();
            buf.drain(..end);
            *self.exports.lock().unwrap() += 1;
            self.sizes.lock().unwrap().push(end - head_end);
            if mode == Mode::Hang {
                std::future::pending::<()>().await;
            }
            for rs in req.resource_spans {
                if let Some(res) = &rs.resource {
                    if let Some(name) = str_of(&res.attributes, "service.name") {
                        self.services.lock().unwrap().push(name);
                    }
                }
                for ss in rs.scope_spans {
                    self.spans.lock().unwrap().extend(ss.spans);
                }
            }
            self.changed.notify_waiters();
            let answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
            if tcp.write_all(answer).await.is_err() {
                return;
            }
        }
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }

    /// The spans once `done` holds of them.
    async fn until(&self, what: &str, done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        within(what, async {
            loop {
                let changed = self.changed.notified();
                let spans = self.spans();
                if done(&spans) {
                    return spans;
                }
                changed.await;
            }
        })
        .await
    }

    /// The spans once `servers` server spans have arrived, with every client span started
    /// before them (a server span ends after its attempts).
    async fn requests(&self, servers: usize) -> Vec<Span> {
        let spans = self
            .until(&format!("{servers} server spans"), |s| {
                s.iter().filter(|s| kind(s) == SpanKind::Server).count() >= servers
            })
            .await;
        for span in &spans {
            let mut keys: Vec<&str> = span.attributes.iter().map(|kv| kv.key.as_str()).collect();
            keys.sort_unstable();
            let n = keys.len();
            keys.dedup();
            assert_eq!(n, keys.len(), "each key once in {}: {keys:?}", span.name);
        }
        spans
    }
}

fn kind(s: &Span) -> SpanKind {
    SpanKind::try_from(s.kind).unwrap()
}

fn value<'a>(
    attrs: &'a [opentelemetry_proto::tonic::common::v1::KeyValue],
    key: &str,
) -> Option<&'a AnyValue> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn str_of(attrs: &[opentelemetry_proto::tonic::common::v1::KeyValue], key: &str) -> Option<String> {
    match value(attrs, key)? {
        AnyValue::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

fn s(span: &Span, key: &str) -> Option<String> {
    str_of(&span.attributes, key)
}

fn int(span: &Span, key: &str) -> Option<i64> {
    match value(&span.attributes, key)? {
        AnyValue::IntValue(i) => Some(*i),
        _ => None,
    }
}

fn boolean(span: &Span, key: &str) -> Option<bool> {
    match value(&span.attributes, key)? {
        AnyValue::BoolValue(b) => Some(*b),
        _ => None,
    }
}

fn strings(span: &Span, key: &str) -> Vec<String> {
    match value(&span.attributes, key) {
        Some(AnyValue::ArrayValue(a)) => a
            .values
            .iter()
            .filter_map(|v| match v.value.as_ref()? {
                AnyValue::StringValue(s) => Some(s.clone()),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn server(spans: &[Span]) -> Span {
    let servers: Vec<&Span> = spans
        .iter()
        .filter(|s| kind(s) == SpanKind::Server)
        .collect();
    assert_eq!(servers.len(), 1, "{spans:#?}");
    servers[0].clone()
}

fn clients(spans: &[Span]) -> Vec<Span> {
    let mut c: Vec<Span> = spans
        .iter()
        .filter(|s| kind(s) == SpanKind::Client)
        .cloned()
        .collect();
    c.sort_by_key(|s| s.start_time_unix_nano);
    c
}

/// `[tracing]` to `receiver`, exporting every 20 ms, with `extra` keys.
fn tracing_section(url: &str, extra: &str) -> String {
    format!("[tracing]\notlp_endpoint = \"{url}\"\nexport_interval_ms = 20\n{extra}\n")
}

fn sim_config(flavor: Flavor) -> SimConfig {
    SimConfig {
        flavor,
        model: "up-model".into(),
        ..SimConfig::default()
    }
}

async fn traced_proxy(flavor: &str, alias: &str, tracing: &str, backend: String) -> Proxy {
    let toml = format!("{}\n{tracing}", one_alias(flavor, "", alias));
    proxy(&toml, &[("b", backend)]).await
}

#[tokio::test]
async fn a_streamed_chat_is_a_server_span_with_a_client_span_per_attempt() {
    let otlp = Receiver::start(Mode::Answer).await;
    let backend = sim(sim_config(Flavor::Llamacpp)).await;
    let p = traced_proxy(
        "llamacpp",
        "",
        &tracing_section(&otlp.url, "service_name = \"edge-proxy\""),
        backend.url(),
    )
    .await;
    let resp = client()
        .post(p.url("/v1/chat/completions"))
        .header("traceparent", traceparent(true))
        .header("x-switchboard-session", "conv-7")
        .json(&chat("a", true))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let events = sse_payloads(resp).await;
    assert!(events.len() > 2, "{events:?}");

    let spans = otlp.requests(1).await;
    let srv = server(&spans);
    assert_eq!(srv.name, "chat a");
    assert_eq!(hex(&srv.trace_id), TRACE_ID, "the client's trace continues");
    assert_eq!(hex(&srv.parent_span_id), PARENT_ID);
    assert_eq!(s(&srv, "gen_ai.operation.name").as_deref(), Some("chat"));
    assert_eq!(s(&srv, "gen_ai.request.model").as_deref(), Some("a"));
    assert_eq!(
        s(&srv, "gen_ai.response.model").as_deref(),
        Some("up-model")
    );
    assert_eq!(s(&srv, "gen_ai.provider.name").as_deref(), Some("llamacpp"));
    assert_eq!(s(&srv, "gen_ai.conversation.id").as_deref(), Some("conv-7"));
    assert_eq!(int(&srv, "gen_ai.request.max_tokens"), Some(4));
    assert_eq!(boolean(&srv, "gen_ai.request.stream"), Some(true));
    assert!(int(&srv, "gen_ai.usage.input_tokens").unwrap() > 0);
    assert_eq!(int(&srv, "gen_ai.usage.output_tokens"), Some(4));
    assert_eq!(strings(&srv, "gen_ai.response.finish_reasons"), ["length"]);
    assert_eq!(int(&srv, "http.response.status_code"), Some(200));
    assert_eq!(s(&srv, "error.type"), None);
    assert!(
        srv.events
            .iter()
            .any(|e| e.name == "switchboard.first_token"),
        "{:?}",
        srv.events
    );
    assert!(
        s(&srv, "gen_ai.input.messages").is_none(),
        "no content by default"
    );
    assert!(s(&srv, "gen_ai.output.messages").is_none());

    let attempts = clients(&spans);
    assert_eq!(attempts.len(), 1);
    let at = &attempts[0];
    assert_eq!(at.name, "chat up-model");
    assert_eq!(at.trace_id, srv.trace_id);
    assert_eq!(
        at.parent_span_id, srv.span_id,
        "the attempt is the server span's child"
    );
    let port = backend
        .url()
        .rsplit(':')
        .next()
        .unwrap()
        .parse::<i64>()
        .unwrap();
    assert_eq!(s(at, "server.address").as_deref(), Some("127.0.0.1"));
    assert_eq!(int(at, "server.port"), Some(port));
    assert_eq!(s(at, "switchboard.backend").as_deref(), Some("b"));
    assert!(at.start_time_unix_nano >= srv.start_time_unix_nano);
    assert!(at.end_time_unix_nano <= srv.end_time_unix_nano);
    assert!(at
        .events
        .iter()
        .any(|e| e.name == "switchboard.first_token"));

    // The backend was handed the attempt's context, not the client's.
    let sent = backend.recorder().last().unwrap();
    let tp = sent.headers.get("traceparent").unwrap().to_str().unwrap();
    assert_eq!(tp, format!("00-{TRACE_ID}-{}-01", hex(&at.span_id)));
    assert_eq!(
        *otlp.services.lock().unwrap().first().unwrap(),
        "edge-proxy"
    );
}

/// A Codex CLI request: its thread is the span's conversation, and the kind of request its
/// turn metadata names (a compaction here) is on the span.
#[tokio::test]
async fn a_codex_requests_thread_and_kind_are_on_its_span() {
    let otlp = Receiver::start(Mode::Answer).await;
    let backend = sim(sim_config(Flavor::Llamacpp)).await;
    let tracing = tracing_section(&otlp.url, "sample_ratio = 1.0");
    let p = traced_proxy("llamacpp", "", &tracing, backend.url()).await;
    let resp = client()
        .post(p.url("/v1/chat/completions"))
        .header("session-id", "codex-session-1")
        .header("thread-id", "codex-thread-9")
        .header(
            "x-codex-turn-metadata",
            r#"{"turn_id":"t3","request_kind":"compact","thread_source":"user"}"#,
        )
        .json(&chat("a", false))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let spans = otlp.requests(1).await;
    let srv = server(&spans);
    assert_eq!(
        s(&srv, "gen_ai.conversation.id").as_deref(),
        Some("codex-thread-9")
    );
    assert_eq!(
        s(&srv, "switchboard.request_kind").as_deref(),
        Some("compact")
    );
}

#[tokio::test]
async fn a_messages_request_translated_for_a_chat_only_backend_names_its_translation() {
    let otlp = Receiver::start(Mode::Answer).await;
    let backend = sim(sim_config(Flavor::Vllm)).await;
    let toml = format!(
        "{}\n{}",
        one_alias("vllm", "", "").replace("slots = 8", "slots = 8\napis = [\"chat\"]"),
        tracing_section(&otlp.url, "capture_content = true")
    );
    let p = proxy(&toml, &[("b", backend.url())]).await;
    let body = json!({"model": "a", "max_tokens": 5, "stream": true,
        "messages": [{"role": "user", "content": "Hello there"}]});
    let resp = client()
        .post(p.url("/v1/messages"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = String::from_utf8(resp.bytes().await.unwrap().to_vec()).unwrap();
    assert!(text.contains("message_stop"), "{text}");
    assert_eq!(
        backend.recorder().last().unwrap().path,
        "/v1/chat/completions"
    );

    let spans = otlp.requests(1).await;
    let srv = server(&spans);
    assert_eq!(srv.name, "chat a");
    assert_eq!(s(&srv, "gen_ai.operation.name").as_deref(), Some("chat"));
    assert_eq!(s(&srv, "url.path").as_deref(), Some("/v1/messages"));
    assert_eq!(int(&srv, "gen_ai.usage.output_tokens"), Some(5));
    assert_eq!(strings(&srv, "gen_ai.response.finish_reasons"), ["length"]);
    let translated = Some("chat_completions".to_string());
    assert_eq!(s(&srv, "switchboard.translated_to"), translated);
    let input = s(&srv, "gen_ai.input.messages").unwrap();
    assert!(input.contains("Hello there"), "{input}");
    let output = s(&srv, "gen_ai.output.messages").unwrap();
    let output: serde_json::Value = serde_json::from_str(&output).unwrap();
    assert_eq!(output[0]["role"], "assistant");
    assert!(!output[0]["parts"][0]["content"]
        .as_str()
        .unwrap()
        .is_empty());
    let at = &clients(&spans)[0];
    assert_eq!(s(at, "gen_ai.provider.name").as_deref(), Some("vllm"));
    assert_eq!(s(at, "switchboard.translated_to"), translated);
}

#[tokio::test]
async fn a_context_rejection_is_a_server_span_with_no_attempt() {
    let otlp = Receiver::start(Mode::Answer).await;
    let backend = sim(sim_config(Flavor::Llamacpp)).await;
    let toml = format!(
        "{}\n{}",
        one_alias("llamacpp", "", "").replace("context_window = 4096", "context_window = 64"),
        tracing_section(&otlp.url, "")
    );
    let p = proxy(&toml, &[("b", backend.url())]).await;
    let mut body = chat("a", false);
    body["messages"][0]["content"] = json!(varied_text(2000, 3));
    let resp = p.post_chat(&client(), &body).await;
    assert_eq!(resp.status(), 400);
    let spans = otlp.requests(1).await;
    let srv = server(&spans);
    assert_eq!(
        s(&srv, "error.type").as_deref(),
        Some("context_length_exceeded")
    );
    assert_eq!(boolean(&srv, "switchboard.context.rejected"), Some(true));
    assert_eq!(int(&srv, "switchboard.context.window"), Some(64));
    assert!(s(&srv, "switchboard.count.method").is_some());
    assert!(int(&srv, "switchboard.count.prompt_tokens").unwrap() > 64);
    assert_eq!(int(&srv, "http.response.status_code"), Some(400));
    let status = srv.status.as_ref().unwrap();
    assert_eq!(status.code, 2, "an error status: {status:?}");
    assert!(clients(&spans).is_empty(), "no backend was tried");
    assert_eq!(backend.recorder().received(), 0);
}

#[tokio::test]
async fn a_fallback_after_a_dead_backend_is_an_event_between_two_attempts() {
    let otlp = Receiver::start(Mode::Answer).await;
    let live = sim(sim_config(Flavor::Llamacpp)).await;
    let toml = format!(
        r#"
[backends.dead]
url = "{{dead}}"
flavor = "llamacpp"
[backends.live]
url = "{{live}}"
flavor = "llamacpp"
[aliases.a]
backend = "dead"
upstream_model = "up-model"
fallbacks = ["f"]
[aliases.f]
backend = "live"
upstream_model = "up-model"
{}"#,
        tracing_section(&otlp.url, "")
    );
    let p = proxy(&toml, &[("dead", dead_url().await), ("live", live.url())]).await;
    let resp = p.post_chat(&client(), &chat("a", false)).await;
    assert_eq!(resp.status(), 200);
    let spans = otlp.requests(1).await;
    let srv = server(&spans);
    let fallback = srv
        .events
        .iter()
        .find(|e| e.name == "switchboard.fallback")
        .expect("a fallback event");
    assert_eq!(
        str_of(&fallback.attributes, "switchboard.fallback.from").as_deref(),
        Some("a")
    );
    assert_eq!(
        str_of(&fallback.attributes, "switchboard.fallback.to").as_deref(),
        Some("f")
    );
    assert_eq!(
        str_of(&fallback.attributes, "switchboard.fallback.reason").as_deref(),
        Some("connect")
    );
    assert_eq!(s(&srv, "switchboard.alias").as_deref(), Some("f"));
    assert_eq!(s(&srv, "error.type"), None);
    let attempts = clients(&spans);
    assert_eq!(attempts.len(), 2, "{attempts:#?}");
    assert_eq!(
        s(&attempts[0], "switchboard.backend").as_deref(),
        Some("dead")
    );
    assert_eq!(s(&attempts[0], "error.type").as_deref(), Some("connect"));
    assert_eq!(attempts[0].status.as_ref().unwrap().code, 2);
    assert_eq!(
        s(&attempts[1], "switchboard.backend").as_deref(),
        Some("live")
    );
    assert_eq!(s(&attempts[1], "switchboard.alias").as_deref(), Some("f"));
    assert_eq!(s(&attempts[1], "error.type"), None);
    assert_eq!(int(&attempts[1], "switchboard.attempt"), Some(2));
}

#[tokio::test]
async fn a_stream_the_client_leaves_ends_its_spans_as_cancelled() {
    let otlp = Receiver::start(Mode::Answer).await;
    let backend = sim(SimConfig {
        token_delay: Duration::from_millis(50),
        completion_tokens: 400,
        ..sim_config(Flavor::Llamacpp)
    })
    .await;
    let p = traced_proxy(
        "llamacpp",
        "",
        &tracing_section(&otlp.url, ""),
        backend.url(),
    )
    .await;
    let mut body = chat("a", true);
    body.as_object_mut().unwrap().remove("max_tokens");
    let mut resp = p.post_chat(&client(), &body).await;
    assert_eq!(resp.status(), 200);
    within("a first chunk", resp.chunk())
        .await
        .unwrap()
        .unwrap();
    drop(resp);
    let spans = otlp.requests(1).await;
    let srv = server(&spans);
    assert_eq!(boolean(&srv, "switchboard.cancelled"), Some(true));
    assert_eq!(s(&srv, "error.type").as_deref(), Some("cancelled"));
    let at = &clients(&spans)[0];
    assert_eq!(s(at, "error.type").as_deref(), Some("cancelled"));
}

/// A trace id whose low half is 1: in any share the ratio sampler keeps above 0 (it reads the
/// low half; `TRACE_ID`'s puts it in no share under 0.64).
const LOW_TRACE_ID: &str = "4bf92f3577b34da60000000000000001";

/// A chat sent with `traceparent`; the `traceparent` the backend was handed for it.
async fn traced_chat(p: &Proxy, backend: &switchboard_sim::Sim, traceparent: &str) -> String {
    let resp = client()
        .post(p.url("/v1/chat/completions"))
        .header("traceparent", traceparent)
        .json(&chat("a", false))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    backend.recorder().last().unwrap().headers["traceparent"]
        .to_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn a_clients_sampled_flag_never_raises_sampling_past_the_ratio() {
    let otlp = Receiver::start(Mode::Answer).await;
    let backend = sim(sim_config(Flavor::Llamacpp)).await;
    let p = traced_proxy(
        "llamacpp",
        "",
        &tracing_section(&otlp.url, "sample_ratio = 0.0"),
        backend.url(),
    )
    .await;
    // A new trace at ratio 0: not recorded, but the backend still gets a context (unsampled).
    for _ in 0..5 {
        assert_eq!(
            p.post_chat(&client(), &chat("a", false)).await.status(),
            200
        );
    }
    let tp = backend.recorder().last().unwrap().headers["traceparent"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(tp.starts_with("00-") && tp.ends_with("-00"), "{tp}");
    // A client's sampled trace at ratio 0: continued, but not recorded either.
    for _ in 0..20 {
        let tp = traced_chat(&p, &backend, &traceparent(true)).await;
        assert!(
            tp.starts_with(&format!("00-{TRACE_ID}-")) && tp.ends_with("-00"),
            "ratio 0 records nothing, whatever the client's flag: {tp}"
        );
    }

    // At ratio 0.5 the ratio decides on the trace id for a client's sampled trace too.
    let backend = sim(sim_config(Flavor::Llamacpp)).await;
    let p = traced_proxy(
        "llamacpp",
        "",
        &tracing_section(&otlp.url, "sample_ratio = 0.5"),
        backend.url(),
    )
    .await;
    let tp = traced_chat(&p, &backend, &traceparent(true)).await;
    assert!(tp.ends_with("-00"), "outside the share: {tp}");
    // An unsampled parent is followed, even in the share.
    let unsampled = format!("00-{LOW_TRACE_ID}-{PARENT_ID}-00");
    let tp = traced_chat(&p, &backend, &unsampled).await;
    assert!(tp.ends_with("-00"), "{tp}");
    let sampled = format!("00-{LOW_TRACE_ID}-{PARENT_ID}-01");
    let tp = traced_chat(&p, &backend, &sampled).await;
    assert!(tp.ends_with("-01"), "in the share and sampled: {tp}");
    // Spans leave in the order they end: the last request's show the others made none.
    let spans = otlp.requests(1).await;
    assert_eq!(spans.len(), 2, "{spans:#?}");
    assert!(
        spans.iter().all(|s| hex(&s.trace_id) == LOW_TRACE_ID),
        "{spans:#?}"
    );
}

#[tokio::test]
async fn a_request_refused_at_auth_makes_no_span() {
    std::env::set_var("SB_T_TRACE_KEYS", "trace-key");
    let otlp = Receiver::start(Mode::Answer).await;
    let backend = sim(sim_config(Flavor::Llamacpp)).await;
    let toml = format!(
        "{}\n{}",
        one_alias("llamacpp", "api_keys_env = \"SB_T_TRACE_KEYS\"", ""),
        tracing_section(&otlp.url, "")
    );
    let p = proxy(&toml, &[("b", backend.url())]).await;
    let c = client();
    for key in [None, Some("wrong-key")] {
        let mut req = c
            .post(p.url("/v1/chat/completions"))
            .header("traceparent", traceparent(true))
            .json(&chat("a", false));
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        assert_eq!(req.send().await.unwrap().status(), 401);
    }
    // Counted once their records ended (where a span would have been handed to the export).
    let refused = "switchboard_requests_total{alias=\"unknown\",endpoint=\"chat_completions\",status=\"401\",stream=\"false\"}";
    within("the two refusals counted", async {
        while sample(&p.metrics().await, refused) < 2.0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let other = format!("00-{LOW_TRACE_ID}-{PARENT_ID}-01");
    let resp = c
        .post(p.url("/v1/chat/completions"))
        .bearer_auth("trace-key")
        .header("traceparent", other)
        .json(&chat("a", false))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let spans = otlp.requests(1).await;
    assert!(
        spans.iter().all(|s| hex(&s.trace_id) == LOW_TRACE_ID),
        "the refused requests made no span: {spans:#?}"
    );
    assert_eq!(spans.len(), 2);
}

#[tokio::test]
async fn with_tracing_off_the_clients_traceparent_passes_untouched() {
    let backend = sim(sim_config(Flavor::Llamacpp)).await;
    let p = traced_proxy("llamacpp", "", "", backend.url()).await;
    let resp = client()
        .post(p.url("/v1/chat/completions"))
        .header("traceparent", traceparent(true))
        .header("tracestate", "vendor=x")
        .json(&chat("a", false))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let sent = backend.recorder().last().unwrap();
    assert_eq!(sent.headers["traceparent"], traceparent(true).as_str());
    assert_eq!(sent.headers["tracestate"], "vendor=x");
    assert!(p.state.live.load().tracer.is_none());
}

#[tokio::test]
async fn a_hanging_collector_drops_spans_past_the_queue_and_requests_go_on() {
    let otlp = Receiver::start(Mode::Hang).await;
    let backend = sim(sim_config(Flavor::Llamacpp)).await;
    let p = traced_proxy(
        "llamacpp",
        "",
        &tracing_section(&otlp.url, "queue_spans = 4\nexport_timeout_ms = 60000"),
        backend.url(),
    )
    .await;
    let c = client();
    let requests = 30;
    for _ in 0..requests {
        assert_eq!(p.post_chat(&c, &chat("a", false)).await.status(), 200);
    }
    // Two spans a request; the queue holds 4 and the stuck export a batch of at most 4.
    let at_least = 2 * requests - 8;
    let dropped = within("the spans past the queue counted", async {
        loop {
            let m = p.metrics().await;
            let n = sample(
                &m,
                "switchboard_trace_spans_dropped_total{reason=\"queue_full\"}",
            );
            if n >= f64::from(at_least) {
                return n;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(dropped <= f64::from(2 * requests), "{dropped}");
    assert!(
        *otlp.exports.lock().unwrap() >= 1,
        "the collector was reached"
    );
    assert!(otlp.spans().is_empty());
}

#[tokio::test]
async fn a_collector_that_is_down_counts_failed_exports_and_requests_go_on() {
    let backend = sim(sim_config(Flavor::Llamacpp)).await;
    let p = traced_proxy(
        "llamacpp",
        "",
        &tracing_section(&dead_url().await, ""),
        backend.url(),
    )
    .await;
    let c = client();
    for _ in 0..3 {
        assert_eq!(p.post_chat(&c, &chat("a", true)).await.status(), 200);
    }
    within("the failed exports counted", async {
        loop {
            let m = p.metrics().await;
            if sample(
                &m,
                "switchboard_trace_spans_dropped_total{reason=\"export_failed\"}",
            ) >= 6.0
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn tracing_is_turned_on_and_off_by_a_reload() {
    let otlp = Receiver::start(Mode::Answer).await;
    let backend = sim(sim_config(Flavor::Llamacpp)).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("routes.toml");
    let plain = fill(&one_alias("llamacpp", "", ""), &[("b", backend.url())]);
    std::fs::write(&path, &plain).unwrap();
    let cfg = switchboard_proxy::config::load(&path).unwrap();
    let p = start(switchboard_proxy::live::AppState::new(cfg, Some(path.clone())).unwrap()).await;
    let c = client();
    assert_eq!(p.post_chat(&c, &chat("a", false)).await.status(), 200);
    assert!(p.state.live.load().tracer.is_none());

    std::fs::write(
        &path,
        format!("{plain}\n{}", tracing_section(&otlp.url, "")),
    )
    .unwrap();
    switchboard_proxy::live::reload::reload(&p.state)
        .await
        .unwrap();
    let tracer = p.state.live.load().tracer.clone().expect("tracing on");
    assert_eq!(p.post_chat(&c, &chat("a", false)).await.status(), 200);
    otlp.requests(1).await;
    // An unchanged setting keeps its tracer (and its export queue).
    switchboard_proxy::live::reload::reload(&p.state)
        .await
        .unwrap();
    let kept = p.state.live.load().tracer.clone().unwrap();
    assert!(std::sync::Arc::ptr_eq(&tracer, &kept));

    std::fs::write(&path, &plain).unwrap();
    switchboard_proxy::live::reload::reload(&p.state)
        .await
        .unwrap();
    assert!(p.state.live.load().tracer.is_none());
    assert_eq!(p.post_chat(&c, &chat("a", false)).await.status(), 200);
}

#[tokio::test]
async fn a_translated_responses_stream_names_the_chat_backend_and_its_finish() {
    let otlp = Receiver::start(Mode::Answer).await;
    let backend = sim(sim_config(Flavor::Llamacpp)).await;
    let toml = format!(
        "{}\n{}",
        one_alias("llamacpp", "", "").replace("slots = 8", "slots = 8\napis = [\"chat\"]"),
        tracing_section(&otlp.url, "")
    );
    let p = proxy(&toml, &[("b", backend.url())]).await;
    let body =
        json!({"model": "a", "max_output_tokens": 6, "stream": true, "input": "Hello there"});
    let resp = client()
        .post(p.url("/v1/responses"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = String::from_utf8(resp.bytes().await.unwrap().to_vec()).unwrap();
    assert!(
        text.contains("response.completed") || text.contains("response.incomplete"),
        "{text}"
    );
    assert_eq!(
        backend.recorder().last().unwrap().path,
        "/v1/chat/completions"
    );
    let spans = otlp.requests(1).await;
    let srv = server(&spans);
    assert_eq!(s(&srv, "url.path").as_deref(), Some("/v1/responses"));
    assert_eq!(int(&srv, "gen_ai.request.max_tokens"), Some(6));
    assert_eq!(int(&srv, "gen_ai.usage.output_tokens"), Some(6));
    assert_eq!(strings(&srv, "gen_ai.response.finish_reasons"), ["length"]);
    assert_eq!(
        s(&srv, "gen_ai.response.model").as_deref(),
        Some("up-model")
    );
    let at = &clients(&spans)[0];
    assert_eq!(
        s(at, "switchboard.translated_to").as_deref(),
        Some("chat_completions")
    );
    assert!(at
        .events
        .iter()
        .any(|e| e.name == "switchboard.first_token"));
}

/// A chat whose one message is `content`.
fn chat_saying(content: &str) -> serde_json::Value {
    let mut body = chat("a", false);
    body["messages"][0]["content"] = json!(content);
    body
}

#[tokio::test]
async fn captured_content_is_cut_to_its_bound_at_a_character_boundary_and_marked() {
    let otlp = Receiver::start(Mode::Answer).await;
    let backend = sim(sim_config(Flavor::Llamacpp)).await;
    let toml = format!(
        "{}\n{}",
        one_alias("llamacpp", "", "").replace("context_window = 4096", "context_window = 1000000"),
        tracing_section(&otlp.url, "capture_content = true")
    );
    let p = proxy(&toml, &[("b", backend.url())]).await;
    // 200 KB of two-byte characters after one byte: the default bound (64 KiB) falls inside one.
    let prompt = format!("x{}", "é".repeat(100_000));
    let resp = p.post_chat(&client(), &chat_saying(&prompt)).await;
    assert_eq!(resp.status(), 200);
    let spans = otlp.requests(1).await;
    let srv = server(&spans);
    let input = s(&srv, "gen_ai.input.messages").unwrap();
    assert!(
        input.len() <= 64 << 10 && input.len() > 60 << 10,
        "{} bytes captured",
        input.len()
    );
    assert!(input.ends_with('é'), "cut at a character boundary");
    assert_eq!(boolean(&srv, "switchboard.content.truncated"), Some(true));
    // A prompt within the bound is whole and unmarked.
    let resp = p.post_chat(&client(), &chat_saying("short one")).await;
    assert_eq!(resp.status(), 200);
    let spans = otlp.requests(2).await;
    let short = spans
        .iter()
        .filter(|s| kind(s) == SpanKind::Server)
        .find(|sp| s(sp, "gen_ai.input.messages").is_some_and(|m| m.contains("short one")))
        .expect("the short prompt's span");
    assert_eq!(boolean(short, "switchboard.content.truncated"), None);
}

#[tokio::test]
async fn exports_stay_under_their_byte_bound_and_a_span_too_big_alone_is_dropped() {
    let otlp = Receiver::start(Mode::Answer).await;
    let backend = sim(SimConfig {
        slot_ctx: 1 << 20,
        ..sim_config(Flavor::Llamacpp)
    })
    .await;
    let toml = format!(
        "{}\n[tracing]\notlp_endpoint = \"{}\"\nexport_interval_ms = 1000\n\
         capture_content = true\nexport_max_bytes = 16384\n",
        one_alias("llamacpp", "", "").replace("context_window = 4096", "context_window = 1000000"),
        otlp.url
    );
    let p = proxy(&toml, &[("b", backend.url())]).await;
    let c = client();
    // Eight server spans of about 2.5 KB each: more than one export of 16 KiB holds.
    for i in 0..8 {
        let prompt = format!("{i} {}", "word ".repeat(400));
        assert_eq!(p.post_chat(&c, &chat_saying(&prompt)).await.status(), 200);
    }
    // One whose captured prompt alone (30 KB, under the 64 KiB capture bound) is too big.
    let big = "word ".repeat(6000);
    let resp = p.post_chat(&c, &chat_saying(&big)).await;
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    let spans = otlp
        .until("8 server spans and 9 attempts", |s| {
            let n = |k| s.iter().filter(|s| kind(s) == k).count();
            n(SpanKind::Server) >= 8 && n(SpanKind::Client) >= 9
        })
        .await;
    let dropped = within("the span too big counted", async {
        loop {
            let m = p.metrics().await;
            let n = sample(
                &m,
                "switchboard_trace_spans_dropped_total{reason=\"too_large\"}",
            );
            if n >= 1.0 {
                return n;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(dropped, 1.0);
    let servers = spans.iter().filter(|s| kind(s) == SpanKind::Server).count();
    assert_eq!(servers, 8, "the big request's server span is not exported");
    let sizes = otlp.sizes.lock().unwrap().clone();
    assert!(sizes.len() >= 2, "{sizes:?}");
    assert!(sizes.iter().all(|&n| n <= 16384), "{sizes:?}");
    let m = p.metrics().await;
    for reason in ["queue_full", "export_failed"] {
        let key = format!("switchboard_trace_spans_dropped_total{{reason=\"{reason}\"}}");
        assert_eq!(sample(&m, &key), 0.0, "{reason}");
    }
}
