//! The families of GPU time: work by alias, backend, client and phase, how far predictions
//! were off, preemptions, prompt tokens read from cache, each backend's learned speeds, and the
//! queue waits predicted.

use std::sync::{Arc, Mutex};

use foldhash::HashMap;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::AtomicU64;

use super::labels::{ttft_hist, AliasLabel, BackendLabel, Name};
use crate::config::Priority;
use crate::fleet::cost::CostModel;
use crate::fleet::work::Measured;
use crate::lock::Locked;

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub(super) enum Phase {
    prefill,
    decode,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct WorkLabels {
    alias: Name,
    backend: Name,
    client: Name,
    phase: Phase,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub(super) enum Class {
    interactive,
    normal,
    batch,
    idle,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct PreemptLabels {
    alias: Name,
    class: Class,
}

/// The measured over the predicted GPU-seconds of a request: 1 is exact.
const RATIO: [f64; 11] = [0.125, 0.25, 0.5, 0.67, 0.8, 0.9, 1.11, 1.25, 1.5, 2.0, 4.0];

fn ratio_hist() -> Histogram {
    Histogram::new(RATIO)
}

type Seconds = Counter<f64, AtomicU64>;
type Level = Gauge<f64, AtomicU64>;

/// One alias's series of work and prediction error by backend and client, each looked up in
/// its family once (a lock and a hash of its labels) and then kept.
#[derive(Debug, Default)]
pub(super) struct KeptWork(Mutex<HashMap<String, HashMap<String, WorkSeries>>>);

#[derive(Debug)]
struct WorkSeries {
    prefill: Seconds,
    decode: Seconds,
    error: Histogram,
}

/// The families of GPU time (a clone shares them).
#[derive(Clone, Debug)]
pub(super) struct GpuFamilies {
    work: Family<WorkLabels, Seconds>,
    error: Family<BackendLabel, Histogram, fn() -> Histogram>,
    preemptions: Family<PreemptLabels, Counter>,
    cached: Family<AliasLabel, Counter>,
    predicted_wait: Family<AliasLabel, Histogram, fn() -> Histogram>,
    prefill_rate: Family<BackendLabel, Level>,
    prefill_half: Family<BackendLabel, Level>,
    decode_rate: Family<BackendLabel, Level>,
    decode_half: Family<BackendLabel, Level>,
}

impl Default for GpuFamilies {
    fn default() -> Self {
        GpuFamilies {
            work: Family::default(),
            error: Family::new_with_constructor(ratio_hist),
            preemptions: Family::default(),
            cached: Family::default(),
            predicted_wait: Family::new_with_constructor(ttft_hist),
            prefill_rate: Family::default(),
            prefill_half: Family::default(),
            decode_rate: Family::default(),
            decode_half: Family::default(),
        }
    }
}

fn name(s: &str) -> Name {
    Arc::new(s.to_string())
}

impl GpuFamilies {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register_with_unit(
            "gpu",
            "GPU time of requests as their backends measured it (llama.cpp timings) or the proxy timed it, by alias, backend, client and phase (prefill, decode)",
            Unit::Seconds,
            self.work.clone(),
        );
        r.register(
            "gpu_prediction_ratio",
            "A request's measured GPU-seconds over those predicted before it ran, by backend (1 is exact)",
            self.error.clone(),
        );
        r.register(
            "preemptions",
            "Requests that gave their slot up to an interactive request before sending a byte, and were put back in their queue, by alias and class",
            self.preemptions.clone(),
        );
        r.register(
            "prompt_cached_tokens",
            "Prompt tokens the backends read from their cache, by alias (beside switchboard_prompt_tokens_total)",
            self.cached.clone(),
        );
        r.register_with_unit(
            "queue_wait_predicted",
            "The wait for a slot predicted when a request entered a queue (the work ahead of it)",
            Unit::Seconds,
            self.predicted_wait.clone(),
        );
        r.register(
            "backend_prefill_tokens_per_second",
            "The prefill rate at depth 0 the backend's cost model holds",
            self.prefill_rate.clone(),
        );
        r.register(
            "backend_prefill_half_depth_tokens",
            "The depth at which the backend's prefill runs at half its rate (0: it does not slow)",
            self.prefill_half.clone(),
        );
        r.register(
            "backend_decode_tokens_per_second",
            "The decode rate at depth 0 the backend's cost model holds",
            self.decode_rate.clone(),
        );
        r.register(
            "backend_decode_half_depth_tokens",
            "The depth at which the backend's decode runs at half its rate (0: it does not slow)",
            self.decode_half.clone(),
        );
    }

    /// A request of `client` on `alias`, served by `backend`, took `m`; the series counted
    /// into are kept in `kept` (the alias's own) after their first lookup.
    pub(super) fn work(
        &self,
        alias: &Name,
        kept: &KeptWork,
        backend: &str,
        client: &str,
        m: &Measured,
    ) {
        let mut by_backend = kept.0.locked();
        let by_client = match by_backend.get_mut(backend) {
            Some(c) => c,
            None => by_backend.entry(backend.to_string()).or_default(),
        };
        let series = match by_client.get(client) {
            Some(s) => s,
            None => by_client
                .entry(client.to_string())
                .or_insert_with(|| self.series(alias, backend, client)),
        };
        series.prefill.inc_by(m.work.prefill.max(0.0));
        series.decode.inc_by(m.work.decode.max(0.0));
        let predicted = m.predicted.total();
        if predicted > 0.0 {
            series.error.observe(m.work.total() / predicted);
        }
    }

    /// The series a request of `client` on `alias`, served by `backend`, counts its work into.
    fn series(&self, alias: &Name, backend: &str, client: &str) -> WorkSeries {
        let (backend, client) = (name(backend), name(client));
        let phase = |phase| {
            self.work.get_or_create_owned(&WorkLabels {
                alias: Arc::clone(alias),
                backend: Arc::clone(&backend),
                client: Arc::clone(&client),
                phase,
            })
        };
        WorkSeries {
            prefill: phase(Phase::prefill),
            decode: phase(Phase::decode),
            error: self.error.get_or_create_owned(&BackendLabel { backend }),
        }
    }

    pub(super) fn preempted(&self, alias: &Name, class: Priority) {
        let class = match class {
            Priority::Interactive => Class::interactive,
            Priority::Normal => Class::normal,
            Priority::Batch => Class::batch,
            Priority::Idle => Class::idle,
        };
        let labels = PreemptLabels {
            alias: Arc::clone(alias),
            class,
        };
        self.preemptions.get_or_create(&labels).inc();
    }

    /// The series of `alias` of the cached prompt tokens.
    pub(super) fn cached(&self, alias: &Name) -> Counter {
        let labels = AliasLabel {
            alias: Arc::clone(alias),
        };
        self.cached.get_or_create_owned(&labels)
    }

    pub(super) fn predicted_wait(&self, alias: &Name, secs: f64) {
        let labels = AliasLabel {
            alias: Arc::clone(alias),
        };
        self.predicted_wait.get_or_create(&labels).observe(secs);
    }

    /// Backend `backend`'s speeds as its cost model holds them now.
    pub(super) fn speeds(&self, backend: &str, cost: &CostModel) {
        let l = BackendLabel {
            backend: name(backend),
        };
        let (prefill, decode) = cost.rates();
        self.prefill_rate
            .get_or_create(&l)
            .set(prefill.tokens_per_second());
        self.prefill_half
            .get_or_create(&l)
            .set(prefill.half_depth().unwrap_or(0.0));
        self.decode_rate
            .get_or_create(&l)
            .set(decode.tokens_per_second());
        self.decode_half
            .get_or_create(&l)
            .set(decode.half_depth().unwrap_or(0.0));
    }
}
