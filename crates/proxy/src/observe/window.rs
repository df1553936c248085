//! Per-alias rolling five-minute figures for the status page: requests, errors, context
//! rejections, output tokens, and the quantiles of time to first token and decode speed.
//!
//! A ring of 10-second steps, each with its counts and binned timings, under one short lock
//! per alias: a request adds to the current step once, when its record is dropped. A step is
//! cleared when the ring comes round to it again, so memory stays fixed (about 20 KB an
//! alias). Timings go into geometric bins four to an octave, so a median is within a few
//! percent (the Prometheus histograms' buckets are too coarse for one number on a page).

use crate::lock::Locked;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Length of one step of the ring.
pub(crate) const STEP: Duration = Duration::from_secs(10);
/// Steps summed: 30 of 10 s, the last five minutes (the current step counts from its start).
pub(crate) const STEPS: usize = 30;

/// Geometric bins: bin 0 holds values up to `low`, bin `i` those up to `low · 2^(i/4)`, the
/// last one everything larger.
struct Scale {
    low: f64,
    /// `1 / low`, so the hot path multiplies.
    inv_low: f64,
}

/// `2^(1/4)`, `2^(1/2)`, `2^(3/4)`: the quarter-octave steps inside one octave.
const QUARTERS: [f64; 3] = [
    1.189_207_115_002_721,
    std::f64::consts::SQRT_2,
    1.681_792_830_507_429,
];

impl Scale {
    const PER_OCTAVE: f64 = 4.0;

    /// `ceil(4 · log2(v / low))`, bounded to the bins, from the float's exponent and three
    /// comparisons of its mantissa (no logarithm on the hot path).
    fn bin<const N: usize>(&self, v: f64) -> usize {
        // NaN and anything up to `low` (zero, negative) go to the first bin.
        if v.partial_cmp(&self.low) != Some(std::cmp::Ordering::Greater) {
            return 0;
        }
        let x = v * self.inv_low;
        if !x.is_finite() {
            return N - 1;
        }
        // x = m · 2^e with m in [1, 2); ceil(4·log2 x) = 4e + the steps m is past.
        let bits = x.to_bits();
        let e = ((bits >> 52) & 0x7ff) as i64 - 1023;
        let m = f64::from_bits((bits & ((1 << 52) - 1)) | (1023 << 52));
        let q = i64::from(m > 1.0) + QUARTERS.iter().map(|&r| i64::from(m > r)).sum::<i64>();
        usize::try_from(4 * e + q).map_or(0, |i| i.min(N - 1))
    }

    fn upper(&self, i: usize) -> f64 {
        self.low * (i as f64 / Self::PER_OCTAVE).exp2()
    }

    /// The `q` quantile, interpolated linearly inside its bin; a rank in the last bin gives
    /// that bin's lower edge. `None` without observations.
    fn quantile(&self, counts: &[u32], q: f64) -> Option<f64> {
        let total: u64 = counts.iter().map(|&c| u64::from(c)).sum();
        if total == 0 {
            return None;
        }
        let rank = q * total as f64;
        let last = counts.len() - 1;
        let mut below = 0u64;
        for (i, &c) in counts.iter().enumerate() {
            let upto = below + u64::from(c);
            if c > 0 && upto as f64 >= rank {
                let lo = if i == 0 { 0.0 } else { self.upper(i - 1) };
                if i == last {
                    return Some(lo);
                }
                return Some(lo + (self.upper(i) - lo) * (rank - below as f64) / f64::from(c));
            }
            below = upto;
        }
        Some(self.upper(last - 1))
    }
}

/// Time to first token: 1 ms up to 35 minutes.
const TTFT: Scale = Scale {
    low: 0.001,
    inv_low: 1000.0,
};
const TTFT_BINS: usize = 86;
/// Decode speed: 0.5 up to 131,072 tokens per second.
const TPS: Scale = Scale {
    low: 0.5,
    inv_low: 2.0,
};
const TPS_BINS: usize = 74;

/// What one finished request adds to its alias's window.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    /// A 5xx answer, or a stream that ended in an error after its 200.
    pub error: bool,
    pub ttft: Option<Duration>,
    pub decode_tps: Option<f64>,
    /// Tokens generated.
    pub tokens: u64,
}

#[derive(Clone, Copy, Debug)]
struct Step {
    /// The step number (time since the window's origin, in steps) this slot holds.
    at: u64,
    requests: u32,
    errors: u32,
    rejections: u32,
    tokens: u64,
    ttft: [u32; TTFT_BINS],
    decode: [u32; TPS_BINS],
}

impl Step {
    const EMPTY: Step = Step {
        at: u64::MAX,
        requests: 0,
        errors: 0,
        rejections: 0,
        tokens: 0,
        ttft: [0; TTFT_BINS],
        decode: [0; TPS_BINS],
    };
}

