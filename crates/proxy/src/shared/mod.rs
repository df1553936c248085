//! The optional store several processes share (Redis or Valkey, `server.shared_state`): slot
//! leases and client limits counted across processes, and whether it is reachable — while it
//! is not, every caller counts on its own at once and the store is tried again in the
//! background.

pub mod buckets;
pub mod lease;
pub mod places;
mod release;
mod scripts;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use redis::aio::ConnectionManager;
use tokio::sync::mpsc;

use crate::config::SharedState;
use crate::lock::Locked;

/// Where the store's state is shown: `switchboard_shared_state_up` and the count of times it
/// was lost.
#[derive(Debug, Clone, Default)]
pub struct Signals {
    pub up: Gauge,
    pub(crate) fallbacks: Counter,
}

/// Work done off the request path, in order, by the store's task (releases have a task of
/// their own: [`release`]).
#[derive(Debug)]
enum Op {
    /// Tokens given back to (or taken from) a client's buckets.
    Settle { key: Arc<str>, args: Vec<i64> },
}

/// The store and this process's place in it.
#[derive(Debug)]
pub struct Store {
    settings: SharedState,
    /// The URL as shown (no password).
    shown: String,
    client: redis::Client,
    conn: ArcSwapOption<ConnectionManager>,
    up: AtomicBool,
    /// Unique to this process: the prefix of its lease ids.
    process: String,
    next: AtomicU64,
    /// The leases held now, id -> key: renewed while held, and put back into a store that
    /// lost them (restarted, or unreachable when they were taken).
    held: Mutex<HashMap<u64, places::Places>>,
    ops: mpsc::UnboundedSender<Op>,
    /// Leases and waiters given back, on their own connection and task.
    releases: Arc<release::Releases>,
    signals: Signals,
}

/// Every key starts with it, so the store may hold other things beside.
const PREFIX: &str = "switchboard";

/// Why the store cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Url(#[from] redis::RedisError),
    #[error("{0}")]
    NoRuntime(#[from] tokio::runtime::TryCurrentError),
}

impl Store {
    /// The store of `settings`, its task started on the current runtime (connecting in the
    /// background: until it answers, callers count on their own). Fails on a URL the client
    /// does not take, or outside a runtime.
    pub fn start(settings: &SharedState, signals: Signals) -> Result<Arc<Store>, StartError> {
        let client = redis::Client::open(settings.url.as_str())?;
        let handle = tokio::runtime::Handle::try_current()?;
        let (tx, rx) = mpsc::unbounded_channel();
        signals.up.set(0);
        let store = Arc::new(Store {
            settings: settings.clone(),
            shown: shown(&settings.url),
            client,
            conn: ArcSwapOption::empty(),
            up: AtomicBool::new(false),
            process: format!("{:016x}", rand::random::<u64>()),
            next: AtomicU64::new(0),
            held: Mutex::default(),
            ops: tx,
            releases: Arc::default(),
            signals,
        });
        handle.spawn(run(Arc::downgrade(&store), rx));
        handle.spawn(release::run(
            Arc::clone(&store.releases),
            store.client.clone(),
            settings.clone(),
        ));
        Ok(store)
    }

    /// The store answers: counts are shared.
    pub fn up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// The URL without any password.
    pub(crate) fn shown(&self) -> &str {
        &self.shown
    }

    /// A key of this store for `kind` and `name`.
    pub fn key(kind: &str, name: &str) -> Arc<str> {
        Arc::from(format!("{PREFIX}:{kind}:{name}"))
    }

