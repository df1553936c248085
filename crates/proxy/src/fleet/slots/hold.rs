//! A slot kept for a conversation's next turn: how soon each conversation's next turn came
//! after its last gave its slot back ([`Returns`]), and whether a slot its turn frees is worth
//! keeping for it ([`keep_until`]); the scheduler hands a kept slot out when the hold ends.

use std::time::{Duration, Instant};

use super::State;
use crate::fleet::ticket::Ticket;

/// Conversations remembered, each way.
const KEPT: usize = 64;

/// The least a slot is kept for (a turn that came back at once may come a little later).
const LEAST_HOLD: Duration = Duration::from_millis(50);

/// When each conversation's last turn gave its slot back, and how soon its next came.
#[derive(Debug, Default)]
pub(super) struct Returns {
    freed: Vec<(u64, Instant)>,
    gaps: Vec<(u64, Duration)>,
}

/// `(k, v)` as the only entry of `k` in `list`, the oldest entry dropped past [`KEPT`].
fn put<V>(list: &mut Vec<(u64, V)>, k: u64, v: V) {
    list.retain(|(c, _)| *c != k);
    if list.len() >= KEPT {
        list.remove(0);
    }
    list.push((k, v));
}

impl Returns {
    /// A turn of conversation `k` gave its slot back at `now`.
    pub(crate) fn freed(&mut self, k: u64, now: Instant) {
        put(&mut self.freed, k, now);
    }

    /// The next turn of conversation `k` came at `now`: how soon is noted.
    pub(crate) fn returned(&mut self, k: u64, now: Instant) {
        let Some(i) = self.freed.iter().position(|(c, _)| *c == k) else {
            return;
        };
        let (_, freed) = self.freed.swap_remove(i);
        put(&mut self.gaps, k, now.saturating_duration_since(freed));
    }

    fn gap(&self, k: u64) -> Option<Duration> {
        self.gaps.iter().find(|(c, _)| *c == k).map(|(_, g)| *g)
    }
}

/// Until when a slot freed by a request of `t` is kept for its conversation's next turn:
/// ordering by work with holds on, a slot of its own cache, others waiting (else it stays
/// open anyway) but none of its conversation, its client within the slack of the fair order's
/// next, and its conversation known to come back within the hold (kept twice that gap, at
/// least [`LEAST_HOLD`]).
pub(super) fn keep_until(st: &State, t: &Ticket, now: Instant) -> Option<Instant> {
    let sched = &st.schedule;
    let k = t.conversation?;
    if !sched.by_work() || sched.slot_hold.is_zero() || !st.pinned || st.waiters.is_empty() {
        return None;
    }
    // Nor for a better class waiting, nor past its own turn's waiters.
    if st
        .waiters
        .iter()
        .any(|w| w.ticket.conversation == Some(k) || w.ticket.class < t.class)
    {
        return None;
    }
    let next = st
        .waiters
        .iter()
        .map(|w| st.fair.start(w.ticket.client))
        .fold(f64::INFINITY, f64::min);
    if st.fair.start(t.client) > next + sched.pin_slack {
        return None;
    }
    let gap = st.returns.gap(k)?;
    (gap <= sched.slot_hold).then(|| now + (gap * 2).max(LEAST_HOLD).min(sched.slot_hold))
}
