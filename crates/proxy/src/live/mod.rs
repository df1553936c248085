//! Shared state: the live config snapshot (swapped atomically on reload, on SIGHUP or a change
//! of the file), the upstream client, metrics.

pub(crate) mod alias;
pub mod discover;
pub mod figures;
pub mod probes;
pub mod reload;
pub mod watch;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
// foldhash: read on every request, keyed by names from the config (no untrusted keys).
use foldhash::HashMap;

use crate::clients::Registry;
use crate::config::{Alias, Backend, Config, ConfigError, ConfigErrors};
use crate::fleet::balance::Affinity;
use crate::fleet::breaker::Breaker;
use crate::fleet::discovery::Discovered;
use crate::fleet::health::Health;
use crate::fleet::lease::SharedSlots;
use crate::fleet::routes::RouteTable;
use crate::fleet::slots::Slots;
use crate::fleet::work::Outputs;
use crate::guard::GuardSpec;
use crate::ledger::Ledger;
use crate::lock::Locked;
use crate::observe::metrics::{AliasMetrics, Metrics};
use crate::observe::trace::Tracer;
use crate::shared::Store;
use crate::tokens::gate::CountGate;
use crate::upstream::exchange::{Answer, Exchange, Outbound};
use crate::upstream::failure::UpstreamError;
use crate::upstream::{tls::TlsSettings, Client};
use alias::{LiveAlias, Replica};
use figures::{Figures, Found, Fresh};

/// Everything derived from one config; a request uses one snapshot from start to end.
#[derive(Debug)]
pub struct Snapshot {
    /// The config with its figures in force: `"auto"` windows and slots as discovered.
    pub config: Config,
    /// The live aliases, by name and old name, with their fallback orders.
    pub routes: RouteTable<LiveAlias>,
    /// The metric handles of requests for no alias.
    unknown: AliasMetrics,
    /// Every backend as a replica, by name: its slots, breaker and connections.
    replicas: HashMap<String, Arc<Replica>>,
    /// Which backend each conversation is on; the same table in every snapshot.
    affinity: Arc<Affinity>,
    /// Turns of the tie-break between equally loaded replicas.
    turn: std::sync::atomic::AtomicUsize,
    /// The turns every token count takes (kept from the previous snapshot while its
    /// settings are unchanged, so counts running still count against it).
    gate: Arc<CountGate>,
    /// What the backends reported, where it was asked.
    found: Found,
    /// Who holds which key; each client's counters kept across snapshots.
    pub clients: Registry,
    /// The tracer, when `[tracing]` is on (kept while its setting is unchanged).
    pub tracer: Option<Arc<Tracer>>,
    /// The usage ledger, when `[ledger]` is set (kept while its setting is unchanged).
    pub ledger: Option<Arc<Ledger>>,
    /// The store slots and client limits are shared in, when `server.shared_state` is set:
    /// started with the process, the same in every snapshot.
    pub(crate) shared: Option<Arc<Store>>,
}

impl Snapshot {
    /// The first snapshot of a process, its shared store started when the config has one.
    fn first(config: Config, at: Kept<'_>) -> Result<Snapshot, ConfigErrors> {
        let metrics = at.metrics;
        let shared = match &config.server.shared_state {
            Some(settings) => {
                let signals = metrics.shared_signals(&crate::shared::shown(&settings.url));
                let store = Store::start(settings, signals).map_err(|reason| {
                    ConfigErrors(vec![ConfigError::BadValue {
                        key: "server.shared_state".into(),
                        value: crate::shared::shown(&settings.url),
                        reason: reason.to_string(),
                    }])
                })?;
                Some(store)
            }
            None => None,
        };
        Self::assemble(config, at, None, Vec::new(), shared)
    }

    /// `previous`: the snapshot being replaced. Its discoveries hold for backends still at the
    /// same URL and flavour, `fresh` ones on top; `"auto"` figures are put in force from them.
    /// A backend whose slots and queue did not change keeps its `Slots`, so requests in flight
    /// still count against the same limit; an alias whose guard did not change keeps its
    /// counter (and the counts it has cached). Building a guard's counter loads its tokenizer:
    /// a file that cannot be loaded fails the snapshot.
    pub(crate) fn build(
        config: Config,
        at: Kept<'_>,
        previous: Option<&Snapshot>,
        fresh: Fresh,
    ) -> Result<Snapshot, ConfigErrors> {
        let shared = previous.and_then(|p| p.shared.clone());
        Self::assemble(config, at, previous, fresh, shared)
    }

