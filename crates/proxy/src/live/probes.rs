//! The health loop: every backend of the live config probed on the interval, the states
//! recorded; a backend that comes up with figures left to it (`"auto"`) is asked for them.
//! Beside it the load loop: every replica's load read from the backend on the (shorter) load
//! interval.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{discover, AppState};
use crate::config::{Backend, Config};
use crate::fleet::health::{probe, BackendState};
use crate::fleet::load;
use crate::fleet::slots::Slots;

/// Probe every backend of the live config now, and record the results. A backend found up
/// that was not up before (down, loading, or never probed: this covers the start), or whose
/// `"auto"` figures are still unknown, is asked what it serves; its figures are put in force
/// in a new snapshot before this returns.
pub async fn probe_all(state: &AppState) {
    let snap = state.live.load_full();
    let timeout = discover::timeout(&snap.config.server);
    let probes = snap.config.backends.values().map(|b| {
        let client = state.client.clone();
        let b = Arc::clone(b);
        async move { (b.name.clone(), probe(&client, &b, timeout).await) }
    });
    let mut recovered = Vec::new();
    for (name, st) in futures_util::future::join_all(probes).await {
        let before = state.health.get(&name);
        let Some(st) = st else {
            // The proxy could not open a socket: the backend keeps the state it had.
            tracing::warn!(backend = %name, "health probe not made: out of file descriptors");
            continue;
        };
        log_change(&name, before, st);
        state.health.set(&name, st);
        state.metrics.backend_state(&name, st);
        // A half-open breaker takes the probe as its trial.
        if let Some(b) = snap.replica(&name).map(|r| &r.breaker) {
            let now = crate::fleet::breaker::now();
            b.probed(st == BackendState::up, now);
            state.metrics.breaker_state(&name, b.state(now));
        }
        let came_up = st == BackendState::up && before != Some(BackendState::up);
        let unknown = st == BackendState::up && snap.discovered(&name).is_none();
        if came_up || unknown {
            recovered.push(name);
        }
    }
    let ask: Vec<_> = discover::wanting(&snap.config)
        .into_iter()
        .filter(|b| recovered.contains(&b.name))
        .collect();
    if ask.is_empty() {
        return;
    }
    let fresh = discover::ask(&state.client, &ask, timeout).await;
    if fresh.is_empty() {
        return;
    }
    if let Err(e) = state.apply_found(fresh) {
        tracing::error!("cannot put the discovered figures in force:\n{e}");
    }
}

/// A backend's state as probed, logged when it changes (once per change, not per probe).
fn log_change(backend: &str, before: Option<BackendState>, now: BackendState) {
    if before == Some(now) {
        return;
    }
    let from = crate::fleet::health::state_name(before);
    let to = crate::fleet::health::state_name(Some(now));
    match now {
        BackendState::up => tracing::info!(backend, from, to, "backend state changed"),
        BackendState::loading | BackendState::down => {
            tracing::warn!(backend, from, to, "backend state changed")
        }
    }
}

/// The backends whose load matters: those an alias has among two replicas or more, of a
/// flavour that reports its load.
fn replicas(config: &Config) -> Vec<Arc<Backend>> {
    let mut found: Vec<Arc<Backend>> = Vec::new();
    for alias in config.aliases.values().filter(|a| a.backends.len() > 1) {
        for b in &alias.backends {
            let reports = !b.flavor.runtime().load.is_empty();
            if reports && !found.iter().any(|f| f.name == b.name) {
                found.push(Arc::clone(b));
            }
        }
    }
    found
}

/// Read the load of every replica of the live config now, and record it (a replica that
/// cannot be read has its last reading set aside).
pub async fn read_loads(state: &AppState) {
    let snap = state.live.load_full();
    let Some(interval) = snap.config.server.load_interval else {
        return;
    };
    let reads = replicas(&snap.config).into_iter().map(|b| {
        let slots = snap.replica(&b.name).map(|r| Arc::clone(&r.slots));
        let timeout = load::max_age(interval).min(discover::timeout(&snap.config.server));
        async move { read_load(state, &b, slots.as_deref(), timeout).await }
    });
    futures_util::future::join_all(reads).await;
}

/// Read one backend's load now, within `timeout`, `slots` its slots in this process, and
/// record it.
pub(crate) async fn read_load(
    state: &AppState,
    backend: &Backend,
    slots: Option<&Slots>,
    timeout: Duration,
) {
    let own = || slots.map_or(0, Slots::busy);
    let (at, before) = (Instant::now(), own());
    let busy = load::read(&state.client, backend, timeout).await;
    if let Err(e) = &busy {
        tracing::debug!(backend = %backend.name, "load not read: {e}");
    }
    let health = state.health.of(&backend.name);
    health.reported.set(busy.ok(), before.max(own()), at);
}

/// Read the replicas' load forever on the configured interval (spawned by [`run`]).
async fn run_loads(state: AppState) {
    loop {
        read_loads(&state).await;
        let every = state.live.load().config.server.load_interval;
        // Off: looked at again now and then, in case a reload turns it on.
        tokio::time::sleep(every.unwrap_or(Duration::from_secs(1))).await;
    }
}

/// Probe forever on the configured interval (spawned by `serve`), and read the replicas' load
/// on its own.
pub async fn run(state: AppState) {
    tokio::spawn(run_loads(state.clone()));
    loop {
        probe_all(&state).await;
        let every = state.live.load().config.server.health_interval;
        tokio::time::sleep(every).await;
    }
}