/// The last five minutes of one alias.
#[derive(Debug)]
pub struct Window {
    origin: Instant,
    ring: Mutex<Box<[Step; STEPS]>>,
}

/// The sums over the last five minutes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Summary {
    pub requests: u64,
    pub errors: u64,
    pub rejections: u64,
    /// Median time to first token, seconds.
    pub ttft_p50: Option<f64>,
    /// Median decode speed of a request, tokens per second.
    pub(crate) decode_p50: Option<f64>,
}

impl Window {
    /// An empty window whose steps are counted from `origin`.
    pub fn new(origin: Instant) -> Window {
        Window {
            origin,
            ring: Mutex::new(Box::new([Step::EMPTY; STEPS])),
        }
    }

    fn step_of(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.origin).as_secs() / STEP.as_secs()
    }

    /// The ring's slot for `at`, cleared first if it still holds an older step.
    fn with_step(&self, at: Instant, f: impl FnOnce(&mut Step)) {
        let n = self.step_of(at);
        let mut ring = self.ring.locked();
        let slot = &mut ring[(n % STEPS as u64) as usize];
        if slot.at != n {
            *slot = Step {
                at: n,
                ..Step::EMPTY
            };
        }
        f(slot);
    }

    /// A request ended at `at`.
    pub fn record(&self, at: Instant, s: Sample) {
        // Bins found before the lock is taken.
        let ttft = s.ttft.map(|t| TTFT.bin::<TTFT_BINS>(t.as_secs_f64()));
        let decode = s.decode_tps.map(|v| TPS.bin::<TPS_BINS>(v));
        self.with_step(at, |step| {
            step.requests = step.requests.saturating_add(1);
            step.errors = step.errors.saturating_add(u32::from(s.error));
            step.tokens = step.tokens.saturating_add(s.tokens);
            if let Some(b) = ttft {
                step.ttft[b] = step.ttft[b].saturating_add(1);
            }
            if let Some(b) = decode {
                step.decode[b] = step.decode[b].saturating_add(1);
            }
        });
    }

    /// A request was rejected as over its context window at `at`.
    pub(crate) fn rejection(&self, at: Instant) {
        self.with_step(at, |step| {
            step.rejections = step.rejections.saturating_add(1);
        });
    }

    /// The sums of the steps within five minutes of `now`.
    pub fn summary(&self, now: Instant) -> Summary {
        let n = self.step_of(now);
        let oldest = n.saturating_sub(STEPS as u64 - 1);
        let mut sum = Summary::default();
        let mut ttft = [0u32; TTFT_BINS];
        let mut decode = [0u32; TPS_BINS];
        {
            let ring = self.ring.locked();
            for step in ring.iter().filter(|s| (oldest..=n).contains(&s.at)) {
                sum.requests += u64::from(step.requests);
                sum.errors += u64::from(step.errors);
                sum.rejections += u64::from(step.rejections);
                for (t, c) in ttft.iter_mut().zip(step.ttft) {
                    *t = t.saturating_add(c);
                }
                for (d, c) in decode.iter_mut().zip(step.decode) {
                    *d = d.saturating_add(c);
                }
            }
        }
        sum.ttft_p50 = TTFT.quantile(&ttft, 0.5);
        sum.decode_p50 = TPS.quantile(&decode, 0.5);
        sum
    }
}

/// One step of the window as the status page charts it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Point {
    pub requests: u32,
    pub errors: u32,
    /// Tokens generated by the requests that ended in it.
    pub(crate) tokens: u64,
    /// Time to first token, seconds: median and 95th percentile.
    pub(crate) ttft_p50: Option<f64>,
    pub(crate) ttft_p95: Option<f64>,
}

