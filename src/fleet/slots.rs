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
        self.slots.saturating_sub(self.free())
    }

    /// Slots free right now.
    pub fn free(&self) -> u32 {
        u32::try_from(self.sem.available_permits()).unwrap_or(u32::MAX)
    }

    /// Requests holding a slot or waiting for one.
    pub fn load(&self) -> u32 {
        self.busy() + self.waiting.load(Ordering::Acquire)
    }

    /// A slot now, without waiting.
    pub fn try_acquire(&self) -> Option<SlotPermit> {
        Arc::clone(&self.sem)
            .try_acquire_owned()
            .ok()
            .map(SlotPermit)
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
            // The wait ran out: the queue had room, the slots never came free.
            _ => Err(ProxyError::QueueTimeout {
                alias: alias.to_string(),
                waited: timeout,
                retry_after: 1,
            }),
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

    /// Regression (issue 19): a wait that runs out with room in the queue is a 503 saying
    /// so, not the 429 of a full queue.
    #[tokio::test]
    async fn r19_queue_wait_running_out_is_not_a_full_queue() {
        let m = Queued::default();
        let slots = Slots::new(1, 4);
        let _held = slots.try_acquire().unwrap();
        let waited = slots.acquire("a", Duration::from_millis(20), &m).await;
        let e = waited.unwrap_err();
        assert!(matches!(e, ProxyError::QueueTimeout { .. }), "{e:?}");
        assert_eq!(e.parts().0, axum::http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(m.0.load(Ordering::SeqCst), 0);
        assert_eq!(slots.load(), 1);
    }
}