    fn lock_held(&self) -> std::sync::MutexGuard<'_, HashMap<u64, places::Places>> {
        self.held.locked()
    }

    fn lease_id(&self, n: u64) -> String {
        format!("{}:{n}", self.process)
    }

    /// The connection while the store is up; `None`: count on your own.
    fn conn(&self) -> Option<ConnectionManager> {
        if !self.up() {
            return None;
        }
        self.conn.load_full().map(|c| ConnectionManager::clone(&c))
    }

    /// Run `call` against the store within its timeout; an error or a timeout marks it down.
    async fn call<T, F>(&self, call: impl FnOnce(ConnectionManager) -> F) -> Option<T>
    where
        F: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let conn = self.conn()?;
        match tokio::time::timeout(self.settings.timeout, call(conn)).await {
            Ok(Ok(v)) => Some(v),
            Ok(Err(e)) => {
                self.down(&e.to_string());
                None
            }
            Err(_) => {
                self.down(&format!(
                    "no answer within {:?} (server.shared_state_timeout_ms)",
                    self.settings.timeout
                ));
                None
            }
        }
    }

    fn down(&self, why: &str) {
        if self.up.swap(false, Ordering::AcqRel) {
            self.signals.up.set(0);
            self.signals.fallbacks.inc();
            tracing::warn!(
                store = %self.shown,
                error = why,
                "shared state unreachable: slots and client limits counted by this process alone until it answers"
            );
        }
    }

    fn came_up(&self) {
        if !self.up.swap(true, Ordering::AcqRel) {
            self.signals.up.set(1);
            tracing::info!(
                store = %self.shown,
                "shared state reachable: slots and client limits counted across processes"
            );
        }
    }

    fn send(&self, op: Op) {
        if self.up() {
            let _ = self.ops.send(op);
        }
    }

    /// Connect when not connected, then renew every lease held (putting back those the store
    /// lost), or ping when none is: the store is up when that answers.
    async fn keep(&self) {
        let conn = match self.conn.load_full() {
            Some(c) => ConnectionManager::clone(&c),
            None => {
                let cfg = redis::aio::ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.settings.timeout))
                    .set_response_timeout(Some(self.settings.timeout))
                    .set_number_of_retries(1);
                match redis::aio::ConnectionManager::new_lazy_with_config(self.client.clone(), cfg)
                {
                    Ok(c) => {
                        self.conn.store(Some(Arc::new(c.clone())));
                        c
                    }
                    Err(e) => return self.down(&e.to_string()),
                }
            }
        };
        let mut by_key: HashMap<String, Vec<String>> = HashMap::new();
        for (n, places) in self.lock_held().iter() {
            by_key
                .entry(places.keys().leases.clone())
                .or_default()
                .push(self.lease_id(*n));
        }
        let lease = self.settings.lease.as_millis() as u64;
        let result = if by_key.is_empty() {
            let mut c = conn;
            let ping = async move { redis::cmd("PING").query_async::<String>(&mut c).await };
            tokio::time::timeout(self.settings.timeout, ping)
                .await
                .map(|r| r.map(|_| ()))
        } else {
            let mut inv = scripts::RENEW.prepare_invoke();
            inv.arg(lease).arg(release::gone_prefix());
            for (key, ids) in &by_key {
                inv.key(key);
                inv.arg(ids.len());
                for id in ids {
                    inv.arg(id);
                }
            }
            let mut c = conn;
            let renew = async move { inv.invoke_async::<i64>(&mut c).await };
            tokio::time::timeout(self.settings.timeout, renew)
                .await
                .map(|r| r.map(|_| ()))
        };
        match result {
            Ok(Ok(())) => self.came_up(),
            Ok(Err(e)) => self.down(&e.to_string()),
            Err(_) => self.down("no answer to the renewal within server.shared_state_timeout_ms"),
        }
    }

    /// Carry out queued work.
    async fn apply(&self, ops: Vec<Op>) {
        for Op::Settle { key, args } in ops {
            self.call(|mut c| async move {
                let mut inv = scripts::BUCKETS.prepare_invoke();
                inv.key(key.as_ref()).arg("settle");
                for a in args {
                    inv.arg(a);
                }
                inv.invoke_async::<Vec<String>>(&mut c).await
            })
            .await;
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.releases.close();
    }
}

/// The store's task: queued work as it comes, and every third of a lease the renewal (or,
/// while the store is down, the attempt to reach it). Ends with the store.
async fn run(store: std::sync::Weak<Store>, mut ops: mpsc::UnboundedReceiver<Op>) {
    let every = match store.upgrade() {
        Some(s) => (s.settings.lease / 3).max(Duration::from_millis(100)),
        None => return,
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            op = ops.recv() => {
                let Some(op) = op else { return };
                let mut batch = vec![op];
                while let Ok(more) = ops.try_recv() {
                    batch.push(more);
                }
                let Some(s) = store.upgrade() else { return };
                s.apply(batch).await;
            }
            _ = tick.tick() => {
                let Some(s) = store.upgrade() else { return };
                s.keep().await;
            }
        }
    }
}

/// A store URL as logs and the status page show it: without a password.
pub(crate) fn shown(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(None);
            u.to_string()
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_is_shown_without_its_password() {
        assert_eq!(
            shown("redis://user:secret@cache:6379/2"),
            "redis://user@cache:6379/2"
        );
        assert_eq!(shown("redis://cache:6379/0"), "redis://cache:6379/0");
    }
}
