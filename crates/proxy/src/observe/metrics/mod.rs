//! Every metric family, registered once, with typed bounded labels (`labels.rs`); per-alias
//! handles for the hot path (`alias.rs`); the client families (`client.rs`).

mod alias;
pub(crate) mod batches;
mod client;
mod exports;
mod gpu;
mod labels;
mod text;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use super::window::Window;
use crate::fleet::balance::AffinityResult;
use crate::fleet::breaker::BreakerState;
use crate::fleet::health::BackendState;
use crate::lock::Locked;
use crate::upstream::failure::UpstreamReason;
use crate::upstream::watch::ConnWatch;

pub(crate) use alias::{AliasHandles, AliasMetrics};
use client::ClientFamilies;
pub(crate) use client::{ClientMetrics, RefusalReason};
use labels::{
    duration_hist, overhead_hist, tps_hist, ttft_hist, AffinityLabels, AliasLabel, BackendLabel,
    BackendStateLabels, BreakerLabels, CountFallbackLabels, FallbackLabels, Hist, NotPooledLabels,
    NotPooledReason, RejectionLabels, ReloadLabel, ReloadResult, RequestLabels, RetryLabels,
    RetryReason, StoreLabel, UpstreamLabels, VersionLabel,
};
pub(crate) use labels::{CountFallback, CountMethod, SpanDrop, SpansDropped};
use text::to_prometheus_text;

