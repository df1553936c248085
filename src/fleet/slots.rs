//! Per-backend concurrency and its queue, a scheduler: as many requests as the backend has
//! slots; the rest wait in a bounded queue and a freed slot goes to the waiting request first
//! by priority class, then in turn among the clients with requests waiting in that class
//! (round robin, so one client's many requests do not push another's few behind them), and
//! ahead of both to a request waiting past its class's `max_wait` (aging). With a shared
//! store, a request holding its slot here takes the backend's shared lease too before it is
//! sent ([`super::lease`]), so every process together keeps to the backend's slots.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::lease::SharedSlots;
use crate::config::Priority;
use crate::error::ProxyError;
use crate::shared::lease::Lease;

/// Told of a request's time in the queue (the per-alias queue metrics).
pub trait QueueWatch: Sync {
    /// A request starts waiting.
    fn entered(&self);
    /// It stopped waiting, after `waited`, whether it got a slot or not.
    fn left(&self, waited: Duration);
}

/// Who waits and since when: what the scheduler orders by.
#[derive(Debug, Clone, Copy)]
pub struct Ticket {
    pub class: Priority,
    /// The client (its id, 0 for the anonymous one): the unit of the fair turn.
    pub client: u64,
    /// When the request arrived: kept when it moves to another replica or a fallback, so it
    /// keeps its place.
    pub since: Instant,
    /// Its class's wait after which it goes ahead of newer requests.
    pub max_wait: Duration,
}

impl Ticket {
    /// A request of the plain path: normal class, anonymous, arriving now.
    pub fn plain(since: Instant) -> Ticket {
        Ticket {
            class: Priority::Normal,
            client: 0,
            since,
            max_wait: Duration::MAX,
        }
    }

    fn due(&self) -> Instant {
        self.since
            .checked_add(self.max_wait)
            .unwrap_or(self.since + Duration::from_secs(1 << 32))
    }
}

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
    waiters: Vec<Waiter>,
    seq: u64,
    /// The client last served in each class (the fair turn goes on from it).
    last: [Option<u64>; 3],
}

#[derive(Debug)]
struct Waiter {
    seq: u64,
    ticket: Ticket,
    tx: oneshot::Sender<SlotPermit>,
}

/// Held while a request occupies a backend slot; dropping it frees the slot (to the next
/// waiting request, if any).
#[derive(Debug)]
pub struct SlotPermit {
    inner: Option<Arc<Inner>>,
    /// The backend's shared lease, given back with the slot.
    lease: Option<Lease>,
}