    /// [`Self::build`] with the shared store given.
    fn assemble(
        config: Config,
        at: Kept<'_>,
        previous: Option<&Snapshot>,
        fresh: Fresh,
        shared: Option<Arc<Store>>,
    ) -> Result<Snapshot, ConfigErrors> {
        let metrics = at.metrics;
        let found = figures::carry(&config, previous, fresh);
        let config = figures::apply(config, &found);
        let gate = previous
            .map(|p| &p.gate)
            .filter(|g| g.config() == config.server.count)
            .map(Arc::clone)
            .unwrap_or_else(|| {
                let (running, waiting) = metrics.count_gauges();
                Arc::new(CountGate::new(config.server.count, running, waiting))
            });
        let mut guards = guards(&config, previous, &gate)?;
        let tracer = tracer(&config, metrics, previous)?;
        let ledger = ledger(&config, metrics, previous)?;
        let clients = Registry::build(
            &config,
            metrics,
            previous.map(|p| &p.clients),
            shared.as_ref(),
            ledger.as_ref().map(|l| l.board()),
        );
        let replicas = replicas(&config, at, previous, shared.as_ref());
        let live = config.aliases.values().map(|a| {
            let of = |b: &Arc<Backend>| Arc::clone(&replicas[&b.name]);
            let replicas: Vec<_> = a.backends.iter().map(of).collect();
            let metrics = alias_metrics(a, metrics, &replicas);
            Arc::new(LiveAlias::new(
                Arc::clone(a),
                metrics,
                guards.remove(&a.name),
                replicas,
            ))
        });
        let routes = RouteTable::of(live.collect::<Vec<_>>());
        let affinity = previous.map_or_else(Arc::default, |p| Arc::clone(&p.affinity));
        Ok(Snapshot {
            config,
            routes,
            unknown: metrics.alias("unknown"),
            replicas,
            affinity,
            turn: std::sync::atomic::AtomicUsize::new(0),
            gate,
            found,
            clients,
            tracer,
            ledger,
            shared,
        })
    }

    /// The live alias of a current name (not an old one).
    pub fn alias(&self, name: &str) -> Option<&Arc<LiveAlias>> {
        self.routes.alias(name)
    }

    /// A backend as a replica, by its config name (for the probes and pages that walk the
    /// backends; a request holds its replicas from its alias).
    pub fn replica(&self, backend: &str) -> Option<&Arc<Replica>> {
        self.replicas.get(backend)
    }

    pub fn affinity(&self) -> &Affinity {
        &self.affinity
    }

    /// The next turn of the tie-break between equally loaded replicas.
    pub(crate) fn next_turn(&self) -> usize {
        self.turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// The gate every token count of this snapshot takes a turn at.
    pub fn count_gate(&self) -> &Arc<CountGate> {
        &self.gate
    }

    /// An alias's window and slots in force and where they come from (config, discovered
    /// and when, or a pending `"auto"`).
    pub fn figures(&self, alias: &str) -> Option<Figures> {
        let a = self.routes.alias(alias)?;
        Some(figures::figures(&a.spec, &self.found))
    }

    /// What a backend reported, if it was asked and answered.
    pub fn discovered(&self, backend: &str) -> Option<&Arc<Discovered>> {
        self.found.get(backend)
    }

    /// The metric handles of requests that name no alias (yet).
    pub(crate) fn unknown_metrics(&self) -> &AliasMetrics {
        &self.unknown
    }
}

/// What outlives every snapshot and each one is built with: the metric registry and the
/// backends' health.
#[derive(Clone, Copy)]
pub(crate) struct Kept<'a> {
    pub(crate) metrics: &'a Metrics,
    pub(crate) health: &'a Health,
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
    pub(crate) config_path: Option<Arc<Path>>,
    /// Where proxied requests go instead of the pool: a scripted backend, in the pipeline's
    /// tests ([`AppState::with_exchange`]); `None` in service.
    script: Option<Arc<dyn Exchange>>,
    /// Held while a snapshot is built and stored, so a reload and a discovery that finish
    /// together do not lose one another.
    rebuild: Arc<Mutex<()>>,
    /// The last reload's result and time.
    pub(crate) reloads: Arc<reload::ReloadLog>,
    /// How long each client's recent answers were (what its next is expected to take).
    pub(crate) outputs: Arc<Outputs>,
    /// The Batch API's state (in the ledger the process started with), or why it is off.
    pub(crate) batches: Result<Arc<crate::batches::Batches>, &'static str>,
}

