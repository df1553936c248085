//! The limits of a minute of one client behind one small trait ([`Limiter`]): [`Local`]
//! keeps them in this process, a token bucket per limit, refilled continuously over the
//! minute; [`super::shared::Shared`] keeps them in the store several processes share. (Its
//! budgets of a calendar day and month are [`crate::budget`]'s.)

use std::sync::Mutex;
use std::time::{Duration, Instant};

pub(crate) use crate::budget::Left;
use crate::lock::Locked;
use crate::shared::lease::Lease;

/// The limits of one client (each `None`: no limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Limits {
    pub(crate) requests_per_minute: Option<u64>,
    pub(crate) tokens_per_minute: Option<u64>,
}

/// Where a client stands against each of its limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Standing {
    pub(crate) requests: Option<Left>,
    pub(crate) tokens: Option<Left>,
}

/// Which limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Which {
    Requests,
    Tokens,
}

/// A request the limits do not let through now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) which: Which,
    pub(crate) limit: u64,
    /// What the request needs of it.
    pub(crate) needed: u64,
    /// Seconds until it would fit; `None`: it never fits (more than the whole budget).
    pub(crate) retry_after: Option<u64>,
}

/// A client's limits: one request and `tokens` taken together or not at all; a refund (or
/// a further charge) when the request's real cost is known; a place among its requests in
/// flight.
#[async_trait::async_trait]
pub(crate) trait Limiter: Send + Sync + std::fmt::Debug {
    async fn reserve(&self, tokens: u64, now: Instant) -> Result<Standing, Refusal>;
    /// The request took `used` tokens of the `reserved` ones (more or fewer).
    fn settle(&self, reserved: u64, used: u64, now: Instant);
    fn standing(&self, now: Instant) -> Standing;
    /// New limits from a reload; what was used is kept.
    fn reconfigure(&self, limits: Limits);
    /// A place among at most `max` requests in flight, `here` of which are in flight in this
    /// process already; `Err(())`: none is free. What it holds (a shared lease) is given
    /// back when dropped.
    async fn enter(&self, max: u32, here: u32) -> Result<Option<Lease>, ()> {
        if here >= max {
            Err(())
        } else {
            Ok(None)
        }
    }
}

/// A token bucket: `capacity` over `window`; its level may go below zero when a request
/// used more than it reserved (the debt is paid off by the refill).
#[derive(Debug, Clone, Copy)]
struct Bucket {
    capacity: f64,
    window: Duration,
    level: f64,
    at: Instant,
}

impl Bucket {
    fn new(capacity: u64, window: Duration, now: Instant) -> Bucket {
        Bucket {
            capacity: capacity as f64,
            window,
            level: capacity as f64,
            at: now,
        }
    }

    fn rate(&self) -> f64 {
        self.capacity / self.window.as_secs_f64()
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.level = (self.level + dt * self.rate()).min(self.capacity);
        self.at = self.at.max(now);
    }

    /// Seconds until `cost` fits (0: it does now), `None` when it never does.
    fn wait_for(&self, cost: f64) -> Option<u64> {
        if cost > self.capacity {
            return None;
        }
        let short = cost - self.level;
        Some(if short <= 0.0 {
            0
        } else {
            (short / self.rate()).ceil().max(1.0) as u64
        })
    }

    fn left(&self) -> Left {
        let empty = (self.capacity - self.level).max(0.0);
        Left {
            limit: self.capacity as u64,
            remaining: self.level.max(0.0).floor() as u64,
            reset: crate::seconds::duration(empty / self.rate()),
        }
    }

    fn set_capacity(&mut self, capacity: u64) {
        let used = self.capacity - self.level;
        self.capacity = capacity as f64;
        self.level = self.capacity - used;
    }
}

#[derive(Debug)]
struct Buckets {
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
}

/// The limits kept in this process.
#[derive(Debug)]
pub(crate) struct Local(Mutex<Buckets>);

