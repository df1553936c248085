//! A client's limits kept in the shared store: one budget and one count of requests in
//! flight for every process. This process keeps a copy of the levels the store last
//! reported (for the rate-limit headers and the status page) and counts on that copy alone
//! while the store is unreachable.

use std::sync::Arc;
use std::time::Instant;

use super::limiter::{Limiter, Limits, Local, Refusal, Standing};
use crate::shared::buckets::{Spec, Specs};
use crate::shared::lease::{Lease, Take};
use crate::shared::places::Places;
use crate::shared::Store;

/// The limits of one client in the store.
#[derive(Debug)]
pub(crate) struct Shared {
    store: Arc<Store>,
    /// The client's buckets in the store.
    key: Arc<str>,
    /// Its requests in flight in the store.
    inflight: Places,
    /// The levels last reported, refilled here between reports; the whole count while the
    /// store is unreachable.
    local: Local,
}

impl Shared {
    /// The limits of client `name` in `store`, its buckets of `kind` (`client`: requests and
    /// tokens; `gpu`: GPU-milliseconds).
    pub(crate) fn new(
        store: Arc<Store>,
        kind: &str,
        name: &str,
        limits: Limits,
        now: Instant,
    ) -> Shared {
        Shared {
            key: Store::key(kind, name),
            inflight: Places::new("inflight", name),
            store,
            local: Local::new(limits, now),
        }
    }

    fn specs(&self) -> Specs {
        self.local
            .specs()
            .map(|b| b.map(|(capacity, window)| Spec { capacity, window }))
    }

    fn limited(&self) -> bool {
        self.local.specs().iter().any(Option::is_some)
    }
}

#[async_trait::async_trait]
impl Limiter for Shared {
    async fn reserve(&self, tokens: u64, now: Instant) -> Result<Standing, Refusal> {
        if !self.limited() {
            return Ok(Standing::default());
        }
        match self.store.reserve(&self.key, &self.specs(), tokens).await {
            Some(got) => {
                self.local.adopt(got.levels, now);
                if got.took {
                    Ok(self.local.standing(now))
                } else {
                    Err(self.local.refusal(tokens, now))
                }
            }
            None => self.local.take(tokens, now),
        }
    }

    fn settle(&self, reserved: u64, used: u64, now: Instant) {
        self.local.settle(reserved, used, now);
        let back = reserved as i64 - used as i64;
        if back != 0 && self.limited() {
            self.store.settle(&self.key, &self.specs(), back);
        }
    }

    fn standing(&self, now: Instant) -> Standing {
        self.local.standing(now)
    }

    fn reconfigure(&self, limits: Limits) {
        self.local.reconfigure(limits);
    }

    async fn enter(&self, max: u32, here: u32) -> Result<Option<Lease>, ()> {
        let mut asking = self.store.ask(&self.inflight, None);
        match asking.take(max).await {
            Take::Taken => Ok(Some(asking.hold())),
            Take::Full => Err(()),
            Take::Down if here >= max => Err(()),
            Take::Down => Ok(Some(asking.hold())),
        }
    }
}