impl AppState {
    /// The state of a proxy serving `config`; fails, naming the key, when an https backend's
    /// `ca_file` or a guard's tokenizer cannot be loaded.
    pub fn new(config: Config, config_path: Option<PathBuf>) -> Result<AppState, ConfigErrors> {
        let tls = load_tls(&config)?;
        let metrics = Arc::new(Metrics::new());
        let health = Arc::new(Health::default());
        let client = Client::new(config.server.connect_timeout, tls);
        let batches = crate::batches::of(&config, metrics.batches.db_up.clone())?;
        let snap = Snapshot::first(
            config,
            Kept {
                metrics: &metrics,
                health: &health,
            },
        )?;
        Ok(AppState {
            live: Arc::new(ArcSwap::from_pointee(snap)),
            client,
            metrics,
            health,
            started: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            config_path: config_path.map(Arc::from),
            script: None,
            rebuild: Arc::default(),
            outputs: Arc::default(),
            reloads: Arc::default(),
            batches,
        })
    }

    /// The same state, its proxied requests answered by `script` instead of the pool (the
    /// pipeline's tests: no sockets, paused time).
    #[cfg(test)]
    pub(crate) fn with_exchange(self, script: Arc<dyn Exchange>) -> AppState {
        AppState {
            script: Some(script),
            ..self
        }
    }

    /// Send one proxied request: through the pool, or to the script where one is set.
    pub(crate) async fn post(&self, to: Outbound<'_>) -> Result<Answer, UpstreamError> {
        match &self.script {
            None => crate::upstream::exchange::send(&self.client, to).await,
            Some(script) => script.post(to).await,
        }
    }

    /// The same shared state with an upstream pool of its own (one per worker thread, so
    /// each worker's connections live on its own runtime).
    pub(crate) fn with_own_client(&self) -> AppState {
        AppState {
            client: self.client.for_worker(),
            ..self.clone()
        }
    }

    /// The state backend `name` is shown with: `up`, `loading`, `down` (by its health probe),
    /// `unknown` (not probed yet), or `breaker_open` while its circuit breaker refuses
    /// requests. The one source of the state column of `/v1/models`, `switchboard routes` and
    /// status pages.
    pub fn shown_state(&self, backend: &str) -> &'static str {
        let snap = self.live.load();
        let breaker = snap
            .replica(backend)
            .map(|r| r.breaker.state(crate::fleet::breaker::now()));
        crate::fleet::health::shown_state(self.health.get(backend), breaker)
    }

    /// Set the breaker-state gauges of the live config's backends (at each scrape: a back-off
    /// ends with time, not with an event).
    pub(crate) fn record_breakers(&self) {
        let snap = self.live.load();
        let now = crate::fleet::breaker::now();
        for r in snap.replicas.values() {
            self.metrics.breaker_state(r.name(), r.breaker.state(now));
            self.metrics.speeds(r.name(), &r.health.cost);
        }
    }

    /// What every snapshot of this state is built with.
    fn kept(&self) -> Kept<'_> {
        Kept {
            metrics: &self.metrics,
            health: &self.health,
        }
    }

    /// Swap in a new config; requests in flight keep the snapshot they started with. A config
    /// whose snapshot cannot be built is refused and the running one kept.
    pub fn swap(&self, config: Config) -> Result<(), ConfigErrors> {
        self.swap_found(config, Vec::new())
    }

    /// [`Self::swap`] with `fresh` discoveries put in force as well.
    pub(crate) fn swap_found(&self, config: Config, fresh: Fresh) -> Result<(), ConfigErrors> {
        let tls = load_tls(&config)?;
        let _one = self.rebuild.locked();
        let previous = self.live.load_full();
        let next = Snapshot::build(config, self.kept(), Some(&previous), fresh)?;
        self.client.set_tls(tls);
        self.live.store(Arc::new(next));
        Ok(())
    }

    /// Put `fresh` discoveries in force on the running config (a new snapshot of it; its TLS
    /// settings stay those in force).
    pub(crate) fn apply_found(&self, fresh: Fresh) -> Result<(), ConfigErrors> {
        let _one = self.rebuild.locked();
        let previous = self.live.load_full();
        let config = previous.config.clone();
        let next = Snapshot::build(config, self.kept(), Some(&previous), fresh)?;
        self.live.store(Arc::new(next));
        Ok(())
    }
}

