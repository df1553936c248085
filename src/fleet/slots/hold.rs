//! A slot kept for a conversation's next turn: how soon each conversation came back to the
//! slot its last turn left, and whether a slot its turn frees is worth keeping for it (see
//! [`keep_until`]); the scheduler hands a kept slot out when the hold ends.

use std::time::Instant;

use super::State;
use crate::fleet::ticket::Ticket;

/// Conversations whose return gap is remembered.
const GAPS: usize = 64;

/// Note how soon conversation `k` came back to the slot its last turn left.
pub(super) fn returned(st: &mut State, k: u64, now: Instant) {
    let Some((i, _)) = st.table.cached(k) else {
        return;
    };
    let slot = &st.table.slots[i];
    let Some(freed) = slot.freed_at.filter(|_| slot.holder.is_none()) else {
        return;
    };
    let gap = now.saturating_duration_since(freed);
    st.gaps.retain(|(c, _)| *c != k);
    if st.gaps.len() >= GAPS {
        st.gaps.remove(0);
    }
    st.gaps.push((k, gap));
}

/// Until when a slot freed by a request of `t` is kept for its conversation's next turn:
/// ordering by work with holds on, a slot of its own cache, others waiting (else it stays
/// open anyway) but none of its conversation, its client within the slack of the fair order's
/// next, and its conversation known to come back within the hold (kept twice that gap).
pub(super) fn keep_until(st: &State, t: &Ticket, now: Instant) -> Option<Instant> {
    let sched = &st.schedule;
    let k = t.conversation?;
    if !sched.by_work() || sched.slot_hold.is_zero() || !st.pinned || st.waiters.is_empty() {
        return None;
    }
    if st.waiters.iter().any(|w| w.ticket.conversation == Some(k)) {
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
    let gap = st.gaps.iter().find(|(c, _)| *c == k)?.1;
    (gap <= sched.slot_hold).then(|| now + (gap * 2).min(sched.slot_hold))
}
