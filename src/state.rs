//! Shared state: the live config snapshot (swapped atomically on reload), the upstream client, metrics.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
// foldhash: read on every request, keyed by names from the config (no untrusted keys).
use foldhash::HashMap;

use crate::config::Config;
use crate::health::Health;
use crate::metrics::{AliasMetrics, Metrics};
use crate::routes::RouteTable;
use crate::slots::Slots;
use crate::upstream::Pool;

/// Everything derived from one config; a request uses one snapshot from start to end.
#[derive(Debug)]
pub struct Snapshot {
    pub config: Config,
    pub routes: RouteTable,
    alias_metrics: HashMap<String, AliasMetrics>,
    unknown: AliasMetrics,
    slots: HashMap<String, Arc<Slots>>,
}

impl Snapshot {
    /// `previous`: the snapshot being replaced. A backend whose slots and queue did not change
    /// keeps its `Slots`, so requests in flight still count against the same limit.
    pub fn new(config: Config, metrics: &Metrics, previous: Option<&Snapshot>) -> Snapshot {
        let routes = RouteTable::new(&config);
        let slots: HashMap<String, Arc<Slots>> = config
            .backends
            .values()
            .map(|b| {
                let kept = previous
                    .and_then(|p| p.slots.get(&b.name))
                    .filter(|s| s.slots() == b.slots.get() && s.queue_limit() == b.queue);
                let s = kept
                    .map(Arc::clone)
                    .unwrap_or_else(|| Arc::new(Slots::new(b.slots.get(), b.queue)));
                (b.name.clone(), s)
            })
            .collect();
        let alias_metrics = config
            .aliases
            .values()
            .map(|a| {
                let m = metrics.alias(&a.name);
                if let Some(s) = slots.get(&a.backend.name) {
                    m.queue_limit.set(i64::from(s.queue_limit()));
                }
                (a.name.clone(), m)
            })
            .collect();
        Snapshot {
            config,
            routes,
            alias_metrics,
            unknown: metrics.alias("unknown"),
            slots,
        }
    }

    /// Metric handles of an alias, or of `unknown`.
    pub fn metrics(&self, alias: Option<&str>) -> &AliasMetrics {
        alias
            .and_then(|a| self.alias_metrics.get(a))
            .unwrap_or(&self.unknown)
    }

    pub fn slots(&self, backend: &str) -> Option<&Arc<Slots>> {
        self.slots.get(backend)
    }
}

/// Cheap to clone; handed to every handler.
#[derive(Clone, Debug)]
pub struct AppState {
    pub live: Arc<ArcSwap<Snapshot>>,
    pub client: reqwest::Client,
    /// Plain-http backend connections, driven in the request's task (one pool per worker).
    pub pool: Arc<Pool>,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    /// Unix time the process started: the `created` of `/v1/models` entries.
    pub started: u64,
    /// Where the config came from, for reloads.
    pub config_path: Option<Arc<Path>>,
}

impl AppState {
    pub fn new(config: Config, config_path: Option<PathBuf>) -> AppState {
        let metrics = Arc::new(Metrics::new());
        let client = upstream_client(&config);
        let pool = Arc::new(Pool::new(config.server.connect_timeout));
        let snap = Snapshot::new(config, &metrics, None);
        AppState {
            live: Arc::new(ArcSwap::from_pointee(snap)),
            client,
            pool,
            metrics,
            health: Arc::new(Health::default()),
            started: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            config_path: config_path.map(Arc::from),
        }
    }

    /// The same shared state with an upstream client of its own (one per worker thread, so
    /// each worker's connection pool lives on its own runtime).
    pub fn with_own_client(&self) -> AppState {
        let config = &self.live.load().config;
        AppState {
            client: upstream_client(config),
            pool: Arc::new(Pool::new(config.server.connect_timeout)),
            ..self.clone()
        }
    }

    /// Swap in a new config; requests in flight keep the snapshot they started with.
    pub fn swap(&self, config: Config) {
        let previous = self.live.load_full();
        self.live.store(Arc::new(Snapshot::new(
            config,
            &self.metrics,
            Some(&previous),
        )));
    }
}

/// The pooled HTTP client used for every backend.
fn upstream_client(config: &Config) -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(config.server.connect_timeout)
        .tcp_nodelay(true)
        .pool_max_idle_per_host(1024)
        .no_proxy()
        .build()
        .unwrap_or_else(|e| {
            // Only a TLS back end failing to initialise gets here.
            tracing::error!("cannot build the upstream client ({e}); using defaults");
            reqwest::Client::default()
        })
}