/// Every alias's guard with its counter: the counter kept from `previous` where the guard
/// settings and the alias's backend and model are unchanged, built (tokenizer loaded)
/// otherwise. An alias whose `"auto"` window is not known yet gets a guard of window 0, not
/// in force (see [`Snapshot::guard`]): its tokenizer is loaded, and so checked, all the same.
pub(crate) fn guards(
    config: &Config,
    previous: Option<&Snapshot>,
    gate: &Arc<CountGate>,
) -> Result<HashMap<String, Arc<GuardSpec>>, ConfigErrors> {
    let mut guards = HashMap::default();
    let mut errs = Vec::new();
    for alias in config.aliases.values() {
        let Some(cfg) = &alias.guard else { continue };
        let window = alias.context_window.map_or(0, |w| w.get());
        let same = |old: &&Arc<crate::config::Alias>| {
            old.guard.as_ref() == Some(cfg)
                && old.upstream_model == alias.upstream_model
                && old.backend.url == alias.backend.url
                && old.backend.flavor == alias.backend.flavor
                && old.backend.api_key == alias.backend.api_key
        };
        let kept = previous.and_then(|p| {
            p.alias(&alias.name)
                .filter(|l| same(&&l.spec))
                .and_then(|l| l.built_guard())
        });
        match kept {
            Some(g) if g.window == window && Arc::ptr_eq(&g.gate, gate) => {
                guards.insert(alias.name.clone(), Arc::clone(g));
            }
            Some(g) => {
                let g = GuardSpec {
                    window,
                    gate: Arc::clone(gate),
                    ..GuardSpec::clone(g)
                };
                guards.insert(alias.name.clone(), Arc::new(g));
            }
            None => match GuardSpec::build(cfg, window, alias, Arc::clone(gate)) {
                Ok(g) => {
                    guards.insert(alias.name.clone(), Arc::new(g));
                }
                Err(reason) => {
                    let (key, value) = cfg.counter_key();
                    errs.push(ConfigError::BadValue {
                        key: format!("aliases.{}.{key}", alias.name),
                        value,
                        reason: reason.to_string(),
                    });
                }
            },
        }
    }
    if errs.is_empty() {
        Ok(guards)
    } else {
        Err(ConfigErrors(errs))
    }
}

/// What `switchboard check` loads besides the file: every https backend's CA file and every
/// guard's tokenizer, as start-up and reload load them; every error, naming its key.
pub fn check(config: &Config) -> Result<(), ConfigErrors> {
    let (_, mut errors) = tls_settings(config);
    let gate = Arc::new(CountGate::unlimited(config.server.count.concurrency));
    if let Err(ConfigErrors(more)) = guards(config, None, &gate) {
        errors.extend(more);
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ConfigErrors(errors))
    }
}

/// Read the CA files of `config`'s https backends and make their TLS settings; the errors
/// name the key (`backends.NAME.ca_file`). `switchboard check`, start-up and reload use it.
pub(crate) fn load_tls(config: &Config) -> Result<TlsSettings, ConfigErrors> {
    let (tls, errors) = tls_settings(config);
    if errors.is_empty() {
        Ok(tls)
    } else {
        Err(ConfigErrors(errors))
    }
}

fn tls_settings(config: &Config) -> (TlsSettings, Vec<ConfigError>) {
    let https = config.backends.values().filter_map(|b| {
        let spec = b.tls.as_ref()?;
        Some((b.name.as_str(), b.authority.as_str(), spec))
    });
    let (tls, errors) = TlsSettings::load(https, crate::files::read_ca);
    let errors = errors
        .into_iter()
        .map(|e| ConfigError::BadValue {
            key: format!("backends.{}.{}", e.backend, e.key),
            value: e.value,
            reason: e.reason.to_string(),
        })
        .collect();
    (tls, errors)
}

/// The tracer of `config`: the previous snapshot's while its setting is the same, else a new
/// one (its export thread started); none while tracing is off.
fn tracer(
    config: &Config,
    metrics: &Metrics,
    previous: Option<&Snapshot>,
) -> Result<Option<Arc<Tracer>>, ConfigErrors> {
    let Some(settings) = &config.tracing else {
        return Ok(None);
    };
    kept_or_started(
        previous.and_then(|p| p.tracer.as_ref()),
        |t| t.settings() == settings,
        || Tracer::start(settings, metrics.spans_dropped.clone()),
        ("tracing.otlp_endpoint", &settings.url),
    )
}

