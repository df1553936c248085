//! Reload when the config file changes: its folder is watched (so a file written anew and
//! renamed over the old one, as editors save, is seen), changes are debounced, and a file whose
//! bytes did not change is not reloaded.

use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use super::reload::reload;
use super::AppState;

/// Watch the config file of `state` and reload it on change, for as long as the process
/// lives (spawned by `serve`). Returns at once when there is no file or it cannot be watched.
pub async fn run(state: AppState) {
    let Some(path) = state.config_path.as_deref().map(Path::to_path_buf) else {
        return;
    };
    let Some(name) = path.file_name().map(|n| n.to_os_string()) else {
        return;
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let (tx, mut rx) = mpsc::channel::<()>(16);
    let watched = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let ours = event.is_ok_and(|e| {
            !e.kind.is_access() && e.paths.iter().any(|p| p.file_name() == Some(&name))
        });
        if ours {
            // A full channel already holds a wake-up: nothing is lost.
            let _ = tx.try_send(());
        }
    });
    let mut watcher = match watched {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch the config file; reload on SIGHUP only");
            return;
        }
    };
    if let Err(e) = watcher.watch(&dir, RecursiveMode::NonRecursive) {
        tracing::warn!(error = %e, dir = %dir.display(), "cannot watch the config folder; reload on SIGHUP only");
        return;
    }
    tracing::info!(path = %path.display(), "watching the config file for changes");
    let mut seen = std::fs::read(&path).ok();
    while rx.recv().await.is_some() {
        let quiet = state.live.load().config.server.reload_debounce;
        settle(&mut rx, quiet).await;
        let now = std::fs::read(&path).ok();
        if now.is_none() || now == seen {
            // Gone for now (the rename is under way) or the same bytes: nothing to reload.
            continue;
        }
        seen = now;
        let _ = reload(&state);
    }
    drop(watcher);
}

/// Wait until no change came for `quiet`.
async fn settle(rx: &mut mpsc::Receiver<()>, quiet: Duration) {
    while let Ok(Some(())) = tokio::time::timeout(quiet, rx.recv()).await {}
}
