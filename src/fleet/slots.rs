//! Per-backend concurrency and its queue, a scheduler: as many requests as the backend has
//! slots; the rest wait in a bounded queue and a freed slot goes to the waiting request first
//! by priority class, then in turn among the clients with requests waiting in that class
//! (round robin, so one client's many requests do not push another's few behind them). A
//! request waiting past its class's `max_wait` is lifted a class for each such wait, up to the
//! best class waiting, into that class's turn (aging: a lower class is not starved, and no
//! backlog goes ahead of everyone). A full queue makes room for a request of a better class,
//! or of a client holding less than its fair part, by refusing the newest request of the
//! worst class, or of the client holding most ([`displaced`]). With a shared
//! store, a request holding its slot here takes the backend's shared lease too before it is
//! sent ([`super::lease`]), so every process together keeps to the backend's slots.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::lease::SharedSlots;
use super::ticket::{QueueWatch, Ticket};
use crate::config::Priority;
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
    waiters: Vec<Waiter>,
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

/// The waiting request that gets the next slot, and the class whose turn it took: the best
/// class waiting, its next client in turn after `last` among those with a request in it (its
/// own or lifted into it, [`Ticket::lifted`]), that client's oldest request there.
fn pick(waiters: &[Waiter], last: &[Option<u64>; 3], now: Instant) -> Option<(usize, Priority)> {
    let best = waiters.iter().map(|w| w.ticket.class).min()?;
    let in_turn = || {
        waiters
            .iter()
            .enumerate()
            .filter(move |(_, w)| w.ticket.lifted(best, now) == best)
    };
    let after = last[best as usize];
    let next_client = in_turn()
        .map(|(_, w)| w.ticket.client)
        .filter(|c| after.is_none_or(|a| *c > a))
        .min()
        .or_else(|| in_turn().map(|(_, w)| w.ticket.client).min())?;
    in_turn()
        .filter(|(_, w)| w.ticket.client == next_client)
        .min_by_key(|(_, w)| (w.ticket.since, w.seq))
        .map(|(i, _)| (i, best))
}

