//! Per-backend concurrency: as many requests as the backend has slots, the rest wait in a bounded queue.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ProxyError;

/// Told of a request's time in the queue (the per-alias queue metrics).
pub trait QueueWatch: Sync {
    /// A request starts waiting.
    fn entered(&self);
    /// It stopped waiting, after `waited`, whether it got a slot or not.
    fn left(&self, waited: Duration);
}

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
    watch: &'a dyn QueueWatch,
    since: Instant,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.slots.waiting.fetch_sub(1, Ordering::AcqRel);
        self.watch.left(self.since.elapsed());
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

    /// Slots taken now.
    pub fn busy(&self) -> u32 {
        let free = u32::try_from(self.sem.available_permits()).unwrap_or(u32::MAX);
        self.slots.saturating_sub(free)
    }

    /// Take a slot, waiting in the queue up to `timeout`.
    pub async fn acquire(
        &self,
        alias: &str,
        timeout: Duration,
        watch: &dyn QueueWatch,
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
        watch.entered();
        let _waiting = Waiting {
            slots: self,
            watch,
            since: Instant::now(),
        };
        let permit = tokio::time::timeout(timeout, Arc::clone(&self.sem).acquire_owned()).await;
        match permit {
            Ok(Ok(p)) => Ok(SlotPermit(p)),
            _ => Err(overloaded()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicI64;

    use super::*;

    /// Counts the requests waiting, as the queue gauge does.
    #[derive(Default)]
    struct Queued(AtomicI64);

    impl QueueWatch for Queued {
        fn entered(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        fn left(&self, _waited: Duration) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn queues_then_rejects_when_full() {
        let m = Queued::default();
        let slots = Slots::new(1, 1);
        let first = slots
            .acquire("a", Duration::from_secs(5), &m)
            .await
            .unwrap();
        assert_eq!(slots.busy(), 1);
        let waiter = slots.acquire("a", Duration::from_secs(5), &m);
        tokio::pin!(waiter);
        // Poll once so the waiter enters the queue.
        assert!(futures_util::poll!(waiter.as_mut()).is_pending());
        assert_eq!(m.0.load(Ordering::SeqCst), 1);
        let third = slots.acquire("a", Duration::from_secs(5), &m).await;
        assert!(matches!(third, Err(ProxyError::Overloaded { .. })));
        drop(first);
        let second = waiter.await.unwrap();
        assert_eq!(m.0.load(Ordering::SeqCst), 0);
        drop(second);
        assert_eq!(slots.busy(), 0);
    }
}
