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

mod fair;
mod hold;
mod order;
mod permit;
mod predict;
mod privacy;
pub use permit::SlotPermit;
#[cfg(test)]
pub(crate) use predict::Holding;
pub(crate) use privacy::Isolation;
mod refused;
mod table;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use fair::Fair;
use hold::{keep_until, Returns};
use order::{displaced, pick, Waiter};
use table::{Holder, Kept, Table};

pub(crate) use refused::Refused;

use super::lease::SharedSlots;
use super::ticket::{QueueWatch, Ticket};
use crate::config::{ByClass, Priority, Scheduling};
use crate::lock::Locked;

/// The slots of one backend.
#[derive(Debug)]
pub struct Slots {
    inner: Arc<Inner>,
    slots: u32,
    queue: u32,
    /// The backend's leases in the shared store, when there is one.
    shared: Option<SharedSlots>,
    /// Who held which slot over the last ten minutes.
    pub timeline: crate::fleet::timeline::Timeline,
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
    waiters: Vec<Waiter<oneshot::Sender<SlotPermit>>>,
    seq: u64,
    /// The client last served in each class (the fair turn goes on from it).
    last: ByClass<Option<u64>>,
    /// Each slot: its holder, the conversation it caches, whether it is kept.
    table: Table,
    /// The clients' shares of GPU time.
    fair: Fair,
    /// Grants made (each permit names its own).
    grants: u64,
    /// How the slots are shared (the config in force).
    schedule: Scheduling,
    /// Whether the backend is sent the slot a request takes (each slot its own cache).
    pinned: bool,
    /// Whose caches its requests may meet.
    isolation: Isolation,
    /// How soon each conversation came back for its next turn, last time (a few kept).
    returns: Returns,
}

