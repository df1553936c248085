//! Why a request got no slot, and what its client is told.

use std::time::Duration;

use crate::error::ProxyError;

/// Why a request got no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The queue was full, or the request's place in it went to a request of a better class
    /// or a fairer share: the 429 of a full queue.
    Full { slots: u32 },
    /// The wait ran out with room in the queue: no slot came free.
    TimedOut(Duration),
}

impl Refused {
    /// What the client of `alias` is told, when no other replica or fallback takes it.
    pub(crate) fn error(self, alias: &str) -> ProxyError {
        match self {
            Refused::Full { slots } => ProxyError::Overloaded {
                alias: alias.to_string(),
                slots,
                retry_after: 1,
            },
            Refused::TimedOut(waited) => ProxyError::QueueTimeout {
                alias: alias.to_string(),
                waited,
                retry_after: 1,
            },
        }
    }
}
