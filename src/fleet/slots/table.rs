//! A backend's slots one by one: who holds each (and what it may still be asked to give up),
//! whose conversation each holds in its cache, and which one a grant takes — the slot holding
//! the request's conversation, else the one used least recently, never one kept for another
//! conversation's next turn.

use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::config::{Priority, Scheduling};
use crate::fleet::ticket::Ticket;

/// The request holding a slot.
#[derive(Debug)]
pub(super) struct Holder {
    /// The grant's number (a permit names its grant).
    pub grant: u64,
    pub ticket: Ticket,
    pub granted_at: Instant,
    /// Told when the request is to give its slot up; `None` once it sent its client a byte
    /// (or may be preempted no more).
    pub preempt: Option<oneshot::Sender<()>>,
}

impl Holder {
    /// Its predicted prefill seconds left at `now`.
    fn prefill_left(&self, now: Instant) -> Duration {
        let ends = self.granted_at + Duration::from_secs_f64(self.ticket.prefill.max(0.0));
        ends.saturating_duration_since(now)
    }
}

/// One slot.
#[derive(Debug, Default)]
pub(super) struct Slot {
    pub holder: Option<Holder>,
    /// The conversation whose prefix the slot's cache holds, and how many tokens of it.
    pub cached: Option<(u64, u64)>,
    /// When it was last freed (the least recently used goes to a request without a slot of
    /// its own).
    pub freed_at: Option<Instant>,
    /// Kept for a conversation's next turn.
    pub kept: Option<Kept>,
}

/// A slot kept for the next turn of `conversation` (of class `class`) until `until`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Kept {
    pub conversation: u64,
    pub until: Instant,
    pub class: Priority,
}

impl Slot {
    /// Predicted seconds until it is free at `now`: its holder's predicted work left, or a
    /// hold's time left.
    pub fn left(&self, now: Instant) -> f64 {
        match (&self.holder, self.kept) {
            (Some(h), _) => {
                let ends = h.granted_at + Duration::from_secs_f64(h.ticket.work.max(0.0));
                ends.saturating_duration_since(now).as_secs_f64()
            }
            (None, Some(kept)) => kept.until.saturating_duration_since(now).as_secs_f64(),
            (None, None) => 0.0,
        }
    }

    /// Whether a request of `conversation` may take it at `now`.
    fn open_to(&self, conversation: Option<u64>, now: Instant) -> bool {
        self.holder.is_none()
            && match self.kept {
                Some(kept) => conversation == Some(kept.conversation) || now >= kept.until,
                None => true,
            }
    }
}

/// The slots of one backend.
#[derive(Debug)]
pub(super) struct Table {
    pub slots: Vec<Slot>,
}

impl Table {
    pub fn new(n: u32) -> Table {
        Table {
            slots: (0..n).map(|_| Slot::default()).collect(),
        }
    }

    /// The slot a request of `conversation` takes at `now`: the open one holding its
    /// conversation, else the open one kept for nobody used least recently, else any open one.
    pub fn choose(&self, conversation: Option<u64>, now: Instant) -> Option<usize> {
        let open = || {
            self.slots
                .iter()
                .enumerate()
                .filter(move |(_, s)| s.open_to(conversation, now))
        };
        let own = conversation.and_then(|k| {
            open()
                .find(|(_, s)| s.cached.is_some_and(|(c, _)| c == k))
                .map(|(i, _)| i)
        });
        own.or_else(|| {
            open()
                .min_by_key(|(_, s)| (s.kept.is_some(), s.freed_at))
                .map(|(i, _)| i)
        })
    }

    /// The slot kept for `conversation`, if any is (and open).
    pub fn kept_for(&self, conversation: u64, now: Instant) -> Option<usize> {
        self.slots.iter().position(|s| {
            s.holder.is_none()
                && s.kept
                    .is_some_and(|kept| kept.conversation == conversation && now < kept.until)
        })
    }

    /// Tokens of `conversation` a slot holds (the most any one holds).
    pub fn cached(&self, conversation: u64) -> Option<(usize, u64)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match s.cached {
                Some((c, n)) if c == conversation => Some((i, n)),
                _ => None,
            })
            .max_by_key(|(_, n)| *n)
    }

    /// Requests of `conversation` holding a slot.
    pub fn held_by(&self, conversation: u64) -> u32 {
        let of = |s: &&Slot| {
            s.holder
                .as_ref()
                .is_some_and(|h| h.ticket.conversation == Some(conversation))
        };
        self.slots.iter().filter(of).count() as u32
    }

    /// The holder a request of class `class` takes a slot from at `now`, when every slot is
    /// held by a worse class and none is predicted to be free within `soon`: of those that
    /// sent their client nothing yet and may still be preempted, the one with the most
    /// predicted prefill left (none with none left).
    /// Whether every slot but `index` holds a request that `schedule` lets preempt no more.
    pub fn spent_but(&self, index: usize, schedule: &Scheduling) -> bool {
        self.slots.iter().enumerate().all(|(i, s)| {
            i == index
                || s.holder
                    .as_ref()
                    .is_some_and(|h| schedule.spent(h.ticket.class, h.ticket.preemptions))
        })
    }

    pub fn victim(&self, class: Priority, now: Instant, soon: Duration) -> Option<usize> {
        let all_worse = self
            .slots
            .iter()
            .all(|s| s.holder.as_ref().is_some_and(|h| h.ticket.class > class));
        if !all_worse || self.slots.iter().any(|s| s.left(now) <= soon.as_secs_f64()) {
            return None;
        }
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let h = s.holder.as_ref()?;
                h.preempt.as_ref()?;
                let left = h.prefill_left(now);
                (!left.is_zero()).then_some((i, left))
            })
            .max_by_key(|(_, left)| *left)
            .map(|(i, _)| i)
    }
}
