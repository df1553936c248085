//! One request's spans: the server span (the client's request, from intake to the answer's
//! last byte) and the client span of each attempt at a backend, filled as the pipeline learns
//! its facts and ended with the request's record.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use http::HeaderMap;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt as _, Tracer as _};
use opentelemetry::{Array, Context, KeyValue, StringValue, Value};
use opentelemetry_http::HeaderInjector;
use opentelemetry_sdk::trace::Span;

use super::names as n;
use super::Tracer;
use crate::fleet::work::Measured;
use crate::wire::usage::Usage;
use switchboard_json::utf8::prefix;

/// `at` on the wall clock (spans carry wall-clock times; the request's are monotonic).
pub(crate) fn wall_clock(at: Instant) -> SystemTime {
    let now = SystemTime::now();
    now.checked_sub(at.elapsed()).unwrap_or(now)
}

/// The spans of one request.
pub(crate) struct RequestTrace {
    tracer: Arc<Tracer>,
    /// The server span, inside the context attempts are started in.
    server: Context,
    /// The attempt running now (or the one that answered).
    attempt: Option<Span>,
    attempts: u32,
    operation: &'static str,
    /// `started` on both clocks, to place later instants.
    wall: SystemTime,
    started: Instant,
    /// What the answer named: its model and finish reasons.
    response_model: Option<String>,
    finish_reasons: Vec<String>,
    error_type: Option<&'static str>,
    /// The answer's text, when content is captured.
    output: Option<String>,
    /// Captured content was cut to its bound.
    truncated: bool,
    /// What may change while the request goes on (the span takes each key once, at its end):
    /// the alias serving it, the last attempt's backend and flavour, its translation.
    alias: Option<String>,
    backend: Option<(String, &'static str)>,
    translated: Option<&'static str>,
    /// The server span is sampled: false, it only carries the trace to the backend.
    recording: bool,
}

impl std::fmt::Debug for RequestTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestTrace")
            .field("attempts", &self.attempts)
            .finish_non_exhaustive()
    }
}

/// One attempt at a backend, as its span tells it.
pub(crate) struct Attempt<'a> {
    pub(crate) backend: &'a str,
    /// `gen_ai.provider.name`: the backend's flavour.
    pub(crate) flavor: &'static str,
    /// `host:port`.
    pub(crate) authority: &'a str,
    /// The model as the backend is asked for it.
    pub(crate) model: &'a str,
    pub(crate) alias: &'a str,
    /// Time spent waiting for the replica's slot.
    pub(crate) queued: Duration,
    /// The conversation's replica: `hit`, `moved`, `new` (replicas only).
    pub(crate) affinity: Option<&'static str>,
    /// Sent once more after a backend dropped it unanswered.
    pub(crate) resent: bool,
    /// The wait for the slot predicted when it queued (none where it did not), and its GPU
    /// time predicted there.
    pub(crate) predicted_wait: Option<Duration>,
    pub(crate) predicted_work: f64,
}

/// What the request's record knows at its end.
pub(crate) struct End<'a> {
    pub(crate) status: u16,
    pub(crate) usage: Option<Usage>,
    pub(crate) first_token: Option<Instant>,
    /// The answer reached its end (unset: the client went away).
    pub(crate) completed: bool,
    pub(crate) error: Option<&'a str>,
    /// Its GPU time, measured.
    pub(crate) work: Option<Measured>,
}

impl RequestTrace {
    pub(super) fn new(
        tracer: Arc<Tracer>,
        server: Span,
        operation: &'static str,
        started: Instant,
    ) -> RequestTrace {
        let recording = server.is_recording();
        RequestTrace {
            recording,
            tracer,
            server: Context::new().with_span(server),
            attempt: None,
            attempts: 0,
            operation,
            wall: wall_clock(started),
            started,
            response_model: None,
            finish_reasons: Vec::new(),
            error_type: None,
            output: None,
            truncated: false,
            alias: None,
            backend: None,
            translated: None,
        }
    }