pub(super) const MINUTE: Duration = Duration::from_secs(60);

impl Local {
    pub(crate) fn new(limits: Limits, now: Instant) -> Local {
        Local(Mutex::new(Buckets {
            requests: limits
                .requests_per_minute
                .map(|n| Bucket::new(n, MINUTE, now)),
            tokens: limits
                .tokens_per_minute
                .map(|n| Bucket::new(n, MINUTE, now)),
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Buckets> {
        self.0.locked()
    }
}

impl Buckets {
    fn refill(&mut self, now: Instant) {
        for b in [&mut self.requests, &mut self.tokens].into_iter().flatten() {
            b.refill(now);
        }
    }

    fn standing(&self) -> Standing {
        Standing {
            requests: self.requests.as_ref().map(Bucket::left),
            tokens: self.tokens.as_ref().map(Bucket::left),
        }
    }
}

impl Buckets {
    /// Why one request and `tokens` do not fit now, if they do not: a request that can never
    /// fit is told so first, whichever limit it is.
    fn refusal(&self, tokens: u64) -> Option<Refusal> {
        let checks = [
            (Which::Requests, self.requests, 1),
            (Which::Tokens, self.tokens, tokens),
        ];
        let mut refusal: Option<Refusal> = None;
        for (which, bucket, cost) in checks {
            let Some(bucket) = bucket else { continue };
            let wait = bucket.wait_for(cost as f64);
            if wait == Some(0) {
                continue;
            }
            if crate::budget::worse(refusal.map(|r| r.retry_after), wait) {
                refusal = Some(Refusal {
                    which,
                    limit: bucket.capacity as u64,
                    needed: cost,
                    retry_after: wait,
                });
            }
        }
        refusal
    }
}

impl Local {
    /// Take one request and `tokens`, or say which limit refuses them.
    pub(crate) fn take(&self, tokens: u64, now: Instant) -> Result<Standing, Refusal> {
        let mut guard = self.lock();
        let b = &mut *guard;
        b.refill(now);
        if let Some(r) = b.refusal(tokens) {
            return Err(r);
        }
        if let Some(r) = &mut b.requests {
            r.level -= 1.0;
        }
        if let Some(t) = &mut b.tokens {
            t.level -= tokens as f64;
        }
        Ok(b.standing())
    }

    /// The levels a shared store reported (requests, tokens), as of `now`.
    pub(crate) fn adopt(&self, levels: [Option<f64>; 2], now: Instant) {
        let mut guard = self.lock();
        let b = &mut *guard;
        for (bucket, level) in [&mut b.requests, &mut b.tokens].into_iter().zip(levels) {
            if let (Some(bucket), Some(level)) = (bucket, level) {
                bucket.level = level.min(bucket.capacity);
                bucket.at = now;
            }
        }
    }

    /// Why one request and `tokens` do not fit now (the store said they do not): the limit
    /// and the wait, as this process's copy of the levels shows them.
    pub(crate) fn refusal(&self, tokens: u64, now: Instant) -> Refusal {
        let mut guard = self.lock();
        guard.refill(now);
        guard.refusal(tokens).unwrap_or(Refusal {
            which: Which::Requests,
            limit: guard.requests.map_or(0, |b| b.capacity as u64),
            needed: 1,
            retry_after: Some(1),
        })
    }

    /// The buckets' capacities and windows (requests, tokens).
    pub(crate) fn specs(&self) -> [Option<(u64, Duration)>; 2] {
        let b = self.lock();
        [b.requests, b.tokens].map(|x| x.map(|x| (x.capacity as u64, x.window)))
    }
}

#[async_trait::async_trait]
impl Limiter for Local {
    async fn reserve(&self, tokens: u64, now: Instant) -> Result<Standing, Refusal> {
        self.take(tokens, now)
    }

    fn settle(&self, reserved: u64, used: u64, now: Instant) {
        let mut b = self.lock();
        b.refill(now);
        let back = reserved as f64 - used as f64;
        let b = &mut *b;
        if let Some(t) = &mut b.tokens {
            t.level = (t.level + back).min(t.capacity);
        }
    }

    fn standing(&self, now: Instant) -> Standing {
        let mut b = self.lock();
        b.refill(now);
        b.standing()
    }

    fn reconfigure(&self, limits: Limits) {
        let mut b = self.lock();
        let now = Instant::now();
        b.refill(now);
        let apply =
            |slot: &mut Option<Bucket>, limit: Option<u64>, window| match (slot.as_mut(), limit) {
                (Some(bucket), Some(n)) => bucket.set_capacity(n),
                (None, Some(n)) => *slot = Some(Bucket::new(n, window, now)),
                (_, None) => *slot = None,
            };
        apply(&mut b.requests, limits.requests_per_minute, MINUTE);
        apply(&mut b.tokens, limits.tokens_per_minute, MINUTE);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn local(rpm: Option<u64>, tpm: Option<u64>) -> (Local, Instant) {
        let now = Instant::now();
        let limits = Limits {
            requests_per_minute: rpm,
            tokens_per_minute: tpm,
        };
        (Local::new(limits, now), now)
    }

    #[test]
    fn tokens_are_reserved_then_refunded_and_refill_over_the_minute() {
        let (l, t0) = local(None, Some(600));
        let s = l.take(500, t0).unwrap();
        assert_eq!(s.tokens.unwrap().remaining, 100);
        let r = l.take(200, t0).unwrap_err();
        assert_eq!((r.which, r.retry_after), (Which::Tokens, Some(10)));
        // Used 50 of the 500: 450 back.
        l.settle(500, 50, t0);
        assert_eq!(l.standing(t0).tokens.unwrap().remaining, 550);
        // 10 tokens a second come back.
        let later = t0 + Duration::from_secs(3);
        assert_eq!(l.standing(later).tokens.unwrap().remaining, 580);
        // More than the whole minute's budget never fits.
        let never = l.take(601, later).unwrap_err();
        assert_eq!(never.retry_after, None);
    }

    #[test]
    fn requests_and_tokens_a_minute_count_alike() {
        let (l, t0) = local(Some(2), Some(1000));
        l.take(400, t0).unwrap();
        let s = l.take(400, t0).unwrap();
        assert_eq!(s.requests.unwrap().remaining, 0);
        assert_eq!(s.requests.unwrap().reset, Duration::from_secs(60));
        let r = l.take(1, t0).unwrap_err();
        assert_eq!((r.which, r.retry_after), (Which::Requests, Some(30)));
        let t1 = t0 + Duration::from_secs(30);
        let r = l.take(800, t1).unwrap_err();
        assert_eq!(r.which, Which::Tokens);
        // A usage over the reservation goes into debt.
        l.settle(0, 800, t1);
        assert_eq!(l.standing(t1).tokens.unwrap().remaining, 0);
        let r = l.take(1, t1).unwrap_err();
        assert_eq!(r.which, Which::Tokens);
    }

    #[test]
    fn a_debt_past_any_duration_resets_at_the_longest_one_not_a_panic() {
        let (l, t0) = local(None, Some(1));
        l.settle(0, u64::MAX, t0);
        let left = l.standing(t0).tokens.unwrap();
        assert_eq!((left.remaining, left.reset), (0, Duration::MAX));
    }

    #[test]
    fn a_reload_keeps_what_was_used() {
        let (l, t0) = local(None, Some(100));
        l.take(60, t0).unwrap();
        l.reconfigure(Limits {
            tokens_per_minute: Some(200),
            ..Limits::default()
        });
        let left = l.standing(t0).tokens.unwrap();
        assert_eq!((left.limit, left.remaining / 10), (200, 14));
    }
}
