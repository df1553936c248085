//! A backend's slots one by one: who holds each (and what it may still be asked to give up),
//! whose conversation each holds in its cache, and which one a grant takes — the slot holding
//! the request's conversation, else the one used least recently, never one kept for another
//! conversation's next turn. Indexed so that a grant, a release and a conversation's lookups
//! cost the same with 4 slots or 4,096: the open slots in the order they were freed (a queue
//! whose entries go stale as their slots are taken, dropped from its front and swept when it
//! grows past twice the slots: a grant and a release push and pop, where an ordered set cost
//! ten times as much), counts of the open and kept slots, and each conversation's slots with
//! the open ones among them in the order freed and the most tokens any of them holds (a
//! conversation sending many requests at once holds many slots: a grant looks at the last
//! of its open ones, a prediction at the tally).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use foldhash::HashMap;

use tokio::sync::oneshot;

use crate::config::{Priority, Scheduling};
use crate::fleet::ticket::Ticket;

/// The request holding a slot.
#[derive(Debug)]
pub(super) struct Holder {
    /// The grant's number (a permit names its grant).
    pub(crate) grant: u64,
    pub(crate) ticket: Ticket,
    pub(crate) granted_at: Instant,
    /// Told when the request is to give its slot up; `None` once it sent its client a byte
    /// (or may be preempted no more).
    pub(crate) preempt: Option<oneshot::Sender<()>>,
}

impl Holder {
    /// Its predicted prefill seconds left at `now`.
    fn prefill_left(&self, now: Instant) -> Duration {
        until(self.granted_at, self.ticket.prefill, now)
    }
}

/// What is left at `now` of `secs` seconds from `start` (the longest `Duration` where they end
/// past what an `Instant` holds: a prediction may be any number).
fn until(start: Instant, secs: f64, now: Instant) -> Duration {
    let ends = start.checked_add(crate::seconds::duration(secs));
    ends.map_or(Duration::MAX, |ends| ends.saturating_duration_since(now))
}

/// One slot.
#[derive(Debug, Default)]
pub(super) struct Slot {
    pub(crate) holder: Option<Holder>,
    /// The conversation whose prefix the slot's cache holds, and how many tokens of it.
    pub(crate) cached: Option<(u64, u64)>,
    /// The cache group of the request that held it last (whose prefixes its cache holds);
    /// `None`: not held in this process yet, so its cache is anyone's.
    pub(crate) group: Option<u64>,
    /// When it was last freed, as the table counts frees (0: never; the least recently used
    /// goes to a request without a slot of its own).
    freed: u64,
    /// Kept for a conversation's next turn.
    pub(crate) kept: Option<Kept>,
}

/// A slot kept for the next turn of `conversation` (of class `class`) until `until`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Kept {
    pub(crate) conversation: u64,
    pub(crate) until: Instant,
    pub(crate) class: Priority,
}

