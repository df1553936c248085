//! The health loop: every backend of the live config probed on the interval, the states
//! recorded; a backend that comes up with figures left to it (`"auto"`) is asked for them.

use std::sync::Arc;

use super::{discover, AppState};
use crate::fleet::health::{probe, BackendState};

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
        if let Some(b) = snap.breaker(&name) {
            let now = std::time::Instant::now();
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

/// Probe forever on the configured interval (spawned by `serve`).
pub async fn run(state: AppState) {
    loop {
        probe_all(&state).await;
        let every = state.live.load().config.server.health_interval;
        tokio::time::sleep(every).await;
    }
}
