//! The health loop: every backend of the live config probed on the interval, the states recorded.

use std::sync::Arc;
use std::time::Duration;

use super::AppState;
use crate::fleet::health::{probe, BackendState};

/// Probe every backend of the live config now, and record the results.
pub async fn probe_all(state: &AppState) {
    let snap = state.live.load_full();
    let timeout = snap
        .config
        .server
        .health_interval
        .min(Duration::from_secs(5));
    let probes = snap.config.backends.values().map(|b| {
        let client = state.client.clone();
        let b = Arc::clone(b);
        async move { (b.name.clone(), probe(&client, &b, timeout).await) }
    });
    for (name, st) in futures_util::future::join_all(probes).await {
        state.health.set(&name, st);
        state.metrics.backend_state(&name, st);
        // A half-open breaker takes the probe as its trial.
        if let Some(b) = snap.breaker(&name) {
            let now = std::time::Instant::now();
            b.probed(st == BackendState::up, now);
            state.metrics.breaker_state(&name, b.state(now));
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
