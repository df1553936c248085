//! The slot table's tests: its invariants under any sequence of grants, frees, keeps and
//! reports (proptest), and a slot taken again and again.

use super::*;
use proptest::prelude::*;

/// One change to a table: a grant to the slot `choose` gives a request of a conversation
/// (of `n` tokens), the holder of the `i`th held slot giving it back, the `i`th open slot
/// kept for its conversation (until `at` ms) or no longer kept, tokens reported.
#[derive(Debug, Clone)]
enum Op {
    Grant(Option<u64>, u64),
    Free(usize),
    Ungrant(usize),
    Keep(usize, u64),
    Unkeep(usize),
    Cache(usize, u64, u64),
}

fn op() -> impl Strategy<Value = Op> {
    let conv = prop::option::of(0u64..4);
    prop_oneof![
        (conv, 1u64..100).prop_map(|(c, n)| Op::Grant(c, n)),
        (0usize..8).prop_map(Op::Free),
        (0usize..8).prop_map(Op::Ungrant),
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
            .filter(|(_, s)| s.cached.is_some_and(|(c, _)| c == k))
            .max_by_key(|(_, s)| s.freed)
            .map(|(i, _)| i)
    });
    own.or_else(|| {
        open()
            .min_by_key(|(_, s)| (s.kept.is_some(), s.freed))
            .map(|(i, _)| i)
    })
}

fn check(t: &Table, now: Instant) {
    let open: Vec<usize> = t.open_slots().collect();
    assert_eq!(t.open, open.len(), "the open count");
    let kept_open = open.iter().filter(|&&i| t.slots[i].kept.is_some()).count();
    assert_eq!(t.kept, kept_open, "the kept count");
    assert!(
        t.freed.len() <= 2 * t.slots.len() + 16,
        "the freed queue is swept"
    );
    let mut idle: Vec<usize> = (0..t.slots.len())
        .filter(|&i| t.slots[i].holder.is_none())
        .collect();
    let mut sorted = open.clone();
    sorted.sort_unstable();
    idle.sort_unstable();
    assert_eq!(sorted, idle, "the open set is the slots nobody holds");
    for c in [None, Some(0), Some(1), Some(2), Some(3)] {
        assert_eq!(
            t.choose(c, None, now),
            scanned_choose(t, c, now),
            "choose {c:?}"
        );
    }
    for k in 0..4u64 {
        let of = |s: &Slot| s.cached.is_some_and(|(c, _)| c == k);
        let most = t
            .slots
            .iter()
            .filter(|s| of(s))
            .map(|s| s.cached.unwrap().1);
        assert_eq!(t.cached(k), most.max(), "cached {k}");
        let held = t.slots.iter().filter(|s| {
            s.holder
                .as_ref()
                .is_some_and(|h| h.ticket.conversation == Some(k))
        });
        assert_eq!(t.held_by(k) as usize, held.count(), "held_by {k}");
        let mut open: Vec<usize> = t.of(k, true).map(|(i, _)| i).collect();
        open.sort_unstable();
        let scanned: Vec<usize> = (0..t.slots.len())
            .filter(|&i| t.slots[i].holder.is_none() && of(&t.slots[i]))
            .collect();
        assert_eq!(open, scanned, "the open slots caching {k}");
        let kept = (0..t.slots.len())
            .filter(|&i| {
                let s = &t.slots[i];
                s.holder.is_none() && s.kept.is_some_and(|x| x.conversation == k && now < x.until)
            })
            .max_by_key(|&i| t.slots[i].freed);
        assert_eq!(t.kept_for(k, now), kept, "kept_for {k}");
    }
    let mut kept = t.kept();
    kept.sort_unstable();
    let scanned: Vec<usize> = (0..t.slots.len())
        .filter(|&i| t.slots[i].holder.is_none() && t.slots[i].kept.is_some())
        .collect();
    assert_eq!(kept, scanned, "kept");
}

/// A conversation that keeps coming back to its slot while another slot stays open leaves
/// a stale entry in the freed queue at each release: swept, the queue stays within twice
/// the slots, and the open slot is still the one a newcomer takes.
#[test]
fn a_slot_taken_again_and_again_leaves_the_freed_queue_bounded() {
    let t0 = Instant::now();
    let mut t = Table::new(2);
    for grant in 1..=100u64 {
        let i = t.choose(Some(7), None, t0).unwrap();
        assert_eq!(i, 0);
        let ticket = Ticket {
            conversation: Some(7),
            tokens: 5,
            ..Ticket::plain(t0)
        };
        t.hold(
            i,
            Holder {
                grant,
                ticket,
                granted_at: t0,
                preempt: None,
            },
        );
        assert!(t.free(i, grant).is_some());
        assert!(t.freed.len() <= 2 * 2 + 16, "{} entries", t.freed.len());
    }
    assert_eq!(t.choose(Some(8), None, t0), Some(1));
}

proptest! {
    /// The indexes answer as a scan of every slot does, after any changes.
    #[test]
    fn indexed_lookups_answer_as_a_scan_of_every_slot(
        n in 1u32..6,
        ops in prop::collection::vec(op(), 0..200),
    ) {
        let t0 = Instant::now();
        let now = t0 + Duration::from_millis(20);
        let mut t = Table::new(n);
        let mut grants = 0u64;
        for op in ops {
            match op {
                Op::Grant(c, tokens) => {
                    let Some(i) = t.choose(c, None, now) else { continue };
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
                Op::Ungrant(i) => {
                    let held: Vec<usize> =
                        (0..t.slots.len()).filter(|&j| t.slots[j].holder.is_some()).collect();
                    if let Some(&j) = held.get(i % held.len().max(1)) {
                        t.ungrant(j);
                    }
                }
                Op::Keep(..) | Op::Unkeep(_) if t.open == 0 => {}
                Op::Keep(i, at) => {
                    let j = t.open_slots().nth(i % t.open).unwrap();
                    let Some((conversation, _)) = t.slots[j].cached else { continue };
                    let until = t0 + Duration::from_millis(at);
                    t.keep(j, Some(Kept { conversation, until, class: Priority::Batch }));
                }
                Op::Unkeep(i) => {
                    let j = t.open_slots().nth(i % t.open).unwrap();
                    t.keep(j, None);
                }
                Op::Cache(i, k, tokens) => t.cache(i, k, tokens),
            }
            check(&t, now);
        }
    }
}
