//! Discovery for the live config: which backends have figures left to them, and asking them.

use std::sync::Arc;
use std::time::Duration;

use super::figures::Fresh;
use crate::config::{Backend, Config, Server, Sizing};
use crate::fleet::discovery;
use crate::fleet::drift::Probed;

/// How long one discovery or health request may take.
pub(crate) fn timeout(server: &Server) -> Duration {
    server.health_interval.min(Duration::from_secs(5))
}

/// Whether `backend` has a figure left to it: `slots = "auto"`, or an alias on it with
/// `context_window = "auto"`.
pub(crate) fn wants(config: &Config, backend: &Backend) -> bool {
    backend.slots_setting.is_auto()
        || config
            .aliases
            .values()
            .any(|a| a.backend.name == backend.name && a.window_setting == Some(Sizing::Auto))
}

/// The backends of `config` that [`wants`] names.
pub(crate) fn wanting(config: &Config) -> Vec<Arc<Backend>> {
    config
        .backends
        .values()
        .filter(|b| wants(config, b))
        .cloned()
        .collect()
}

/// Ask every one of `backends` at once; those that answered, by name. A backend that could
/// not be asked is logged and left out (its previous figures, if any, stay in force).
pub(crate) async fn ask(
    client: &crate::upstream::Client,
    backends: &[Arc<Backend>],
    timeout: Duration,
) -> Fresh {
    let asks = backends
        .iter()
        .map(|b| async move { (b, discovery::discover(client, b, timeout).await) });
    let mut found = Vec::new();
    for (b, answer) in futures_util::future::join_all(asks).await {
        match answer {
            Ok(d) => {
                tracing::info!(backend = %b.name, "discovered: {}", d.summary());
                found.push((Arc::clone(b), Arc::new(d)));
            }
            Err(e) => {
                tracing::warn!(backend = %b.name, "cannot discover the backend's figures: {e}")
            }
        }
    }
    found
}

/// Ask every backend of `config` at once, failures kept (`check --probe`, `export --probe`).
pub async fn ask_all(client: &crate::upstream::Client, config: &Config) -> Probed {
    let timeout = timeout(&config.server);
    let asks = config.backends.values().map(|b| async move {
        (
            b.name.clone(),
            discovery::discover(client, b, timeout).await,
        )
    });
    futures_util::future::join_all(asks)
        .await
        .into_iter()
        .collect()
}
