//! Config reload on SIGHUP: load, validate, swap; on any error the running config stays.

use crate::metrics::ReloadResult;
use crate::state::AppState;

/// Reload the config file now. Returns the error text when the new config was refused.
pub fn reload(state: &AppState) -> Result<(), String> {
    let Some(path) = &state.config_path else {
        return Err("no config file to reload".into());
    };
    match crate::config::load(path)
        .and_then(|cfg| crate::state::load_tls(&cfg).map(|tls| (cfg, tls)))
    {
        Ok((cfg, tls)) => {
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
                    "server.connect_timeout_ms",
                    old.connect_timeout != new.connect_timeout,
                ),
                (
                    "server.shutdown_grace_secs",
                    old.shutdown_grace != new.shutdown_grace,
                ),
            ];
            for (key, _) in at_restart.iter().filter(|(_, changed)| *changed) {
                tracing::warn!("{key} changed; the new value takes effect at restart");
            }
            state.swap_loaded(cfg, tls);
            state.metrics.config_reload(ReloadResult::success);
            tracing::info!(path = %path.display(), "config reloaded");
            Ok(())
        }
        Err(e) => {
            state.metrics.config_reload(ReloadResult::failure);
            tracing::error!(path = %path.display(), "config reload refused, keeping the running config:\n{e}");
            Err(e.to_string())
        }
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
        let _ = reload(&state);
    }
}

#[cfg(not(unix))]
pub async fn on_sighup(_state: AppState) {}
