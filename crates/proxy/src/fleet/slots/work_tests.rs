//! The scheduler's tests of GPU time: the fair order by work, the other orders, preemption,
//! pinned slots and the hold for a returning turn, predicted waits. On tokio's paused clock.

use super::tests::{now, order_by, ticket, Queued};
use super::*;
use crate::config::{Order, Priority};

fn worth(work: f64, t: Ticket) -> Ticket {
    Ticket {
        work,
        prefill: work,
        ..t
    }
}

fn scheduled(order: Order) -> Scheduling {
    Scheduling {
        order,
        ..Scheduling::default()
    }
}

#[tokio::test(start_paused = true)]
async fn by_work_one_compaction_is_a_turn_as_long_as_ten_short_ones() {
    let t0 = now();
    // Client 1: two compactions of 10 s each; client 2: eleven turns of 1 s.
    let mut ts = vec![
        worth(10.0, ticket(Priority::Batch, 1, t0)),
        worth(10.0, ticket(Priority::Batch, 1, t0)),
    ];
    ts.extend((0..11).map(|_| worth(1.0, ticket(Priority::Batch, 2, t0))));
    let got = order_by(Scheduling::default(), &ts).await;
    assert_eq!(got[0], 0, "{got:?}");
    // Ten of client 2's turns, then client 1's second compaction.
    assert!(got[1..11].iter().all(|&i| i >= 2), "{got:?}");
    assert_eq!(got[11], 1, "{got:?}");
    // By requests, the clients alternate whatever each request costs.
    let got = order_by(scheduled(Order::Requests), &ts).await;
    assert_eq!(&got[..4], &[0, 2, 1, 3], "{got:?}");
}

#[tokio::test(start_paused = true)]
async fn by_arrival_the_oldest_goes_first_whatever_its_class() {
    let t0 = now();
    let ts = [
        ticket(Priority::Batch, 1, t0),
        ticket(Priority::Interactive, 2, t0 + Duration::from_secs(1)),
    ];
    assert_eq!(order_by(scheduled(Order::Arrival), &ts).await, vec![0, 1]);
    assert_eq!(order_by(Scheduling::default(), &ts).await, vec![1, 0]);
}

#[tokio::test(start_paused = true)]
async fn an_interactive_request_takes_the_slot_of_the_batch_one_with_most_prefill_left() {
    let m = Queued::default();
    let slots = Slots::new(2, 8);
    let t0 = now();
    let mut short = slots
        .try_acquire_for(worth(5.0, ticket(Priority::Batch, 1, t0)))
        .unwrap();
    let mut long = slots
        .try_acquire_for(worth(60.0, ticket(Priority::Batch, 2, t0)))
        .unwrap();
    assert!(short.preemptible() && long.preemptible());
    let person = ticket(Priority::Interactive, 3, t0);
    let mut waiting = Box::pin(slots.acquire(Duration::from_secs(30), person, &m));
    assert!(futures_util::poll!(waiting.as_mut()).is_pending());
    // Before its preemption wait, nobody is asked.
    tokio::time::advance(Duration::from_millis(900)).await;
    assert!(futures_util::poll!(waiting.as_mut()).is_pending());
    assert!(futures_util::poll!(Box::pin(long.preempted())).is_pending());
    tokio::time::advance(Duration::from_millis(200)).await;
    assert!(futures_util::poll!(waiting.as_mut()).is_pending());
    // The long one is asked; the short one is not.
    long.preempted().await;
    assert!(futures_util::poll!(Box::pin(short.preempted())).is_pending());
    let index = long.index();
    drop(long);
    let got = waiting.await.unwrap();
    assert_eq!(got.index(), index);
    assert!(
        !got.preemptible(),
        "an interactive request is never preempted"
    );
    drop(short);
}

