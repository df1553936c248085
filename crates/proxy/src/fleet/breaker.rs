//! Circuit breaker per backend: consecutive failures open it; after a back-off one trial (a
//! request or a health probe) is let through half-open, and its outcome closes or reopens it.
//! An attempt tells its backend's breaker what it did through its [`Tally`], and only so.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelValue;

use crate::config::BreakerConfig;
use crate::lock::Locked;

/// Where a breaker stands.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum BreakerState {
    /// Requests pass.
    closed,
    /// Requests are refused until the back-off is over.
    open,
    /// The back-off is over: one trial decides (others are refused while it runs).
    half_open,
}

impl BreakerState {
    pub(crate) const ALL: [BreakerState; 3] = [Self::closed, Self::open, Self::half_open];
}

#[derive(Debug)]
struct Inner {
    cfg: BreakerConfig,
    /// Failures in a row while closed.
    failures: u32,
    /// Set while open (and half-open, once it is past).
    open_until: Option<Instant>,
    /// A half-open trial is running.
    trial: bool,
}

/// One backend's breaker.
#[derive(Debug)]
pub struct Breaker {
    inner: Mutex<Inner>,
}

/// Leave to send one request: settle it with [`Pass::succeeded`] or [`Pass::failed`]; a
/// trial dropped unsettled (its client went away) lets the next request try instead.
#[derive(Debug)]
pub(crate) struct Pass {
    breaker: Arc<Breaker>,
    trial: bool,
    settled: bool,
}

