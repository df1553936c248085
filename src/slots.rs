//! Per-backend concurrency: as many requests as the backend has slots, the rest wait in a bounded queue.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ProxyError;
use crate::metrics::AliasMetrics;

/// The slots of one backend.
#[derive(Debug)]
pub struct Slots {
    sem: Arc<Semaphore>,
    waiting: AtomicU32,
    slots: u32,
    queue: u32,
}

/// Held while a request occupies a backend slot; dropping it frees the slot.
#[derive(Debug)]
pub struct SlotPermit(#[allow(dead_code)] OwnedSemaphorePermit);

/// Undoes the queue bookkeeping however the wait ends (granted, timed out, or client gone).
struct Waiting<'a> {
    slots: &'a Slots,
    metrics: &'a AliasMetrics,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.slots.waiting.fetch_sub(1, Ordering::AcqRel);
        self.metrics.queued.dec();
    }
}

impl Slots {
    pub fn new(slots: u32, queue: u32) -> Slots {
        Slots {
            sem: Arc::new(Semaphore::new(slots as usize)),
            waiting: AtomicU32::new(0),
            slots,
            queue,
        }
    }

    pub fn slots(&self) -> u32 {
        self.slots
    }

    pub fn queue_limit(&self) -> u32 {
        self.queue
    }

    /// Take a slot, waiting in the queue up to `timeout`.
    pub async fn acquire(
        &self,
        alias: &str,
        timeout: Duration,
        metrics: &AliasMetrics,
    ) -> Result<SlotPermit, ProxyError> {
        if let Ok(p) = Arc::clone(&self.sem).try_acquire_owned() {
            return Ok(SlotPermit(p));
        }
        let overloaded = || ProxyError::Overloaded {
            alias: alias.to_string(),
            slots: self.slots,
            retry_after: 1,
        };
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.queue {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(overloaded());
        }
        metrics.queued.inc();
        let _waiting = Waiting {
            slots: self,
            metrics,
        };
        let started = Instant::now();
        let permit = tokio::time::timeout(timeout, Arc::clone(&self.sem).acquire_owned()).await;
        metrics.queue_wait.observe(started.elapsed().as_secs_f64());
        match permit {
            Ok(Ok(p)) => Ok(SlotPermit(p)),
            _ => Err(overloaded()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    #[tokio::test]
    async fn queues_then_rejects_when_full() {
        let m = Metrics::new().alias("a");
        let slots = Slots::new(1, 1);
        let first = slots
            .acquire("a", Duration::from_secs(5), &m)
            .await
            .unwrap();
        let waiter = slots.acquire("a", Duration::from_secs(5), &m);
        tokio::pin!(waiter);
        // Poll once so the waiter enters the queue.
        assert!(futures_util::poll!(waiter.as_mut()).is_pending());
        assert_eq!(m.queued.get(), 1);
        let third = slots.acquire("a", Duration::from_secs(5), &m).await;
        assert!(matches!(third, Err(ProxyError::Overloaded { .. })));
        drop(first);
        let _second = waiter.await.unwrap();
        assert_eq!(m.queued.get(), 0);
    }
}
