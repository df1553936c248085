//! Leases: one of a counted few places (a backend's slots, a client's requests in flight)
//! held in the store, with an expiry renewed while held, so a process that dies frees its
//! places within a lease; given back when dropped (see [`super::release`]).

use std::sync::Arc;

use super::places::Places;
use super::{release, scripts, Store};

/// A waiter that has not asked for its lease this long is gone (its process died): it
/// loses its place. Waiters ask far more often (see `fleet::lease`).
pub(crate) const STALE: std::time::Duration = std::time::Duration::from_secs(1);

/// What the store said to a request for a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// Held (renewed from now on until dropped).
    Taken,
    /// Every place is taken (or, in a queue, others have the turn).
    Full,
    /// The store is unreachable: count on your own.
    Down,
}

/// A place held; dropping it gives it back. Taken while the store was down it is put in
/// the store when it returns, so the counts there include what is in flight.
#[derive(Debug)]
pub struct Lease {
    store: Arc<Store>,
    places: Places,
    n: u64,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.store.lock_held().remove(&self.n);
        let id = self.store.lease_id(self.n);
        self.store.releases.push(self.places.clone(), id);
    }
}

/// Who asks in a queue: its rank (lower first: class, then arrival), its class and client
/// (the fair turn within the class), and whether the place count is shared by processes.
#[derive(Debug, Clone, Copy)]
pub struct Turn {
    pub rank: u64,
    pub(crate) client: u64,
    /// The count asked for is this process's figure for a resource every process shares
    /// (a backend's slots): the store uses the least figure of the processes asking.
    pub(crate) agree: bool,
}

/// One request's turn at a set of places: its lease id, kept while it waits so it keeps
/// its place in the store's queue.
#[derive(Debug)]
pub struct Asking {
    store: Arc<Store>,
    places: Places,
    n: u64,
    /// In the store's queue; `None`: taken now or not at all.
    turn: Option<Turn>,
    /// A call was sent whose answer is unknown (it may still run): the id is released if
    /// this goes without its lease.
    unsure: bool,
    /// The count the store used at the last answer.
    agreed: Option<u32>,
    done: bool,
}

impl Store {
    /// A turn at `places`; `turn` places it in the store's queue of waiters of every
    /// process, `None` takes a place now or not at all.
    pub fn ask(self: &Arc<Self>, places: &Places, turn: Option<Turn>) -> Asking {
        Asking {
            store: Arc::clone(self),
            places: places.clone(),
            n: self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            turn,
            unsure: false,
            agreed: None,
            done: false,
        }
    }
}

impl Asking {
    /// Ask the store once for one of `capacity` places.
    pub async fn take(&mut self, capacity: u32) -> Take {
        if !self.store.up() {
            return Take::Down;
        }
        self.unsure = true;
        let got = self.invoke(capacity).await;
        match got {
            Some((took, cap)) => {
                self.agreed = u32::try_from(cap).ok();
                if took == 1 {
                    Take::Taken
                } else {
                    self.unsure = false;
                    Take::Full
                }
            }
            None => Take::Down,
        }
    }

    /// The count of places the store used at its last answer (the least of the processes'
    /// figures, with [`Turn::agree`]).
    pub(crate) fn agreed(&self) -> Option<u32> {
        self.agreed
    }

    async fn invoke(&self, capacity: u32) -> Option<(i64, i64)> {
        let store = &self.store;
        let id = store.lease_id(self.n);
        let lease_ms = store.settings.lease.as_millis() as u64;
        let stale_ms = STALE.as_millis() as u64;
        let (rank, client, process) = match self.turn {
            Some(t) => (
                t.rank.to_string(),
                t.client.to_string(),
                if t.agree { store.process.as_str() } else { "" },
            ),
            None => (String::new(), String::new(), ""),
        };
        let k = self.places.keys();
        let gone = release::gone_key(&id);
        store
            .call(|mut c| async move {
                scripts::TAKE
                    .key(&k.leases)
                    .key(&k.waiters)
                    .key(&k.seen)
                    .key(&k.who)
                    .key(&k.served)
                    .key(&k.caps)
                    .key(&k.caps_seen)
                    .key(gone)
                    .arg(capacity)
                    .arg(lease_ms)
                    .arg(&id)
                    .arg(rank)
                    .arg(stale_ms)
                    .arg(client)
                    .arg(process)
                    .invoke_async::<(i64, i64)>(&mut c)
                    .await
            })
            .await
    }

    /// The place, held: after [`Take::Taken`], or to count on one's own after
    /// [`Take::Down`] (it goes into the store when that returns).
    pub fn hold(mut self) -> Lease {
        self.done = true;
        let store = Arc::clone(&self.store);
        let places = self.places.clone();
        store.lock_held().insert(self.n, places.clone());
        Lease {
            store,
            places,
            n: self.n,
        }
    }
}

impl Drop for Asking {
    /// A waiter that goes without its lease leaves the store's queue; one whose last ask
    /// may yet run gives back what that ask may take.
    fn drop(&mut self) {
        if !self.done && (self.turn.is_some() || self.unsure) {
            let id = self.store.lease_id(self.n);
            self.store.releases.push(self.places.clone(), id);
        }
    }
}