impl Breaker {
    pub(crate) fn new(cfg: BreakerConfig) -> Breaker {
        Breaker {
            inner: Mutex::new(Inner {
                cfg,
                failures: 0,
                open_until: None,
                trial: false,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.locked()
    }

    /// Take a reloaded config's settings, keeping the state.
    pub(crate) fn reconfigure(&self, cfg: BreakerConfig) {
        self.lock().cfg = cfg;
    }

    pub(crate) fn state(&self, now: Instant) -> BreakerState {
        match self.lock().open_until {
            None => BreakerState::closed,
            Some(t) if now < t => BreakerState::open,
            Some(_) => BreakerState::half_open,
        }
    }

    /// A request could pass now (closed, or half-open with no trial running).
    pub(crate) fn usable(&self, now: Instant) -> bool {
        let inner = self.lock();
        match inner.open_until {
            None => true,
            Some(t) => now >= t && !inner.trial,
        }
    }

    /// Time until a trial may run (zero when it may now).
    pub(crate) fn retry_in(&self, now: Instant) -> Duration {
        self.lock()
            .open_until
            .map_or(Duration::ZERO, |t| t.saturating_duration_since(now))
    }

    /// Leave to send a request now, or `None` while open or while a trial runs.
    pub(crate) fn enter(self: &Arc<Self>, now: Instant) -> Option<Pass> {
        let mut inner = self.lock();
        let trial = match inner.open_until {
            None => false,
            Some(t) if now >= t && !inner.trial => {
                inner.trial = true;
                true
            }
            Some(_) => return None,
        };
        Some(Pass {
            breaker: Arc::clone(self),
            trial,
            settled: false,
        })
    }

    /// The backend answered: it closes.
    pub(crate) fn success(&self) {
        let mut inner = self.lock();
        inner.failures = 0;
        inner.open_until = None;
        inner.trial = false;
    }

    /// The backend failed: one more in a row, opening at the limit; a failed trial (or a
    /// failure while open) starts the back-off again.
    pub(crate) fn failure(&self, now: Instant) {
        let mut inner = self.lock();
        let open_for = inner.cfg.open_for;
        if inner.open_until.is_some() {
            inner.open_until = Some(now + open_for);
            inner.trial = false;
            return;
        }
        inner.failures += 1;
        if inner.failures >= inner.cfg.failures.get() {
            inner.failures = 0;
            inner.open_until = Some(now + open_for);
            tracing::warn!(
                failures = inner.cfg.failures.get(),
                "backend breaker opened for {open_for:?}"
            );
        }
    }

    /// A health probe's outcome: it settles a half-open breaker like a trial would; it
    /// neither opens a closed breaker nor shortens an open one's back-off.
    pub(crate) fn probed(&self, up: bool, now: Instant) {
        let half_open = {
            let inner = self.lock();
            inner.open_until.is_some_and(|t| now >= t) && !inner.trial
        };
        match (half_open, up) {
            (true, true) => self.success(),
            (true, false) => self.failure(now),
            _ => {}
        }
    }
}

impl Pass {
    /// The backend answered (a head that is not a 5xx).
    pub(crate) fn succeeded(mut self) {
        self.settled = true;
        self.breaker.success();
    }

    /// The backend failed this request.
    pub(crate) fn failed(mut self) {
        self.settled = true;
        self.breaker.failure(now());
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        if self.trial && !self.settled {
            self.breaker.lock().trial = false;
        }
    }
}

/// What one attempt did, as its backend's breaker counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The backend answered: a head that is not a 5xx.
    Answered,
    /// The backend failed on its own: refused, not delivered, timed out, malformed, a 5xx, a
    /// body broken or stalled.
    Failed,
    /// Nothing said of the backend: a loading 503, a hang-up on a request it took, the
    /// proxy's own want of descriptors. A half-open trial lets the next request try instead.
    Neither,
}

/// An attempt's word to its backend's breaker, the one way an attempt tells it anything: its
/// [`Pass`] until the head settles it, then the breaker itself for a body that fails after.
#[derive(Debug, Default)]
pub struct Tally {
    pass: Option<Pass>,
    breaker: Option<Arc<Breaker>>,
}

impl Tally {
    pub(crate) fn new(pass: Option<Pass>, breaker: Option<Arc<Breaker>>) -> Tally {
        Tally { pass, breaker }
    }

    /// Tell the breaker what the attempt did (at most once per stage: the head, then the body).
    pub(crate) fn tell(&mut self, outcome: Outcome) {
        match (outcome, self.pass.take()) {
            (Outcome::Answered, Some(pass)) => pass.succeeded(),
            (Outcome::Failed, Some(pass)) => pass.failed(),
            (Outcome::Failed, None) => {
                if let Some(b) = &self.breaker {
                    b.failure(now());
                }
            }
            (Outcome::Answered | Outcome::Neither, _) => {}
        }
    }
}

/// The time breakers are read at: tokio's clock, so that it is paused in tests with the rest
/// of a request's timing.
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;

    fn breaker(failures: u32) -> Arc<Breaker> {
        Arc::new(Breaker::new(BreakerConfig {
            failures: NonZeroU32::new(failures).unwrap(),
            open_for: Duration::from_secs(10),
        }))
    }

    #[test]
    fn opens_after_failures_in_a_row_and_a_trial_closes_it() {
        let b = breaker(3);
        let t0 = Instant::now();
        b.failure(t0);
        b.failure(t0);
        b.success();
        b.failure(t0);
        b.failure(t0);
        assert_eq!(b.state(t0), BreakerState::closed);
        b.failure(t0);
        assert_eq!(b.state(t0), BreakerState::open);
        assert!(b.enter(t0).is_none());
        let later = t0 + Duration::from_secs(10);
        assert_eq!(b.state(later), BreakerState::half_open);
        let trial = b.enter(later).unwrap();
        // One trial at a time.
        assert!(b.enter(later).is_none() && !b.usable(later));
        trial.succeeded();
        assert_eq!(b.state(later), BreakerState::closed);
        assert!(b.enter(later).is_some());
    }

    #[test]
    fn a_failed_trial_reopens_and_an_abandoned_one_lets_another_try() {
        let b = breaker(1);
        let t0 = Instant::now();
        b.failure(t0);
        let later = t0 + Duration::from_secs(10);
        drop(b.enter(later).unwrap());
        let trial = b.enter(later).unwrap();
        trial.failed();
        assert_eq!(b.state(Instant::now()), BreakerState::open);
        assert!(b.retry_in(Instant::now()) > Duration::from_secs(9));
    }

    #[test]
    fn a_probe_settles_only_a_half_open_breaker() {
        let b = breaker(1);
        let t0 = Instant::now();
        b.probed(false, t0);
        assert_eq!(b.state(t0), BreakerState::closed);
        b.failure(t0);
        b.probed(true, t0);
        assert_eq!(b.state(t0), BreakerState::open);
        b.probed(true, t0 + Duration::from_secs(10));
        assert_eq!(b.state(t0), BreakerState::closed);
    }
}
