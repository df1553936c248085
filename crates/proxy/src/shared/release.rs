//! Leases and waiters given back to the store on a connection and a task of their own, so a
//! release never queues behind acquires, limit calls or renewals; kept (a bounded number)
//! while the store does not answer and sent again as soon as it does. Each names its lease's
//! own id and leaves a mark that refuses a late-running acquire of that id.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use redis::aio::ConnectionManager;
use tokio::sync::Notify;

use super::places::Places;
use crate::config::SharedState;
use crate::lock::Locked;

/// At most this many releases wait for the store; past it the oldest go (the store drops
/// their leases when they expire).
const MOST: usize = 10_000;

/// One lease (or place in a queue) given back: its places and its id.
#[derive(Debug)]
struct Release {
    places: Places,
    id: String,
}

/// The releases not yet delivered, and the task's wake-up.
#[derive(Debug, Default)]
pub(super) struct Releases {
    pending: Mutex<VecDeque<Release>>,
    wake: Notify,
    closed: AtomicBool,
}

impl Releases {
    fn lock(&self) -> MutexGuard<'_, VecDeque<Release>> {
        self.pending.locked()
    }

    /// Give back lease `id` of `places`, off the caller's path.
    pub(super) fn push(&self, places: Places, id: String) {
        let mut q = self.lock();
        if q.len() >= MOST {
            q.pop_front();
        }
        q.push_back(Release { places, id });
        drop(q);
        self.wake.notify_one();
    }

    /// The store is gone: deliver what is pending once more, then end.
    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.wake.notify_one();
    }

    fn take(&self) -> Vec<Release> {
        self.lock().drain(..).collect()
    }

    /// Put a batch that was not delivered back in front, in its order.
    fn put_back(&self, batch: Vec<Release>) {
        let mut q = self.lock();
        for r in batch.into_iter().rev() {
            if q.len() >= MOST {
                break;
            }
            q.push_front(r);
        }
    }
}

/// The key marking lease `id` as given back: an acquire of it that runs later is refused.
pub(super) fn gone_key(id: &str) -> String {
    format!("{}{id}", gone_prefix())
}

pub(super) fn gone_prefix() -> String {
    format!("{}:gone:", super::PREFIX)
}

/// The releases' task: delivers every pending release in one round trip on its own
/// connection; on no answer (within a lease) or an error, keeps them and tries again after
/// `settings.timeout`. Ends when the store is dropped.
pub(super) async fn run(releases: Arc<Releases>, client: redis::Client, settings: SharedState) {
    let lease_ms = settings.lease.as_millis() as u64;
    let cfg = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(settings.timeout))
        .set_response_timeout(Some(settings.lease))
        .set_number_of_retries(1);
    // Connected before the first release, where the store answers now.
    let mut conn = ConnectionManager::new_with_config(client.clone(), cfg.clone())
        .await
        .ok();
    loop {
        let batch = releases.take();
        if batch.is_empty() {
            if releases.closed.load(Ordering::Acquire) {
                return;
            }
            releases.wake.notified().await;
            continue;
        }
        if conn.is_none() {
            conn = ConnectionManager::new_lazy_with_config(client.clone(), cfg.clone()).ok();
        }
        let delivered = match &mut conn {
            Some(c) => deliver(c, &batch, lease_ms).await.is_ok(),
            None => false,
        };
        if !delivered {
            releases.put_back(batch);
            if releases.closed.load(Ordering::Acquire) {
                return;
            }
            tokio::time::sleep(settings.timeout.max(Duration::from_millis(50))).await;
        }
    }
}

/// Each lease off its set and its waiter off the queue, by its own id, and the mark that
/// refuses a late acquire of that id.
async fn deliver(
    conn: &mut ConnectionManager,
    batch: &[Release],
    lease_ms: u64,
) -> redis::RedisResult<()> {
    let mut pipe = redis::pipe();
    for r in batch {
        let (k, id) = (r.places.keys(), r.id.as_str());
        pipe.zrem(&k.leases, id).ignore();
        pipe.zrem(&k.waiters, id).ignore();
        pipe.zrem(&k.seen, id).ignore();
        pipe.hdel(&k.who, id).ignore();
        pipe.pset_ex(gone_key(id), 1, 2 * lease_ms).ignore();
    }
    pipe.query_async::<()>(conn).await
}
