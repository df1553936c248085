//! A bounded LRU-like cache of token counts per prompt fragment, keyed by a 128-bit hash.

use quick_cache::sync::Cache;
use quick_cache::DefaultHashBuilder;

/// Entries kept per alias. An entry is a 128-bit key and a count (about 40 bytes with the
/// table's overhead), so the cap is roughly 5 MiB; a 200k-token conversation uses about a
/// thousand entries.
pub(crate) const DEFAULT_ENTRIES: usize = 1 << 17;

/// Token counts of prompt fragments (text between special tokens), keyed by two
/// independently seeded 64-bit hashes of the fragment's bytes. The fragment carries its
/// role and content (`user\n…` between `<|im_start|>` and `<|im_end|>`), so the key is a
/// hash of both. Seeds are random per process: a collision needs 2^64 work per guess.
pub(crate) struct SegmentCache {
    cache: Cache<u128, u32>,
    h1: DefaultHashBuilder,
    h2: DefaultHashBuilder,
}

impl SegmentCache {
    pub(crate) fn new(entries: usize) -> SegmentCache {
        SegmentCache {
            cache: Cache::new(entries.max(16)),
            h1: DefaultHashBuilder::new(),
            h2: DefaultHashBuilder::new(),
        }
    }

    pub(crate) fn key(&self, text: &str) -> u128 {
        (u128::from(self.h1.hash_one(text)) << 64) | u128::from(self.h2.hash_one(text))
    }

    pub(crate) fn get(&self, key: u128) -> Option<u32> {
        self.cache.get(&key)
    }

    pub(crate) fn insert(&self, key: u128, count: u32) {
        self.cache.insert(key, count);
    }

    pub(crate) fn len(&self) -> usize {
        self.cache.len()
    }

    pub(crate) fn clear(&self) {
        self.cache.clear();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn keys_differ_and_entries_are_bounded() {
        let c = SegmentCache::new(100);
        assert_ne!(c.key("user\nhello"), c.key("assistant\nhello"));
        assert_eq!(c.key("a"), c.key("a"));
        for i in 0..1000u32 {
            c.insert(c.key(&i.to_string()), i);
        }
        assert!(c.len() <= 100);
        let k = c.key("x");
        c.insert(k, 7);
        assert_eq!(c.get(k), Some(7));
    }
}