/// The ledger of `config`: the previous snapshot's while its setting is the same (counting
/// the budgets in the calendar of `config`), else one opened now ([`Ledger::start_for`]); none
/// without `[ledger]`.
fn ledger(
    config: &Config,
    metrics: &Metrics,
    previous: Option<&Snapshot>,
) -> Result<Option<Arc<Ledger>>, ConfigErrors> {
    let Some(settings) = &config.ledger else {
        return Ok(None);
    };
    // The budgets of a day and a month are read from it when some client has one.
    let any = config.clients.named.iter().any(|c| c.counts_days());
    let calendar = any.then(|| config.server.budget_timezone.clone());
    let ledger = kept_or_started(
        previous.and_then(|p| p.ledger.as_ref()),
        |l| l.settings() == settings,
        || Ledger::start_for(settings, &metrics.ledger, &calendar, previous.is_some()),
        ("ledger.url", &settings.url.shown()),
    )?;
    if let Some(l) = &ledger {
        l.set_calendar(calendar.clone());
    }
    Ok(ledger)
}

/// `before` while `same` holds of it, else one `start`ed now; a start that fails is an error
/// of the config key and value `of`.
fn kept_or_started<T, E: ToString>(
    before: Option<&Arc<T>>,
    same: impl Fn(&T) -> bool,
    start: impl FnOnce() -> Result<T, E>,
    of: (&str, &str),
) -> Result<Option<Arc<T>>, ConfigErrors> {
    if let Some(t) = before.filter(|t| same(t)) {
        return Ok(Some(Arc::clone(t)));
    }
    start().map(|t| Some(Arc::new(t))).map_err(|reason| {
        ConfigErrors(vec![ConfigError::BadValue {
            key: of.0.into(),
            value: of.1.into(),
            reason: reason.to_string(),
        }])
    })
}

/// Each backend as a replica: its slots — the previous snapshot's where their count, queue
/// and (with a shared store) URL are the same, so requests in them keep their places; its
/// breaker (given the new settings) and what was learned of its connections — the previous
/// snapshot's while the backend keeps its URL; new ones otherwise.
fn replicas(
    config: &Config,
    at: Kept<'_>,
    previous: Option<&Snapshot>,
    shared: Option<&Arc<Store>>,
) -> HashMap<String, Arc<Replica>> {
    let metrics = at.metrics;
    let schedule = (config.server.schedule).with_interactive(config.clients.has_interactive());
    config
        .backends
        .values()
        .map(|b| {
            let before = previous.and_then(|p| p.replicas.get(&b.name));
            let same_url = before.filter(|r| r.backend.url == b.url);
            let kept_slots = before
                .filter(|_| shared.is_none() || same_url.is_some())
                .map(|r| &r.slots)
                .filter(|s| s.slots() == b.slots.get() && s.queue_limit() == b.queue);
            let slots = kept_slots.map(Arc::clone).unwrap_or_else(|| {
                let s = Slots::new(b.slots.get(), b.queue);
                Arc::new(match shared {
                    Some(store) => s.with_shared(SharedSlots::new(Arc::clone(store), &b.url)),
                    None => s,
                })
            });
            let cfg = config.server.breaker;
            let breaker = match same_url {
                Some(r) => {
                    r.breaker.reconfigure(cfg);
                    Arc::clone(&r.breaker)
                }
                None => Arc::new(Breaker::new(cfg)),
            };
            let conns = same_url.map_or_else(
                || Arc::new(metrics.conn_watch(&b.name)),
                |r| Arc::clone(&r.conns),
            );
            slots.serve(schedule, b);
            let health = at.health.of(&b.name);
            health.cost.seed(b.seed);
            let replica = Replica {
                backend: Arc::clone(b),
                slots,
                breaker,
                conns,
                health,
            };
            (b.name.clone(), Arc::new(replica))
        })
        .collect()
}

/// An alias's metric handles, its queue limit set to the sum of its replicas' queues.
fn alias_metrics(alias: &Alias, metrics: &Metrics, replicas: &[Arc<Replica>]) -> AliasMetrics {
    let m = metrics.alias(&alias.name);
    let limit: i64 = replicas
        .iter()
        .map(|r| i64::from(r.slots.queue_limit()))
        .sum();
    m.queue_limit.set(limit);
    m
}
