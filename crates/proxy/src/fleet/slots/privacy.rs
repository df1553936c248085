//! Whose prompt cache a request meets on a backend whose clients make several cache groups:
//! a slot's cache holds the prefixes of the request that held it last, so a request uses it
//! only where that request was of its own group; where the backend keeps prompts beyond its
//! slots (llama.cpp's host-memory cache), or the proxy does not choose the slot, none does.

use crate::config::Backend;
use crate::runtime::Privacy;

/// How a backend's slots keep cache groups apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Isolation {
    /// One group, or a runtime that keeps groups apart itself (a salted prefix cache): every
    /// request may use what a slot holds.
    #[default]
    Open,
    /// Each slot's cache is its last request's alone: a request prefers a slot its group held
    /// last, and uses the cache of no other.
    BySlot,
    /// No slot's cache is known to be one group's: no request uses any.
    Cold,
}

impl Isolation {
    /// The isolation of `backend`'s slots, `pinned` where it is told the slot each request
    /// takes.
    pub(crate) fn of(backend: &Backend, pinned: bool) -> Isolation {
        match backend.flavor.runtime().privacy {
            Privacy::Slots(_) if backend.isolated && pinned && !backend.cache_ram => {
                Isolation::BySlot
            }
            Privacy::Slots(_) if backend.isolated => Isolation::Cold,
            _ => Isolation::Open,
        }
    }

    /// The group a request of `group` looks for among the open slots, where slots are chosen
    /// by group.
    pub(super) fn prefers(self, group: u64) -> Option<u64> {
        (self == Isolation::BySlot).then_some(group)
    }

    /// Whether a request of `group` may use the cache of a slot that a request of `last`
    /// held last (`None`: none in this process).
    pub(super) fn warm(self, group: u64, last: Option<u64>) -> bool {
        match self {
            Isolation::Open => true,
            Isolation::BySlot => last == Some(group),
            Isolation::Cold => false,
        }
    }

    /// Whether any request may meet a conversation's cached prefix (for its prediction).
    pub(super) fn caches(self) -> bool {
        self != Isolation::Cold
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_warm_only_for_the_group_that_held_it_last() {
        assert!(Isolation::Open.warm(1, Some(2)));
        assert!(Isolation::Open.warm(1, None));
        assert!(Isolation::BySlot.warm(1, Some(1)));
        assert!(!Isolation::BySlot.warm(1, Some(2)));
        assert!(
            !Isolation::BySlot.warm(1, None),
            "a slot held before this process started"
        );
        assert!(!Isolation::Cold.warm(1, Some(1)));
        assert_eq!(Isolation::BySlot.prefers(3), Some(3));
        assert_eq!(Isolation::Open.prefers(3), None);
    }
}
