//! One request's bookkeeping: in-flight gauge, request counter, latency and token metrics, the
//! status page's window, the log line.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderValue;

use crate::fleet::reported::{believed, Bounds};
use crate::fleet::timeline::{Bar, Lost};
use crate::fleet::work::{Clock, Job, Loss, Measured};
use crate::ledger::{Ledger, Row};
use crate::observe::metrics::{AliasMetrics, ClientMetrics};
use crate::observe::trace::{End, RequestTrace};
use crate::observe::window::Sample;
use crate::wire::usage::Usage;
use crate::wire::{Endpoint, Seen};

/// A client's charge for the request, settled once as the record ends: from the usage the
/// backend reported, else from the tokens seen generated (`made`); `sent`: the request went
/// to a backend (a request refused or cancelled before that used nothing).
pub(crate) trait Settle: Send + Sync + std::fmt::Debug {
    /// `gpu`: the GPU-milliseconds measured, when they were. Returns what was charged.
    fn settle(&mut self, usage: Option<Usage>, made: u64, sent: bool, gpu: Option<u64>) -> Charged;
}

/// What a request's client was charged (the ledger's row keeps it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Charged {
    pub(crate) tokens: u64,
    pub(crate) gpu_ms: u64,
}

/// A counter that learns from the prompt tokens the backend reports (an estimating one), fed
/// as the record ends: `prompt_bytes` is the prompt's byte measure taken as it was sent.
pub(crate) trait Learn: Send + Sync + std::fmt::Debug {
    fn learn(&self, prompt_bytes: usize, prompt_tokens: u32);
}

/// Lives as long as the request: dropped when the answer is complete or the client is gone.
/// Dropping records every metric of the request once and writes its log line.
#[derive(Debug)]
pub struct Record {
    armed: bool,
    m: AliasMetrics,
    endpoint: Endpoint,
    pub stream: bool,
    started: Instant,
    /// As it is echoed in `x-request-id`.
    pub(crate) request_id: HeaderValue,
    pub(crate) backend: Option<String>,
    pub status: u16,
    pub usage: Option<Usage>,
    pub first_token: Option<Instant>,
    pub first_content: Option<Instant>,
    pub last_token: Option<Instant>,
    /// Set once the answer reached its end (or an error was answered); unset at drop = client gone.
    pub completed: bool,
    pub(crate) error: Option<String>,
    /// An estimating counter and the prompt's byte measure: fed the reported prompt tokens.
    pub(crate) estimator: Option<(Arc<dyn Learn>, usize)>,
    sent_at: Option<Instant>,
    headers_at: Option<Instant>,
    post_headers: Duration,
    /// The client's metrics, when the request came with a client's key.
    pub(crate) client: Option<ClientMetrics>,
    /// Who owns its usage (`crate::clients::Caller::owner`), when it came with a key.
    pub(crate) owner: Option<Arc<str>>,
    /// The client's charge, once its limits admitted the request.
    pub(crate) charge: Option<Box<dyn Settle>>,
    /// Token events seen in a stream (what a stream cut short is charged).
    pub(crate) generated: u64,
    /// The request's spans, when tracing is on.
    pub(crate) trace: Option<Box<RequestTrace>>,
    /// Its work on the backend that answered: predicted, measured at its end.
    pub(crate) work: Option<Job>,
    /// The usage ledger its row goes to, when one is kept.
    pub(crate) ledger: Option<Arc<Ledger>>,
    /// Time it waited for slots, all attempts together.
    pub(crate) queued: Duration,
    /// Times its slot was taken before it sent a byte.
    pub(crate) preempted: u32,
    /// An alias other than the one asked for answered it.
    pub(crate) fell_back: bool,
}

impl Record {
    pub fn start(m: &AliasMetrics, endpoint: Endpoint, request_id: HeaderValue) -> Record {
        m.inflight.inc();
        Record {
            armed: true,
            m: m.clone(),
            endpoint,
            stream: false,
            started: Instant::now(),
            request_id,
            backend: None,
            status: 0,
            usage: None,
            first_token: None,
            first_content: None,
            last_token: None,
            completed: false,
            error: None,
            estimator: None,
            sent_at: None,
            headers_at: None,
            post_headers: Duration::ZERO,
            client: None,
            owner: None,
            charge: None,
            generated: 0,
            trace: None,
            work: None,
            ledger: None,
            queued: Duration::ZERO,
            preempted: 0,
            fell_back: false,
        }
    }

    /// The request's trace where it is sampled, to be told what happens; `None` when tracing
    /// is off or the trace only passes through (unsampled).
    pub(crate) fn traced(&mut self) -> Option<&mut RequestTrace> {
        self.trace.as_deref_mut().filter(|t| t.recording())
    }

    /// When the request arrived.
    pub(crate) fn started(&self) -> Instant {
        self.started
    }

    /// Move the request to its alias's metrics once the model resolved.
    pub fn route(&mut self, m: &AliasMetrics, backend: &str) {
        self.m.inflight.dec();
        m.inflight.inc();
        self.m = m.clone();
        self.backend = Some(backend.to_string());
    }