#[tokio::test(start_paused = true)]
async fn a_request_that_sent_a_byte_or_was_preempted_enough_keeps_its_slot() {
    let m = Queued::default();
    let slots = Slots::new(1, 8);
    let t0 = now();
    let mut started = slots
        .try_acquire_for(worth(60.0, ticket(Priority::Batch, 1, t0)))
        .unwrap();
    assert!(started.started());
    assert!(!started.preemptible());
    let person = ticket(Priority::Interactive, 3, t0);
    let mut waiting = Box::pin(slots.acquire(Duration::from_secs(5), person, &m));
    assert!(futures_util::poll!(waiting.as_mut()).is_pending());
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(futures_util::poll!(waiting.as_mut()).is_pending());
    drop(started);
    drop(waiting.await.unwrap());
    let spent = Ticket {
        preemptions: Scheduling::default().max_preemptions,
        ..worth(60.0, ticket(Priority::Batch, 1, t0))
    };
    assert!(!slots.try_acquire_for(spent).unwrap().preemptible());
    // Ordered by requests, nobody is preempted.
    slots.set_schedule(scheduled(Order::Requests), false);
    let t = worth(60.0, ticket(Priority::Batch, 1, t0));
    assert!(!slots.try_acquire_for(t).unwrap().preemptible());
}

/// A batch request of a minute's work, preempted as often as it may be.
fn spent(client: u64, since: Instant) -> Ticket {
    Ticket {
        preemptions: Scheduling::default().max_preemptions,
        ..worth(60.0, ticket(Priority::Batch, client, since))
    }
}

#[tokio::test(start_paused = true)]
async fn a_slot_goes_to_a_request_still_preemptible_while_the_others_hold_spent_ones() {
    let m = Queued::default();
    let slots = Slots::new(2, 8);
    let t0 = now();
    let spent = |client| spent(client, t0);
    let kept = slots.try_acquire_for(spent(1)).unwrap();
    let freed = slots
        .try_acquire_for(worth(1.0, ticket(Priority::Batch, 2, t0)))
        .unwrap();
    // Client 3's preempted request waits before its next one, first in its client's order.
    let mut again = Box::pin(slots.acquire(Duration::from_secs(300), spent(3), &m));
    assert!(futures_util::poll!(again.as_mut()).is_pending());
    let next = worth(1.0, ticket(Priority::Batch, 3, t0 + Duration::from_secs(1)));
    let mut fresh = Box::pin(slots.acquire(Duration::from_secs(300), next, &m));
    assert!(futures_util::poll!(fresh.as_mut()).is_pending());
    // With the other slot spent, the freed one goes to the request that can still give it up.
    let index = freed.index();
    drop(freed);
    let fresh = fresh.await.unwrap();
    assert_eq!(fresh.index(), index);
    assert!(fresh.preemptible());
    assert!(futures_util::poll!(again.as_mut()).is_pending());
    // With no other request waiting, the spent one takes a slot anyway.
    drop(fresh);
    assert_eq!(again.await.unwrap().index(), index);
    drop(kept);
}

/// A request preempted as often as it may be still goes before the Batch API's lines: while
/// the other slot holds a spent request, the freed one is its, not a line's.
#[tokio::test(start_paused = true)]
async fn a_spent_request_takes_a_freed_slot_before_batch_lines() {
    let m = Queued::default();
    let slots = Slots::new(2, 8);
    let t0 = now();
    let spent = |client| spent(client, t0);
    let kept = slots.try_acquire_for(spent(1)).unwrap();
    let person = slots
        .try_acquire_for(worth(1.0, ticket(Priority::Interactive, 2, t0)))
        .unwrap();
    let line = Ticket {
        max_wait: Duration::MAX,
        ..worth(1.0, ticket(Priority::Idle, 4, t0))
    };
    let mut lines = Box::pin(slots.acquire(Duration::from_secs(300), line, &m));
    assert!(futures_util::poll!(lines.as_mut()).is_pending());
    let mut again = Box::pin(slots.acquire(Duration::from_secs(300), spent(3), &m));
    assert!(futures_util::poll!(again.as_mut()).is_pending());
    let index = person.index();
    drop(person);
    let again = again.await.unwrap();
    assert_eq!(again.index(), index);
    assert!(futures_util::poll!(lines.as_mut()).is_pending());
    drop(kept);
    assert!(lines.await.unwrap().preemptible());
    drop(again);
}