/// All of Switchboard's metric families. Registered once in [`Metrics::new`].
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    duration: Hist,
    ttft: Hist,
    ttfc: Hist,
    prompt_tokens: Family<AliasLabel, Counter>,
    completion_tokens: Family<AliasLabel, Counter>,
    reasoning_tokens: Family<AliasLabel, Counter>,
    prefill_tps: Hist,
    decode_tps: Hist,
    inflight: Family<AliasLabel, Gauge>,
    queued: Family<AliasLabel, Gauge>,
    queue_limit: Family<AliasLabel, Gauge>,
    queue_wait: Hist,
    cancels: Family<AliasLabel, Counter>,
    rejections: Family<RejectionLabels, Counter>,
    count_fallbacks: Family<CountFallbackLabels, Counter>,
    counts_running: Gauge,
    counts_waiting: Gauge,
    upstream_errors: Family<UpstreamLabels, Counter>,
    upstream_retries: Family<RetryLabels, Counter>,
    not_pooled: Family<NotPooledLabels, Counter>,
    backend_up: Family<BackendLabel, Gauge>,
    backend_state: Family<BackendStateLabels, Gauge>,
    breaker: Family<BreakerLabels, Gauge>,
    fallbacks: Family<FallbackLabels, Counter>,
    affinity: Family<AffinityLabels, Counter>,
    overhead: Hist,
    reloads: Family<ReloadLabel, Counter>,
    shared_up: Family<StoreLabel, Gauge>,
    shared_fallbacks: Family<StoreLabel, Counter>,
    /// Client connections open now (all workers): what `server.max_connections` bounds.
    pub(crate) client_connections: Gauge,
    /// Client connections closed at once because `server.max_connections` were open.
    pub(crate) connections_refused: Counter,
    /// Spans the tracer could not export.
    pub(crate) spans_dropped: SpansDropped,
    /// The usage ledger's rows written, dropped and waiting.
    pub ledger: crate::ledger::Counters,
    clients: ClientFamilies,
    gpu: gpu::GpuFamilies,
    /// The Batch API's lines and batches.
    pub batches: batches::BatchFamilies,
    /// The status page's rolling window of every alias, kept across reloads like the series.
    windows: Mutex<HashMap<String, Arc<Window>>>,
    /// Where every window counts its steps from.
    origin: Instant,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut r = Registry::with_prefix("switchboard");
        let m = Metrics {
            requests: Family::default(),
            duration: Family::new_with_constructor(duration_hist),
            ttft: Family::new_with_constructor(ttft_hist),
            ttfc: Family::new_with_constructor(ttft_hist),
            prompt_tokens: Family::default(),
            completion_tokens: Family::default(),
            reasoning_tokens: Family::default(),
            prefill_tps: Family::new_with_constructor(tps_hist),
            decode_tps: Family::new_with_constructor(tps_hist),
            inflight: Family::default(),
            queued: Family::default(),
            queue_limit: Family::default(),
            queue_wait: Family::new_with_constructor(ttft_hist),
            cancels: Family::default(),
            rejections: Family::default(),
            count_fallbacks: Family::default(),
            counts_running: Gauge::default(),
            counts_waiting: Gauge::default(),
            upstream_errors: Family::default(),
            upstream_retries: Family::default(),
            not_pooled: Family::default(),
            backend_up: Family::default(),
            backend_state: Family::default(),
            breaker: Family::default(),
            fallbacks: Family::default(),
            affinity: Family::default(),
            overhead: Family::new_with_constructor(overhead_hist),
            reloads: Family::default(),
            shared_up: Family::default(),
            shared_fallbacks: Family::default(),
            client_connections: Gauge::default(),
            connections_refused: Counter::default(),
            spans_dropped: SpansDropped::default(),
            ledger: Default::default(),
            clients: ClientFamilies::default(),
            gpu: gpu::GpuFamilies::default(),
            batches: batches::BatchFamilies::default(),
            windows: Mutex::default(),
            origin: Instant::now(),
            registry: Registry::default(),
        };
        m.register_traffic(&mut r);
        m.register_load(&mut r);
        m.register_process(&mut r);
        m.clients.register(&mut r);
        m.gpu.register(&mut r);
        // Counters start at 0 so rate() and alerts see them before the first event.
        for result in [ReloadResult::success, ReloadResult::failure] {
            let _ = m.reloads.get_or_create(&ReloadLabel { result });
        }
        Metrics { registry: r, ..m }
    }

    /// Requests, their timing and tokens.
    fn register_traffic(&self, r: &mut Registry) {
        r.register(
            "requests",
            "Requests answered, by alias, endpoint, HTTP status and streaming",
            self.requests.clone(),
        );
        r.register_with_unit(
            "request_duration",
            "Time from request to the last byte of the answer",
            Unit::Seconds,
            self.duration.clone(),
        );
        r.register_with_unit("time_to_first_token", "Time from request to the first generated token of any kind (reasoning, content or tool call)", Unit::Seconds, self.ttft.clone());
        r.register_with_unit(
            "time_to_first_content",
            "Time from request to the first content token after any reasoning",
            Unit::Seconds,
            self.ttfc.clone(),
        );
        r.register(
            "prompt_tokens",
            "Prompt tokens reported by backends",
            self.prompt_tokens.clone(),
        );
        r.register(
            "completion_tokens",
            "Completion tokens reported by backends",
            self.completion_tokens.clone(),
        );
        r.register(
            "reasoning_tokens",
            "Reasoning tokens reported by backends (part of completion tokens)",
            self.reasoning_tokens.clone(),
        );
        r.register(
            "prefill_tokens_per_second",
            "Prompt tokens divided by time to first token, or the backend's own prompt timing",
            self.prefill_tps.clone(),
        );
        r.register(
            "decode_tokens_per_second",
            "Completion tokens per second from first to last token, or the backend's own timing",
            self.decode_tps.clone(),
        );
    }

    /// Load on the fleet: in flight, queued, rejected, failed.
    fn register_load(&self, r: &mut Registry) {
        r.register(
            "inflight_requests",
            "Requests being served now",
            self.inflight.clone(),
        );
        r.register(
            "queued_requests",
            "Requests waiting for a backend slot",
            self.queued.clone(),
        );
        r.register(
            "queue_limit",
            "Most requests that may wait for a backend slot",
            self.queue_limit.clone(),
        );
        r.register_with_unit(
            "queue_wait",
            "Time spent waiting for a backend slot",
            Unit::Seconds,
            self.queue_wait.clone(),
        );
        r.register(
            "client_cancels",
            "Requests whose client went away before the answer was complete",
            self.cancels.clone(),
        );
        r.register(
            "context_rejections",
            "Requests rejected as over the context window, by counting method",
            self.rejections.clone(),
        );
        r.register(
            "count_fallbacks",
            "Token counts made another way than the alias's own (template: the local template failed, so the backend's count or the estimate; too_large: past server.count_limit_bytes; busy: no turn within server.count_queue_timeout_ms), by reason",
            self.count_fallbacks.clone(),
        );
        r.register(
            "counts_running",
            "Token counts running now (at most server.count_concurrency)",
            self.counts_running.clone(),
        );
        r.register(
            "counts_waiting",
            "Token counts waiting for a turn to run",
            self.counts_waiting.clone(),
        );
        r.register(
            "upstream_errors",
            "Failed exchanges with backends, by reason",
            self.upstream_errors.clone(),
        );
        r.register(
            "upstream_retries",
            "Requests sent once more on a new connection because a kept one was closed or reset before a byte of answer, by backend and reason",
            self.upstream_retries.clone(),
        );
        r.register(
            "upstream_connections_not_pooled",
            "Connections closed after their answer instead of kept, by backend and reason (closes_after_stream: the backend was seen closing its connection after a streamed answer)",
            self.not_pooled.clone(),
        );
        r.register(
            "fallbacks",
            "Requests that left an alias for one of its fallbacks, by reason",
            self.fallbacks.clone(),
        );
        r.register(
            "affinity",
            "Requests of a known conversation that went to its replica (hit), moved to another (moved), or started one (new)",
            self.affinity.clone(),
        );
    }

    /// Backends' health, the proxy's own overhead, reloads, the build.
    fn register_process(&self, r: &mut Registry) {
        r.register(
            "backend_up",
            "1 when the backend answers its health probe, else 0",
            self.backend_up.clone(),
        );
        r.register(
            "backend_state",
            "1 for the backend's current state (up, loading, down)",
            self.backend_state.clone(),
        );
        r.register(
            "breaker_state",
            "1 for the backend's circuit breaker state (closed, open, half_open)",
            self.breaker.clone(),
        );
        r.register_with_unit(
            "proxy_overhead",
            "Time spent in Switchboard itself, upstream wait excluded",
            Unit::Seconds,
            self.overhead.clone(),
        );
        r.register(
            "config_reloads",
            "Configuration reloads by result",
            self.reloads.clone(),
        );
        r.register(
            "shared_state_up",
            "1 while the shared store (server.shared_state) answers, 0 while this process counts slots and client limits on its own; no series without a store",
            self.shared_up.clone(),
        );
        r.register(
            "shared_state_fallbacks",
            "Times the shared store stopped answering and this process fell back to its own counts",
            self.shared_fallbacks.clone(),
        );
        r.register(
            "client_connections",
            "Client connections open now",
            self.client_connections.clone(),
        );
        r.register(
            "connections_refused",
            "Client connections closed at once because server.max_connections were open",
            self.connections_refused.clone(),
        );
        exports::register(r, &self.spans_dropped, &self.ledger);
        self.batches.register(r);
        let info: Family<VersionLabel, Gauge> = Family::default();
        info.get_or_create(&VersionLabel {
            version: env!("CARGO_PKG_VERSION"),
        })
        .set(1);
        r.register(
            "build_info",
            "Build information; the value is always 1",
            info,
        );
    }

    /// Handles for one client (a configured name or `anonymous`); made per config snapshot.
    pub fn client(&self, name: &str) -> ClientMetrics {
        self.clients.handles(name)
    }

    /// Handles for one alias; created per config snapshot so the hot path takes no lock.
    pub fn alias(&self, name: &str) -> AliasMetrics {
        let name = Arc::new(name.to_string());
        let l = AliasLabel {
            alias: Arc::clone(&name),
        };
        for method in CountMethod::ALL {
            let _ = self.rejections.get_or_create(&RejectionLabels {
                alias: Arc::clone(&name),
                method,
            });
        }
        for reason in CountFallback::ALL {
            let _ = self.count_fallbacks.get_or_create(&CountFallbackLabels {
                alias: Arc::clone(&name),
                reason,
            });
        }
        for reason in [
            UpstreamReason::connect,
            UpstreamReason::timeout,
            UpstreamReason::status_5xx,
            UpstreamReason::stream_broken,
            UpstreamReason::protocol,
            UpstreamReason::too_large,
        ] {
            let _ = self.upstream_errors.get_or_create(&UpstreamLabels {
                alias: Arc::clone(&name),
                reason,
            });
        }
        let window = {
            let mut windows = self.windows.locked();
            let w = windows
                .entry(name.to_string())
                .or_insert_with(|| Arc::new(Window::new(self.origin)));
            Arc::clone(w)
        };
        AliasMetrics(Arc::new(AliasHandles {
            window,
            duration: self.duration.get_or_create_owned(&l),
            ttft: self.ttft.get_or_create_owned(&l),
            ttfc: self.ttfc.get_or_create_owned(&l),
            prompt_tokens: self.prompt_tokens.get_or_create_owned(&l),
            completion_tokens: self.completion_tokens.get_or_create_owned(&l),
            reasoning_tokens: self.reasoning_tokens.get_or_create_owned(&l),
            prefill_tps: self.prefill_tps.get_or_create_owned(&l),
            decode_tps: self.decode_tps.get_or_create_owned(&l),
            inflight: self.inflight.get_or_create_owned(&l),
            queued: self.queued.get_or_create_owned(&l),
            queue_limit: self.queue_limit.get_or_create_owned(&l),
            queue_wait: self.queue_wait.get_or_create_owned(&l),
            cancels: self.cancels.get_or_create_owned(&l),
            overhead: self.overhead.get_or_create_owned(&l),
            requests: self.requests.clone(),
            ok: Default::default(),
            rejections: self.rejections.clone(),
            count_fallbacks: self.count_fallbacks.clone(),
            upstream_errors: self.upstream_errors.clone(),
            fallbacks: self.fallbacks.clone(),
            affinity: [
                AffinityResult::hit,
                AffinityResult::moved,
                AffinityResult::new,
            ]
            .map(|result| {
                self.affinity.get_or_create_owned(&AffinityLabels {
                    alias: Arc::clone(&name),
                    result,
                })
            }),
            gpu: self.gpu.clone(),
            gpu_kept: Default::default(),
            cached_tokens: self.gpu.cached(&name),
            name,
        }))
    }

    /// The gauges of the count gate: running, waiting.
    pub(crate) fn count_gauges(&self) -> (Gauge, Gauge) {
        (self.counts_running.clone(), self.counts_waiting.clone())
    }

    /// The connection watch of `backend`, counting into its series.
    pub fn conn_watch(&self, backend: &str) -> ConnWatch {
        let name = Arc::new(backend.to_string());
        let retried = |reason| {
            self.upstream_retries
                .get_or_create(&RetryLabels {
                    backend: Arc::clone(&name),
                    reason,
                })
                .clone()
        };
        let not_pooled = self
            .not_pooled
            .get_or_create(&NotPooledLabels {
                backend: Arc::clone(&name),
                reason: NotPooledReason::closes_after_stream,
            })
            .clone();
        ConnWatch::new(
            backend,
            retried(RetryReason::closed),
            retried(RetryReason::reset),
            not_pooled,
        )
    }

    /// Record a backend's breaker state.
    pub fn breaker_state(&self, backend: &str, state: BreakerState) {
        let name = Arc::new(backend.to_string());
        for s in BreakerState::ALL {
            self.breaker
                .get_or_create(&BreakerLabels {
                    backend: Arc::clone(&name),
                    state: s,
                })
                .set(i64::from(s == state));
        }
    }

    /// Record a backend's health state.
    pub fn backend_state(&self, backend: &str, state: BackendState) {
        let name = Arc::new(backend.to_string());
        self.backend_up
            .get_or_create(&BackendLabel {
                backend: Arc::clone(&name),
            })
            .set(i64::from(state == BackendState::up));
        for s in [BackendState::up, BackendState::loading, BackendState::down] {
            self.backend_state
                .get_or_create(&BackendStateLabels {
                    backend: Arc::clone(&name),
                    state: s,
                })
                .set(i64::from(s == state));
        }
    }

    /// A config reload ended: `succeeded` when the new config took effect.
    pub(crate) fn config_reload(&self, succeeded: bool) {
        let result = if succeeded {
            ReloadResult::success
        } else {
            ReloadResult::failure
        };
        self.reloads.get_or_create(&ReloadLabel { result }).inc();
    }

    /// The exposition text. OpenMetrics when asked for it; otherwise the Prometheus text
    /// format (0.0.4), which older scrapers and `promtool check metrics` parse.
    /// The series of the shared store at `store` (its URL as shown): up, and falls back.
    pub fn shared_signals(&self, store: &str) -> crate::shared::Signals {
        let label = StoreLabel {
            store: store.to_string(),
        };
        crate::shared::Signals {
            up: self.shared_up.get_or_create(&label).clone(),
            fallbacks: self.shared_fallbacks.get_or_create(&label).clone(),
        }
    }

    /// Backend `backend`'s learned speeds, shown as its cost model holds them now (set before
    /// each scrape).
    pub fn speeds(&self, backend: &str, cost: &crate::fleet::cost::CostModel) {
        self.gpu.speeds(backend, cost);
    }

    pub fn render(&self, openmetrics: bool) -> String {
        let mut out = String::with_capacity(16 * 1024);
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            return String::new();
        }
        if openmetrics {
            out
        } else {
            to_prometheus_text(&out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Endpoint;

    /// The kept status-200 series and the family's are the same series; other statuses and
    /// clones of the handles count into the same place.
    #[test]
    fn kept_request_series_count_with_the_family() {
        let m = Metrics::new();
        let a = m.alias("frank");
        let b = a.clone();
        a.request(Endpoint::chat_completions, 200, true);
        b.request(Endpoint::chat_completions, 200, true);
        a.request(Endpoint::chat_completions, 200, false);
        a.request(Endpoint::chat_completions, 502, true);
        let text = m.render(false);
        let line = |labels: &str| format!("switchboard_requests_total{{alias=\"frank\",{labels}}}");
        for (labels, n) in [
            (
                r#"endpoint="chat_completions",status="200",stream="true""#,
                2,
            ),
            (
                r#"endpoint="chat_completions",status="200",stream="false""#,
                1,
            ),
            (
                r#"endpoint="chat_completions",status="502",stream="true""#,
                1,
            ),
        ] {
            assert!(
                text.contains(&format!("{} {n}\n", line(labels))),
                "{labels}\n{text}"
            );
        }
        // A fresh set of handles for the same alias (a reloaded config) shares the series.
        m.alias("frank")
            .request(Endpoint::chat_completions, 200, true);
        assert!(m.render(false).contains(&format!(
            "{} 3\n",
            line(r#"endpoint="chat_completions",status="200",stream="true""#)
        )));
    }

    #[test]
    fn renders_both_formats() {
        let m = Metrics::new();
        let a = m.alias("frank");
        a.request(Endpoint::chat_completions, 200, true);
        a.ttft.observe(0.2);
        m.backend_state("b", BackendState::loading);
        let om = m.render(true);
        assert!(om.contains("# TYPE switchboard_requests counter"));
        assert!(om.contains(
            "switchboard_requests_total{alias=\"frank\",endpoint=\"chat_completions\",status=\"200\",stream=\"true\"} 1"
        ));
        assert!(om.ends_with("# EOF\n"));
        let text = m.render(false);
        assert!(text.contains("# TYPE switchboard_requests_total counter"));
        assert!(text.contains("# HELP switchboard_requests_total Requests"));
        assert!(!text.contains("# EOF"));
        assert!(text.contains("switchboard_backend_up{backend=\"b\"} 0"));
        assert!(text.contains("switchboard_backend_state{backend=\"b\",state=\"loading\"} 1"));
        assert!(text.contains("switchboard_build_info{version="));
    }
}
