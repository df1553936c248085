//! Backend health: flavour-aware probes on an interval, and the state (up, loading, down) they give.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::config::Backend;
use crate::flavor::Flavor;
use crate::metrics::BackendState;
use crate::state::AppState;

/// The last probed state of every backend, by name.
#[derive(Debug, Default)]
pub struct Health {
    states: RwLock<HashMap<String, BackendState>>,
}

impl Health {
    pub fn get(&self, backend: &str) -> Option<BackendState> {
        self.states.read().ok()?.get(backend).copied()
    }

    pub fn set(&self, backend: &str, state: BackendState) {
        if let Ok(mut m) = self.states.write() {
            m.insert(backend.to_string(), state);
        }
    }
}

/// The name of a state as `routes` and `/v1/models` show it.
pub fn state_name(state: Option<BackendState>) -> &'static str {
    match state {
        Some(BackendState::up) => "up",
        Some(BackendState::loading) => "loading",
        Some(BackendState::down) => "down",
        None => "unknown",
    }
}

/// Probe one backend once.
///
/// llama.cpp answers `/health` 503 while loading; SGLang sends an empty 503 while starting;
/// vLLM accepts connections but does not answer HTTP until loaded, so a read timeout after a
/// successful connect means loading. A refused or failed connection means down.
pub async fn probe(client: &reqwest::Client, backend: &Backend, timeout: Duration) -> BackendState {
    let path = match backend.flavor {
        Flavor::Openai => "/v1/models",
        _ => "/health",
    };
    let mut req = client
        .get(format!("{}{}", backend.url, path))
        .timeout(timeout);
    if let Some(auth) = &backend.api_key {
        req = req.header(reqwest::header::AUTHORIZATION, auth.clone());
    }
    match req.send().await {
        Ok(r) if r.status().is_success() => BackendState::up,
        Ok(r) if r.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE => BackendState::loading,
        Ok(_) => BackendState::down,
        Err(e) if e.is_timeout() && !e.is_connect() => BackendState::loading,
        Err(_) => BackendState::down,
    }
}

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
