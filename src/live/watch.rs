//! Reload when the config file changes: its folder is watched (so a file written anew and
//! renamed over the old one, as editors save, is seen), changes are debounced, and a file whose
//! bytes did not change is not reloaded.

use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use super::reload::reload;
use super::AppState;

/// A watch on the config file, set up: [`Watching::run`] reloads on each change.
pub struct Watching {
    state: AppState,
    path: PathBuf,
    rx: mpsc::Receiver<()>,
    /// The file's bytes as last loaded.
    seen: Option<Vec<u8>>,
    /// Kept alive for as long as the watch runs.
    _watcher: notify::RecommendedWatcher,
}

/// Watch the config file of `state` and reload it on change, for as long as the process
/// lives (spawned by `serve`). Returns at once when there is no file or it cannot be watched.
pub async fn run(state: AppState) {
    if let Some(w) = start(&state) {
        w.run().await;
    }
}

/// Set up the watch of `state`'s config file (changes from this moment on are seen).
pub fn start(state: &AppState) -> Option<Watching> {
    let path = state.config_path.as_deref().map(Path::to_path_buf)?;
    let name = path.file_name()?.to_os_string();
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let (tx, rx) = mpsc::channel::<()>(16);
    let watched = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // The file itself, or the `..data` link through which a Kubernetes ConfigMap volume
        // swaps in all its files at once (the file is a link into it).
        let ours = event.is_ok_and(|e| {
            !e.kind.is_access()
                && e.paths.iter().any(|p| {
                    p.file_name() == Some(&name)
                        || p.file_name()
                            .is_some_and(|f| f.as_encoded_bytes().starts_with(b"..data"))
                })
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
            return None;
        }
    };
    if let Err(e) = watcher.watch(&dir, RecursiveMode::NonRecursive) {
        tracing::warn!(error = %e, dir = %dir.display(), "cannot watch the config folder; reload on SIGHUP only");
        return None;
    }
    tracing::info!(path = %path.display(), "watching the config file for changes");
    Some(Watching {
        state: state.clone(),
        seen: std::fs::read(&path).ok(),
        path,
        rx,
        _watcher: watcher,
    })
}

impl Watching {
    /// Reload on each change, debounced, while the process lives.
    pub async fn run(mut self) {
        while self.rx.recv().await.is_some() {
            let quiet = self.state.live.load().config.server.reload_debounce;
            settle(&mut self.rx, quiet).await;
            let now = std::fs::read(&self.path).ok();
            if now.is_none() || now == self.seen {
                // Gone for now (a rename under way) or the same bytes: nothing to reload.
                continue;
            }
            self.seen = now;
            let _ = reload(&self.state).await;
        }
    }
}

/// Wait until no change came for `quiet`.
async fn settle(rx: &mut mpsc::Receiver<()>, quiet: Duration) {
    while let Ok(Some(())) = tokio::time::timeout(quiet, rx.recv()).await {}
}