/// The time the scheduler reads: tokio's clock (the real one outside tests), so a paused test
/// clock ages requests and ends holds too.
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.locked()
    }

    /// Slot `index` goes to a request of `ticket`: its holder set, its client's share charged.
    fn grant(self: &Arc<Inner>, st: &mut State, index: usize, ticket: Ticket) -> SlotPermit {
        let now = now();
        st.grants += 1;
        let grant = st.grants;
        let waiting = st
            .waiters
            .iter()
            .map(|w| st.fair.start(w.ticket.client))
            .fold(f64::INFINITY, f64::min);
        st.fair.granted(ticket.client, ticket.work, waiting);
        let (tx, rx) = match st.schedule.preemptible(ticket.class, ticket.preemptions) {
            true => {
                let (tx, rx) = oneshot::channel();
                (Some(tx), Some(rx))
            }
            false => (None, None),
        };
        let warm = st.isolation.warm(ticket.group, st.table.slots[index].group);
        let holder = Holder {
            grant,
            ticket,
            granted_at: now,
            preempt: tx,
        };
        st.table.hold(index, holder);
        self.busy.fetch_add(1, Ordering::AcqRel);
        SlotPermit {
            inner: Some(Arc::clone(self)),
            index: index as u32,
            grant,
            preempt: rx,
            lease: None,
            warm,
            unplaced: false,
        }
    }

    /// Slot `index`, given by `grant`, came free: kept for its conversation's next turn, or
    /// to the next waiting request, else open.
    fn release(self: &Arc<Inner>, index: usize, grant: u64) {
        let mut st = self.lock();
        let now = now();
        let Some(h) = st.table.free(index, grant) else {
            return;
        };
        self.busy.fetch_sub(1, Ordering::AcqRel);
        if let Some(k) = h.ticket.conversation {
            st.returns.freed(k, now);
        }
        if let Some(until) = keep_until(&st, &h.ticket, now) {
            let kept = Kept {
                conversation: h.ticket.conversation.unwrap_or_default(),
                until,
                class: h.ticket.class,
            };
            st.table.keep(index, Some(kept));
            self.expire_at(index, kept);
            return;
        }
        self.hand_out(&mut st, index, now);
    }

    /// Slot `index` (open) to the next waiting request that takes it, if any. While every
    /// other slot holds a request that may be preempted no more, a request that may not either
    /// takes it only when no other waits: an `interactive` request then always has a slot it
    /// can take within one preemption wait. Batch lines (`idle`) do not count as others here:
    /// they take a slot only when no other class waits, a spent request included.
    fn hand_out(self: &Arc<Inner>, st: &mut State, index: usize, now: Instant) {
        while !st.waiters.is_empty() {
            let held = st.table.slots[index].cached.map(|(k, _)| k);
            let sched = &st.schedule;
            let spent_elsewhere = st.table.spent_but(index, sched);
            let open = |t: &Ticket| {
                t.class != Priority::Idle
                    && !(spent_elsewhere && sched.spent(t.class, t.preemptions))
            };
            let picked = pick(&st.waiters, &st.last, now, &st.fair, sched, held, &open)
                .or_else(|| pick(&st.waiters, &st.last, now, &st.fair, sched, held, &|_| true));
            let Some((i, turn)) = picked else {
                return;
            };
            let w = st.waiters.swap_remove(i);
            self.waiting
                .store(st.waiters.len() as u32, Ordering::Release);
            st.last[turn] = Some(w.ticket.client);
            let permit = self.grant(st, index, w.ticket);
            match w.tx.send(permit) {
                Ok(()) => return,
                // Its request is gone: disarmed, so dropping it here frees nothing; the slot
                // and the share it was charged are undone.
                Err(mut p) => {
                    p.inner = None;
                    st.table.ungrant(index);
                    self.busy.fetch_sub(1, Ordering::AcqRel);
                    st.fair.settle(w.ticket.client, w.ticket.work, 0.0);
                }
            }
        }
    }

    /// Slot `index`, `kept` for a conversation, is handed out when the hold ends unless the
    /// conversation took it (or a better class did).
    fn expire_at(self: &Arc<Inner>, index: usize, kept: Kept) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let inner = Arc::clone(self);
        rt.spawn(async move {
            tokio::time::sleep_until(kept.until.into()).await;
            let mut st = inner.lock();
            let slot = &st.table.slots[index];
            if slot.holder.is_none() && slot.kept == Some(kept) {
                st.table.keep(index, None);
                inner.hand_out(&mut st, index, now());
            }
        });
    }

    /// Holds a request of a better class than their conversation's waits for end at once:
    /// their slots are handed out.
    fn unkeep(self: &Arc<Inner>, st: &mut State, now: Instant) {
        let Some(best) = st.waiters.iter().map(|w| w.ticket.class).min() else {
            return;
        };
        for index in st.table.kept() {
            let slot = &st.table.slots[index];
            if slot.holder.is_none() && slot.kept.is_some_and(|k| best < k.class) {
                st.table.keep(index, None);
                self.hand_out(st, index, now);
            }
        }
    }

    /// A request of `ticket` has waited its preemption wait: when every slot holds a worse
    /// class and none is predicted to free within another such wait, the one with the most
    /// predicted prefill left that sent its client nothing is told to give its slot up.
    /// Whether one was.
    fn preempt_for(&self, ticket: &Ticket) -> bool {
        let mut st = self.lock();
        if !st.schedule.by_work() || ticket.class != Priority::Interactive {
            return false;
        }
        let soon = st.schedule.preempt_after.unwrap_or_default();
        let Some(i) = st.table.victim(ticket.class, now(), soon) else {
            return false;
        };
        let h = st.table.slots[i].holder.as_mut();
        h.and_then(|h| h.preempt.take())
            .is_some_and(|tx| tx.send(()).is_ok())
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
    pub(crate) fn new(slots: u32, queue: u32) -> Slots {
        Slots {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    waiters: Vec::new(),
                    seq: 0,
                    last: ByClass::default(),
                    table: Table::new(slots),
                    fair: Fair::default(),
                    grants: 0,
                    schedule: Scheduling::default(),
                    pinned: false,
                    isolation: Isolation::Open,
                    returns: Returns::default(),
                }),
                busy: AtomicU32::new(0),
                waiting: AtomicU32::new(0),
            }),
            slots,
            queue,
            shared: None,
            timeline: Default::default(),
        }
    }

    /// The same slots, kept across processes in `shared` as well.
    pub(crate) fn with_shared(mut self, shared: SharedSlots) -> Slots {
        self.shared = Some(shared);
        self
    }

    /// Share the slots by `schedule`; `pinned`: the backend is told which slot each request
    /// takes, each slot with a cache of its own.
    pub(crate) fn set_schedule(&self, schedule: Scheduling, pinned: bool) {
        let mut st = self.inner.lock();
        st.schedule = schedule;
        st.pinned = pinned;
    }

    /// Share the slots of `backend` by `schedule`: pinned where its config and runtime let it
    /// (a slot's number means nothing to processes sharing the backend's slots), its cache
    /// groups kept apart as it can ([`Isolation::of`]).
    pub(crate) fn serve(&self, schedule: Scheduling, backend: &crate::config::Backend) {
        let pinned = backend.pin_slots && !self.is_shared();
        self.set_schedule(schedule, pinned);
        self.inner.lock().isolation = Isolation::of(backend, pinned);
    }

    /// Whether it counts in a shared store too.
    pub(crate) fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    pub fn slots(&self) -> u32 {
        self.slots
    }

    pub(crate) fn queue_limit(&self) -> u32 {
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
    pub(crate) fn held_by(&self, key: u64) -> u32 {
        self.inner.lock().table.held_by(key)
    }

    /// Tokens of conversation `key` this backend's cache is known to hold (as this process
    /// last left them).
    pub(crate) fn cached_for(&self, key: u64) -> u64 {
        let st = self.inner.lock();
        let cached = st.table.cached(key).filter(|_| st.isolation.caches());
        cached.unwrap_or(0)
    }

    /// A request of `client`, predicted at `predicted` GPU-seconds, took `measured`; it left
    /// `tokens` of conversation `key` in slot `index` (as its backend reported them).
    pub(crate) fn settle(
        &self,
        client: u64,
        predicted: f64,
        measured: f64,
        left: Option<(usize, u64, u64)>,
    ) {
        let mut st = self.inner.lock();
        st.fair.settle(client, predicted, measured);
        if let Some((index, key, tokens)) = left {
            st.table.cache(index, key, tokens);
        }
    }

    /// A slot for `ticket` now, if one is open to it and nobody waits (a conversation's own
    /// kept slot is its own even then, unless a better class waits).
    fn take(&self, st: &mut State, ticket: Ticket) -> Option<SlotPermit> {
        let now = now();
        if let Some(k) = ticket.conversation {
            st.returns.returned(k, now);
            let better = st.waiters.iter().any(|w| w.ticket.class < ticket.class);
            if let Some(i) = st.table.kept_for(k, now).filter(|_| !better) {
                return Some(self.inner.grant(st, i, ticket));
            }
        }
        if !st.waiters.is_empty() {
            return None;
        }
        let group = st.isolation.prefers(ticket.group);
        let i = st.table.choose(ticket.conversation, group, now)?;
        Some(self.inner.grant(st, i, ticket))
    }

    /// A slot now, without waiting (and without passing anyone waiting). With a shared store
    /// that is up, never: its lease is asked for in [`Self::acquire`].
    pub fn try_acquire(&self) -> Option<SlotPermit> {
        self.try_acquire_for(Ticket::plain(now()))
    }

    /// [`Self::try_acquire`] for a request of `ticket`.
    pub fn try_acquire_for(&self, ticket: Ticket) -> Option<SlotPermit> {
        let lease = match &self.shared {
            Some(shared) => Some(shared.unasked()?),
            None => None,
        };
        let mut st = self.inner.lock();
        let mut permit = self.take(&mut st, ticket)?;
        permit.lease = lease;
        Some(permit)
    }

    /// Take a slot, waiting in the queue up to `timeout`, in the order of `ticket`; with a
    /// shared store, then the backend's shared lease within the same `timeout`.
    pub(crate) async fn acquire(
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

    /// A slot of this process, waiting in its queue up to `timeout`; an `interactive` request
    /// that waits its preemption wait asks for a lower class's slot (again after each such
    /// wait).
    async fn acquire_here(
        &self,
        timeout: Duration,
        ticket: Ticket,
        watch: &dyn QueueWatch,
    ) -> Result<SlotPermit, Refused> {
        let (seq, mut rx, preempt_after) = {
            let mut st = self.inner.lock();
            if let Some(p) = self.take(&mut st, ticket) {
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
            self.inner.unkeep(&mut st, now());
            if ticket.class < Priority::Idle {
                st.table.yield_idle();
            }
            let preempts = st.schedule.by_work() && ticket.class == Priority::Interactive;
            (seq, rx, st.schedule.preempt_after.filter(|_| preempts))
        };
        watch.entered();
        let waiting = Waiting {
            inner: &self.inner,
            seq,
            watch,
            since: Instant::now(),
        };
        let deadline = tokio::time::Instant::now() + timeout;
        let mut preempt_at = preempt_after.map(|d| tokio::time::Instant::now() + d);
        let got = loop {
            let preempt = async {
                match preempt_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                got = &mut rx => break Some(got),
                () = tokio::time::sleep_until(deadline) => break None,
                () = preempt => {
                    self.inner.preempt_for(&ticket);
                    preempt_at = preempt_after.map(|d| tokio::time::Instant::now() + d);
                }
            }
        };
        match got {
            Some(Ok(p)) => Ok(p),
            // Its place was given to a request of a better class or a fairer share.
            Some(Err(_)) => Err(self.full()),
            // Granted (or its place given away) as the wait ran out.
            None if !waiting.leave() => match rx.try_recv() {
                Ok(p) => Ok(p),
                Err(oneshot::error::TryRecvError::Closed) => Err(self.full()),
                Err(_) => Err(Refused::TimedOut(timeout)),
            },
            // The wait ran out: the queue had room, the slots never came free.
            None => Err(Refused::TimedOut(timeout)),
        }
    }

    fn full(&self) -> Refused {
        Refused::Full { slots: self.slots }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod work_tests;