    fn at(&self, t: Instant) -> SystemTime {
        self.wall + t.saturating_duration_since(self.started)
    }

    fn set(&self, kv: KeyValue) {
        self.server.span().set_attribute(kv);
    }

    /// Whether this request's spans are sampled, so worth telling what happens; an unsampled
    /// trace is only carried on to the backend.
    pub(crate) fn recording(&self) -> bool {
        self.recording
    }

    /// Whether prompts and answers are captured.
    pub(crate) fn captures_content(&self) -> bool {
        self.tracer.captures_content()
    }

    /// The request resolved: the model the client asked for and what it asked of it.
    pub(crate) fn resolved(&mut self, requested: &str, max_tokens: Option<u64>, stream: bool) {
        let span = self.server.span();
        span.update_name(format!("{} {requested}", self.operation));
        span.set_attribute(KeyValue::new(n::REQUEST_MODEL, requested.to_string()));
        span.set_attribute(KeyValue::new(n::REQUEST_STREAM, stream));
        if let Some(m) = max_tokens {
            span.set_attribute(KeyValue::new(
                n::REQUEST_MAX_TOKENS,
                i64::try_from(m).unwrap_or(i64::MAX),
            ));
        }
    }

    /// The most bytes of captured content an attribute holds.
    fn capture_max(&self) -> usize {
        self.tracer.settings().capture_max_bytes
    }

    /// The request's messages as the client sent them (only when content is captured), cut
    /// to the capture bound.
    pub(crate) fn input(&mut self, messages: &str) {
        if self.captures_content() {
            let kept = prefix(messages, self.capture_max());
            self.truncated |= kept.len() < messages.len();
            self.set(KeyValue::new(n::INPUT_MESSAGES, kept.to_string()));
        }
    }

    pub(crate) fn conversation(&self, id: &str) {
        self.set(KeyValue::new(n::CONVERSATION, id.to_string()));
    }

    /// What kind of request its harness says it is (Codex CLI's `request_kind`).
    pub(crate) fn request_kind(&self, kind: &str) {
        self.set(KeyValue::new(n::REQUEST_KIND, kind.to_string()));
    }

    pub(crate) fn client(&self, name: &str) {
        self.set(KeyValue::new(n::CLIENT, name.to_string()));
    }

    /// The alias serving the request now.
    pub(crate) fn alias(&mut self, alias: &str) {
        self.alias = Some(alias.to_string());
    }

    /// The guard's count: how it counted, what, against which window.
    pub(crate) fn counted(&self, method: &'static str, prompt: Option<u32>, window: u32) {
        self.set(KeyValue::new(n::COUNT_METHOD, method));
        if let Some(p) = prompt {
            self.set(KeyValue::new(n::COUNT_PROMPT, i64::from(p)));
        }
        self.set(KeyValue::new(n::CONTEXT_WINDOW, i64::from(window)));
    }

    /// The guard refused the request: it does not fit the window.
    pub(crate) fn rejected(&self) {
        self.set(KeyValue::new(n::CONTEXT_REJECTED, true));
    }

    /// The request moved from alias `from` to its fallback `to`, for `reason`.
    pub(crate) fn fallback(&self, from: &str, to: &str, reason: &str) {
        self.server.span().add_event(
            n::FALLBACK,
            vec![
                KeyValue::new(n::FALLBACK_FROM, from.to_string()),
                KeyValue::new(n::FALLBACK_TO, to.to_string()),
                KeyValue::new(n::FALLBACK_REASON, reason.to_string()),
            ],
        );
    }

