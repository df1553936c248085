//! A request's place in any queue it waits in: its ticket (class, client, arrival, how long
//! it may wait before it is lifted a class, conversation) and its client, whose queue figures
//! count it while it waits, and the longest wait for a slot it takes.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderName};

use super::{class, Caller, PRIORITY};
use crate::config::{Clients, Priority};
use crate::error::ProxyError;
use crate::fleet::ticket::Ticket;

/// Where a request stands in a queue: its ticket, its client (for the client's queue
/// figures), and the longest wait for a slot it takes (its client's `max_queue_wait_ms`, its
/// own `x-switchboard-max-wait-ms`, the shorter).
pub(crate) struct Place {
    pub(crate) ticket: Ticket,
    pub(crate) caller: Option<Caller>,
    pub(crate) max_wait: Option<Duration>,
}

/// The header a request sets the longest wait for a slot it takes with, in milliseconds.
pub(crate) const MAX_WAIT: HeaderName = HeaderName::from_static("x-switchboard-max-wait-ms");

impl Place {
    /// The place of a request of `caller` (`None`: no key is configured) with `headers`,
    /// arrived at `since`, in `conversation` (when some alias on its way has replicas): the
    /// same place on every replica and fallback.
    ///
    /// A batch line (`idle`) waits in the `idle` class whoever its client is, as long as it
    /// takes: no wait of its client's bounds it.
    pub(crate) fn new(
        caller: Option<&Caller>,
        headers: &HeaderMap,
        clients: &Clients,
        since: Instant,
        conversation: Option<u64>,
        idle: bool,
    ) -> Result<Place, ProxyError> {
        if idle {
            return Ok(Place {
                ticket: Ticket {
                    class: Priority::Idle,
                    client: caller.map_or(0, |c| c.state.id),
                    group: caller.map_or(0, |c| c.cache_group),
                    conversation,
                    ..Ticket::plain(since)
                },
                caller: caller.cloned(),
                max_wait: None,
            });
        }
        let own = caller.and_then(|c| c.spec.max_queue_wait);
        let max_wait = match (own, asked_wait(headers)?) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if caller.is_none() && !headers.contains_key(PRIORITY) {
            return Ok(Place {
                ticket: Ticket {
                    conversation,
                    ..Ticket::plain(since)
                },
                caller: None,
                max_wait,
            });
        }
        let own = caller.map_or(Priority::Normal, |c| c.spec.priority);
        let class = class(own, headers)?;
        Ok(Place {
            ticket: Ticket {
                class,
                client: caller.map_or(0, |c| c.state.id),
                group: caller.map_or(0, |c| c.cache_group),
                since,
                max_wait: clients.max_wait(class),
                conversation,
                ..Ticket::plain(since)
            },
            caller: caller.cloned(),
            max_wait,
        })
    }

    /// The request waits for a slot: its client's queue gauge and wait count it until the
    /// guard is dropped, however the wait ends.
    pub(crate) fn queued(&self) -> Option<Queued<'_>> {
        self.caller.as_ref().map(Queued::enter)
    }
}

/// A client's request waiting for a slot.
pub(crate) struct Queued<'a> {
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

/// The wait a request's `x-switchboard-max-wait-ms` sets (a whole number of milliseconds; else
/// the 400 of an invalid request).
fn asked_wait(headers: &HeaderMap) -> Result<Option<Duration>, ProxyError> {
    let Some(v) = headers.get(MAX_WAIT) else {
        return Ok(None);
    };
    let ms = v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok());
    ms.map(|ms| Some(Duration::from_millis(ms))).ok_or_else(|| {
        ProxyError::InvalidRequest(format!(
            "invalid x-switchboard-max-wait-ms header {:?}: expected a whole number of milliseconds",
            crate::error::Echo::new(&String::from_utf8_lossy(v.as_bytes()))
        ))
    })
}
