//! A counted set of places in the store (a backend's slots, a client's requests in flight):
//! the names of its keys.

use std::sync::Arc;

use super::Store;

/// The keys of one counted set of places.
#[derive(Debug)]
pub(super) struct Keys {
    /// The leases held: id -> expiry.
    pub(super) leases: String,
    /// The queue of waiters: id -> rank (class, then arrival).
    pub(super) waiters: String,
    /// Each waiter's last ask: id -> time.
    pub(super) seen: String,
    /// Each waiter's client: id -> client.
    pub(super) who: String,
    /// The fair turn: each client's tag per class, and each class's last tag served.
    pub(super) served: String,
    /// The place count each process is configured with: process -> count.
    pub(super) caps: String,
    /// When each process last asked: process -> time.
    pub(super) caps_seen: String,
}

/// A counted set of places in the store: its lease key, and the queue of its waiters.
#[derive(Debug, Clone)]
pub struct Places(Arc<Keys>);

impl Places {
    /// The places of `kind` (`slots`, `inflight`) named `name`.
    pub fn new(kind: &str, name: &str) -> Places {
        let leases = Store::key(kind, name).to_string();
        let waiters = Store::key(&format!("{kind}-wait"), name).to_string();
        Places(Arc::new(Keys {
            seen: format!("{waiters}:seen"),
            who: format!("{waiters}:who"),
            served: format!("{waiters}:served"),
            caps: format!("{leases}:caps"),
            caps_seen: format!("{leases}:caps-seen"),
            leases,
            waiters,
        }))
    }

    /// Its keys.
    pub(super) fn keys(&self) -> &Keys {
        &self.0
    }
}