    /// Its timeline mark, should an attempt lose its slot `how`.
    pub(crate) fn loss(&self, how: Lost) -> Loss {
        Loss {
            how,
            client: self.client.as_ref().map(|c| Arc::clone(c.shared_name())),
            alias: Arc::clone(self.m.shared_name()),
        }
    }

    pub(crate) fn metrics(&self) -> &AliasMetrics {
        &self.m
    }

    pub fn sending(&mut self) {
        self.sent_at = Some(Instant::now());
    }

    pub fn headers_received(&mut self) {
        self.headers_at = Some(Instant::now());
    }

    /// Time from the backend's headers to handing the response to the client.
    pub(crate) fn responding(&mut self) {
        if let Some(h) = self.headers_at {
            self.post_headers = h.elapsed();
        }
    }

    /// What a stream's events showed: its usage, first and last tokens, a backend error.
    pub(crate) fn absorb(&mut self, seen: Seen) {
        if seen.usage.is_some() {
            self.usage = seen.usage;
        }
        self.generated += seen.tokens;
        self.first_token = self.first_token.or(seen.first_token);
        self.first_content = self.first_content.or(seen.first_content);
        self.last_token = seen.last_token.or(self.last_token);
        if self.error.is_none() {
            self.error = seen.error;
        }
    }

    /// Move the bookkeeping out (into a stream body), leaving a disarmed husk here.
    pub(crate) fn take(&mut self) -> Record {
        let husk = Record {
            armed: false,
            m: self.m.clone(),
            endpoint: self.endpoint,
            stream: self.stream,
            started: self.started,
            request_id: self.request_id.clone(),
            backend: None,
            status: self.status,
            usage: None,
            first_token: None,
            first_content: None,
            last_token: None,
            completed: true,
            error: None,
            estimator: None,
            sent_at: None,
            headers_at: None,
            post_headers: Duration::ZERO,
            client: None,
            owner: None,
            charge: None,
            generated: 0,
            trace: None,
            work: None,
            ledger: None,
            queued: Duration::ZERO,
            preempted: 0,
            fell_back: false,
        };
        std::mem::replace(self, husk)
    }

    /// Its work measured now, given back to the scheduler and the cost model; its usage held
    /// to what the request could have taken (by its work's bounds; without one, an answer
    /// kept from an attempt given up, to what any request is counted in).
    fn measure(&mut self, now: Instant) -> Option<Measured> {
        let clock = Clock {
            sent: self.sent_at,
            first_token: self.first_token,
            last_token: self.last_token,
            ended: now,
        };
        let Some(job) = self.work.take() else {
            self.usage = self.usage.map(|u| believed(u, &Bounds::ANY));
            return None;
        };
        let held = job.grant().map(|h| (h, Arc::clone(job.slots())));
        let measured = job.finish(&mut self.usage, &clock);
        if let Some(((slot, start), slots)) = held {
            let usage = self.usage.unwrap_or_default();
            slots.timeline.push(Bar {
                slot,
                start,
                first: self.first_token,
                end: now,
                client: self.client.as_ref().map(|c| Arc::clone(c.shared_name())),
                lost: None,
                alias: Arc::clone(self.m.shared_name()),
                status: self.status,
                error: self.failed(),
                prompt: usage.prompt,
                output: self.output(),
                gpu_s: measured.work.total(),
                requests: 1,
            });
        }
        let client = self.client.as_ref().map_or("-", ClientMetrics::name);
        let backend = self.backend.as_deref().unwrap_or("-");
        self.m.work(backend, client, &measured);
        Some(measured)
    }

    /// It failed, as the error-ratio rule counts failures: a 5xx answer, or a stream that
    /// ended in an error after its 200 (client errors and cancels are not failures).
    fn failed(&self) -> bool {
        self.status >= 500 || (self.status < 400 && self.error.is_some())
    }

    /// The tokens it generated: as reported, else as seen relayed.
    fn output(&self) -> u64 {
        self.usage.map_or(self.generated, |u| u.completion)
    }

    /// The ledger's row of the request, ending `now`.
    fn row(&self, now: Instant, work: Option<Measured>, charged: Option<Charged>) -> Row {
        let ms = |d: Duration| d.as_millis() as i64;
        let total = now - self.started;
        let usage = self.usage.unwrap_or_default();
        let generated = self.output();
        let gpu = work.map(|w| w.work).unwrap_or_default();
        let client = self.client.as_ref().map_or("-", ClientMetrics::name);
        Row {
            seq: 0,
            at_ms: crate::ledger::now_ms() - ms(total),
            request_id: self.request_id.to_str().unwrap_or("-").to_string(),
            client: client.to_string(),
            // Named only where it is not the client (a key of `server.api_keys_env`).
            owner: self
                .owner
                .as_deref()
                .filter(|o| *o != client)
                .map(str::to_string),
            alias: self.m.name().to_string(),
            backend: self.backend.as_deref().unwrap_or("-").to_string(),
            api: self.endpoint.label(),
            status: i64::from(self.status),
            prompt_tokens: usage.prompt as i64,
            cached_tokens: usage.cached.unwrap_or(0) as i64,
            output_tokens: generated as i64,
            gpu_prefill_s: gpu.prefill,
            gpu_decode_s: gpu.decode,
            ttft_ms: self.first_token.map(|t| ms(t - self.started)),
            duration_ms: ms(total),
            queue_ms: ms(self.queued),
            cancelled: !self.completed,
            preempted: i64::from(self.preempted),
            fell_back: self.fell_back,
            charged_tokens: charged.map(|c| c.tokens as i64),
            charged_gpu_s: charged.map(|c| c.gpu_ms as f64 / 1000.0),
        }
    }