/// The waiter a request of `ticket` takes the place of in a full queue of `queue` places, if
/// any: the newest of the worst class waiting, when that class is worse than its own; else,
/// when its client holds fewer than its fair part — ceil(`queue` / k) places, at least one,
/// with k the clients waiting counting its own — the newest of its class of the client that
/// holds most over its part. `None`: it is refused (the 429 of a full queue).
fn displaced(waiters: &[Waiter], queue: u32, ticket: &Ticket) -> Option<usize> {
    let newest = |of: &dyn Fn(&Waiter) -> bool| {
        waiters
            .iter()
            .enumerate()
            .filter(|(_, w)| of(w))
            .max_by_key(|(_, w)| (w.ticket.since, w.seq))
            .map(|(i, _)| i)
    };
    let worst = waiters.iter().map(|w| w.ticket.class).max()?;
    if worst > ticket.class {
        return newest(&|w| w.ticket.class == worst);
    }
    let mut held: Vec<(u64, u32)> = Vec::new();
    for w in waiters {
        match held.iter_mut().find(|(c, _)| *c == w.ticket.client) {
            Some((_, n)) => *n += 1,
            None => held.push((w.ticket.client, 1)),
        }
    }
    let holds = |client: u64| held.iter().find(|(c, _)| *c == client).map_or(0, |h| h.1);
    let own = holds(ticket.client);
    let k = held.len() as u32 + u32::from(own == 0);
    let part = queue.div_ceil(k).max(1);
    if own >= part {
        return None;
    }
    let most = held
        .iter()
        .filter(|&&(c, n)| {
            n > part
                && waiters
                    .iter()
                    .any(|w| w.ticket.client == c && w.ticket.class == ticket.class)
        })
        .max_by_key(|(_, n)| *n)?
        .0;
    newest(&|w| w.ticket.client == most && w.ticket.class == ticket.class)
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
            conversation: None,
        }
    }

    #[tokio::test]
    async fn queues_then_rejects_when_full() {
        let m = Queued::default();
        let slots = Slots::new(1, 1);
        let t = Ticket::plain(Instant::now());
        let first = slots.acquire(Duration::from_secs(5), t, &m).await.unwrap();
        assert_eq!(slots.busy(), 1);
        let waiter = slots.acquire(Duration::from_secs(5), t, &m);
        tokio::pin!(waiter);
        // Poll once so the waiter enters the queue.
        assert!(futures_util::poll!(waiter.as_mut()).is_pending());
        assert_eq!(m.0.load(Ordering::SeqCst), 1);
        let third = slots.acquire(Duration::from_secs(5), t, &m).await;
        assert!(
            matches!(third, Err(Refused::Full { slots: 1 })),
            "{:?}",
            third.err()
        );
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
        let waited = slots.acquire(Duration::from_millis(20), t, &m).await;
        let e = waited.unwrap_err();
        assert_eq!(e, Refused::TimedOut(Duration::from_millis(20)));
        assert_eq!(
            e.error("a").parts().0,
            axum::http::StatusCode::SERVICE_UNAVAILABLE
        );
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
            .map(|t| Box::pin(slots.acquire(Duration::from_secs(600), *t, &m)))
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

    /// Tokio's clock now, as the scheduler reads it (paused in these tests).
    fn now() -> Instant {
        tokio::time::Instant::now().into_std()
    }

    fn aging(class: Priority, client: u64, since: Instant, max_wait_ms: u64) -> Ticket {
        Ticket {
            max_wait: Duration::from_millis(max_wait_ms),
            ..ticket(class, client, since)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_past_its_max_wait_takes_turns_in_the_better_class() {
        let t0 = now();
        tokio::time::advance(Duration::from_secs(1)).await;
        let ts = [
            ticket(Priority::Interactive, 2, now()),
            ticket(Priority::Interactive, 2, now()),
            aging(Priority::Batch, 3, t0, 1),
        ];
        // Lifted into the interactive turn, it goes between client 2's two, not before both.
        assert_eq!(order(&ts).await, [0, 2, 1]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_aged_flood_takes_turns_with_later_requests_and_does_not_go_ahead_of_them() {
        let t0 = now();
        // Client 1's batch flood of six, each past its 1 s wait once the clock moves on.
        let mut ts: Vec<Ticket> = (0..6)
            .map(|_| aging(Priority::Batch, 1, t0, 1000))
            .collect();
        tokio::time::advance(Duration::from_secs(20)).await;
        ts.push(ticket(Priority::Normal, 3, now()));
        ts.push(ticket(Priority::Interactive, 2, now()));
        let got = order(&ts).await;
        let at = |i: usize| got.iter().position(|&g| g == i).unwrap();
        assert!(
            at(7) <= 1,
            "the interactive one waits for the flood: {got:?}"
        );
        assert!(at(6) <= 3, "the normal one waits for the flood: {got:?}");
        let flood: Vec<usize> = got.iter().copied().filter(|&i| i < 6).collect();
        assert_eq!(flood, (0..6).collect::<Vec<_>>());
    }

    #[tokio::test(start_paused = true)]
    async fn an_aged_request_is_not_lifted_past_its_own_class_when_no_better_one_waits() {
        let t0 = now();
        let mut ts: Vec<Ticket> = (0..4).map(|_| aging(Priority::Normal, 1, t0, 1)).collect();
        tokio::time::advance(Duration::from_secs(5)).await;
        ts.push(ticket(Priority::Normal, 2, now()));
        let got = order(&ts).await;
        assert_eq!(got.iter().position(|&g| g == 4), Some(1), "{got:?}");
    }

    type Acquiring<'a> =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<SlotPermit, Refused>> + 'a>>;

    /// A request at the queue: still waiting, or answered.
    enum At<'a> {
        Waiting(Acquiring<'a>),
        Done(Result<SlotPermit, Refused>),
    }

    impl At<'_> {
        /// Whether it was refused with the 429 of a full queue (`false`: still waiting).
        async fn refused(&mut self) -> bool {
            if let At::Waiting(w) = self {
                if let std::task::Poll::Ready(r) = futures_util::poll!(w.as_mut()) {
                    *self = At::Done(r);
                }
            }
            match self {
                At::Waiting(_) => false,
                At::Done(Err(Refused::Full { .. })) => true,
                At::Done(r) => panic!("neither waiting nor refused: {:?}", r.as_ref().err()),
            }
        }
    }

    /// `tickets` queued at `slots` (each polled once, in order).
    async fn queue_up<'a>(slots: &'a Slots, m: &'a Queued, tickets: &[Ticket]) -> Vec<At<'a>> {
        let mut waiters = Vec::new();
        for t in tickets {
            let mut at = At::Waiting(Box::pin(slots.acquire(Duration::from_secs(600), *t, m)));
            at.refused().await;
            waiters.push(at);
        }
        waiters
    }

    #[tokio::test(start_paused = true)]
    async fn a_better_class_takes_the_place_of_the_newest_worse_waiter() {
        let (m, slots) = (Queued::default(), Slots::new(1, 8));
        let _held = slots.try_acquire().unwrap();
        let t0 = now();
        let mut ts: Vec<Ticket> = (0..8).map(|_| ticket(Priority::Batch, 1, t0)).collect();
        ts.push(ticket(Priority::Interactive, 2, t0));
        let mut w = queue_up(&slots, &m, &ts).await;
        assert!(!w[8].refused().await, "the interactive one waits");
        assert!(w[7].refused().await, "the newest batch one gave its place");
        for w in &mut w[..7] {
            assert!(!w.refused().await);
        }
        assert_eq!((slots.waiting(), m.0.load(Ordering::SeqCst)), (8, 8));
        // More of the batch client's own find the queue full: no one of a worse class is left
        // to give way, and it holds more than its part.
        let mut late = queue_up(&slots, &m, &[ticket(Priority::Batch, 1, t0)]).await;
        assert!(late[0].refused().await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_under_its_fair_part_takes_the_place_of_the_newest_of_the_one_holding_most() {
        let (m, slots) = (Queued::default(), Slots::new(1, 4));
        let _held = slots.try_acquire().unwrap();
        let t0 = now();
        let t = |client| ticket(Priority::Normal, client, t0);
        let mut w = queue_up(&slots, &m, &[t(1), t(1), t(1), t(1)]).await;
        // Client 2, holding none of its part (2 of 4), takes client 1's newest place.
        w.extend(queue_up(&slots, &m, &[t(2)]).await);
        assert!(!w[4].refused().await);
        assert!(w[3].refused().await);
        // Client 1, at three, over its part: refused, and no one gives way to it.
        w.extend(queue_up(&slots, &m, &[t(1)]).await);
        assert!(w[5].refused().await);
        // Client 3 (part 2 of 4 among three): client 1 still holds most, over its part.
        w.extend(queue_up(&slots, &m, &[t(3)]).await);
        assert!(!w[6].refused().await);
        assert!(w[2].refused().await);
        // Client 2 again: under its part, but no client is over its part now.
        w.extend(queue_up(&slots, &m, &[t(2)]).await);
        assert!(w[7].refused().await);
        for i in [0, 1, 4, 6] {
            assert!(!w[i].refused().await, "{i}");
        }
        assert_eq!((slots.waiting(), m.0.load(Ordering::SeqCst)), (4, 4));
    }

    #[tokio::test]
    async fn the_conversations_holding_slots_are_counted_through_hand_overs() {
        let (m, slots) = (Queued::default(), Slots::new(2, 4));
        let one = slots.try_acquire_for(Some(7)).unwrap();
        let plain = slots.try_acquire().unwrap();
        assert_eq!((slots.held_by(7), slots.held_by(8)), (1, 0));
        let t = Ticket {
            conversation: Some(7),
            ..Ticket::plain(Instant::now())
        };
        let mut next = Box::pin(slots.acquire(Duration::from_secs(9), t, &m));
        assert!(futures_util::poll!(next.as_mut()).is_pending());
        drop(plain);
        let two = next.await.unwrap();
        assert_eq!(slots.held_by(7), 2);
        drop(one);
        assert_eq!(slots.held_by(7), 1);
        drop(two);
        assert_eq!((slots.held_by(7), slots.busy()), (0, 0));
    }

    #[tokio::test]
    async fn a_gone_waiter_hands_its_slot_on() {
        let m = Queued::default();
        let slots = Slots::new(1, 4);
        let held = slots.try_acquire().unwrap();
        let t = Ticket::plain(Instant::now());
        let mut gone = Box::pin(slots.acquire(Duration::from_secs(9), t, &m));
        let mut next = Box::pin(slots.acquire(Duration::from_secs(9), t, &m));
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