    /// An attempt at a backend begins: its client span, a child of the server span.
    pub(crate) fn attempt(&mut self, a: &Attempt<'_>) {
        self.attempts += 1;
        let (host, port) = split_authority(a.authority);
        let mut attrs = vec![
            KeyValue::new(n::OPERATION, self.operation),
            KeyValue::new(n::PROVIDER, a.flavor),
            KeyValue::new(n::REQUEST_MODEL, a.model.to_string()),
            KeyValue::new(n::SERVER_ADDRESS, host.to_string()),
            KeyValue::new(n::BACKEND, a.backend.to_string()),
            KeyValue::new(n::ALIAS, a.alias.to_string()),
            KeyValue::new(n::ATTEMPT, i64::from(self.attempts)),
            KeyValue::new(n::QUEUE_WAIT, a.queued.as_secs_f64() * 1000.0),
        ];
        if let Some(port) = port {
            attrs.push(KeyValue::new(n::SERVER_PORT, i64::from(port)));
        }
        if let Some(result) = a.affinity {
            attrs.push(KeyValue::new(n::AFFINITY, result));
        }
        if a.resent {
            attrs.push(KeyValue::new(n::RESENT, true));
        }
        if let Some(w) = a.predicted_wait {
            attrs.push(KeyValue::new(
                n::QUEUE_WAIT_PREDICTED,
                w.as_secs_f64() * 1000.0,
            ));
        }
        attrs.push(KeyValue::new(n::GPU_PREDICTED, a.predicted_work));
        let tracer = self.tracer.sdk();
        let span = tracer
            .span_builder(format!("{} {}", self.operation, a.model))
            .with_kind(SpanKind::Client)
            .with_start_time(SystemTime::now())
            .with_attributes(attrs)
            .start_with_context(tracer, &self.server);
        // An attempt left open (one that never reached its send) ends where the next begins.
        if let Some(mut before) = self.attempt.replace(span) {
            before.end();
        }
        self.backend = Some((a.backend.to_string(), a.flavor));
        self.translated = None;
    }

    /// The attempt gave its slot up to an interactive request before its client had a byte:
    /// its span ends so, and the request's tells of it.
    pub(crate) fn preempted(&mut self, backend: &str) {
        if let Some(mut a) = self.attempt.take() {
            a.set_attribute(KeyValue::new(n::PREEMPTED, true));
            a.end();
        }
        self.server.span().add_event(
            n::PREEMPTED,
            vec![KeyValue::new(n::BACKEND, backend.to_string())],
        );
    }

    /// The attempt is sent translated to `api` (the backend does not serve the client's).
    pub(crate) fn translated(&mut self, api: &'static str) {
        if let Some(a) = &mut self.attempt {
            a.set_attribute(KeyValue::new(n::TRANSLATED, api));
        }
        self.translated = Some(api);
    }

    /// The backend's `traceparent` (and `tracestate`): the attempt's span, in place of any
    /// the client sent.
    pub(crate) fn inject(&self, headers: &mut HeaderMap) {
        headers.remove("traceparent");
        headers.remove("tracestate");
        let propagator = self.tracer.propagator();
        match &self.attempt {
            Some(a) => {
                let cx = Context::new().with_remote_span_context(a.span_context().clone());
                propagator.inject_context(&cx, &mut HeaderInjector(headers));
            }
            // Unsampled: no attempt spans; the trace goes on, unsampled, from the server span.
            None => propagator.inject_context(&self.server, &mut HeaderInjector(headers)),
        }
    }

    /// The attempt failed before any byte reached the client: why, and the backend's status
    /// when it answered one.
    pub(crate) fn attempt_failed(&mut self, error_type: &str, status: Option<u16>) {
        if let Some(mut a) = self.attempt.take() {
            if let Some(s) = status {
                a.set_attribute(KeyValue::new(n::HTTP_STATUS, i64::from(s)));
            }
            a.set_attribute(KeyValue::new(n::ERROR_TYPE, error_type.to_string()));
            a.set_status(Status::error(error_type.to_string()));
            a.end();
        }
    }

    /// The error the client was answered with (its `code`).
    pub(crate) fn error_type(&mut self, code: &'static str) {
        self.error_type = Some(code);
    }

