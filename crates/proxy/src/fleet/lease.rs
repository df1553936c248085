//! A backend's slots across processes: the shared lease a request takes, after its slot in
//! this process, before it is sent — at once when the store has one free, else waiting in the
//! store's queue of every process's requests (by priority class, then in fair turns by client,
//! each client's by arrival), asking again with a growing pause, until the queue's deadline.
//! An unreachable store lets it go on with this process's slot alone. Processes configured
//! with different `slots` for one backend all keep to the least figure, and say so.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::ticket::{QueueWatch, Ticket};
use crate::shared::lease::{Lease, Take, Turn};
use crate::shared::places::Places;
use crate::shared::Store;

/// A backend's places in the store.
#[derive(Debug, Clone)]
pub(crate) struct SharedSlots {
    pub(crate) store: Arc<Store>,
    places: Places,
    /// The backend's URL, as logs name it.
    url: Arc<str>,
    /// The slot count the store last used, when it differed from this process's (0: none
    /// differed yet): a change is logged once.
    told: Arc<AtomicU32>,
}

/// The first pause between two asks, and the longest.
const FIRST: Duration = Duration::from_millis(2);
const MOST: Duration = Duration::from_millis(20);

/// Rank in the store's queue: the class first, then the time the request arrived (in ms of
/// the Unix epoch, on this host's clock).
fn rank(t: &Ticket) -> u64 {
    let arrived = SystemTime::now()
        .checked_sub(t.since.elapsed())
        .unwrap_or(SystemTime::now());
    let ms = arrived
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    ((t.class as u64) << 48) | (ms & ((1 << 48) - 1))
}

impl SharedSlots {
    /// The slots of the backend at `url` (the key every process agrees on, whatever it
    /// names the backend).
    pub(crate) fn new(store: Arc<Store>, url: &str) -> SharedSlots {
        SharedSlots {
            store,
            places: Places::new("slots", url),
            url: Arc::from(url),
            told: Arc::default(),
        }
    }

    /// A lease when the store is down: counted here, put in the store when it returns.
    /// `None` while it is up (a lease must be asked for).
    pub(crate) fn unasked(&self) -> Option<Lease> {
        (!self.store.up()).then(|| self.store.ask(&self.places, None).hold())
    }

    /// One of `capacity` leases by `deadline`; `Err(())` when the deadline passes first.
    /// `watch` is told of the wait when the store has none free at once.
    pub(crate) async fn take(
        &self,
        capacity: u32,
        ticket: &Ticket,
        deadline: Instant,
        watch: &dyn QueueWatch,
    ) -> Result<Lease, ()> {
        let turn = Turn {
            rank: rank(ticket),
            client: ticket.client,
            agree: true,
        };
        let mut asking = self.store.ask(&self.places, Some(turn));
        let mut pause = FIRST;
        let mut waiting: Option<Waited<'_>> = None;
        loop {
            let took = asking.take(capacity).await;
            self.tell(capacity, asking.agreed());
            match took {
                Take::Taken | Take::Down => return Ok(asking.hold()),
                Take::Full => {}
            }
            if waiting.is_none() {
                watch.entered();
                waiting = Some(Waited {
                    watch,
                    since: Instant::now(),
                });
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(());
            }
            let jitter =
                Duration::from_micros(rand::random_range(0..=pause.as_micros() as u64 / 2));
            tokio::time::sleep((pause + jitter).min(deadline - now)).await;
            pause = (pause * 2).min(MOST);
        }
    }
}

impl SharedSlots {
    /// Log once each figure the store uses for the backend's slots that is not this
    /// process's own `capacity` (another process sharing the store has fewer).
    fn tell(&self, capacity: u32, agreed: Option<u32>) {
        let Some(agreed) = agreed.filter(|a| *a != capacity) else {
            return;
        };
        if self.told.swap(agreed, Ordering::Relaxed) != agreed {
            tracing::warn!(
                backend = %self.url,
                slots = capacity,
                using = agreed,
                "slots differ between processes sharing the store: every process keeps to the least"
            );
        }
    }
}

/// A wait for a shared lease, told to the queue watch however it ends.
struct Waited<'a> {
    watch: &'a dyn QueueWatch,
    since: Instant,
}

impl Drop for Waited<'_> {
    fn drop(&mut self) {
        self.watch.left(self.since.elapsed());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Priority;

    #[test]
    fn the_store_queue_ranks_by_class_then_arrival() {
        let now = Instant::now();
        let t = |class, ago: u64| Ticket {
            class,
            client: 1,
            since: now - Duration::from_secs(ago),
            ..Ticket::plain(now - Duration::from_secs(ago))
        };
        let old_batch = rank(&t(Priority::Batch, 60));
        let new_interactive = rank(&t(Priority::Interactive, 0));
        let old_normal = rank(&t(Priority::Normal, 30));
        let new_normal = rank(&t(Priority::Normal, 0));
        assert!(new_interactive < old_normal);
        assert!(old_normal < new_normal);
        assert!(new_normal < old_batch);
    }
}