fn of(conversation: u64, client: u64) -> Ticket {
    Ticket {
        conversation: Some(conversation),
        tokens: 1_000,
        ..worth(1.0, ticket(Priority::Batch, client, now()))
    }
}

#[tokio::test(start_paused = true)]
async fn a_conversation_finds_the_slot_it_left() {
    let slots = Slots::new(3, 8);
    slots.set_schedule(Scheduling::default(), true);
    let a = slots.try_acquire_for(of(7, 1)).unwrap();
    let b = slots.try_acquire_for(of(8, 2)).unwrap();
    let (ia, ib) = (a.index(), b.index());
    assert_ne!(ia, ib);
    drop((a, b));
    // Another conversation takes the slot used least recently, not one holding a prefix.
    let c = slots.try_acquire_for(of(9, 3)).unwrap();
    assert!(c.index() != ia && c.index() != ib);
    assert_eq!(slots.try_acquire_for(of(8, 2)).unwrap().index(), ib);
    assert_eq!(slots.try_acquire_for(of(7, 1)).unwrap().index(), ia);
    assert_eq!(slots.cached_for(7), 1_000);
}

#[tokio::test(start_paused = true)]
async fn a_slot_waits_for_a_turn_that_comes_back_fast_and_no_longer() {
    let m = Queued::default();
    let slots = Slots::new(1, 8);
    let holding = Scheduling {
        slot_hold: Duration::from_millis(500),
        ..Scheduling::default()
    };
    slots.set_schedule(holding, true);
    // Its first turn, then its second 100 ms after: the gap is learned.
    drop(slots.try_acquire_for(of(7, 1)).unwrap());
    tokio::time::advance(Duration::from_millis(100)).await;
    let second = slots.try_acquire_for(of(7, 1)).unwrap();
    let other = of(9, 2);
    let mut waiting = Box::pin(slots.acquire(Duration::from_secs(30), other, &m));
    assert!(futures_util::poll!(waiting.as_mut()).is_pending());
    // The slot is kept for the conversation's next turn, which takes it past the waiter.
    drop(second);
    assert!(futures_util::poll!(waiting.as_mut()).is_pending());
    tokio::time::advance(Duration::from_millis(100)).await;
    let third = slots.try_acquire_for(of(7, 1)).unwrap();
    drop(third);
    // Kept again (twice the gap); no turn comes: the waiter gets it when the hold ends.
    assert!(futures_util::poll!(waiting.as_mut()).is_pending());
    tokio::time::advance(Duration::from_millis(250)).await;
    let got = waiting.await.unwrap();
    assert_eq!(got.index(), 0);
}

fn holding(slack: f64) -> Scheduling {
    Scheduling {
        slot_hold: Duration::from_millis(500),
        pin_slack: slack,
        ..Scheduling::default()
    }
}

#[tokio::test(start_paused = true)]
async fn a_kept_slot_goes_at_once_to_a_better_class_arriving_during_the_hold() {
    let m = Queued::default();
    let slots = Slots::new(1, 8);
    slots.set_schedule(holding(10.0), true);
    drop(slots.try_acquire_for(of(7, 1)).unwrap());
    tokio::time::advance(Duration::from_millis(100)).await;
    let second = slots.try_acquire_for(of(7, 1)).unwrap();
    let mut batch = Box::pin(slots.acquire(Duration::from_secs(30), of(9, 2), &m));
    assert!(futures_util::poll!(batch.as_mut()).is_pending());
    drop(second);
    // Kept for conversation 7; a person comes: the hold ends for it, not after it.
    let person = ticket(Priority::Interactive, 3, now());
    let mut asking = Box::pin(slots.acquire(Duration::from_secs(30), person, &m));
    let got = futures_util::poll!(asking.as_mut());
    assert!(matches!(got, std::task::Poll::Ready(Ok(_))), "{got:?}");
    // Nor does the returning turn pass the person when it comes back first.
    assert!(futures_util::poll!(batch.as_mut()).is_pending());
}

