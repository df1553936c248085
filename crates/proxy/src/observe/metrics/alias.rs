//! One alias's metric handles, resolved once and shared by its requests (the hot path).

use std::ops::Deref;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

use super::gpu::{GpuFamilies, KeptWork};
use super::labels::{
    CountFallback, CountFallbackLabels, CountMethod, FallbackLabels, Name, RejectionLabels,
    RequestLabels, UpstreamLabels,
};
use crate::config::Priority;
use crate::fleet::balance::AffinityResult;
use crate::fleet::routes::FallbackReason;
use crate::fleet::ticket::QueueWatch;
use crate::fleet::work::Measured;
use crate::observe::window::Window;
use crate::upstream::failure::UpstreamReason;
use crate::wire::Endpoint;

/// Pre-resolved metric handles for one alias, shared: a clone is one reference count.
#[derive(Clone, Debug)]
pub struct AliasMetrics(pub(super) Arc<AliasHandles>);

impl Deref for AliasMetrics {
    type Target = AliasHandles;

    fn deref(&self) -> &AliasHandles {
        &self.0
    }
}

/// The handles behind [`AliasMetrics`].
#[derive(Debug)]
pub struct AliasHandles {
    pub(super) name: Name,
    /// The last five minutes, for the status page.
    pub window: Arc<Window>,
    pub(crate) duration: Histogram,
    pub(crate) ttft: Histogram,
    pub(crate) ttfc: Histogram,
    pub(crate) prompt_tokens: Counter,
    pub(crate) completion_tokens: Counter,
    pub(crate) reasoning_tokens: Counter,
    pub(crate) prefill_tps: Histogram,
    pub(crate) decode_tps: Histogram,
    pub(crate) inflight: Gauge,
    pub(crate) queued: Gauge,
    pub(crate) queue_limit: Gauge,
    pub(crate) queue_wait: Histogram,
    pub(crate) cancels: Counter<u64, AtomicU64>,
    pub(crate) overhead: Histogram,
    pub(super) requests: Family<RequestLabels, Counter>,
    /// The `requests_total` series of status 200 by endpoint and `stream`, looked up in the
    /// family once (a lock and a hash) and then kept.
    pub(super) ok: [[OnceLock<Counter>; 2]; Endpoint::COUNT],
    pub(super) rejections: Family<RejectionLabels, Counter>,
    pub(super) count_fallbacks: Family<CountFallbackLabels, Counter>,
    pub(super) upstream_errors: Family<UpstreamLabels, Counter>,
    pub(super) fallbacks: Family<FallbackLabels, Counter>,
    /// By [`AffinityResult`] in declaration order.
    pub(super) affinity: [Counter; 3],
    pub(super) gpu: GpuFamilies,
    /// Its series of GPU time, by backend and client.
    pub(super) gpu_kept: KeptWork,
    /// Its series of `switchboard_prompt_cached_tokens_total`.
    pub(crate) cached_tokens: Counter,
}

impl AliasHandles {
    /// A request of this alias went on to the fallback `to`.
    pub fn fallback(&self, to: &AliasHandles, reason: FallbackReason) {
        self.fallbacks
            .get_or_create(&FallbackLabels {
                alias: Arc::clone(&self.name),
                to: Arc::clone(&to.name),
                reason,
            })
            .inc();
    }

    /// A request of `client` served by `backend` took `m` of its GPU.
    pub fn work(&self, backend: &str, client: &str, m: &Measured) {
        self.gpu
            .work(&self.name, &self.gpu_kept, backend, client, m);
    }

    /// A request of class `class` gave its slot up to an interactive one.
    pub fn preempted(&self, class: Priority) {
        self.gpu.preempted(&self.name, class);
    }

    /// A backend read `tokens` of a request's prompt from its cache.
    pub fn cached(&self, tokens: u64) {
        self.cached_tokens.inc_by(tokens);
    }

    /// A request entered a queue with a wait of `secs` predicted.
    pub fn predicted_wait(&self, secs: f64) {
        self.gpu.predicted_wait(&self.name, secs);
    }

    pub(crate) fn affinity(&self, result: AffinityResult) {
        self.affinity[result as usize].inc();
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Its name, shared (a clone is no copy).
    pub(crate) fn shared_name(&self) -> &std::sync::Arc<String> {
        &self.name
    }

    pub fn request(&self, endpoint: Endpoint, status: u16, stream: bool) {
        let series = || {
            self.requests.get_or_create_owned(&RequestLabels {
                alias: Arc::clone(&self.name),
                endpoint,
                status,
                stream,
            })
        };
        if status == 200 {
            self.ok[endpoint.index()][usize::from(stream)]
                .get_or_init(series)
                .inc();
        } else {
            series().inc();
        }
    }

    pub(crate) fn rejection(&self, method: CountMethod) {
        self.window.rejection(Instant::now());
        self.rejections
            .get_or_create(&RejectionLabels {
                alias: Arc::clone(&self.name),
                method,
            })
            .inc();
    }

    /// A count of this alias was made another way than its own.
    pub(crate) fn count_fallback(&self, reason: CountFallback) {
        self.count_fallbacks
            .get_or_create(&CountFallbackLabels {
                alias: Arc::clone(&self.name),
                reason,
            })
            .inc();
    }

    pub(crate) fn upstream_error(&self, reason: UpstreamReason) {
        self.upstream_errors
            .get_or_create(&UpstreamLabels {
                alias: Arc::clone(&self.name),
                reason,
            })
            .inc();
    }
}

/// The queue gauge and wait histogram of the alias whose request waits for a slot.
impl QueueWatch for AliasHandles {
    fn entered(&self) {
        self.queued.inc();
    }

    fn left(&self, waited: std::time::Duration) {
        self.queued.dec();
        self.queue_wait.observe(waited.as_secs_f64());
    }
}
