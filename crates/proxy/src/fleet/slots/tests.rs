//! The scheduler's tests: queueing, refusal, class order, turns, aging, displacement.

use std::sync::atomic::AtomicI64;

use super::*;
use crate::config::Priority;

/// Counts the requests waiting, as the queue gauge does.
#[derive(Default)]
pub(super) struct Queued(pub(super) AtomicI64);

impl QueueWatch for Queued {
    fn entered(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
    fn left(&self, _waited: Duration) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

pub(super) fn ticket(class: Priority, client: u64, since: Instant) -> Ticket {
    Ticket {
        class,
        client,
        since,
        max_wait: Duration::from_secs(60),
        ..Ticket::plain(since)
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
    order_by(Scheduling::default(), tickets).await
}

/// [`order`] under `schedule`.
pub(super) async fn order_by(schedule: Scheduling, tickets: &[Ticket]) -> Vec<usize> {
    let m = Queued::default();
    let slots = Slots::new(1, 64);
    slots.set_schedule(schedule, false);
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
pub(super) fn now() -> Instant {
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
    let t = Ticket {
        conversation: Some(7),
        ..Ticket::plain(Instant::now())
    };
    let one = slots.try_acquire_for(t).unwrap();
    let plain = slots.try_acquire().unwrap();
    assert_eq!((slots.held_by(7), slots.held_by(8)), (1, 0));
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