#[tokio::test(start_paused = true)]
async fn a_conversation_keeps_its_slot_only_within_the_slack_of_those_waiting() {
    let m = Queued::default();
    let slots = Slots::new(1, 8);
    slots.set_schedule(holding(2.5), true);
    let turn = || worth(1.0, of(7, 1));
    drop(slots.try_acquire_for(turn()).unwrap());
    tokio::time::advance(Duration::from_millis(100)).await;
    let mut held = slots.try_acquire_for(turn()).unwrap();
    let mut other = Box::pin(slots.acquire(Duration::from_secs(30), worth(1.0, of(9, 2)), &m));
    assert!(futures_util::poll!(other.as_mut()).is_pending());
    // Client 1 is ahead of client 2 by a second a turn: its turns come back to a kept slot
    // while it is within 2.5 s of client 2, then the slot goes to client 2.
    let mut turns = 2;
    loop {
        drop(held);
        if futures_util::poll!(other.as_mut()).is_ready() {
            break;
        }
        tokio::time::advance(Duration::from_millis(10)).await;
        held = slots
            .try_acquire_for(turn())
            .expect("kept for its next turn");
        turns += 1;
        assert!(turns < 10, "the conversation kept the slot past the slack");
    }
    assert_eq!(turns, 4);
}

#[tokio::test(start_paused = true)]
async fn the_wait_predicted_is_the_work_ahead_over_the_slots() {
    let m = Queued::default();
    let slots = Slots::new(2, 8);
    let t0 = now();
    let _a = slots.try_acquire_for(worth(10.0, ticket(Priority::Batch, 1, t0)));
    let _b = slots.try_acquire_for(worth(4.0, ticket(Priority::Batch, 2, t0)));
    let early = worth(3.0, ticket(Priority::Interactive, 3, t0));
    let mut queued = Box::pin(slots.acquire(Duration::from_secs(60), early, &m));
    assert!(futures_util::poll!(queued.as_mut()).is_pending());
    tokio::time::advance(Duration::from_secs(1)).await;
    // Slots free in 9 s and 3 s; the interactive request ahead takes the one at 3 s (to 6 s).
    let batch = worth(2.0, ticket(Priority::Batch, 4, t0));
    assert_eq!(slots.predicted_wait(&batch), Duration::from_secs(6));
    // An interactive request goes before batch waiters but after the interactive one.
    let person = worth(1.0, ticket(Priority::Interactive, 5, t0));
    assert_eq!(slots.predicted_wait(&person), Duration::from_secs(6));
}

#[tokio::test(start_paused = true)]
async fn nobody_is_preempted_when_a_slot_is_predicted_free_within_another_wait() {
    let m = Queued::default();
    let slots = Slots::new(2, 8);
    let t0 = now();
    let ending = slots
        .try_acquire_for(worth(1.5, ticket(Priority::Batch, 1, t0)))
        .unwrap();
    let mut long = slots
        .try_acquire_for(worth(60.0, ticket(Priority::Batch, 2, t0)))
        .unwrap();
    let person = ticket(Priority::Interactive, 3, t0);
    let mut waiting = Box::pin(slots.acquire(Duration::from_secs(30), person, &m));
    assert!(futures_util::poll!(waiting.as_mut()).is_pending());
    // At 1.1 s the first slot is predicted free in 0.4 s: the person waits for it.
    tokio::time::advance(Duration::from_millis(1_100)).await;
    assert!(futures_util::poll!(waiting.as_mut()).is_pending());
    assert!(futures_util::poll!(Box::pin(long.preempted())).is_pending());
    let index = ending.index();
    drop(ending);
    assert_eq!(waiting.await.unwrap().index(), index);
}

