//! Which replica takes a request. A conversation's replicas are in an order every process
//! computes alike from the request alone: weighted rendezvous (highest-random-weight) hashing
//! of its key over the alias's replicas, weighted by slots. It goes to the first in that order
//! that is usable and has a free slot; when none has, to the least loaded (most free slots,
//! then fewest requests, then its own order). A request without a conversation goes to the
//! least loaded, ties in turn.
//!
//! The hash is XXH3-64 (seed 0 for the key, the key as the seed of a replica's score), fixed
//! by its specification: every process, build and platform computes the same key and order
//! (but for scores within a rounding error of each other, a chance of about one in 2^50).

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelValue;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Conversations remembered (the oldest are forgotten first).
const REMEMBERED: usize = 16 * 1024;

/// How a replica is loaded now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Load {
    /// Slots free.
    pub(crate) free: u32,
    /// Requests holding a slot or waiting for one.
    pub(crate) load: u32,
}

/// Whether `a` is less loaded than `b`: more free slots, then fewer requests.
fn less_loaded(a: Load, b: Load) -> bool {
    a.free > b.free || (a.free == b.free && a.load < b.load)
}

/// The best of `n` replicas by their `load` (`None`: unusable), ties broken in turn from
/// `turn`: the one with the most free slots, then the fewest requests.
pub(crate) fn least_loaded(
    n: usize,
    turn: usize,
    mut load: impl FnMut(usize) -> Option<Load>,
) -> Option<usize> {
    let mut best: Option<(usize, Load)> = None;
    for k in 0..n {
        let i = (turn + k) % n;
        let Some(l) = load(i) else { continue };
        if best.is_none_or(|(_, b)| less_loaded(l, b)) {
            best = Some((i, l));
        }
    }
    best.map(|(i, _)| i)
}

/// A replica as the choice for a conversation sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Replica<'a> {
    /// Its name: what the conversation's order is computed from (the same in every process
    /// that reads the same config).
    pub(crate) name: &'a str,
    /// Its weight in the order: its slots.
    pub(crate) weight: u32,
    pub(crate) load: Load,
}

/// Replica `name`'s score for conversation `key` in weighted rendezvous hashing:
/// `-weight / ln(u)`, `u` in (0, 1) from XXH3-64 of the name seeded with the key. The highest
/// score is the conversation's first replica; a replica of twice the weight is first for twice
/// the conversations, and taking a replica away moves only the conversations it had.
pub(crate) fn score(key: u64, name: &str, weight: u32) -> f64 {
    let h = xxh3_64_with_seed(name.as_bytes(), key);
    // The top 53 bits, centred in their step: strictly inside (0, 1).
    let u = ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    -f64::from(weight.max(1)) / u.ln()
}

/// The indices of `replicas` in conversation `key`'s order, first first (ties by index).
pub fn order(key: u64, replicas: &[(&str, u32)]) -> Vec<usize> {
    let mut scored: Vec<(f64, usize)> = replicas
        .iter()
        .enumerate()
        .map(|(i, (name, weight))| (score(key, name, *weight), i))
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    scored.into_iter().map(|(_, i)| i).collect()
}

/// Where a conversation goes among the usable replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pick {
    /// The replica it goes to.
    pub(crate) index: usize,
    /// The first usable replica of its order (`index` unless that one is full).
    pub(crate) first: usize,
}

/// The replica of `n` that conversation `key` goes to: the first in its order
/// ([`score`]) with a free slot, else the least loaded (ties in its order). `look` gives each
/// usable replica (`None`: unusable) and is called once for each.
pub(crate) fn for_conversation<'a>(
    key: u64,
    n: usize,
    mut look: impl FnMut(usize) -> Option<Replica<'a>>,
) -> Option<Pick> {
    let mut first: Option<(usize, f64)> = None;
    let mut first_free: Option<(usize, f64)> = None;
    let mut least: Option<(usize, Load, f64)> = None;
    for i in 0..n {
        let Some(r) = look(i) else { continue };
        let s = score(key, r.name, r.weight);
        if first.is_none_or(|(_, b)| s > b) {
            first = Some((i, s));
        }
        if r.load.free > 0 && first_free.is_none_or(|(_, b)| s > b) {
            first_free = Some((i, s));
        }
        let better = least.is_none_or(|(_, l, b)| less_loaded(r.load, l) || (r.load == l && s > b));
        if better {
            least = Some((i, r.load, s));
        }
    }
    let index = first_free.map(|(i, _)| i).or(least.map(|(i, _, _)| i))?;
    Some(Pick {
        index,
        first: first.map_or(index, |(i, _)| i),
    })
}

