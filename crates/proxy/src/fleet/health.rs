//! Backend health: flavour-aware probes on an interval, and the state (up, loading, down) they give.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use prometheus_client::encoding::EncodeLabelValue;

use crate::config::Backend;
use crate::fleet::cost::CostModel;
use crate::fleet::load::Reported;
use crate::fleet::named::ByName;
use crate::upstream::{Client, SendError};

/// A backend's health state.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum BackendState {
    up,
    loading,
    down,
}

/// What the probes last found of every backend, by name: one [`BackendHealth`] each, kept for
/// the process's life (a snapshot's replicas hold theirs, so a request reads it without a
/// lookup).
#[derive(Debug, Default)]
pub struct Health {
    backends: ByName<BackendHealth>,
}

impl Health {
    /// Backend `name`'s health, made on first use (unknown, no reading).
    pub(crate) fn of(&self, name: &str) -> Arc<BackendHealth> {
        self.backends.of(name)
    }

    pub fn get(&self, backend: &str) -> Option<BackendState> {
        self.backends.get(backend).and_then(|h| h.state())
    }

    pub(crate) fn set(&self, backend: &str, state: BackendState) {
        self.of(backend).set(state);
    }
}

/// One backend's health: its state by its last probe, the load it last reported, and its
/// cost model.
#[derive(Debug, Default)]
pub(crate) struct BackendHealth {
    /// 0 until probed, else a [`BackendState`] plus one.
    state: AtomicU8,
    /// The load it reports beyond this process's own requests.
    pub(crate) reported: Reported,
    /// What its answers taught of its speed.
    pub(crate) cost: Arc<CostModel>,
}

impl BackendHealth {
    /// Its state by its last probe; `None` until probed.
    pub(crate) fn state(&self) -> Option<BackendState> {
        match self.state.load(Ordering::Relaxed) {
            1 => Some(BackendState::up),
            2 => Some(BackendState::loading),
            3 => Some(BackendState::down),
            _ => None,
        }
    }

    pub(crate) fn set(&self, state: BackendState) {
        let code = match state {
            BackendState::up => 1,
            BackendState::loading => 2,
            BackendState::down => 3,
        };
        self.state.store(code, Ordering::Relaxed);
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

/// The state a backend is shown with (`/v1/models`, `switchboard routes`, status pages): its
/// health, but `breaker_open` while its breaker refuses requests (open or half-open).
pub(crate) fn shown_state(
    health: Option<BackendState>,
    breaker: Option<crate::fleet::breaker::BreakerState>,
) -> &'static str {
    use crate::fleet::breaker::BreakerState;
    match breaker {
        Some(BreakerState::open | BreakerState::half_open) => "breaker_open",
        _ => state_name(health),
    }
}

/// Probe one backend once, at its runtime's health path.
///
/// A 503 means loading (llama.cpp's while it loads, SGLang's empty one while it starts); so
/// does a read timeout after a successful connect (vLLM answers no HTTP until loaded). A
/// refused or failed connection means down. `None`: the proxy could not open a socket (out
/// of file descriptors), which says nothing of the backend.
pub(crate) async fn probe(
    client: &Client,
    backend: &Backend,
    timeout: Duration,
) -> Option<BackendState> {
    let path = backend.flavor.runtime().health_path;
    Some(match client.get(backend.origin(), path, timeout).await {
        Ok(r) if r.status.is_success() => BackendState::up,
        Ok(r) if r.status == StatusCode::SERVICE_UNAVAILABLE => BackendState::loading,
        Ok(_) => BackendState::down,
        Err(SendError::Timeout) => BackendState::loading,
        Err(SendError::Local(_)) => return None,
        Err(_) => BackendState::down,
    })
}