    fn record(&self, now: Instant, work: Option<Measured>) {
        let m = &self.m;
        m.inflight.dec();
        m.request(self.endpoint, self.status, self.stream);
        if let Some(c) = &self.client {
            c.request(self.status);
        }
        let total = now - self.started;
        m.duration.observe(total.as_secs_f64());
        if !self.completed {
            m.cancels.inc();
        }
        if let Some(sent) = self.sent_at {
            m.overhead
                .observe(((sent - self.started) + self.post_headers).as_secs_f64());
        }
        let ttft = self.first_token.map(|t| t - self.started);
        if let Some(t) = ttft {
            m.ttft.observe(t.as_secs_f64());
        }
        if let Some(t) = self.first_content {
            m.ttfc.observe((t - self.started).as_secs_f64());
        }
        let decode = self.usage.and_then(|u| self.tokens(u));
        m.window.record(
            now,
            Sample {
                error: self.failed(),
                ttft,
                decode_tps: decode,
                tokens: self.output(),
            },
        );
        let ms = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1000.0);
        tracing::info!(
            target: "switchboard::request",
            request_id = self.request_id.to_str().unwrap_or_default(),
            client = self.client.as_ref().map(ClientMetrics::name),
            alias = m.name(),
            endpoint = ?self.endpoint,
            backend = self.backend.as_deref().unwrap_or("-"),
            status = self.status,
            stream = self.stream,
            prompt_tokens = self.usage.map(|u| u.prompt),
            completion_tokens = self.usage.map(|u| u.completion),
            reasoning_tokens = self.usage.and_then(|u| u.reasoning),
            ttft_ms = ms(ttft),
            duration_ms = total.as_secs_f64() * 1000.0,
            gpu_predicted_s = work.map(|w| w.predicted.total()),
            gpu_prefill_s = work.map(|w| w.work.prefill),
            gpu_decode_s = work.map(|w| w.work.decode),
            cancelled = !self.completed,
            error = self.error.as_deref(),
        );
    }

    /// Token counters and speeds of a request with reported usage; returns its decode speed.
    fn tokens(&self, u: Usage) -> Option<f64> {
        let m = &self.m;
        if let Some((counter, bytes)) = &self.estimator {
            counter.learn(*bytes, u32::try_from(u.prompt).unwrap_or(u32::MAX));
        }
        m.prompt_tokens.inc_by(u.prompt);
        let cached = u.timings.and_then(|t| t.cache_n).or(u.cached);
        if let Some(c) = cached.filter(|c| *c > 0) {
            m.cached(c);
        }
        m.completion_tokens.inc_by(u.completion);
        if let Some(r) = u.reasoning {
            m.reasoning_tokens.inc_by(r);
        }
        // Prompt tokens over the time from sending to the first token; a non-streamed
        // answer without the backend's own timings has no first token to time.
        let prefill = u.prefill_tps.or_else(|| {
            let t = self.first_token? - self.sent_at?;
            (u.prompt > 0 && t > Duration::ZERO).then(|| u.prompt as f64 / t.as_secs_f64())
        });
        if let Some(v) = prefill {
            m.prefill_tps.observe(v);
        }
        let decode = u.decode_tps.or_else(|| {
            let span = self.last_token? - self.first_token?;
            (u.completion > 1 && span > Duration::ZERO)
                .then(|| (u.completion - 1) as f64 / span.as_secs_f64())
        });
        if let Some(v) = decode {
            m.decode_tps.observe(v);
        }
        decode
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        if self.armed {
            let now = Instant::now();
            let work = self.measure(now);
            let charged = self.charge.take().map(|mut c| {
                let gpu = work.map(|w| (w.work.total() * 1000.0).round() as u64);
                c.settle(self.usage, self.generated, self.sent_at.is_some(), gpu)
            });
            if let Some(t) = self.trace.take() {
                t.finish(&End {
                    status: self.status,
                    usage: self.usage,
                    first_token: self.first_token,
                    completed: self.completed,
                    error: self.error.as_deref(),
                    work,
                });
            }
            if let Some(ledger) = self.ledger.take() {
                ledger.record(self.row(now, work, charged));
            }
            self.record(now, work);
        }
    }
}
