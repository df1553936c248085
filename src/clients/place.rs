//! A request's place in any queue it waits in: its ticket (class, client, arrival, how long
//! it may wait before it is lifted a class, conversation) and its client, whose queue figures
//! count it while it waits.

use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::http::HeaderMap;

use super::{class, Caller, PRIORITY};
use crate::config::{Clients, Priority};
use crate::error::ProxyError;
use crate::fleet::ticket::Ticket;

/// Where a request stands in a queue: its ticket, and its client (for the client's queue
/// figures).
pub struct Place {
    pub ticket: Ticket,
    pub caller: Option<Caller>,
}

impl Place {
    /// The place of a request of `caller` that arrived `since`, in `conversation`: its class
    /// is its client's, or lower as its header asks (a value that is no class is a 400). The
    /// same place on every replica and fallback.
    pub fn new(
        caller: Option<&Caller>,
        headers: &HeaderMap,
        clients: &Clients,
        since: Instant,
        conversation: Option<u64>,
    ) -> Result<Place, ProxyError> {
        if caller.is_none() && !headers.contains_key(PRIORITY) {
            return Ok(Place {
                ticket: Ticket {
                    conversation,
                    ..Ticket::plain(since)
                },
                caller: None,
            });
        }
        let own = caller.map_or(Priority::Normal, |c| c.spec.priority);
        let class = class(own, headers)?;
        Ok(Place {
            ticket: Ticket {
                class,
                client: caller.map_or(0, |c| c.state.id),
                since,
                max_wait: clients.max_wait(class),
                conversation,
            },
            caller: caller.cloned(),
        })
    }

    /// The request waits for a slot: its client's queue gauge and wait count it until the
    /// guard is dropped, however the wait ends.
    pub fn queued(&self) -> Option<Queued<'_>> {
        self.caller.as_ref().map(Queued::enter)
    }
}

/// A client's request waiting for a slot.
pub struct Queued<'a> {
    caller: &'a Caller,
    since: Instant,
}

impl<'a> Queued<'a> {
    fn enter(caller: &'a Caller) -> Queued<'a> {
        caller.state.metrics.queued.inc();
        caller.state.queued.fetch_add(1, Ordering::Relaxed);
        Queued {
            caller,
            since: Instant::now(),
        }
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        let s = &self.caller.state;
        s.metrics.queued.dec();
        s.queued.fetch_sub(1, Ordering::Relaxed);
        s.metrics
            .queue_wait
            .observe(self.since.elapsed().as_secs_f64());
    }
}
