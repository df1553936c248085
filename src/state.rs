//! Shared state: the live config snapshot (swapped atomically on reload), the upstream client, metrics.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
// foldhash: read on every request, keyed by names from the config (no untrusted keys).
use foldhash::HashMap;

use crate::config::{Config, ConfigError, ConfigErrors};
use crate::health::Health;
use crate::metrics::{AliasMetrics, Metrics};
use crate::routes::RouteTable;
use crate::slots::Slots;
use crate::upstream::tls::TlsSettings;
use crate::upstream::Client;

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
    /// Backend connections (http and https), driven in the request's task (one pool per
    /// worker), with the TLS settings of the live config.
    pub client: Client,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    /// Unix time the process started: the `created` of `/v1/models` entries.
    pub started: u64,
    /// Where the config came from, for reloads.
    pub config_path: Option<Arc<Path>>,
}

impl AppState {
    /// The state of `config`; fails when an https backend's TLS settings cannot be loaded
    /// (its `ca_file` missing or not a CA), naming the key.
    pub fn try_new(config: Config, config_path: Option<PathBuf>) -> Result<AppState, ConfigErrors> {
        let tls = load_tls(&config)?;
        Ok(AppState::with_tls(config, config_path, tls))
    }

    /// [`AppState::try_new`] for configs whose CA files are not in question (tests, the
    /// demo): a backend whose TLS settings fail to load is logged, and its connections fail.
    pub fn new(config: Config, config_path: Option<PathBuf>) -> AppState {
        let tls = load_tls_or_log(&config);
        AppState::with_tls(config, config_path, tls)
    }

    fn with_tls(config: Config, config_path: Option<PathBuf>, tls: TlsSettings) -> AppState {
        let metrics = Arc::new(Metrics::new());
        let client = Client::new(config.server.connect_timeout, tls);
        let snap = Snapshot::new(config, &metrics, None);
        AppState {
            live: Arc::new(ArcSwap::from_pointee(snap)),
            client,
            metrics,
            health: Arc::new(Health::default()),
            started: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            config_path: config_path.map(Arc::from),
        }
    }

    /// The same shared state with an upstream pool of its own (one per worker thread, so
    /// each worker's connections live on its own runtime).
    pub fn with_own_client(&self) -> AppState {
        AppState {
            client: self.client.for_worker(),
            ..self.clone()
        }
    }

    /// Swap in a new config; requests in flight keep the snapshot they started with. For
    /// configs whose CA files are not in question (tests): a backend whose TLS settings fail
    /// to load is logged, and its connections fail. Reload uses [`AppState::swap_loaded`].
    pub fn swap(&self, config: Config) {
        let tls = load_tls_or_log(&config);
        self.swap_loaded(config, tls);
    }

    /// Swap in a new config with its TLS settings, as [`load_tls`] made them.
    pub fn swap_loaded(&self, config: Config, tls: TlsSettings) {
        let previous = self.live.load_full();
        self.client.set_tls(tls);
        self.live.store(Arc::new(Snapshot::new(
            config,
            &self.metrics,
            Some(&previous),
        )));
    }
}

/// Read the CA files of `config`'s https backends and make their TLS settings; the errors
/// name the key (`backends.NAME.ca_file`). `switchboard check`, start-up and reload use it.
pub fn load_tls(config: &Config) -> Result<TlsSettings, ConfigErrors> {
    let (tls, errors) = tls_settings(config);
    if errors.is_empty() {
        Ok(tls)
    } else {
        Err(ConfigErrors(errors))
    }
}

fn load_tls_or_log(config: &Config) -> TlsSettings {
    let (tls, errors) = tls_settings(config);
    for e in errors {
        tracing::error!("{e}");
    }
    tls
}

fn tls_settings(config: &Config) -> (TlsSettings, Vec<ConfigError>) {
    let https = config.backends.values().filter_map(|b| {
        let spec = b.tls.as_ref()?;
        Some((b.name.as_str(), b.authority.as_str(), spec))
    });
    let (tls, errors) = TlsSettings::load(https);
    let errors = errors
        .into_iter()
        .map(|e| ConfigError::BadValue {
            key: format!("backends.{}.{}", e.backend, e.key),
            value: e.value,
            reason: e.reason,
        })
        .collect();
    (tls, errors)
}
