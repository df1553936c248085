//! Who waits for a slot and since when, what it will cost, what the scheduler orders by, and
//! who is told of the wait.

use std::time::{Duration, Instant};

use crate::config::Priority;

/// Told of a request's time in the queue (the per-alias queue metrics).
pub(crate) trait QueueWatch: Sync {
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
    /// Its client's cache group ([`crate::config::ClientSpec::cache_group`]; 0 for none):
    /// whose cached prefixes it may meet where caches are isolated.
    pub group: u64,
    /// When the request arrived: kept when it moves to another replica or a fallback, so it
    /// keeps its place.
    pub since: Instant,
    /// Its class's wait after which it is lifted into the next class's turns.
    pub max_wait: Duration,
    /// Its conversation's key: counted while it holds a slot ([`Slots::held_by`]), and the
    /// slot it leaves holds that conversation's prefix.
    pub conversation: Option<u64>,
    /// Its predicted GPU-seconds on the backend it waits for, all and prefill
    /// ([`crate::fleet::cost`]); 0 where nothing is predicted.
    pub work: f64,
    pub prefill: f64,
    /// The tokens its slot will hold after it: its prompt and expected output.
    pub tokens: u64,
    /// How many times it gave its slot up to a better class.
    pub preemptions: u32,
}

impl Ticket {
    /// A request of the plain path: normal class, anonymous, arriving now.
    pub fn plain(since: Instant) -> Ticket {
        Ticket {
            class: Priority::Normal,
            client: 0,
            group: 0,
            since,
            max_wait: Duration::MAX,
            conversation: None,
            work: 0.0,
            prefill: 0.0,
            tokens: 0,
            preemptions: 0,
        }
    }

    pub(super) fn due(&self) -> Instant {
        self.since
            .checked_add(self.max_wait)
            .unwrap_or(self.since + Duration::from_secs(1 << 32))
    }

    /// Its class in the queue at `now`: its own, lifted one class for each `max_wait` it has
    /// waited, but never past `best` (the best class waiting).
    pub(super) fn lifted(&self, best: Priority, now: Instant) -> Priority {
        if now < self.due() || self.class <= best {
            return self.class;
        }
        let waited = now.saturating_duration_since(self.since).as_nanos();
        let steps = waited / self.max_wait.as_nanos().max(1);
        let class = (self.class as usize).saturating_sub(steps.min(3) as usize);
        Priority::ALL[class.max(best as usize)]
    }
}
