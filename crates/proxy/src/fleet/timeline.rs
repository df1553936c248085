//! A backend's slots over the last ten minutes, for the status page: each request that held a
//! slot as a bar from its grant to its end (its first token splits prefill from decode), and
//! each that lost its slot (preempted, or failed before an answer) as a mark.
//!
//! Bounded: the first [`ROWS`] slots of a backend (the page draws no more; a backend of more
//! slots, such as vLLM's, keeps no bar of the others), at most [`MOST`] bars. Once three
//! quarters full, a bar that follows the same client's bar on the same slot within a second
//! is merged into it; past the bound the oldest bar goes. One short lock per finished
//! request.

use crate::lock::Locked;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How far back the timeline reaches.
pub(crate) const SPAN: Duration = Duration::from_secs(600);
/// Bars kept a backend at most.
pub const MOST: usize = 600;
/// The slots a timeline keeps bars of: the first ones.
pub(crate) const ROWS: u32 = 16;

/// One request (or several merged) on one slot.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    pub slot: u32,
    pub start: Instant,
    /// Its first token: prefill before it, decode after.
    pub first: Option<Instant>,
    pub end: Instant,
    /// `None`: a request of no named client.
    pub client: Option<Arc<String>>,
    /// It lost its slot before it answered: how.
    pub lost: Option<Lost>,
    pub alias: Arc<String>,
    pub status: u16,
    /// Ended in an error (a 5xx, or a stream that broke off).
    pub error: bool,
    pub prompt: u64,
    pub output: u64,
    pub gpu_s: f64,
    /// Requests it stands for (more than one once merged).
    pub requests: u32,
}

/// How a request lost its slot before it answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lost {
    /// Its slot went to an `interactive` request; it went back to its queue.
    Preempted,
    /// Its attempt failed (or its client went away) before an answer.
    Failed,
}

#[derive(Debug, Default)]
pub struct Timeline {
    bars: Mutex<VecDeque<Bar>>,
}

impl Timeline {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Bar>> {
        self.bars.locked()
    }

    pub fn push(&self, bar: Bar) {
        if bar.slot >= ROWS {
            return;
        }
        let mut bars = self.lock();
        if bars.len() >= MOST * 3 / 4 {
            let same = bars.iter_mut().rev().find(|b| b.slot == bar.slot);
            if let Some(b) = same.filter(|b| mergeable(b, &bar)) {
                b.end = b.end.max(bar.end);
                b.error |= bar.error;
                b.prompt += bar.prompt;
                b.output += bar.output;
                b.gpu_s += bar.gpu_s;
                b.requests += bar.requests;
                return;
            }
        }
        while bars.len() >= MOST {
            bars.pop_front();
        }
        bars.push_back(bar);
    }

    /// The bars that end within [`SPAN`] of `now`, oldest first.
    pub fn recent(&self, now: Instant) -> Vec<Bar> {
        let from = now.checked_sub(SPAN);
        let mut bars = self.lock();
        while bars
            .front()
            .is_some_and(|b| from.is_some_and(|f| b.end < f))
        {
            bars.pop_front();
        }
        bars.iter().cloned().collect()
    }
}

/// `next` may join `b`: the same client and alias, both answered, starting within a second
/// of `b`'s end.
fn mergeable(b: &Bar, next: &Bar) -> bool {
    b.lost.is_none()
        && next.lost.is_none()
        && b.client == next.client
        && b.alias == next.alias
        && next.start.saturating_duration_since(b.end) <= Duration::from_secs(1)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn bar(slot: u32, start: Instant, secs: u64, client: &str) -> Bar {
        Bar {
            slot,
            start,
            first: Some(start + Duration::from_millis(100)),
            end: start + Duration::from_secs(secs),
            client: Some(Arc::new(client.into())),
            lost: None,
            alias: Arc::new("a".into()),
            status: 200,
            error: false,
            prompt: 10,
            output: 5,
            gpu_s: 1.0,
            requests: 1,
        }
    }

    #[test]
    fn bars_of_slots_past_the_drawn_rows_are_not_kept() {
        let t = Timeline::default();
        let start = Instant::now();
        t.push(bar(ROWS, start, 1, "ann"));
        assert!(t.recent(start).is_empty());
        t.push(bar(ROWS - 1, start, 1, "ann"));
        assert_eq!(t.recent(start).len(), 1);
    }

    #[test]
    fn bars_are_kept_ten_minutes_and_bounded() {
        let t0 = Instant::now();
        let t = Timeline::default();
        t.push(bar(0, t0, 1, "ann"));
        t.push(bar(1, t0 + Duration::from_secs(5), 1, "bob"));
        assert_eq!(t.recent(t0 + Duration::from_secs(10)).len(), 2);
        // Ten minutes after the first ended, it is gone.
        assert_eq!(t.recent(t0 + Duration::from_secs(602)).len(), 1);
        // Alternating clients never merge: past the bound the oldest goes.
        let t = Timeline::default();
        for i in 0..(MOST as u64 + 50) {
            let who = if i % 2 == 0 { "ann" } else { "bob" };
            t.push(bar(0, t0 + Duration::from_secs(i), 1, who));
        }
        let kept = t.recent(t0 + Duration::from_secs(MOST as u64 + 50));
        assert_eq!(kept.len(), MOST);
        assert_eq!(kept[0].start, t0 + Duration::from_secs(50));
    }

    #[test]
    fn a_full_timeline_merges_a_clients_back_to_back_requests() {
        let t0 = Instant::now();
        let t = Timeline::default();
        for i in 0..(MOST as u64) {
            t.push(bar(0, t0 + Duration::from_secs(i), 1, "ann"));
        }
        let kept = t.recent(t0 + Duration::from_secs(MOST as u64));
        assert_eq!(kept.len(), MOST * 3 / 4);
        let last = kept.last().unwrap();
        assert_eq!(last.requests as usize, MOST - MOST * 3 / 4 + 1);
        assert_eq!(last.end, t0 + Duration::from_secs(MOST as u64));
        assert_eq!(
            kept.iter().map(|b| b.requests as usize).sum::<usize>(),
            MOST
        );
    }
}
