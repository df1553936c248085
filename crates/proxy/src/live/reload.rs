//! Config reload (on SIGHUP, or when the file changes: see `watch`): load, validate, ask the
//! backends with `"auto"` figures what they serve, build the snapshot, swap; on any error the
//! running config stays. The last reload's result and time are kept for the status page.

use std::sync::Mutex;
use std::time::SystemTime;

use crate::config::ConfigErrors;
use crate::live::{discover, AppState};
use crate::lock::Locked;

/// How the last reload ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReloadOutcome {
    /// The new config is in force.
    Applied,
    /// The new config was refused with this many errors (they are in the log); the running
    /// config stays.
    Refused { errors: usize },
}

/// The last reload: when it ended and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LastReload {
    pub(crate) at: SystemTime,
    pub(crate) outcome: ReloadOutcome,
}

/// The last reload of this process, if any (shared by every worker's state).
#[derive(Debug, Default)]
pub(crate) struct ReloadLog(Mutex<Option<LastReload>>);

impl ReloadLog {
    pub(crate) fn last(&self) -> Option<LastReload> {
        *self.0.locked()
    }

    fn set(&self, outcome: ReloadOutcome) {
        let at = SystemTime::now();
        *self.0.locked() = Some(LastReload { at, outcome });
    }
}

/// Why a reload left the running config in force.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("no config file to reload")]
    NoFile,
    /// The new config was refused; every error is in it.
    #[error(transparent)]
    Refused(ConfigErrors),
}

/// Reload the config file now. Returns why when the new config was refused.
/// Backends with figures left to them (`"auto"`) are asked anew before the swap; one that
/// cannot be asked keeps the figures it had, if it is the same backend (URL and flavour).
pub async fn reload(state: &AppState) -> Result<(), ReloadError> {
    let Some(path) = &state.config_path else {
        state.reloads.set(ReloadOutcome::Refused { errors: 1 });
        return Err(ReloadError::NoFile);
    };
    let loaded = match crate::config::load(path) {
        Ok(cfg) => {
            warn_at_restart(state, &cfg);
            let ask = discover::wanting(&cfg);
            let timeout = discover::timeout(&cfg.server);
            let fresh = discover::ask(&state.client, &ask, timeout).await;
            state.swap_found(cfg, fresh)
        }
        Err(e) => Err(e),
    };
    match loaded {
        Ok(()) => {
            state.metrics.config_reload(true);
            state.reloads.set(ReloadOutcome::Applied);
            tracing::info!(path = %path.display(), "config reloaded");
            Ok(())
        }
        Err(e) => {
            state.metrics.config_reload(false);
            state
                .reloads
                .set(ReloadOutcome::Refused { errors: e.0.len() });
            tracing::error!(path = %path.display(), "config reload refused, keeping the running config:\n{e}");
            Err(ReloadError::Refused(e))
        }
    }
}

/// Server keys that only a restart applies, logged when a reload changes them.
fn warn_at_restart(state: &AppState, cfg: &crate::config::Config) {
    let old = &state.live.load().config.server;
    let new = &cfg.server;
    let at_restart = [
        ("server.listen", old.listen != new.listen),
        (
            "server.metrics_listen",
            old.metrics_listen != new.metrics_listen,
        ),
        ("server.workers", old.workers != new.workers),
        (
            "server.connect_timeout_ms (for https backends)",
            old.connect_timeout != new.connect_timeout,
        ),
        ("server.watch_config", old.watch_config != new.watch_config),
        (
            "server.shared_state (and its lease and timeout)",
            old.shared_state != new.shared_state,
        ),
        (
            "server.shutdown_grace_secs",
            old.shutdown_grace != new.shutdown_grace,
        ),
    ];
    for (key, _) in at_restart.iter().filter(|(_, changed)| *changed) {
        tracing::warn!("{key} changed; the new value takes effect at restart");
    }
}

/// Reload on every SIGHUP, forever (spawned by `serve`).
#[cfg(unix)]
pub async fn on_sighup(state: AppState) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        tracing::warn!("cannot listen for SIGHUP; reload disabled");
        return;
    };
    while hup.recv().await.is_some() {
        let _ = reload(&state).await;
    }
}

#[cfg(not(unix))]
pub(crate) async fn on_sighup(_state: AppState) {}
