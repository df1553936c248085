//! How many token counts run at once, for every alias and worker: a turn, or a bounded wait.
//!
//! A count is CPU work of about a second per MiB of prompt on the blocking pool (and rayon);
//! the gate lets `server.count_concurrency` run at once and the others wait their turn for
//! at most `server.count_queue_timeout_ms`, so counts neither take every core from the
//! relays nor hold memory without bound. Waiting is async: a worker runtime serves its other
//! connections meanwhile.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::CountError;
use crate::config::GateConfig;
use crate::lock::Locked;

/// The shared gate. Its gauges are `switchboard_counts_running` and `_waiting`.
#[derive(Debug)]
pub struct CountGate {
    config: GateConfig,
    turns: Arc<Semaphore>,
    /// Who is counting: each client's part of the turns.
    shares: Arc<Shares>,
    running: Gauge,
    waiting: Gauge,
}

/// A turn to count; the next waiter's comes when it is dropped.
#[derive(Debug)]
pub struct Turn {
    _permit: OwnedSemaphorePermit,
    _claim: Option<Claim>,
    running: Gauge,
}

/// The clients counting now: of each, the turns it holds or waits a permit for (its claims)
/// and its counts waiting to claim one. With `k` of them, a client claims at most
/// `ceil(concurrency / k)` turns (at least one), so one client's many counts leave the
/// others their part.
#[derive(Debug, Default)]
struct Shares {
    clients: Mutex<HashMap<u64, (usize, usize)>>,
    /// A claim was given back (or a client stopped asking): the parts may have grown.
    freed: Notify,
}

impl Shares {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<u64, (usize, usize)>) -> T) -> T {
        f(&mut self.clients.locked())
    }

    /// One more count of `who` asks for a turn.
    fn ask(&self, who: u64) {
        self.with(|c| c.entry(who).or_default().1 += 1);
    }

    /// One count of `who` no longer asks (it claimed a turn, or gave up).
    fn unask(&self, who: u64) {
        self.with(|c| Self::less(c, who, |e| e.1 -= 1));
        self.freed.notify_waiters();
    }

    /// A claim of `who`, when it holds fewer than its part of `concurrency` turns.
    fn claim(&self, who: u64, concurrency: usize) -> bool {
        self.with(|c| {
            let part = concurrency.div_ceil(c.len().max(1)).max(1);
            let e = c.entry(who).or_default();
            let fits = e.0 < part;
            e.0 += usize::from(fits);
            fits
        })
    }

    fn release(&self, who: u64) {
        self.with(|c| Self::less(c, who, |e| e.0 -= 1));
        self.freed.notify_waiters();
    }

    /// `who`'s entry changed by `f`, removed once it neither claims nor asks.
    fn less(c: &mut HashMap<u64, (usize, usize)>, who: u64, f: impl FnOnce(&mut (usize, usize))) {
        if let Some(e) = c.get_mut(&who) {
            f(e);
            if *e == (0, 0) {
                c.remove(&who);
            }
        }
    }
}

/// A client's claim on one turn, given back when dropped.
#[derive(Debug)]
struct Claim {
    shares: Arc<Shares>,
    who: u64,
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.shares.release(self.who);
    }
}

/// A count of a client asking for a turn, until it claims one or gives up.
struct Asking<'a>(&'a Shares, u64);

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        self.0.unask(self.1);
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.running.dec();
    }
}

/// Takes one off the waiting gauge however the wait ends (a turn, a timeout, a client gone).
struct Waiting(Gauge);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl CountGate {
    /// A gate reporting to `running` and `waiting` (unregistered gauges where nothing reads them).
    pub(crate) fn new(config: GateConfig, running: Gauge, waiting: Gauge) -> CountGate {
        CountGate {
            turns: Arc::new(Semaphore::new(config.concurrency.max(1))),
            shares: Arc::default(),
            config,
            running,
            waiting,
        }
    }

    /// A gate of `concurrency` turns, no byte limit and a long wait (tests, benches, CLI).
    pub(crate) fn unlimited(concurrency: usize) -> CountGate {
        let config = GateConfig {
            concurrency,
            wait: Duration::from_secs(3600),
            limit_bytes: usize::MAX,
        };
        CountGate::new(config, Gauge::default(), Gauge::default())
    }

    pub(crate) fn config(&self) -> GateConfig {
        self.config
    }

