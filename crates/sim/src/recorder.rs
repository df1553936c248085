//! What the simulator saw: received requests and the fate of each generation.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::HeaderMap;
use switchboard_sync::Locked;
use tokio::sync::Notify;

/// Requests kept for [`Recorder::requests`]; older ones are forgotten (counts stay exact).
const KEEP_REQUESTS: usize = 4096;
/// Body bytes kept across the remembered requests before the oldest are forgotten.
const KEEP_BODY_BYTES: usize = 64 << 20;

/// One request as the simulator received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// Where one generation ran in GPU mode, and how much of its prompt was cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuRun {
    /// The `id_slot` the request asked for, if any (as sent, before wrapping).
    pub id_slot: Option<i64>,
    /// The slot it ran on.
    pub slot: usize,
    /// Prompt tokens found in the cache (`cache_n`).
    pub cached: u32,
    /// Prompt tokens evaluated (`prompt_n`).
    pub prompt_n: u32,
}

/// Shared log of requests and generation outcomes; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    log: Mutex<Log>,
    received: AtomicUsize,
    cancelled: AtomicU32,
    completed: AtomicU32,
    failed: AtomicU32,
    queued: AtomicU32,
    running: AtomicU32,
    changed: Notify,
    gpu_runs: Mutex<VecDeque<GpuRun>>,
}

#[derive(Debug, Default)]
struct Log {
    requests: VecDeque<Recorded>,
    body_bytes: usize,
}

impl Recorder {
    /// Every request received, in order (the most recent 4096 when there were more).
    pub fn requests(&self) -> Vec<Recorded> {
        self.log().requests.iter().cloned().collect()
    }

    /// The last request received.
    pub fn last(&self) -> Option<Recorded> {
        self.log().requests.back().cloned()
    }

    /// How many requests were received in all.
    pub fn received(&self) -> usize {
        self.inner.received.load(Ordering::Acquire)
    }

    /// Generations whose client went away before the end (queued ones included).
    pub fn cancelled(&self) -> u32 {
        self.inner.cancelled.load(Ordering::Acquire)
    }

    /// Generations that ran to the end.
    pub fn completed(&self) -> u32 {
        self.inner.completed.load(Ordering::Acquire)
    }

    /// Streams cut on purpose by `fail_after`.
    pub fn failed(&self) -> u32 {
        self.inner.failed.load(Ordering::Acquire)
    }

    /// Generations waiting for a slot right now.
    pub fn queued(&self) -> u32 {
        self.inner.queued.load(Ordering::Acquire)
    }

    /// Generations holding a slot right now.
    pub fn running(&self) -> u32 {
        self.inner.running.load(Ordering::Acquire)
    }

    /// GPU mode: every generation that got a slot, in the order they got it (the most recent
    /// 4096).
    pub fn gpu_runs(&self) -> Vec<GpuRun> {
        self.inner.gpu_runs.locked().iter().copied().collect()
    }

    pub(crate) fn gpu_run(&self, run: GpuRun) {
        {
            let mut runs = self.inner.gpu_runs.locked();
            if runs.len() == KEEP_REQUESTS {
                runs.pop_front();
            }
            runs.push_back(run);
        }
        self.inner.changed.notify_waiters();
    }

    /// Resolves once `n` requests were received.
    pub async fn wait_requests(&self, n: usize) {
        self.wait_until(|r| r.received() >= n).await;
    }

    /// Resolves once `n` generations were cancelled.
    pub async fn wait_cancelled(&self, n: u32) {
        self.wait_until(|r| r.cancelled() >= n).await;
    }

    /// Resolves once `n` generations completed.
    pub async fn wait_completed(&self, n: u32) {
        self.wait_until(|r| r.completed() >= n).await;
    }

    /// Resolves once at least `n` generations wait for a slot.
    pub async fn wait_queued(&self, n: u32) {
        self.wait_until(|r| r.queued() >= n).await;
    }

    /// Resolves once at least `n` generations hold a slot.
    pub async fn wait_running(&self, n: u32) {
        self.wait_until(|r| r.running() >= n).await;
    }

    async fn wait_until(&self, done: impl Fn(&Self) -> bool) {
        loop {
            let notified = self.inner.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if done(self) {
                return;
            }
            notified.await;
        }
    }

    fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        self.inner.log.locked()
    }

    pub(crate) fn record(&self, req: Recorded) {
        {
            let mut log = self.log();
            log.body_bytes += req.body.len();
            log.requests.push_back(req);
            while log.requests.len() > KEEP_REQUESTS
                || (log.body_bytes > KEEP_BODY_BYTES && log.requests.len() > 1)
            {
                if let Some(old) = log.requests.pop_front() {
                    log.body_bytes -= old.body.len();
                }
            }
        }
        self.inner.received.fetch_add(1, Ordering::AcqRel);
        self.inner.changed.notify_waiters();
    }

    pub(crate) fn bump(&self, event: Event) {
        let i = &self.inner;
        match event {
            Event::Cancelled => i.cancelled.fetch_add(1, Ordering::AcqRel),
            Event::Completed => i.completed.fetch_add(1, Ordering::AcqRel),
            Event::Failed => i.failed.fetch_add(1, Ordering::AcqRel),
            Event::Queued => i.queued.fetch_add(1, Ordering::AcqRel),
            Event::Dequeued => i.queued.fetch_sub(1, Ordering::AcqRel),
            Event::Started => i.running.fetch_add(1, Ordering::AcqRel),
            Event::Stopped => i.running.fetch_sub(1, Ordering::AcqRel),
        };
        i.changed.notify_waiters();
    }
}

/// A change in a generation's life.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Event {
    Cancelled,
    Completed,
    Failed,
    Queued,
    Dequeued,
    Started,
    Stopped,
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn req(body: &'static str) -> Recorded {
        Recorded {
            method: "POST".into(),
            path: "/x".into(),
            headers: HeaderMap::new(),
            body: Bytes::from_static(body.as_bytes()),
        }
    }

    #[tokio::test]
    async fn wait_requests_wakes_on_record() {
        let rec = Recorder::default();
        let waiter = tokio::spawn({
            let rec = rec.clone();
            async move { rec.wait_requests(2).await }
        });
        rec.record(req("a"));
        rec.record(req("b"));
        tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("waiter finished")
            .expect("no panic");
        assert_eq!(rec.last().expect("a request").body, "b");
        assert_eq!(rec.requests().len(), 2);
    }

    #[test]
    fn log_is_bounded_but_counts_stay_exact() {
        let rec = Recorder::default();
        for _ in 0..KEEP_REQUESTS + 10 {
            rec.record(req("x"));
        }
        assert_eq!(rec.requests().len(), KEEP_REQUESTS);
        assert_eq!(rec.received(), KEEP_REQUESTS + 10);
    }
}
