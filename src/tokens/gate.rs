//! How many token counts run at once, for every alias and worker: a turn, or a bounded wait.
//!
//! A count is CPU work of about a second per MiB of prompt on the blocking pool (and rayon);
//! the gate lets `server.count_concurrency` run at once and the others wait their turn for
//! at most `server.count_queue_timeout_ms`, so counts neither take every core from the
//! relays nor hold memory without bound. Waiting is async: a worker runtime serves its other
//! connections meanwhile.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::CountError;
use crate::config::GateConfig;

/// The shared gate. Its gauges are `switchboard_counts_running` and `_waiting`.
#[derive(Debug)]
pub struct CountGate {
    config: GateConfig,
    turns: Arc<Semaphore>,
    running: Gauge,
    waiting: Gauge,
}

/// A turn to count; the next waiter's comes when it is dropped.
#[derive(Debug)]
pub struct Turn {
    _permit: OwnedSemaphorePermit,
    running: Gauge,
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
    pub fn new(config: GateConfig, running: Gauge, waiting: Gauge) -> CountGate {
        CountGate {
            turns: Arc::new(Semaphore::new(config.concurrency.max(1))),
            config,
            running,
            waiting,
        }
    }

    /// A gate of `concurrency` turns, no byte limit and a long wait (tests, benches, CLI).
    pub fn unlimited(concurrency: usize) -> CountGate {
        let config = GateConfig {
            concurrency,
            wait: Duration::from_secs(3600),
            limit_bytes: usize::MAX,
        };
        CountGate::new(config, Gauge::default(), Gauge::default())
    }

    pub fn config(&self) -> GateConfig {
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
        let turns = Arc::clone(&self.turns);
        let permit = match turns.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                self.waiting.inc();
                let _waiting = Waiting(self.waiting.clone());
                match tokio::time::timeout(self.config.wait, turns.acquire_owned()).await {
                    Ok(Ok(p)) => p,
                    Ok(Err(_)) | Err(_) => {
                        return Err(CountError::Busy {
                            running: self.config.concurrency,
                            waited: self.config.wait,
                        })
                    }
                }
            }
        };
        self.running.inc();
        Ok(Turn {
            _permit: permit,
            running: self.running.clone(),
        })
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
