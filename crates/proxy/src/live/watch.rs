//! Reload when the config file changes: its folder is watched (so a file written anew and
//! renamed over the old one, as editors save, is seen), changes are debounced (but a file that
//! keeps changing is reloaded at least every `reload_max_delay_ms`), and a file whose bytes did
//! not change is not reloaded.

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
            let server = &self.state.live.load().config.server;
            let (quiet, most) = (server.reload_debounce, server.reload_max_delay);
            settle(&mut self.rx, quiet, most).await;
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

/// Wait until no change came for `quiet`, or `most` after the first change, whichever is
/// sooner: changes that never pause still get a reload every `most`.
async fn settle(rx: &mut mpsc::Receiver<()>, quiet: Duration, most: Duration) {
    let end = tokio::time::Instant::now() + most;
    loop {
        let due = end.min(tokio::time::Instant::now() + quiet);
        match tokio::time::timeout_at(due, rx.recv()).await {
            Ok(Some(())) if tokio::time::Instant::now() < end => {}
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn changes_that_pause_are_one_reload_after_the_pause() {
        let (tx, mut rx) = mpsc::channel(16);
        tokio::spawn(async move {
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_millis(50)).await;
                let _ = tx.send(()).await;
            }
            // The watcher lives on.
            std::future::pending::<()>().await;
        });
        let started = tokio::time::Instant::now();
        settle(&mut rx, Duration::from_millis(200), Duration::from_secs(2)).await;
        // The last change at 250 ms, then 200 ms of quiet.
        assert_eq!(started.elapsed(), Duration::from_millis(450));
    }

    #[tokio::test(start_paused = true)]
    async fn changes_that_never_pause_are_reloaded_at_the_most_delay() {
        let (tx, mut rx) = mpsc::channel(16);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(20)).await;
                if tx.send(()).await.is_err() {
                    return;
                }
            }
        });
        let started = tokio::time::Instant::now();
        settle(&mut rx, Duration::from_millis(200), Duration::from_secs(2)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(2));
    }
}
