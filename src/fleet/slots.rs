//! Per-backend concurrency and its queue, a scheduler: as many requests as the backend has
//! slots; the rest wait in a bounded queue and a freed slot goes to the waiting request first
//! by priority class, then in turn among the clients with requests waiting in that class
//! (round robin, so one client's many requests do not push another's few behind them). A
//! request waiting past its class's `max_wait` is lifted a class for each such wait, up to the
//! best class waiting, into that class's turn (aging: a lower class is not starved, and no
//! backlog goes ahead of everyone). A full queue makes room for a request of a better class,
//! or of a client holding less than its fair part, by refusing the newest request of the
//! worst class, or of the client holding most ([`order::displaced`]). With a shared
//! store, a request holding its slot here takes the backend's shared lease too before it is
//! sent ([`super::lease`]), so every process together keeps to the backend's slots.

mod order;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use order::{displaced, pick, Waiter};

use super::lease::SharedSlots;
use super::ticket::{QueueWatch, Ticket};
use crate::error::ProxyError;
use crate::shared::lease::Lease;

/// The slots of one backend.
#[derive(Debug)]
pub struct Slots {
    inner: Arc<Inner>,
    slots: u32,
    queue: u32,
    /// The backend's leases in the shared store, when there is one.
    shared: Option<SharedSlots>,
}

#[derive(Debug)]
struct Inner {
    state: Mutex<State>,
    /// Mirrors of the state for lock-free reads (balancing, gauges).
    busy: AtomicU32,
    waiting: AtomicU32,
}

#[derive(Debug)]
struct State {
    free: u32,
    waiters: Vec<Waiter<oneshot::Sender<SlotPermit>>>,
    seq: u64,
    /// The client last served in each class (the fair turn goes on from it).
    last: [Option<u64>; 3],
    /// The conversation keys of the requests holding a slot (those that have one).
    held: Vec<u64>,
}

impl State {
    /// A request of conversation `key` gave its slot up.
    fn unhold(&mut self, key: Option<u64>) {
        if let Some(i) = key.and_then(|k| self.held.iter().position(|h| *h == k)) {
            self.held.swap_remove(i);
        }
    }
}

/// Held while a request occupies a backend slot; dropping it frees the slot (to the next
/// waiting request, if any).
#[derive(Debug)]
pub struct SlotPermit {
    inner: Option<Arc<Inner>>,
    /// The conversation it holds the slot for, if any.
    conversation: Option<u64>,
    /// The backend's shared lease, given back with the slot.
    lease: Option<Lease>,
}

impl Drop for SlotPermit {
    fn drop(&mut self) {
        // The shared lease first, so that its release is on its way before the slot goes
        // to a request that will ask for it.
        drop(self.lease.take());
        if let Some(inner) = self.inner.take() {
            inner.release(self.conversation);
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot of conversation `key` came free: to the next waiting request, else back to the
    /// free ones.
    fn release(self: &Arc<Inner>, key: Option<u64>) {
        let mut st = self.lock();
        st.unhold(key);
        // Tokio's clock (the real one outside tests): a paused test clock ages requests too.
        let now = tokio::time::Instant::now().into_std();
        loop {
            let Some((i, turn)) = pick(&st.waiters, &st.last, now) else {
                st.free += 1;
                self.busy.fetch_sub(1, Ordering::AcqRel);
                return;
            };
            let w = st.waiters.swap_remove(i);
            self.waiting
                .store(st.waiters.len() as u32, Ordering::Release);
            st.last[turn as usize] = Some(w.ticket.client);
            let conversation = w.ticket.conversation;
            st.held.extend(conversation);
            let permit = SlotPermit {
                inner: Some(Arc::clone(self)),
                conversation,
                lease: None,
            };
            match w.tx.send(permit) {
                Ok(()) => return,
                // Its request is gone: disarmed, so dropping it here frees nothing.
                Err(mut p) => {
                    p.inner = None;
                    st.unhold(conversation);
                }
            }
        }
    }
}

/// Undoes the queue bookkeeping however the wait ends (granted, timed out, or client gone).
struct Waiting<'a> {
    inner: &'a Arc<Inner>,
    seq: u64,
    watch: &'a dyn QueueWatch,
    since: Instant,
}

impl Waiting<'_> {
    /// Leave the queue; `false` when the request was no longer in it (it was granted).
    fn leave(&self) -> bool {
        let mut st = self.inner.lock();
        let at = st.waiters.iter().position(|w| w.seq == self.seq);
        if let Some(i) = at {
            st.waiters.swap_remove(i);
            self.inner
                .waiting
                .store(st.waiters.len() as u32, Ordering::Release);
        }
        at.is_some()
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.leave();
        self.watch.left(self.since.elapsed());
    }
}

