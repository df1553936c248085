//! A backend's slots one by one: who holds each (and what it may still be asked to give up),
//! whose conversation each holds in its cache, and which one a grant takes — the slot holding
//! the request's conversation, else the one used least recently, never one kept for another
//! conversation's next turn. Indexed so that a grant, a release and a conversation's lookups
//! cost the same with 4 slots or 4,096: the open slots in the order they were freed, and each
//! conversation's slots.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use foldhash::HashMap;

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
    /// When it was last freed, as the table counts frees (0: never; the least recently used
    /// goes to a request without a slot of its own).
    freed: u64,
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

/// The slots of one backend. Its fields change only through its methods, which keep the
/// indexes with the slots.
#[derive(Debug)]
pub(super) struct Table {
    pub slots: Vec<Slot>,
    /// The slots nobody holds, by (kept, freed, index): the least recently freed of those kept
    /// for nobody first.
    open: BTreeSet<(bool, u64, usize)>,
    /// The slots whose cache holds each conversation.
    caching: HashMap<u64, Vec<usize>>,
    frees: u64,
}

impl Table {
    pub fn new(n: u32) -> Table {
        Table {
            slots: (0..n).map(|_| Slot::default()).collect(),
            open: (0..n as usize).map(|i| (false, 0, i)).collect(),
            caching: HashMap::default(),
            frees: 0,
        }
    }

    fn open_key(&self, index: usize) -> (bool, u64, usize) {
        let s = &self.slots[index];
        (s.kept.is_some(), s.freed, index)
    }

    /// Slot `index` (open) goes to `holder`: no longer kept, its cache now the holder's
    /// conversation's.
    pub fn hold(&mut self, index: usize, holder: Holder) {
        self.open.remove(&self.open_key(index));
        let cached = holder
            .ticket
            .conversation
            .map(|k| (k, holder.ticket.tokens));
        let slot = &mut self.slots[index];
        let was = slot.cached.map(|(k, _)| k);
        slot.holder = Some(holder);
        slot.kept = None;
        slot.cached = cached;
        let now = cached.map(|(k, _)| k);
        if was != now {
            if let Some(k) = was {
                if let Some(list) = self.caching.get_mut(&k) {
                    list.retain(|&i| i != index);
                    if list.is_empty() {
                        self.caching.remove(&k);
                    }
                }
            }
            if let Some(k) = now {
                self.caching.entry(k).or_default().push(index);
            }
        }
    }

    /// Slot `index`'s holder, when it is the one of `grant`, gives it back: it is open, freed
    /// now. `None`: someone else holds it (or nobody).
    pub fn free(&mut self, index: usize, grant: u64) -> Option<Holder> {
        let h = self.slots[index].holder.take_if(|h| h.grant == grant)?;
        self.frees += 1;
        self.slots[index].freed = self.frees;
        self.open.insert(self.open_key(index));
        Some(h)
    }

    /// Slot `index`'s grant never reached its request: open again as it was before.
    pub fn ungrant(&mut self, index: usize) {
        if self.slots[index].holder.take().is_some() {
            self.open.insert(self.open_key(index));
        }
    }

    /// Slot `index` (open) kept so, or no longer kept.
    pub fn keep(&mut self, index: usize, kept: Option<Kept>) {
        let was = self.open.remove(&self.open_key(index));
        self.slots[index].kept = kept;
        if was {
            self.open.insert(self.open_key(index));
        }
    }

    /// The open slots kept for a conversation.
    pub fn kept(&self) -> Vec<usize> {
        self.kept_open().collect()
    }

