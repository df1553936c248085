//! The order of a backend's queue: which waiting request a freed slot goes to (class, then
//! clients by their share of work or in turn, aging lifting a class; or plain arrival), and
//! which one a full queue refuses to make room for a better one. Pure functions of the waiters; the scheduler ([`super`]) applies them.

use std::time::Instant;

use super::fair::Fair;
use crate::config::{ByClass, Order, Priority, Scheduling};
use crate::fleet::ticket::Ticket;

/// A request waiting for a slot: its place in line and what it carries to be woken (`tx`).
#[derive(Debug)]
pub(super) struct Waiter<T> {
    pub(crate) seq: u64,
    pub(crate) ticket: Ticket,
    pub(crate) tx: T,
}

/// The waiting request that gets the next slot, and the class whose turn it took, among those
/// `open` lets take it.
///
/// By arrival: the oldest, whatever its class (but `idle`, which goes last). Else the best class waiting (a request's own or
/// lifted into it, [`Ticket::lifted`]) and in it, by requests, its next client in turn after
/// `last`; by work, the client with the least start tag in `fair` (ties in turn after
/// `last`) — or, when the freed slot caches conversation `held`, a request of it whose client
/// is within the schedule's slack of that — then that client's oldest request there.
pub(super) fn pick<T>(
    waiters: &[Waiter<T>],
    last: &ByClass<Option<u64>>,
    now: Instant,
    fair: &Fair,
    schedule: &Scheduling,
    held: Option<u64>,
    open: &dyn Fn(&Ticket) -> bool,
) -> Option<(usize, Priority)> {
    let waiting = || waiters.iter().enumerate().filter(|(_, w)| open(&w.ticket));
    if schedule.order == Order::Arrival {
        let idle = |w: &Waiter<T>| w.ticket.class == Priority::Idle;
        let (i, w) = waiting().min_by_key(|(_, w)| (idle(w), w.ticket.since, w.seq))?;
        return Some((i, w.ticket.class));
    }
    let best = waiting().map(|(_, w)| w.ticket.class).min()?;
    let in_turn = || waiting().filter(move |(_, w)| w.ticket.lifted(best, now) == best);
    let after = last[best];
    let in_order = |clients: &mut dyn Iterator<Item = u64>| -> Option<u64> {
        let all: Vec<u64> = clients.collect();
        let next = all
            .iter()
            .copied()
            .filter(|c| after.is_none_or(|a| *c > a))
            .min();
        next.or_else(|| all.iter().copied().min())
    };
    let oldest_of = |client: u64| {
        in_turn()
            .filter(|(_, w)| w.ticket.client == client)
            .min_by_key(|(_, w)| (w.ticket.since, w.seq))
            .map(|(i, _)| (i, best))
    };
    if schedule.order == Order::Requests {
        let client = in_order(&mut in_turn().map(|(_, w)| w.ticket.client))?;
        return oldest_of(client);
    }
    let least = in_turn()
        .map(|(_, w)| fair.start(w.ticket.client))
        .fold(f64::INFINITY, f64::min);
    if let Some(k) = held {
        let own = in_turn()
            .filter(|(_, w)| w.ticket.conversation == Some(k))
            .filter(|(_, w)| fair.start(w.ticket.client) <= least + schedule.pin_slack)
            .min_by_key(|(_, w)| (w.ticket.since, w.seq));
        if let Some((i, _)) = own {
            return Some((i, best));
        }
    }
    let client = in_order(
        &mut in_turn()
            .filter(|(_, w)| fair.start(w.ticket.client) <= least)
            .map(|(_, w)| w.ticket.client),
    )?;
    oldest_of(client)
}

/// The waiter a request of `ticket` takes the place of in a full queue of `queue` places, if
/// any: the newest of the worst class waiting, when that class is worse than its own; else,
/// when its client holds fewer than its fair part — ceil(`queue` / k) places, at least one,
/// with k the clients waiting counting its own — the newest of its class of the client that
/// holds most over its part. `None`: it is refused (the 429 of a full queue).
pub(super) fn displaced<T>(waiters: &[Waiter<T>], queue: u32, ticket: &Ticket) -> Option<usize> {
    let newest = |of: &dyn Fn(&Waiter<T>) -> bool| {
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