/// The Batch API's lines (`idle`) take a slot only when nobody else waits, are never lifted
/// however long they wait, and go last even in arrival order.
#[tokio::test(start_paused = true)]
async fn idle_requests_go_after_every_other_class_in_every_order() {
    let t0 = now();
    let idle = |client, since| Ticket {
        max_wait: Duration::MAX,
        ..ticket(Priority::Idle, client, since)
    };
    let ts = [
        idle(1, t0),
        ticket(Priority::Batch, 2, t0 + Duration::from_secs(1)),
        idle(3, t0),
        ticket(Priority::Normal, 4, t0 + Duration::from_secs(2)),
    ];
    for order in [Order::Work, Order::Requests, Order::Arrival] {
        let got = order_by(scheduled(order), &ts).await;
        assert_eq!(
            &got[2..].iter().all(|&i| i == 0 || i == 2),
            &true,
            "{order:?} {got:?}"
        );
    }
    // Hours later they are still not lifted into the batch class's turns.
    tokio::time::advance(Duration::from_secs(4 * 3600)).await;
    let later = [idle(1, t0), ticket(Priority::Batch, 2, now())];
    assert_eq!(order_by(Scheduling::default(), &later).await, vec![1, 0]);
}

/// An idle request gives its slot up the moment a request of any other class waits for it,
/// without the interactive preemption wait, however often it was preempted before.
#[tokio::test(start_paused = true)]
async fn an_idle_request_gives_its_slot_at_once_to_any_class_that_waits() {
    let m = Queued::default();
    let slots = Slots::new(2, 8);
    let t0 = now();
    let again = Ticket {
        preemptions: 50,
        ..ticket(Priority::Idle, 1, t0)
    };
    let mut first = slots.try_acquire_for(again).unwrap();
    let mut second = slots
        .try_acquire_for(ticket(Priority::Idle, 1, t0))
        .unwrap();
    assert!(first.preemptible() && second.preemptible());
    let agent = ticket(Priority::Batch, 2, t0);
    let mut waiting = Box::pin(slots.acquire(Duration::from_secs(30), agent, &m));
    assert!(futures_util::poll!(waiting.as_mut()).is_pending());
    // No time passes: the one granted last is asked, the other keeps its slot.
    second.preempted().await;
    assert!(futures_util::poll!(Box::pin(first.preempted())).is_pending());
    let index = second.index();
    drop(second);
    let got = waiting.await.unwrap();
    assert_eq!(got.index(), index);
    // An idle request that sent its first byte keeps its slot.
    assert!(first.started());
    let mut more = Box::pin(slots.acquire(Duration::from_secs(30), agent, &m));
    assert!(futures_util::poll!(more.as_mut()).is_pending());
    drop(got);
    drop(more.await.unwrap());
    drop(first);
    // Ordered by requests, an idle request keeps its slot like any other.
    slots.set_schedule(scheduled(Order::Requests), false);
    assert!(!slots
        .try_acquire_for(ticket(Priority::Idle, 1, t0))
        .unwrap()
        .preemptible());
}

/// The page's view of who holds each slot: class, client, time held and predicted time left.
#[tokio::test(start_paused = true)]
async fn the_holders_of_the_slots_with_their_time_held_and_left() {
    let slots = Slots::new(2, 8);
    let t0 = now();
    assert!(slots.holding().is_empty());
    let held = slots
        .try_acquire_for(worth(10.0, ticket(Priority::Batch, 7, t0)))
        .unwrap();
    tokio::time::advance(Duration::from_secs(4)).await;
    assert_eq!(
        slots.holding(),
        vec![Holding {
            slot: held.index(),
            class: Priority::Batch,
            client: 7,
            held: Duration::from_secs(4),
            left: Duration::from_secs(6),
        }]
    );
    drop(held);
    assert!(slots.holding().is_empty());
}

#[tokio::test(start_paused = true)]
async fn work_predicted_past_any_duration_is_the_longest_wait_not_a_panic() {
    let m = Queued::default();
    let slots = Slots::new(1, 8);
    let t0 = now();
    let _held = slots
        .try_acquire_for(worth(1e30, ticket(Priority::Batch, 1, t0)))
        .unwrap();
    let next = worth(1.0, ticket(Priority::Batch, 2, t0));
    let mut waiting = Box::pin(slots.acquire(Duration::from_secs(30), next, &m));
    assert!(futures_util::poll!(waiting.as_mut()).is_pending());
    let longest = Duration::from_secs(u64::MAX / 2);
    assert!(slots.predicted_wait(&next) > longest);
    assert!(slots.predicted_queue()[0].predicted > longest);
    assert!(slots.holding()[0].left > longest);
}
