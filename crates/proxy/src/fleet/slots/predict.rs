//! Predicted waits: the work ahead of a request on a backend — each slot's predicted time left,
//! then the predicted work of each waiter the order puts first, each on the slot free soonest.
//! And the requests holding the slots now, with their time held and predicted left.

use std::time::Duration;

use super::{now, Slots};
use crate::config::{Order, Priority};
use crate::fleet::ticket::Ticket;

/// A request waiting for a slot, as the status page shows it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Queued {
    pub(crate) class: Priority,
    /// Its client's id (0: of no client).
    pub(crate) client: u64,
    /// How long it has waited (since it arrived, across replicas and fallbacks).
    pub(crate) waited: Duration,
    /// Its predicted wait from now.
    pub(crate) predicted: Duration,
}

/// A request holding a slot, as the status page shows it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Holding {
    pub(crate) slot: u32,
    pub(crate) class: Priority,
    /// Its client's id (0: of no client).
    pub(crate) client: u64,
    /// How long it has held the slot.
    pub(crate) held: Duration,
    /// Its predicted time left on it.
    pub(crate) left: Duration,
}

impl Slots {
    /// The requests holding this process's slots now, slot by slot.
    pub(crate) fn holding(&self) -> Vec<Holding> {
        let st = self.inner.lock();
        let now = now();
        let slots = st.table.slots.iter().enumerate();
        slots
            .filter_map(|(i, s)| {
                let h = s.holder.as_ref()?;
                Some(Holding {
                    slot: i as u32,
                    class: h.ticket.class,
                    client: h.ticket.client,
                    held: now.saturating_duration_since(h.granted_at),
                    left: crate::seconds::duration(s.left(now)),
                })
            })
            .collect()
    }

    /// The requests waiting now, in the order they are predicted to go (by class, then by
    /// their clients' start tags, then arrival; by arrival alone when so ordered), each with
    /// its class, client, wait so far and predicted wait from now.
    pub(crate) fn predicted_queue(&self) -> Vec<Queued> {
        let st = self.inner.lock();
        let now = now();
        let mut free: Vec<f64> = st.table.slots.iter().map(|s| s.left(now)).collect();
        let mut waiting: Vec<&Ticket> = st.waiters.iter().map(|w| &w.ticket).collect();
        waiting.sort_by(|a, b| match st.schedule.order {
            Order::Arrival => a.since.cmp(&b.since),
            _ => (a.class, st.fair.start(a.client), a.since)
                .partial_cmp(&(b.class, st.fair.start(b.client), b.since))
                .unwrap_or(std::cmp::Ordering::Equal),
        });
        waiting
            .into_iter()
            .map(|t| {
                let soonest = free
                    .iter_mut()
                    .min_by(|a, b| a.total_cmp(b))
                    .map_or(0.0, |s| {
                        let at = *s;
                        *s += t.work.max(0.0);
                        at
                    });
                Queued {
                    class: t.class,
                    client: t.client,
                    waited: t.since.elapsed(),
                    predicted: crate::seconds::duration(soonest),
                }
            })
            .collect()
    }

    /// The wait predicted for a request of `ticket` queued now: the slots' predicted times
    /// left, then the predicted work of each waiter that goes before it, each put on the slot
    /// free soonest; it starts when the soonest is free after them.
    pub(crate) fn predicted_wait(&self, ticket: &Ticket) -> Duration {
        let st = self.inner.lock();
        let now = now();
        let mut free: Vec<f64> = st.table.slots.iter().map(|s| s.left(now)).collect();
        let start = st.fair.start(ticket.client);
        let ahead = st.waiters.iter().filter(|w| match st.schedule.order {
            Order::Arrival => (w.ticket.since, w.seq) < (ticket.since, u64::MAX),
            _ if w.ticket.class != ticket.class => w.ticket.class < ticket.class,
            Order::Requests => w.ticket.since <= ticket.since,
            Order::Work => {
                let theirs = st.fair.start(w.ticket.client);
                theirs < start || (theirs == start && w.ticket.since <= ticket.since)
            }
        });
        for w in ahead {
            if let Some(soonest) = free.iter_mut().min_by(|a, b| a.total_cmp(b)) {
                *soonest += w.ticket.work.max(0.0);
            }
        }
        let soonest = free.into_iter().min_by(f64::total_cmp).unwrap_or(0.0);
        crate::seconds::duration(soonest)
    }
}