impl Slot {
    /// Predicted seconds until it is free at `now`: its holder's predicted work left, or a
    /// hold's time left.
    pub(crate) fn left(&self, now: Instant) -> f64 {
        match (&self.holder, self.kept) {
            (Some(h), _) => until(h.granted_at, h.ticket.work, now).as_secs_f64(),
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

/// The slots of one backend. Its fields change only through its methods, which keep the
/// indexes with the slots.
#[derive(Debug)]
pub(super) struct Table {
    pub(crate) slots: Vec<Slot>,
    /// The open slots as (freed, index), in the order they were freed: an entry whose slot
    /// was taken since (or freed again) is stale, and skipped.
    freed: VecDeque<(u64, usize)>,
    /// Slots nobody holds, and of those the ones kept for a conversation.
    open: usize,
    kept: usize,
    /// The slots whose cache holds each conversation.
    caching: HashMap<u64, Caching>,
    frees: u64,
}

/// The slots whose cache holds one conversation, and the open ones among them in the order
/// they were freed (the others are held by its requests: a slot's holder is the conversation
/// it caches); the most tokens of it one of them holds, and how many hold that many.
#[derive(Debug, Default)]
struct Caching {
    slots: Vec<usize>,
    open: Vec<usize>,
    most: u64,
    at_most: usize,
}

impl Caching {
    /// One of its slots caches `to` tokens of it where it cached `from` (`None`: it did not,
    /// or does no more). Whether the most is to be counted again (its last slot went lower).
    fn tally(&mut self, from: Option<u64>, to: Option<u64>) -> bool {
        if let Some(n) = to {
            if n > self.most || self.at_most == 0 {
                (self.most, self.at_most) = (n, 1);
                return false;
            }
            self.at_most += usize::from(n == self.most);
        }
        if from == Some(self.most) {
            self.at_most -= 1;
        }
        self.at_most == 0 && !self.slots.is_empty()
    }
}

/// `index` taken out of `list`, where it is, the rest kept in order (it is mostly last).
fn unlist(list: &mut Vec<usize>, index: usize) {
    if let Some(at) = list.iter().rposition(|&i| i == index) {
        list.remove(at);
    }
}

impl Table {
    pub(crate) fn new(n: u32) -> Table {
        Table {
            slots: (0..n).map(|_| Slot::default()).collect(),
            freed: (0..n as usize).map(|i| (0, i)).collect(),
            open: n as usize,
            kept: 0,
            caching: HashMap::default(),
            frees: 0,
        }
    }

    /// Whether the entry (`freed`, `index`) of the freed queue still names an open slot.
    fn live(&self, (freed, index): (u64, usize)) -> bool {
        let s = &self.slots[index];
        s.holder.is_none() && s.freed == freed
    }

    /// The open slots in the order they were freed.
    fn open_slots(&self) -> impl Iterator<Item = usize> + '_ {
        self.freed
            .iter()
            .filter(|&&e| self.live(e))
            .map(|&(_, i)| i)
    }

    /// Changes slot `index` by `change`, keeping the counts of open and kept slots.
    fn change(&mut self, index: usize, change: impl FnOnce(&mut Slot)) {
        let count = |s: &Slot| (s.holder.is_none(), s.holder.is_none() && s.kept.is_some());
        let (open, kept) = count(&self.slots[index]);
        change(&mut self.slots[index]);
        let (now_open, now_kept) = count(&self.slots[index]);
        self.open = self.open + usize::from(now_open) - usize::from(open);
        self.kept = self.kept + usize::from(now_kept) - usize::from(kept);
    }

    /// Slot `index` came open now: last in the freed queue.
    fn freed_now(&mut self, index: usize) {
        self.frees += 1;
        self.slots[index].freed = self.frees;
        self.freed.push_back((self.frees, index));
        if self.freed.len() > 2 * self.slots.len() + 16 {
            let slots = &self.slots;
            self.freed
                .retain(|&(f, i)| slots[i].holder.is_none() && slots[i].freed == f);
        }
    }

    /// Slot `index` (open) goes to `holder`: no longer kept, its cache now the holder's
    /// conversation's.
    pub(crate) fn hold(&mut self, index: usize, holder: Holder) {
        let cached = holder
            .ticket
            .conversation
            .map(|k| (k, holder.ticket.tokens));
        let mut was = None;
        let group = holder.ticket.group;
        self.change(index, |slot| {
            was = slot.cached;
            slot.group = Some(group);
            slot.holder = Some(holder);
            slot.kept = None;
            slot.cached = cached;
        });
        while self.freed.front().is_some_and(|&e| !self.live(e)) {
            self.freed.pop_front();
        }
        match (was, cached) {
            (Some((k, from)), Some((now, to))) if k == now => {
                if let Some(c) = self.caching.get_mut(&k) {
                    unlist(&mut c.open, index);
                }
                self.retally(k, Some(from), Some(to));
            }
            _ => {
                if let Some((k, from)) = was {
                    if let Some(c) = self.caching.get_mut(&k) {
                        unlist(&mut c.open, index);
                        unlist(&mut c.slots, index);
                        if c.slots.is_empty() {
                            self.caching.remove(&k);
                        } else {
                            self.retally(k, Some(from), None);
                        }
                    }
                }
                if let Some((k, to)) = cached {
                    self.caching.entry(k).or_default().slots.push(index);
                    self.retally(k, None, Some(to));
                }
            }
        }
    }

    /// One slot of `conversation` went from `from` tokens of it to `to` (see
    /// [`Caching::tally`]); the most counted again over its slots when its last went lower.
    fn retally(&mut self, conversation: u64, from: Option<u64>, to: Option<u64>) {
        let Some(c) = self.caching.get_mut(&conversation) else {
            return;
        };
        if c.tally(from, to) {
            let slots = &self.slots;
            let tokens = || {
                c.slots
                    .iter()
                    .filter_map(|&i| slots[i].cached.map(|(_, n)| n))
            };
            let most = tokens().max().unwrap_or(0);
            c.at_most = tokens().filter(|&n| n == most).count();
            c.most = most;
        }
    }

    /// Slot `index` came open: open among its conversation's.
    fn opened(&mut self, index: usize) {
        self.freed_now(index);
        let k = self.slots[index].cached.map(|(k, _)| k);
        if let Some(c) = k.and_then(|k| self.caching.get_mut(&k)) {
            c.open.push(index);
        }
    }

    /// Slot `index`'s holder, when it is the one of `grant`, gives it back: it is open, freed
    /// now. `None`: someone else holds it (or nobody).
    pub(crate) fn free(&mut self, index: usize, grant: u64) -> Option<Holder> {
        if self.slots[index].holder.as_ref()?.grant != grant {
            return None;
        }
        let mut h = None;
        self.change(index, |slot| h = slot.holder.take());
        self.opened(index);
        h
    }

    /// Slot `index`'s grant never reached its request: open again (last in the freed order).
    pub(crate) fn ungrant(&mut self, index: usize) {
        if self.slots[index].holder.is_some() {
            self.change(index, |slot| slot.holder = None);
            self.opened(index);
        }
    }

    /// No slot's cache is known to be one cache group's any more (a request ran where its
    /// backend chose).
    pub(crate) fn forget_groups(&mut self) {
        for slot in &mut self.slots {
            slot.group = None;
        }
    }

    /// Slot `index` (open) kept so, or no longer kept.
    pub(crate) fn keep(&mut self, index: usize, kept: Option<Kept>) {
        self.change(index, |slot| slot.kept = kept);
    }

    /// The open slots kept for a conversation, in the order they were freed.
    pub(crate) fn kept(&self) -> Vec<usize> {
        if self.kept == 0 {
            return Vec::new();
        }
        let kept = |&i: &usize| self.slots[i].kept.is_some();
        self.open_slots().filter(kept).collect()
    }

    /// Whether every slot but `index` holds a request that `schedule` lets preempt no more.
    pub(crate) fn spent_but(&self, index: usize, schedule: &Scheduling) -> bool {
        let other_open = match self.open {
            0 => false,
            1 => self.slots[index].holder.is_some(),
            _ => true,
        };
        if other_open {
            return false;
        }
        self.slots.iter().enumerate().all(|(i, s)| {
            i == index
                || s.holder
                    .as_ref()
                    .is_some_and(|h| schedule.spent(h.ticket.class, h.ticket.preemptions))
        })
    }

    /// The slots caching `conversation`, all of them or the open ones (in the order freed).
    fn of(&self, conversation: u64, open: bool) -> impl DoubleEndedIterator<Item = (usize, &Slot)> {
        let c = self.caching.get(&conversation);
        let list = c.map_or(&[][..], |c| if open { &c.open[..] } else { &c.slots[..] });
        list.iter().map(|&i| (i, &self.slots[i]))
    }

    /// The slot a request of `conversation` takes at `now`: the open one holding its
    /// conversation (the one freed last, when several do: its latest turn), else (with
    /// `group`, where caches are kept to their groups) the open one kept for nobody that its
    /// cache group held last, used least recently, else the open one kept for nobody used
    /// least recently, else any open one.
    pub(crate) fn choose(
        &self,
        conversation: Option<u64>,
        group: Option<u64>,
        now: Instant,
    ) -> Option<usize> {
        let own = conversation.and_then(|k| {
            self.of(k, true)
                .rev()
                .find(|(_, s)| s.open_to(conversation, now))
                .map(|(i, _)| i)
        });
        let grouped = || {
            let g = group?;
            self.open_slots().find(|&i| {
                let s = &self.slots[i];
                s.kept.is_none() && s.group == Some(g)
            })
        };
        own.or_else(grouped).or_else(|| {
            // Those kept for nobody first, then the kept ones, each in the order freed.
            let mut open = self.open_slots();
            let unkept = open.find(|&i| self.slots[i].kept.is_none());
            unkept.or_else(|| {
                self.open_slots().find(|&i| {
                    let s = &self.slots[i];
                    s.kept.is_some() && s.open_to(conversation, now)
                })
            })
        })
    }

    /// The slot kept for `conversation`, if any is (and open).
    pub(crate) fn kept_for(&self, conversation: u64, now: Instant) -> Option<usize> {
        // Most of the time no slot is kept at all: the count says so.
        if self.kept == 0 {
            return None;
        }
        self.of(conversation, true)
            .rev()
            .find(|(_, s)| {
                s.kept
                    .is_some_and(|kept| kept.conversation == conversation && now < kept.until)
            })
            .map(|(i, _)| i)
    }

    /// Slot `index`, when it still caches `conversation`, now caches `tokens` of it (what a
    /// request of it left there; the conversation's other slots keep what they held).
    pub(crate) fn cache(&mut self, index: usize, conversation: u64, tokens: u64) {
        if let Some((k, n)) = self.slots.get_mut(index).and_then(|s| s.cached.as_mut()) {
            if *k == conversation {
                let from = std::mem::replace(n, tokens);
                self.retally(conversation, Some(from), Some(tokens));
            }
        }
    }

    /// Tokens of `conversation` a slot holds (the most any one holds).
    pub(crate) fn cached(&self, conversation: u64) -> Option<u64> {
        self.caching.get(&conversation).map(|c| c.most)
    }

    /// Requests of `conversation` holding a slot (each holds one caching it).
    pub(crate) fn held_by(&self, conversation: u64) -> u32 {
        self.caching
            .get(&conversation)
            .map_or(0, |c| (c.slots.len() - c.open.len()) as u32)
    }

    /// A request of another class waits: the `idle` holder granted last that may still give
    /// its slot up is told to (at once: an idle request takes only what nobody waits for).
    /// Whether one was.
    pub(crate) fn yield_idle(&mut self) -> bool {
        let newest = self
            .slots
            .iter_mut()
            .filter_map(|s| s.holder.as_mut())
            .filter(|h| h.ticket.class == Priority::Idle && h.preempt.is_some())
            .max_by_key(|h| h.grant);
        newest
            .and_then(|h| h.preempt.take())
            .is_some_and(|tx| tx.send(()).is_ok())
    }

    /// The holder a request of class `class` takes a slot from at `now`, when every slot is
    /// held by a worse class and none is predicted to be free within `soon`: of those that
    /// sent their client nothing yet and may still be preempted, the one with the most
    /// predicted prefill left (none with none left).
    pub(crate) fn victim(&self, class: Priority, now: Instant, soon: Duration) -> Option<usize> {
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

#[cfg(test)]
mod tests;