impl Slots {
    pub fn new(slots: u32, queue: u32) -> Slots {
        Slots {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    free: slots,
                    waiters: Vec::new(),
                    seq: 0,
                    last: [None; 3],
                    held: Vec::new(),
                }),
                busy: AtomicU32::new(0),
                waiting: AtomicU32::new(0),
            }),
            slots,
            queue,
            shared: None,
        }
    }

    /// The same slots, kept across processes in `shared` as well.
    pub fn with_shared(mut self, shared: SharedSlots) -> Slots {
        self.shared = Some(shared);
        self
    }

    /// Whether it counts in a shared store too.
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    pub fn slots(&self) -> u32 {
        self.slots
    }

    pub fn queue_limit(&self) -> u32 {
        self.queue
    }

    /// Slots taken now.
    pub fn busy(&self) -> u32 {
        self.inner.busy.load(Ordering::Acquire)
    }

    /// Slots free right now.
    pub fn free(&self) -> u32 {
        self.slots.saturating_sub(self.busy())
    }

    /// Requests waiting now.
    pub fn waiting(&self) -> u32 {
        self.inner.waiting.load(Ordering::Acquire)
    }

    /// Requests holding a slot or waiting for one.
    pub fn load(&self) -> u32 {
        self.busy() + self.waiting()
    }

    /// Requests of conversation `key` holding a slot here now (this process's).
    pub fn held_by(&self, key: u64) -> u32 {
        let st = self.inner.lock();
        st.held.iter().filter(|h| **h == key).count() as u32
    }

    fn take(&self, st: &mut State, conversation: Option<u64>) -> Option<SlotPermit> {
        if st.free == 0 || !st.waiters.is_empty() {
            return None;
        }
        st.free -= 1;
        st.held.extend(conversation);
        self.inner.busy.fetch_add(1, Ordering::AcqRel);
        Some(SlotPermit {
            inner: Some(Arc::clone(&self.inner)),
            conversation,
            lease: None,
        })
    }

    /// A slot now, without waiting (and without passing anyone waiting). With a shared store
    /// that is up, never: its lease is asked for in [`Self::acquire`].
    pub fn try_acquire(&self) -> Option<SlotPermit> {
        self.try_acquire_for(None)
    }

    /// [`Self::try_acquire`] for a request of `conversation`.
    pub fn try_acquire_for(&self, conversation: Option<u64>) -> Option<SlotPermit> {
        let lease = match &self.shared {
            Some(shared) => Some(shared.unasked()?),
            None => None,
        };
        let mut st = self.inner.lock();
        let mut permit = self.take(&mut st, conversation)?;
        permit.lease = lease;
        Some(permit)
    }

    /// Take a slot, waiting in the queue up to `timeout`, in the order of `ticket`; with a
    /// shared store, then the backend's shared lease within the same `timeout`.
    pub async fn acquire(
        &self,
        timeout: Duration,
        ticket: Ticket,
        watch: &dyn QueueWatch,
    ) -> Result<SlotPermit, Refused> {
        let start = Instant::now();
        let mut permit = self.acquire_here(timeout, ticket, watch).await?;
        if let Some(shared) = &self.shared {
            let deadline = start + timeout;
            match shared.take(self.slots, &ticket, deadline, watch).await {
                Ok(lease) => permit.lease = Some(lease),
                Err(()) => return Err(Refused::TimedOut(timeout)),
            }
        }
        Ok(permit)
    }

    /// A slot of this process, waiting in its queue up to `timeout`.
    async fn acquire_here(
        &self,
        timeout: Duration,
        ticket: Ticket,
        watch: &dyn QueueWatch,
    ) -> Result<SlotPermit, Refused> {
        let (seq, mut rx) = {
            let mut st = self.inner.lock();
            if let Some(p) = self.take(&mut st, ticket.conversation) {
                return Ok(p);
            }
            if st.waiters.len() >= self.queue as usize {
                let Some(i) = displaced(&st.waiters, self.queue, &ticket) else {
                    return Err(self.full());
                };
                // Its request finds its channel closed: the 429 of a full queue.
                drop(st.waiters.swap_remove(i));
            }
            // Only a request that waits gets the channel its slot is handed over on.
            let (tx, rx) = oneshot::channel();
            st.seq += 1;
            let seq = st.seq;
            st.waiters.push(Waiter { seq, ticket, tx });
            self.inner
                .waiting
                .store(st.waiters.len() as u32, Ordering::Release);
            (seq, rx)
        };
        watch.entered();
        let waiting = Waiting {
            inner: &self.inner,
            seq,
            watch,
            since: Instant::now(),
        };
        match tokio::time::timeout(timeout, &mut rx).await {
            Ok(Ok(p)) => Ok(p),
            // Its place was given to a request of a better class or a fairer share.
            Ok(Err(_)) => Err(self.full()),
            // Granted (or its place given away) as the wait ran out.
            _ if !waiting.leave() => match rx.try_recv() {
                Ok(p) => Ok(p),
                Err(oneshot::error::TryRecvError::Closed) => Err(self.full()),
                Err(_) => Err(Refused::TimedOut(timeout)),
            },
            // The wait ran out: the queue had room, the slots never came free.
            _ => Err(Refused::TimedOut(timeout)),
        }
    }

    fn full(&self) -> Refused {
        Refused::Full { slots: self.slots }
    }
}

/// Why a request got no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The queue was full, or the request's place in it went to a request of a better class
    /// or a fairer share: the 429 of a full queue.
    Full { slots: u32 },
    /// The wait ran out with room in the queue: no slot came free.
    TimedOut(Duration),
}

impl Refused {
    /// What the client of `alias` is told, when no other replica or fallback takes it.
    pub fn error(self, alias: &str) -> ProxyError {
        match self {
            Refused::Full { slots } => ProxyError::Overloaded {
                alias: alias.to_string(),
                slots,
                retry_after: 1,
            },
            Refused::TimedOut(waited) => ProxyError::QueueTimeout {
                alias: alias.to_string(),
                waited,
                retry_after: 1,
            },
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
