//! Leases: one of a counted few places (a backend's slots, a client's requests in flight)
//! held in the store, with an expiry renewed while held, so a process that dies frees its
//! places within a lease; given back when dropped.

use std::sync::Arc;

use super::{scripts, Op, Store};

/// A waiter that has not asked for its lease this long is gone (its process died): it
/// loses its place. Waiters ask far more often (see `fleet::lease`).
pub const STALE: std::time::Duration = std::time::Duration::from_secs(1);

/// What the store said to a request for a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// Held (renewed from now on until dropped).
    Taken,
    /// Every place is taken (or, in a queue, others are ahead).
    Full,
    /// The store is unreachable: count on your own.
    Down,
}

/// A counted set of places in the store: its lease key, and the queue of its waiters.
#[derive(Debug, Clone)]
pub struct Places {
    leases: Arc<str>,
    waiters: Arc<str>,
}

impl Places {
    /// The places of `kind` (`slots`, `inflight`) named `name`.
    pub fn new(kind: &str, name: &str) -> Places {
        Places {
            leases: Store::key(kind, name),
            waiters: Store::key(&format!("{kind}-wait"), name),
        }
    }
}

/// A place held; dropping it gives it back. Taken while the store was down it is put in
/// the store when it returns, so the counts there include what is in flight.
#[derive(Debug)]
pub struct Lease {
    store: Arc<Store>,
    key: Arc<str>,
    n: u64,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.store.lock_held().remove(&self.n);
        let id = self.store.lease_id(self.n);
        self.store.send(Op::Release {
            key: Arc::clone(&self.key),
            id,
        });
    }
}

/// One request's turn at a set of places: its lease id, kept while it waits so it keeps
/// its place in the store's queue.
#[derive(Debug)]
pub struct Asking {
    store: Arc<Store>,
    places: Places,
    n: u64,
    /// In the store's queue, at this rank; `None`: taken now or not at all.
    rank: Option<u64>,
    done: bool,
}

impl Store {
    /// A turn at `places`; `rank` (lower first) places it in the store's queue of waiters
    /// of every process, `None` takes a place now or not at all.
    pub fn ask(self: &Arc<Self>, places: &Places, rank: Option<u64>) -> Asking {
        Asking {
            store: Arc::clone(self),
            places: places.clone(),
            n: self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            rank,
            done: false,
        }
    }
}

impl Asking {
    /// Ask the store once for one of `capacity` places.
    pub async fn take(&mut self, capacity: u32) -> Take {
        let store = &self.store;
        let id = store.lease_id(self.n);
        let lease_ms = store.settings.lease.as_millis() as u64;
        let stale_ms = STALE.as_millis() as u64;
        let rank = self.rank.map(|r| r.to_string()).unwrap_or_default();
        let places = &self.places;
        let got = store
            .call(|mut c| async move {
                scripts::TAKE
                    .key(places.leases.as_ref())
                    .key(places.waiters.as_ref())
                    .key(format!("{}:seen", places.waiters))
                    .arg(capacity)
                    .arg(lease_ms)
                    .arg(&id)
                    .arg(rank)
                    .arg(stale_ms)
                    .invoke_async::<i64>(&mut c)
                    .await
            })
            .await;
        match got {
            Some(1) => Take::Taken,
            Some(_) => Take::Full,
            None => Take::Down,
        }
    }

    /// The place, held: after [`Take::Taken`], or to count on one's own after
    /// [`Take::Down`] (it goes into the store when that returns).
    pub fn hold(mut self) -> Lease {
        self.done = true;
        let store = Arc::clone(&self.store);
        let key = Arc::clone(&self.places.leases);
        store.lock_held().insert(self.n, Arc::clone(&key));
        Lease {
            store,
            key,
            n: self.n,
        }
    }
}

impl Drop for Asking {
    /// A waiter that goes without its lease leaves the store's queue.
    fn drop(&mut self) {
        if !self.done && self.rank.is_some() {
            self.store.send(Op::Leave {
                waiters: Arc::clone(&self.places.waiters),
                id: self.store.lease_id(self.n),
            });
        }
    }
}
