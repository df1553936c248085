//! How a backend's slots are shared (`server.schedule` and the keys beside it): the order a
//! freed slot goes in, when an `interactive` request takes a slot from a lower class, and how
//! long a slot waits for its conversation's next turn — as written, as validated.

use std::time::Duration;

use super::error::ConfigError;
use super::Priority;

/// The keys of `[server]` that say how slots are shared, as written.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct RawSchedule<'a> {
    pub(crate) schedule: Option<&'a str>,
    pub(crate) preempt_after_ms: Option<u64>,
    pub(crate) max_preemptions: Option<u32>,
    pub(crate) slot_hold_ms: Option<u64>,
    pub(crate) pin_slack_gpu_seconds: Option<f64>,
}

/// The order of a backend's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Order {
    /// First come, first served: one class, no turns.
    Arrival,
    /// By class, then clients in turn by request.
    Requests,
    /// By class, then clients by the GPU time they were given (fair share of work).
    #[default]
    Work,
}

/// `server.schedule` and its keys, validated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Scheduling {
    pub(crate) order: Order,
    /// An `interactive` request waiting this long while every slot holds lower classes takes
    /// one that has sent its client nothing yet (`None`: never; only with `Work`).
    pub(crate) preempt_after: Option<Duration>,
    /// How many times one request may be put back in its queue so.
    pub(crate) max_preemptions: u32,
    /// How long a freed llama.cpp slot waits for its conversation's next turn, when that
    /// conversation came back this fast before and its cached prefix is worth the wait (zero:
    /// never; only with `Work`).
    pub(crate) slot_hold: Duration,
    /// How far past the fair order's next (in GPU-seconds) a request whose conversation a
    /// freed slot holds may go first.
    pub(crate) pin_slack: f64,
}

impl Default for Scheduling {
    fn default() -> Self {
        Scheduling {
            order: Order::Work,
            preempt_after: Some(Duration::from_millis(1_000)),
            max_preemptions: 2,
            slot_hold: Duration::from_millis(500),
            pin_slack: 10.0,
        }
    }
}

impl Scheduling {
    /// Whether requests are ordered by work (and preempted, and held for).
    pub(crate) fn by_work(&self) -> bool {
        self.order == Order::Work
    }

    /// Whether a request of `class`, preempted `preemptions` times, may be preempted again
    /// while it holds a slot (until it sends its client a byte).
    /// An `idle` request (a batch line) always may, under `work`: it gives its slot to any
    /// other class that asks, however often.
    pub(crate) fn preemptible(&self, class: Priority, preemptions: u32) -> bool {
        if class == Priority::Idle {
            return self.by_work();
        }
        self.may_preempt(class) && preemptions < self.max_preemptions
    }

    /// Whether a request of `class`, preempted `preemptions` times, would keep its slot however
    /// long an `interactive` request waits for it: it may be preempted no more.
    pub(crate) fn spent(&self, class: Priority, preemptions: u32) -> bool {
        class != Priority::Idle && self.may_preempt(class) && preemptions >= self.max_preemptions
    }

    /// The same sharing where `interactive` requests exist only when `interactive`: without
    /// them nothing is ever preempted, so no request holds its slot as one that may be.
    pub(crate) fn with_interactive(self, interactive: bool) -> Scheduling {
        Scheduling {
            preempt_after: self.preempt_after.filter(|_| interactive),
            ..self
        }
    }

    /// Whether requests of `class` give their slots to `interactive` ones at all.
    fn may_preempt(&self, class: Priority) -> bool {
        self.by_work() && self.preempt_after.is_some() && class > Priority::Interactive
    }
}

pub(super) fn validate(raw: RawSchedule<'_>, errs: &mut Vec<ConfigError>) -> Scheduling {
    let d = Scheduling::default();
    let order = match raw.schedule {
        None | Some("work") => Order::Work,
        Some("requests") => Order::Requests,
        Some("arrival") => Order::Arrival,
        Some(other) => {
            errs.push(ConfigError::BadValue {
                key: "server.schedule".into(),
                value: other.into(),
                reason: "is not one of work, requests, arrival".into(),
            });
            d.order
        }
    };
    let preempt_after = match raw.preempt_after_ms {
        Some(0) => None,
        Some(ms) => Some(Duration::from_millis(ms)),
        None => d.preempt_after,
    };
    let pin_slack = match raw.pin_slack_gpu_seconds {
        Some(v) if !(v.is_finite() && v >= 0.0) => {
            errs.push(ConfigError::BadValue {
                key: "server.pin_slack_gpu_seconds".into(),
                value: v.to_string(),
                reason: "is not a number of seconds at or above 0".into(),
            });
            d.pin_slack
        }
        v => v.unwrap_or(d.pin_slack),
    };
    Scheduling {
        order,
        preempt_after,
        max_preemptions: raw.max_preemptions.unwrap_or(d.max_preemptions),
        slot_hold: raw.slot_hold_ms.map_or(d.slot_hold, Duration::from_millis),
        pin_slack,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_each_key() {
        let mut errs = Vec::new();
        let s = validate(RawSchedule::default(), &mut errs);
        assert_eq!(s, Scheduling::default());
        let raw = RawSchedule {
            schedule: Some("arrival"),
            preempt_after_ms: Some(0),
            max_preemptions: Some(5),
            slot_hold_ms: Some(0),
            pin_slack_gpu_seconds: Some(1.5),
        };
        let s = validate(raw, &mut errs);
        assert!(errs.is_empty(), "{errs:?}");
        assert_eq!(
            s,
            Scheduling {
                order: Order::Arrival,
                preempt_after: None,
                max_preemptions: 5,
                slot_hold: Duration::ZERO,
                pin_slack: 1.5,
            }
        );
        let raw = RawSchedule {
            schedule: Some("fifo"),
            pin_slack_gpu_seconds: Some(-1.0),
            ..RawSchedule::default()
        };
        validate(raw, &mut errs);
        assert_eq!(errs.len(), 2, "{errs:?}");
    }

    #[test]
    fn no_interactive_client_means_no_preemption() {
        let s = Scheduling::default();
        assert!(s.preempt_after.is_some());
        assert!(s.with_interactive(true).may_preempt(Priority::Batch));
        let without = s.with_interactive(false);
        assert_eq!(without.preempt_after, None);
        assert!(!without.may_preempt(Priority::Batch));
        assert!(!without.may_preempt(Priority::Normal));
    }
}