impl Drop for SlotPermit {
    fn drop(&mut self) {
        // The shared lease first, so that its release is on its way before the slot goes
        // to a request that will ask for it.
        drop(self.lease.take());
        if let Some(inner) = self.inner.take() {
            inner.release();
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot came free: to the next waiting request, else back to the free ones.
    fn release(self: &Arc<Inner>) {
        let mut st = self.lock();
        let now = Instant::now();
        loop {
            let Some(i) = pick(&st.waiters, &st.last, now) else {
                st.free += 1;
                self.busy.fetch_sub(1, Ordering::AcqRel);
                return;
            };
            let w = st.waiters.swap_remove(i);
            self.waiting
                .store(st.waiters.len() as u32, Ordering::Release);
            st.last[w.ticket.class as usize] = Some(w.ticket.client);
            let permit = SlotPermit {
                inner: Some(Arc::clone(self)),
                lease: None,
            };
            match w.tx.send(permit) {
                Ok(()) => return,
                // Its request is gone: disarmed, so dropping it here frees nothing.
                Err(mut p) => p.inner = None,
            }
        }
    }
}

/// The waiting request that gets the next slot: the one most overdue past its class's
/// `max_wait`, else the best class's next client in turn after `last`, its oldest request.
fn pick(waiters: &[Waiter], last: &[Option<u64>; 3], now: Instant) -> Option<usize> {
    let overdue = waiters
        .iter()
        .enumerate()
        .filter(|(_, w)| w.ticket.due() <= now)
        .min_by_key(|(_, w)| (w.ticket.due(), w.seq));
    if let Some((i, _)) = overdue {
        return Some(i);
    }
    let class = waiters.iter().map(|w| w.ticket.class).min()?;
    let in_class = || waiters.iter().filter(|w| w.ticket.class == class);
    let after = last[class as usize];
    let next_client = in_class()
        .map(|w| w.ticket.client)
        .filter(|c| after.is_none_or(|a| *c > a))
        .min()
        .or_else(|| in_class().map(|w| w.ticket.client).min())?;
    waiters
        .iter()
        .enumerate()
        .filter(|(_, w)| w.ticket.class == class && w.ticket.client == next_client)
        .min_by_key(|(_, w)| (w.ticket.since, w.seq))
        .map(|(i, _)| i)
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

    fn take(&self, st: &mut State) -> Option<SlotPermit> {
        if st.free == 0 || !st.waiters.is_empty() {
            return None;
        }
        st.free -= 1;
        self.inner.busy.fetch_add(1, Ordering::AcqRel);
        Some(SlotPermit {
            inner: Some(Arc::clone(&self.inner)),
            lease: None,
        })
    }

    /// A slot now, without waiting (and without passing anyone waiting). With a shared store
    /// that is up, never: its lease is asked for in [`Self::acquire`].
    pub fn try_acquire(&self) -> Option<SlotPermit> {
        let lease = match &self.shared {
            Some(shared) => Some(shared.unasked()?),
            None => None,
        };
        let mut st = self.inner.lock();
        let mut permit = self.take(&mut st)?;
        permit.lease = lease;
        Some(permit)
    }

    /// Take a slot, waiting in the queue up to `timeout`, in the order of `ticket`; with a
    /// shared store, then the backend's shared lease within the same `timeout`.
    pub async fn acquire(
        &self,
        alias: &str,
        timeout: Duration,
        ticket: Ticket,
        watch: &dyn QueueWatch,
    ) -> Result<SlotPermit, ProxyError> {
        let start = Instant::now();
        let mut permit = self.acquire_here(alias, timeout, ticket, watch).await?;
        if let Some(shared) = &self.shared {
            let deadline = start + timeout;
            match shared.take(self.slots, &ticket, deadline, watch).await {
                Ok(lease) => permit.lease = Some(lease),
                Err(()) => return Err(self.timed_out(alias, timeout)),
            }
        }
        Ok(permit)
    }

    /// A slot of this process, waiting in its queue up to `timeout`.
    async fn acquire_here(
        &self,
        alias: &str,
        timeout: Duration,
        ticket: Ticket,
        watch: &dyn QueueWatch,
    ) -> Result<SlotPermit, ProxyError> {
        let (seq, mut rx) = {
            let mut st = self.inner.lock();
            if let Some(p) = self.take(&mut st) {
                return Ok(p);
            }
            if st.waiters.len() >= self.queue as usize {
                return Err(ProxyError::Overloaded {
                    alias: alias.to_string(),
                    slots: self.slots,
                    retry_after: 1,
                });
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
            // Granted as the wait ran out: the slot is taken all the same.
            _ if !waiting.leave() => match rx.try_recv() {
                Ok(p) => Ok(p),
                Err(_) => Err(self.timed_out(alias, timeout)),
            },
            // The wait ran out: the queue had room, the slots never came free.
            _ => Err(self.timed_out(alias, timeout)),
        }
    }

    fn timed_out(&self, alias: &str, waited: Duration) -> ProxyError {
        ProxyError::QueueTimeout {
            alias: alias.to_string(),
            waited,
            retry_after: 1,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::atomic::AtomicI64;

    use super::*;

    /// Counts the requests waiting, as the queue gauge does.
    #[derive(Default)]
    struct Queued(AtomicI64);

    impl QueueWatch for Queued {
        fn entered(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        fn left(&self, _waited: Duration) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn ticket(class: Priority, client: u64, since: Instant) -> Ticket {
        Ticket {
            class,
            client,
            since,
            max_wait: Duration::from_secs(60),
        }
    }

    #[tokio::test]
    async fn queues_then_rejects_when_full() {
        let m = Queued::default();
        let slots = Slots::new(1, 1);
        let t = Ticket::plain(Instant::now());
        let first = slots
            .acquire("a", Duration::from_secs(5), t, &m)
            .await
            .unwrap();
        assert_eq!(slots.busy(), 1);
        let waiter = slots.acquire("a", Duration::from_secs(5), t, &m);
        tokio::pin!(waiter);
        // Poll once so the waiter enters the queue.
        assert!(futures_util::poll!(waiter.as_mut()).is_pending());
        assert_eq!(m.0.load(Ordering::SeqCst), 1);
        let third = slots.acquire("a", Duration::from_secs(5), t, &m).await;
        assert!(matches!(third, Err(ProxyError::Overloaded { .. })));
        drop(first);
        let second = waiter.await.unwrap();
        assert_eq!(m.0.load(Ordering::SeqCst), 0);
        drop(second);
        assert_eq!(slots.busy(), 0);
    }

    /// A wait that runs out with room in the queue is a 503 saying so, not the 429 of a
    /// full queue.
    #[tokio::test]
    async fn queue_wait_running_out_is_not_a_full_queue() {
        let m = Queued::default();
        let slots = Slots::new(1, 4);
        let _held = slots.try_acquire().unwrap();
        let t = Ticket::plain(Instant::now());
        let waited = slots.acquire("a", Duration::from_millis(20), t, &m).await;
        let e = waited.unwrap_err();
        assert!(matches!(e, ProxyError::QueueTimeout { .. }), "{e:?}");
        assert_eq!(e.parts().0, axum::http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(m.0.load(Ordering::SeqCst), 0);
        assert_eq!(slots.load(), 1);
    }

    /// Queue `tickets` behind a held slot, then free slots one at a time: the order granted.
    async fn order(tickets: &[Ticket]) -> Vec<usize> {
        let m = Queued::default();
        let slots = Slots::new(1, 64);
        let held = slots.try_acquire().unwrap();
        let mut waiters: Vec<_> = tickets
            .iter()
            .map(|t| Box::pin(slots.acquire("a", Duration::from_secs(600), *t, &m)))
            .collect();
        for w in &mut waiters {
            assert!(futures_util::poll!(w.as_mut()).is_pending());
        }
        drop(held);
        let mut got = Vec::new();
        let mut pending: Vec<(usize, _)> = waiters.into_iter().enumerate().collect();
        while !pending.is_empty() {
            let mut next = None;
            for (k, (i, w)) in pending.iter_mut().enumerate() {
                if let std::task::Poll::Ready(p) = futures_util::poll!(w.as_mut()) {
                    next = Some((k, *i, p.unwrap()));
                    break;
                }
            }
            let (k, i, permit) = next.unwrap();
            got.push(i);
            drop(pending.remove(k));
            drop(permit);
        }
        got
    }

    #[tokio::test]
    async fn interactive_goes_before_batch_queued_earlier() {
        let t0 = Instant::now();
        let mut ts: Vec<Ticket> = (0..8).map(|_| ticket(Priority::Batch, 1, t0)).collect();
        ts.push(ticket(Priority::Interactive, 2, t0));
        assert_eq!(order(&ts).await[0], 8);
    }

    #[tokio::test]
    async fn clients_of_one_class_take_turns() {
        let t0 = Instant::now();
        // Client 1 queues ten, then client 2 one: client 2's goes second, not eleventh.
        let mut ts: Vec<Ticket> = (0..10).map(|_| ticket(Priority::Batch, 1, t0)).collect();
        ts.push(ticket(Priority::Batch, 2, t0));
        let got = order(&ts).await;
        assert_eq!(got.iter().position(|&i| i == 10), Some(1), "{got:?}");
        // Each client's own requests in their order.
        let ones: Vec<usize> = got.iter().copied().filter(|&i| i < 10).collect();
        assert_eq!(ones, (0..10).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_request_past_its_max_wait_goes_ahead_of_newer_ones() {
        let now = Instant::now();
        let old = Ticket {
            max_wait: Duration::from_millis(1),
            ..ticket(Priority::Batch, 1, now - Duration::from_secs(1))
        };
        let ts = [
            ticket(Priority::Interactive, 2, now),
            ticket(Priority::Interactive, 3, now),
            old,
        ];
        assert_eq!(order(&ts).await, [2, 0, 1]);
    }

    #[tokio::test]
    async fn a_gone_waiter_hands_its_slot_on() {
        let m = Queued::default();
        let slots = Slots::new(1, 4);
        let held = slots.try_acquire().unwrap();
        let t = Ticket::plain(Instant::now());
        let mut gone = Box::pin(slots.acquire("a", Duration::from_secs(9), t, &m));
        let mut next = Box::pin(slots.acquire("a", Duration::from_secs(9), t, &m));
        assert!(futures_util::poll!(gone.as_mut()).is_pending());
        assert!(futures_util::poll!(next.as_mut()).is_pending());
        drop(held);
        // Granted to `gone`, which goes away before it runs: the slot passes to `next`.
        drop(gone);
        let p = next.await.unwrap();
        assert_eq!((slots.busy(), slots.waiting()), (1, 0));
        drop(p);
        assert_eq!(slots.busy(), 0);
        assert!(slots.try_acquire().is_some());
    }
}