impl Window {
    /// Each step of the last five minutes, oldest first, for the status page's charts.
    pub(crate) fn series(&self, now: Instant) -> Vec<Point> {
        let n = self.step_of(now);
        let ring = self.ring.locked();
        (0..STEPS as u64)
            .rev()
            .map(|back| {
                let at = n.checked_sub(back);
                match ring.iter().find(|s| Some(s.at) == at) {
                    Some(step) => Point {
                        requests: step.requests,
                        errors: step.errors,
                        tokens: step.tokens,
                        ttft_p50: TTFT.quantile(&step.ttft, 0.5),
                        ttft_p95: TTFT.quantile(&step.ttft, 0.95),
                    },
                    None => Point::default(),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_series_has_a_step_per_ten_seconds_oldest_first() {
        let t0 = Instant::now();
        let w = Window::new(t0);
        w.record(t0, ok(100, 10.0));
        w.record(t0 + STEP * 2, ok(200, 10.0));
        w.record(t0 + STEP * 2, ok(200, 10.0));
        w.record(t0 + STEP * 2, ok(2000, 10.0));
        let s = w.series(t0 + STEP * 2);
        assert_eq!(s.len(), STEPS);
        assert_eq!((s[STEPS - 1].requests, s[STEPS - 1].tokens), (3, 48));
        assert_eq!(s[STEPS - 2], Point::default());
        assert_eq!(s[STEPS - 3].requests, 1);
        let ttft = s[STEPS - 3].ttft_p50.unwrap();
        assert!((0.09..0.11).contains(&ttft), "{ttft}");
        // Two of three at 0.2 s, one at 2 s: the median is near the two, p95 near the one.
        let last = s[STEPS - 1];
        assert!(
            last.ttft_p50.is_some_and(|t| (0.18..0.25).contains(&t)),
            "{last:?}"
        );
        assert!(
            last.ttft_p95.is_some_and(|t| (1.6..2.1).contains(&t)),
            "{last:?}"
        );
    }

    fn ok(ttft_ms: u64, tps: f64) -> Sample {
        Sample {
            error: false,
            ttft: Some(Duration::from_millis(ttft_ms)),
            decode_tps: Some(tps),
            tokens: 16,
        }
    }

    fn close(a: f64, b: f64, within: f64) -> bool {
        (a - b).abs() <= within * b
    }

    #[test]
    fn bins_are_geometric_and_bounded() {
        assert_eq!(TTFT.bin::<TTFT_BINS>(0.0), 0);
        assert_eq!(TTFT.bin::<TTFT_BINS>(f64::NAN), 0);
        assert_eq!(TTFT.bin::<TTFT_BINS>(0.001), 0);
        assert_eq!(TTFT.bin::<TTFT_BINS>(0.002), 4);
        assert_eq!(TTFT.bin::<TTFT_BINS>(0.0021), 5);
        assert_eq!(TTFT.bin::<TTFT_BINS>(1e9), TTFT_BINS - 1);
        assert_eq!(TTFT.bin::<TTFT_BINS>(f64::INFINITY), TTFT_BINS - 1);
        // The exponent-and-mantissa bin is ceil(4·log2(v / low)), checked across the range.
        let mut v = 0.000_9;
        while v < 5000.0 {
            let by_log = ((v / 0.001_f64).log2() * 4.0).ceil().max(0.0) as usize;
            let by_log = by_log.min(TTFT_BINS - 1);
            let bin = TTFT.bin::<TTFT_BINS>(v);
            // Equal, or one off exactly at a bin edge where the two roundings differ.
            assert!(
                bin == by_log || (TTFT.upper(bin) - v).abs() < 1e-9 * v,
                "{v}: {bin} vs {by_log}"
            );
            v *= 1.013;
        }
        assert_eq!(TTFT.upper(TTFT_BINS - 2), 2097.152);
        assert_eq!(TPS.upper(TPS_BINS - 2), 131_072.0);
    }

    #[test]
    fn medians_are_within_a_few_percent() {
        let t0 = Instant::now();
        let w = Window::new(t0);
        for (ttft, tps) in [(150, 50.0), (160, 48.0), (170, 52.0)] {
            w.record(t0, ok(ttft, tps));
        }
        let s = w.summary(t0);
        assert!(close(s.ttft_p50.unwrap(), 0.160, 0.1), "{s:?}");
        assert!(close(s.decode_p50.unwrap(), 50.0, 0.1), "{s:?}");
    }

    #[test]
    fn sums_the_last_five_minutes_and_forgets_older_steps() {
        let t0 = Instant::now();
        let w = Window::new(t0);
        w.record(t0, ok(300, 40.0));
        let failed = Sample {
            error: true,
            ..Sample::default()
        };
        w.record(t0 + Duration::from_secs(5), failed);
        w.rejection(t0 + Duration::from_secs(60));
        w.record(t0 + Duration::from_secs(120), ok(400, 60.0));
        let s = w.summary(t0 + Duration::from_secs(121));
        assert_eq!((s.requests, s.errors, s.rejections), (3, 1, 1));
        assert!(
            s.ttft_p50.is_some_and(|t| (0.25..=0.45).contains(&t)),
            "{s:?}"
        );

        // 4m50s after the first step ends, the first step has left the window.
        let s = w.summary(t0 + Duration::from_secs(300));
        assert_eq!((s.requests, s.errors, s.rejections), (1, 0, 1));
        assert!(close(s.decode_p50.unwrap(), 60.0, 0.1), "{s:?}");
        // Far later, nothing is left, and a request then reuses a slot from scratch.
        let late = t0 + Duration::from_secs(3600);
        assert_eq!(w.summary(late), Summary::default());
        w.record(late, ok(100, 10.0));
        assert_eq!(w.summary(late).requests, 1);
    }

    #[test]
    fn a_request_without_timings_counts_but_adds_no_median() {
        let t0 = Instant::now();
        let w = Window::new(t0);
        w.record(t0, Sample::default());
        let s = w.summary(t0);
        assert_eq!(s.requests, 1);
        assert_eq!((s.ttft_p50, s.decode_p50), (None, None));
    }
}