/// Where a conversation's request went, against where this process sent its last turn.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub(crate) enum AffinityResult {
    /// To the same replica (its prefix is likely cached there).
    hit,
    /// To another: the last one was full or unusable, or the conversation returns to its first
    /// replica after a spill, or another process sent the turns between.
    moved,
    /// A conversation this process had not seen (or forgot).
    new,
}

/// Conversation key → the backend this process last sent it to. A cache, never the source of
/// truth (that is the conversation's order, [`for_conversation`]): with `server.after_spill =
/// "stay"` a conversation that spilled stays where it went while that replica has room, and
/// `switchboard_affinity_total` compares each choice with it. Shared by every snapshot, so it
/// survives reloads; an entry naming a backend that is gone is a miss.
#[derive(Debug)]
pub struct Affinity {
    on: quick_cache::sync::Cache<u64, Arc<str>>,
}

impl Default for Affinity {
    fn default() -> Self {
        Affinity {
            on: quick_cache::sync::Cache::new(REMEMBERED),
        }
    }
}

impl Affinity {
    /// The backend conversation `key` is on.
    pub fn get(&self, key: u64) -> Option<Arc<str>> {
        self.on.get(&key)
    }

    /// Conversation `key` is now on `backend`.
    pub fn set(&self, key: u64, backend: &str) {
        self.on.insert(key, Arc::from(backend));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::fleet::conversation::{conversation_of, SESSION_HEADER};
    use http::HeaderMap;

    #[test]
    fn most_free_slots_then_fewest_requests_then_in_turn() {
        let loads = [
            Some(Load { free: 1, load: 3 }),
            Some(Load { free: 2, load: 2 }),
            None,
            Some(Load { free: 2, load: 1 }),
        ];
        assert_eq!(least_loaded(4, 0, |i| loads[i]), Some(3));
        let even = [Some(Load { free: 2, load: 0 }); 3];
        let picks: Vec<_> = (0..4)
            .map(|t| least_loaded(3, t, |i| even[i]).unwrap())
            .collect();
        assert_eq!(picks, [0, 1, 2, 0]);
        assert_eq!(least_loaded(2, 0, |_| None), None);
    }

    /// Values pinned: a change of hash, seed or piece framing moves every conversation of a
    /// fleet whose processes run different builds, and fails here first.
    #[test]
    fn the_hash_gives_the_same_values_on_every_build() {
        let h = HeaderMap::new();
        let body = br#"{"model":"a","messages":[{"role":"system","content":"S"},{"role":"user","content":"one"}]}"#;
        assert_eq!(
            conversation_of("a", &h, body).map(|c| c.key),
            Some(PINNED_KEY)
        );
        let mut with = HeaderMap::new();
        with.insert(SESSION_HEADER, http::HeaderValue::from_static("s1"));
        assert_eq!(
            conversation_of("a", &with, body).map(|c| c.key),
            Some(PINNED_SESSION)
        );
        assert_eq!(xxh3_64_with_seed(b"replica-a", 42), PINNED_SCORE_HASH);
        // `ln` may differ in its last bit between maths libraries: not an order's concern.
        assert!((score(42, "replica-a", 2) - PINNED_SCORE).abs() < 1e-12);
        assert_eq!(order(42, &[("a", 2), ("b", 2), ("c", 1)]), PINNED_ORDER);
    }

    // Computed apart with the xxHash reference library (its Python binding, `xxh3_64` over
    // the same length-prefixed pieces), not with this code.
    const PINNED_KEY: u64 = 209_996_440_636_044_310;
    const PINNED_SESSION: u64 = 12_833_073_199_391_975_794;
    const PINNED_SCORE_HASH: u64 = 2_394_117_551_950_378_356;
    const PINNED_SCORE: f64 = 0.979_492_764_866_475_7;
    const PINNED_ORDER: [usize; 3] = [1, 0, 2];

    /// Over many conversations each replica is first for its share of the weight, and taking
    /// one away moves only the conversations it had.
    #[test]
    fn conversations_spread_by_weight_and_stay_when_another_replica_goes() {
        let replicas = [("a", 1), ("b", 2), ("c", 1)];
        let keys = 0..20_000u64;
        let mut first = [0usize; 3];
        for k in keys.clone() {
            first[order(k.wrapping_mul(0x9e37_79b9_7f4a_7c15), &replicas)[0]] += 1;
        }
        let share = |i: usize| first[i] as f64 / 20_000.0;
        assert!((share(0) - 0.25).abs() < 0.02, "{first:?}");
        assert!((share(1) - 0.50).abs() < 0.02, "{first:?}");
        assert!((share(2) - 0.25).abs() < 0.02, "{first:?}");
        let without_c = [("a", 1), ("b", 2)];
        for k in keys.map(|k| k.wrapping_mul(0x9e37_79b9_7f4a_7c15)) {
            let all = order(k, &replicas);
            let two = order(k, &without_c);
            let names = |o: &[usize], r: &[(&str, u32)]| -> Vec<String> {
                o.iter().map(|&i| r[i].0.to_string()).collect()
            };
            let mut kept = names(&all, &replicas);
            kept.retain(|n| n != "c");
            assert_eq!(kept, names(&two, &without_c));
        }
    }

    /// Two balancers built apart (the replicas listed in another order, as two processes
    /// with their own config read might) give every conversation the same replicas in the same
    /// order, and the same second choice when the first is full.
    #[test]
    fn two_balancers_built_apart_agree_on_every_conversation() {
        let one = [("a", 2), ("b", 2), ("c", 4)];
        let other = [("c", 4), ("a", 2), ("b", 2)];
        let free = Load { free: 1, load: 1 };
        let full = Load { free: 0, load: 2 };
        for k in (0..2_000u64).map(|k| k.wrapping_mul(0x2545_f491_4f6c_dd1d)) {
            let names = |r: &[(&'static str, u32)]| -> Vec<&'static str> {
                order(k, r).iter().map(|&i| r[i].0).collect()
            };
            let o = names(&one);
            assert_eq!(o, names(&other));
            let pick = |r: &[(&'static str, u32)], full_one: &str| {
                let p = for_conversation(k, r.len(), |i| {
                    Some(Replica {
                        name: r[i].0,
                        weight: r[i].1,
                        load: if r[i].0 == full_one { full } else { free },
                    })
                })
                .unwrap();
                assert_eq!(r[p.first].0, o[0]);
                r[p.index].0
            };
            assert_eq!(pick(&one, ""), o[0]);
            assert_eq!(pick(&one, o[0]), o[1]);
            assert_eq!(pick(&other, o[0]), o[1]);
        }
    }

    #[test]
    fn a_conversation_goes_to_its_first_free_replica_else_the_least_loaded() {
        let names = ["a", "b", "c"];
        let key = 7;
        let o = order(key, &[("a", 1), ("b", 1), ("c", 1)]);
        let at = |loads: [Option<Load>; 3]| {
            for_conversation(key, 3, |i| {
                loads[i].map(|load| Replica {
                    name: names[i],
                    weight: 1,
                    load,
                })
            })
            .map(|p| p.index)
        };
        let free = Some(Load { free: 1, load: 0 });
        let mut loads = [free; 3];
        assert_eq!(at(loads), Some(o[0]));
        loads[o[0]] = None;
        assert_eq!(at(loads), Some(o[1]));
        // All full: the least loaded, whatever its rank.
        loads = [Some(Load { free: 0, load: 3 }); 3];
        loads[o[2]] = Some(Load { free: 0, load: 2 });
        assert_eq!(at(loads), Some(o[2]));
        // All full alike: the conversation's own first.
        loads[o[2]] = Some(Load { free: 0, load: 3 });
        assert_eq!(at(loads), Some(o[0]));
        assert_eq!(at([None; 3]), None);
    }
}