    /// The open slots kept for a conversation, as the open index orders them.
    fn kept_open(&self) -> impl Iterator<Item = usize> + '_ {
        self.open.range((true, 0, 0)..).map(|&(_, _, i)| i)
    }

    /// Whether every slot but `index` holds a request that `schedule` lets preempt no more.
    pub fn spent_but(&self, index: usize, schedule: &Scheduling) -> bool {
        if self.open.iter().any(|&(_, _, i)| i != index) {
            return false;
        }
        self.slots.iter().enumerate().all(|(i, s)| {
            i == index
                || s.holder
                    .as_ref()
                    .is_some_and(|h| schedule.spent(h.ticket.class, h.ticket.preemptions))
        })
    }

    /// The slots caching `conversation`.
    fn of(&self, conversation: u64) -> impl Iterator<Item = (usize, &Slot)> {
        let list = self.caching.get(&conversation).map_or(&[][..], |l| &l[..]);
        list.iter().map(|&i| (i, &self.slots[i]))
    }

    /// The slot a request of `conversation` takes at `now`: the open one holding its
    /// conversation (the first, when several do), else the open one kept for nobody used least recently, else any open one.
    pub fn choose(&self, conversation: Option<u64>, now: Instant) -> Option<usize> {
        let own = conversation.and_then(|k| {
            self.of(k)
                .filter(|(_, s)| s.open_to(conversation, now))
                .map(|(i, _)| i)
                .min()
        });
        own.or_else(|| {
            self.open
                .iter()
                .map(|&(_, _, i)| i)
                .find(|&i| self.slots[i].open_to(conversation, now))
        })
    }

    /// The slot kept for `conversation`, if any is (and open).
    pub fn kept_for(&self, conversation: u64, now: Instant) -> Option<usize> {
        // Most of the time no slot is kept at all: one look at the open index says so.
        self.kept_open().next()?;
        self.of(conversation)
            .filter(|(_, s)| {
                s.holder.is_none()
                    && s.kept
                        .is_some_and(|kept| kept.conversation == conversation && now < kept.until)
            })
            .map(|(i, _)| i)
            .min()
    }

    /// Slot `index`, when it still caches `conversation`, now caches `tokens` of it (what a
    /// request of it left there; the conversation's other slots keep what they held).
    pub fn cache(&mut self, index: usize, conversation: u64, tokens: u64) {
        if let Some((k, n)) = self.slots.get_mut(index).and_then(|s| s.cached.as_mut()) {
            if *k == conversation {
                *n = tokens;
            }
        }
    }

    /// Tokens of `conversation` a slot holds (the most any one holds).
    pub fn cached(&self, conversation: u64) -> Option<(usize, u64)> {
        self.of(conversation)
            .filter_map(|(i, s)| match s.cached {
                Some((c, n)) if c == conversation => Some((i, n)),
                _ => None,
            })
            .max_by_key(|(_, n)| *n)
    }

    /// Requests of `conversation` holding a slot.
    pub fn held_by(&self, conversation: u64) -> u32 {
        let of = |(_, s): &(usize, &Slot)| {
            s.holder
                .as_ref()
                .is_some_and(|h| h.ticket.conversation == Some(conversation))
        };
        self.of(conversation).filter(of).count() as u32
    }

    /// The holder a request of class `class` takes a slot from at `now`, when every slot is
    /// held by a worse class and none is predicted to be free within `soon`: of those that
    /// sent their client nothing yet and may still be preempted, the one with the most
    /// predicted prefill left (none with none left).
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// One change to a table: a grant to the slot `choose` gives a request of a conversation
    /// (of `n` tokens), the holder of the `i`th held slot giving it back, the `i`th open slot
    /// kept for its conversation (until `at` ms) or no longer kept, tokens reported.
    #[derive(Debug, Clone)]
    enum Op {
        Grant(Option<u64>, u64),
        Free(usize),
        Keep(usize, u64),
        Unkeep(usize),
        Cache(usize, u64, u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        let conv = prop::option::of(0u64..4);
        prop_oneof![
            (conv, 1u64..100).prop_map(|(c, n)| Op::Grant(c, n)),
            (0usize..8).prop_map(Op::Free),
            (0usize..8, 0u64..40).prop_map(|(i, at)| Op::Keep(i, at)),
            (0usize..8).prop_map(Op::Unkeep),
            (0usize..8, 0u64..4, 1u64..100).prop_map(|(i, c, n)| Op::Cache(i, c, n)),
        ]
    }

    /// What the indexes answer, found by scanning every slot.
    fn scanned_choose(t: &Table, conversation: Option<u64>, now: Instant) -> Option<usize> {
        let open = || {
            t.slots
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
                .min_by_key(|(_, s)| (s.kept.is_some(), s.freed))
                .map(|(i, _)| i)
        })
    }

    fn check(t: &Table, now: Instant) {
        let open: Vec<usize> = t.open.iter().map(|&(_, _, i)| i).collect();
        let mut idle: Vec<usize> = (0..t.slots.len())
            .filter(|&i| t.slots[i].holder.is_none())
            .collect();
        let mut sorted = open.clone();
        sorted.sort_unstable();
        idle.sort_unstable();
        assert_eq!(sorted, idle, "the open set is the slots nobody holds");
        for c in [None, Some(0), Some(1), Some(2), Some(3)] {
            assert_eq!(t.choose(c, now), scanned_choose(t, c, now), "choose {c:?}");
        }
        for k in 0..4u64 {
            let of = |s: &Slot| s.cached.is_some_and(|(c, _)| c == k);
            let most = t
                .slots
                .iter()
                .filter(|s| of(s))
                .map(|s| s.cached.unwrap().1);
            assert_eq!(t.cached(k).map(|(_, n)| n), most.max(), "cached {k}");
            let held = t.slots.iter().filter(|s| {
                s.holder
                    .as_ref()
                    .is_some_and(|h| h.ticket.conversation == Some(k))
            });
            assert_eq!(t.held_by(k) as usize, held.count(), "held_by {k}");
            let kept = t.slots.iter().position(|s| {
                s.holder.is_none() && s.kept.is_some_and(|x| x.conversation == k && now < x.until)
            });
            assert_eq!(t.kept_for(k, now), kept, "kept_for {k}");
        }
        let mut kept = t.kept();
        kept.sort_unstable();
        let scanned: Vec<usize> = (0..t.slots.len())
            .filter(|&i| t.slots[i].holder.is_none() && t.slots[i].kept.is_some())
            .collect();
        assert_eq!(kept, scanned, "kept");
    }

    proptest! {
        /// The indexes answer as a scan of every slot does, after any changes.
        #[test]
        fn indexed_lookups_answer_as_a_scan_of_every_slot(
            n in 1u32..6,
            ops in prop::collection::vec(op(), 0..60),
        ) {
            let t0 = Instant::now();
            let now = t0 + Duration::from_millis(20);
            let mut t = Table::new(n);
            let mut grants = 0u64;
            for op in ops {
                match op {
                    Op::Grant(c, tokens) => {
                        let Some(i) = t.choose(c, now) else { continue };
                        grants += 1;
                        let ticket = Ticket { conversation: c, tokens, ..Ticket::plain(t0) };
                        let preempt = None;
                        t.hold(i, Holder { grant: grants, ticket, granted_at: t0, preempt });
                    }
                    Op::Free(i) => {
                        let held: Vec<usize> =
                            (0..t.slots.len()).filter(|&j| t.slots[j].holder.is_some()).collect();
                        if let Some(&j) = held.get(i % held.len().max(1)) {
                            let grant = t.slots[j].holder.as_ref().unwrap().grant;
                            prop_assert!(t.free(j, grant + 1).is_none());
                            prop_assert!(t.free(j, grant).is_some());
                        }
                    }
                    Op::Keep(..) | Op::Unkeep(_) if t.open.is_empty() => {}
                    Op::Keep(i, at) => {
                        let j = t.open.iter().nth(i % t.open.len()).unwrap().2;
                        let Some((conversation, _)) = t.slots[j].cached else { continue };
                        let until = t0 + Duration::from_millis(at);
                        t.keep(j, Some(Kept { conversation, until, class: Priority::Batch }));
                    }
                    Op::Unkeep(i) => {
                        let j = t.open.iter().nth(i % t.open.len()).unwrap().2;
                        t.keep(j, None);
                    }
                    Op::Cache(i, k, tokens) => t.cache(i, k, tokens),
                }
                check(&t, now);
            }
        }
    }
}
