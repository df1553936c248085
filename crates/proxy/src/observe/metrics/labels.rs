//! The label sets of the metric families, each value bounded, and the histograms' buckets.

use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

use crate::fleet::balance::AffinityResult;
use crate::fleet::breaker::BreakerState;
use crate::fleet::health::BackendState;
use crate::fleet::routes::FallbackReason;
use crate::upstream::failure::UpstreamReason;
use crate::wire::Endpoint;

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub(super) enum ReloadResult {
    success,
    failure,
}

/// How the prompt of a request refused as too long was counted
/// (`switchboard_context_rejections_total{method}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub(crate) enum CountMethod {
    /// The free byte bound.
    bound,
    /// The model's tokenizer and chat template, in process.
    local,
    /// The backend's tokenize endpoints, or the backend's own context error.
    backend,
    /// A bytes-per-token estimate.
    estimate,
}

impl CountMethod {
    pub(crate) const ALL: [CountMethod; 4] = [
        CountMethod::bound,
        CountMethod::local,
        CountMethod::backend,
        CountMethod::estimate,
    ];
}

/// Why a count was made another way than the alias's own
/// (`switchboard_count_fallbacks_total{reason}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub(crate) enum CountFallback {
    /// The local template engine failed on the request.
    template,
    /// More text to count than `server.count_limit_bytes`.
    too_large,
    /// No turn to count within `server.count_queue_timeout_ms`.
    busy,
}

impl CountFallback {
    pub(crate) const ALL: [CountFallback; 3] = [
        CountFallback::template,
        CountFallback::too_large,
        CountFallback::busy,
    ];
}

pub(super) type Name = Arc<String>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RequestLabels {
    pub(super) alias: Name,
    pub(super) endpoint: Endpoint,
    pub(super) status: u16,
    pub(super) stream: bool,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct AliasLabel {
    pub(super) alias: Name,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RejectionLabels {
    pub(super) alias: Name,
    pub(super) method: CountMethod,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CountFallbackLabels {
    pub(super) alias: Name,
    pub(super) reason: CountFallback,
}

/// Why an ended span was not exported.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub(crate) enum SpanDrop {
    /// The export queue (`tracing.queue_spans`) was full: the collector is slow or down.
    queue_full,
    /// The collector refused the export, could not be reached, or did not answer in time.
    export_failed,
    /// The span alone is bigger than an export may be (`tracing.export_max_bytes`).
    too_large,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct SpanDropLabels {
    pub(super) reason: SpanDrop,
}

/// Spans not exported, by reason: what the tracer counts its losses with.
#[derive(Clone, Debug, Default)]
pub(crate) struct SpansDropped(pub(super) Family<SpanDropLabels, Counter>);

impl SpansDropped {
    pub(crate) fn add(&self, reason: SpanDrop, n: u64) {
        self.0.get_or_create(&SpanDropLabels { reason }).inc_by(n);
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct UpstreamLabels {
    pub(super) alias: Name,
    pub(super) reason: UpstreamReason,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct BackendLabel {
    pub(super) backend: Name,
}

/// Why a request went once more on a new connection: the kept one was closed or reset
/// before a byte of answer.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub(super) enum RetryReason {
    closed,
    reset,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RetryLabels {
    pub(super) backend: Name,
    pub(super) reason: RetryReason,
}

/// Why a connection was not kept after its answer.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub(super) enum NotPooledReason {
    /// The backend closes its connection after a streamed answer.
    closes_after_stream,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct NotPooledLabels {
    pub(super) backend: Name,
    pub(super) reason: NotPooledReason,
}

/// The shared store, by its URL (without a password): one series, and only with a store.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct StoreLabel {
    pub(super) store: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct BackendStateLabels {
    pub(super) backend: Name,
    pub(super) state: BackendState,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct BreakerLabels {
    pub(super) backend: Name,
    pub(super) state: BreakerState,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct FallbackLabels {
    pub(super) alias: Name,
    pub(super) to: Name,
    pub(super) reason: FallbackReason,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct AffinityLabels {
    pub(super) alias: Name,
    pub(super) result: AffinityResult,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ReloadLabel {
    pub(super) result: ReloadResult,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct VersionLabel {
    pub(super) version: &'static str,
}

pub(super) type Hist = Family<AliasLabel, Histogram, fn() -> Histogram>;

pub(super) const TTFT: [f64; 18] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 240.0,
    420.0, 600.0,
];
pub(super) const DURATION: [f64; 18] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0,
    1200.0, 1800.0,
];
pub(super) const TOKENS_PER_SECOND: [f64; 14] = [
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0,
];
pub(super) const OVERHEAD: [f64; 13] = [
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1,
];

pub(super) fn ttft_hist() -> Histogram {
    Histogram::new(TTFT)
}
pub(super) fn duration_hist() -> Histogram {
    Histogram::new(DURATION)
}
pub(super) fn tps_hist() -> Histogram {
    Histogram::new(TOKENS_PER_SECOND)
}
pub(super) fn overhead_hist() -> Histogram {
    Histogram::new(OVERHEAD)
}