    /// What the answer named: the backend's model and a choice's finish reason.
    pub(crate) fn response(&mut self, model: Option<&str>, finish: Option<&str>) {
        if let (None, Some(m)) = (&self.response_model, model) {
            self.response_model = Some(m.to_string());
        }
        if let Some(f) = finish {
            if !self.finish_reasons.iter().any(|r| r == f) {
                self.finish_reasons.push(f.to_string());
            }
        }
    }

    /// Whether the answer's model is known (read from its first event).
    pub(crate) fn knows_model(&self) -> bool {
        self.response_model.is_some()
    }

    /// Answer text, gathered when content is captured, up to the capture bound (what comes
    /// after it is not kept).
    pub(crate) fn output(&mut self, text: &str) {
        if self.captures_content() {
            let max = self.capture_max();
            let out = self.output.get_or_insert_with(String::new);
            let kept = prefix(text, max.saturating_sub(out.len()));
            self.truncated |= kept.len() < text.len();
            out.push_str(kept);
        }
    }

    /// The request ended: both spans told its outcome and ended.
    pub(crate) fn finish(mut self, end: &End<'_>) {
        if !self.recording {
            self.server.span().end();
            return;
        }
        let now = SystemTime::now();
        let mut attrs = Vec::with_capacity(12);
        attrs.push(KeyValue::new(n::HTTP_STATUS, i64::from(end.status)));
        if let Some(u) = end.usage {
            attrs.extend(usage(u));
        }
        if let Some(w) = end.work {
            attrs.push(KeyValue::new(n::GPU_PREFILL, w.work.prefill));
            attrs.push(KeyValue::new(n::GPU_DECODE, w.work.decode));
            attrs.push(KeyValue::new(n::GPU_REPORTED, w.reported));
        }
        if let Some(m) = self.response_model.take() {
            attrs.push(KeyValue::new(n::RESPONSE_MODEL, m));
        }
        if !self.finish_reasons.is_empty() {
            let reasons: Vec<StringValue> = self
                .finish_reasons
                .drain(..)
                .map(StringValue::from)
                .collect();
            attrs.push(KeyValue::new(
                n::FINISH_REASONS,
                Value::Array(Array::String(reasons)),
            ));
        }
        if let Some(text) = self.output.take() {
            let (messages, cut) = output_messages(&text, self.capture_max());
            self.truncated |= cut;
            attrs.push(KeyValue::new(n::OUTPUT_MESSAGES, messages));
        }
        if self.truncated {
            attrs.push(KeyValue::new(n::CONTENT_TRUNCATED, true));
        }
        let error = self.error_of(end);
        if let Some(e) = &error {
            attrs.push(KeyValue::new(n::ERROR_TYPE, e.clone()));
        }
        if !end.completed {
            attrs.push(KeyValue::new(n::CANCELLED, true));
        }
        if let Some(t) = end.first_token {
            let ttft = t.saturating_duration_since(self.started);
            attrs.push(KeyValue::new(n::TTFT, ttft.as_secs_f64() * 1000.0));
        }
        if let Some(mut a) = self.attempt.take() {
            if let Some(t) = end.first_token {
                a.add_event_with_timestamp(n::FIRST_TOKEN, self.at(t), Vec::new());
            }
            for kv in &attrs {
                a.set_attribute(kv.clone());
            }
            if let Some(e) = &error {
                a.set_status(Status::error(e.clone()));
            }
            a.end_with_timestamp(now);
        }
        let settled = self.settled();
        let span = self.server.span();
        span.set_attributes(settled);
        if let Some(t) = end.first_token {
            span.add_event_with_timestamp(
                std::borrow::Cow::Borrowed(n::FIRST_TOKEN),
                self.at(t),
                Vec::new(),
            );
        }
        span.set_attributes(attrs);
        if let Some(e) = error {
            span.set_status(Status::error(e));
        }
        span.end_with_timestamp(now);
    }