    /// Counts running now.
    pub fn running(&self) -> i64 {
        self.running.get()
    }

    /// Counts waiting for a turn now.
    pub fn waiting(&self) -> i64 {
        self.waiting.get()
    }

    /// A turn to count, at once or after a wait of at most the configured time; `Busy` when
    /// none came in that time.
    pub async fn turn(&self) -> Result<Turn, CountError> {
        self.turn_of(None).await
    }

    /// A turn to count for client `who` (`None`: no client, no part to keep to), within its
    /// part of the turns while others count too: first its claim, then a free turn, both
    /// within the configured wait.
    pub async fn turn_of(&self, who: Option<u64>) -> Result<Turn, CountError> {
        let deadline = Instant::now() + self.config.wait;
        let mut waiting = None;
        let claim = match who {
            Some(who) => Some(self.claim(who, deadline, &mut waiting).await?),
            None => None,
        };
        let turns = Arc::clone(&self.turns);
        let permit = match turns.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                self.wait(&mut waiting);
                match tokio::time::timeout_at(deadline, turns.acquire_owned()).await {
                    Ok(Ok(p)) => p,
                    Ok(Err(_)) | Err(_) => return Err(self.busy()),
                }
            }
        };
        self.running.inc();
        Ok(Turn {
            _permit: permit,
            _claim: claim,
            running: self.running.clone(),
        })
    }

    /// `who`'s claim on a turn, waiting (until `deadline`) while it holds its part.
    async fn claim(
        &self,
        who: u64,
        deadline: Instant,
        waiting: &mut Option<Waiting>,
    ) -> Result<Claim, CountError> {
        let shares = &self.shares;
        shares.ask(who);
        let _asking = Asking(shares, who);
        loop {
            let freed = shares.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if shares.claim(who, self.config.concurrency) {
                return Ok(Claim {
                    shares: Arc::clone(shares),
                    who,
                });
            }
            self.wait(waiting);
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return Err(self.busy());
            }
        }
    }

    /// Counted among the waiting (once) until `waiting` is dropped.
    fn wait(&self, waiting: &mut Option<Waiting>) {
        if waiting.is_none() {
            self.waiting.inc();
            *waiting = Some(Waiting(self.waiting.clone()));
        }
    }

    fn busy(&self) -> CountError {
        CountError::Busy {
            running: self.config.concurrency,
            waited: self.config.wait,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn gate(concurrency: usize, wait_ms: u64) -> Arc<CountGate> {
        let config = GateConfig {
            concurrency,
            wait: Duration::from_millis(wait_ms),
            limit_bytes: 1,
        };
        Arc::new(CountGate::new(config, Gauge::default(), Gauge::default()))
    }

    #[tokio::test(start_paused = true)]
    async fn counts_past_the_concurrency_wait_their_turn_in_order() {
        let g = gate(2, 10_000);
        let first = g.turn().await.unwrap();
        let second = g.turn().await.unwrap();
        assert_eq!((g.running(), g.waiting()), (2, 0));
        let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
        for i in 0..2 {
            let (g, done) = (Arc::clone(&g), done_tx.clone());
            tokio::spawn(async move {
                let turn = g.turn().await.unwrap();
                done.send(i).unwrap();
                tokio::time::sleep(Duration::from_secs(1)).await;
                drop(turn);
            });
        }
        tokio::task::yield_now().await;
        assert_eq!((g.running(), g.waiting()), (2, 2));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(done_rx.try_recv().is_err(), "no turn while both are taken");
        drop(first);
        assert_eq!(done_rx.recv().await, Some(0));
        assert_eq!((g.running(), g.waiting()), (2, 1));
        drop(second);
        assert_eq!(done_rx.recv().await, Some(1));
        assert_eq!((g.running(), g.waiting()), (2, 0));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!((g.running(), g.waiting()), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_past_the_timeout_is_busy() {
        let g = gate(1, 500);
        let _held = g.turn().await.unwrap();
        let started = tokio::time::Instant::now();
        let err = g.turn().await.unwrap_err();
        assert_eq!(started.elapsed(), Duration::from_millis(500));
        assert!(matches!(err, CountError::Busy { running: 1, .. }), "{err}");
        assert!(
            err.to_string().contains("server.count_concurrency"),
            "{err}"
        );
        assert_eq!((g.running(), g.waiting()), (1, 0));
    }
}