    /// The server span's facts that changed on the way, as they ended.
    fn settled(&mut self) -> Vec<KeyValue> {
        let mut kv = Vec::with_capacity(4);
        if let Some(alias) = self.alias.take() {
            kv.push(KeyValue::new(n::ALIAS, alias));
        }
        if let Some((backend, flavor)) = self.backend.take() {
            kv.push(KeyValue::new(n::BACKEND, backend));
            kv.push(KeyValue::new(n::PROVIDER, flavor));
        }
        if let Some(api) = self.translated {
            kv.push(KeyValue::new(n::TRANSLATED, api));
        }
        kv
    }

    /// `error.type` of the request: the error code it was answered with, the stream's
    /// error, `cancelled` when the client went away.
    fn error_of(&self, end: &End<'_>) -> Option<String> {
        if let Some(code) = self.error_type {
            return Some(code.to_string());
        }
        if !end.completed {
            return Some("cancelled".into());
        }
        if end.error.is_some() {
            return Some("stream_error".into());
        }
        (end.status >= 400).then(|| end.status.to_string())
    }
}

/// The usage attributes of an answer.
fn usage(u: Usage) -> Vec<KeyValue> {
    let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let mut kv = vec![
        KeyValue::new(n::INPUT_TOKENS, int(u.prompt)),
        KeyValue::new(n::OUTPUT_TOKENS, int(u.completion)),
    ];
    if let Some(r) = u.reasoning {
        kv.push(KeyValue::new(n::REASONING_TOKENS, int(r)));
    }
    if let Some(c) = u.cached {
        kv.push(KeyValue::new(n::CACHED_TOKENS, int(c)));
    }
    kv
}

/// `gen_ai.output.messages` of an answer's text: one assistant message with one text part,
/// the text cut (at a character boundary) until the whole is within `max` bytes; and whether
/// it was cut.
fn output_messages(text: &str, max: usize) -> (String, bool) {
    let mut text = text;
    let mut cut = false;
    loop {
        let whole = serde_json::json!([{
            "role": "assistant",
            "parts": [{"type": "text", "content": text}],
        }])
        .to_string();
        if whole.len() <= max || text.is_empty() {
            return (whole, cut);
        }
        // The excess, or half the text where escapes make the excess more than the text: a
        // few passes at most.
        let keep = text
            .len()
            .saturating_sub(whole.len() - max)
            .max(text.len() / 2);
        text = prefix(text, keep);
        cut = true;
    }
}

/// `host:port` as host and port.
fn split_authority(authority: &str) -> (&str, Option<u16>) {
    match authority.rsplit_once(':') {
        Some((host, port)) => match port.parse() {
            Ok(p) => (host.trim_start_matches('[').trim_end_matches(']'), Some(p)),
            Err(_) => (authority, None),
        },
        None => (authority, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities_split_into_host_and_port() {
        assert_eq!(split_authority("dankclaw:7771"), ("dankclaw", Some(7771)));
        assert_eq!(split_authority("[::1]:8080"), ("::1", Some(8080)));
        assert_eq!(split_authority("plain"), ("plain", None));
    }

    #[test]
    fn captured_content_is_cut_at_a_character_boundary_within_its_bound() {
        assert_eq!(prefix("héllo", 2), "h", "not inside the two bytes of é");
        assert_eq!(prefix("héllo", 3), "hé");
        assert_eq!(prefix("hi", 64), "hi");
        let text = "\"quoted\" ünïcode ".repeat(100);
        let (whole, cut) = output_messages(&text, 256);
        assert!(cut && whole.len() <= 256, "{} bytes", whole.len());
        let v: serde_json::Value = serde_json::from_str(&whole).unwrap();
        let kept = v[0]["parts"][0]["content"].as_str().unwrap();
        assert!(text.starts_with(kept) && !kept.is_empty(), "{whole}");
        let (whole, cut) = output_messages("short", 256);
        assert!(!cut && whole.contains("short"));
    }

    #[test]
    fn the_wall_clock_of_an_instant_is_before_now_by_its_age() {
        let at = Instant::now();
        let wall = wall_clock(at);
        assert!(wall <= SystemTime::now());
    }
}
