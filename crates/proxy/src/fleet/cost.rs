//! What a request costs a backend in GPU time, learned from what its answers report: a prefill
//! rate that falls with the depth the prompt is read at, and a decode rate that falls with the
//! depth it writes at. One [`CostModel`] per backend, kept for the process's life (a reload
//! keeps what was learned).
//!
//! Each phase is a line in the time per token: `t(x) = a + b·x` seconds for the token at depth
//! `x` (attention reads every token before it), so `n` tokens from depth `d` take
//! `a·n + b·n·(d + n/2)`. `a` and `b` are fitted by least squares over the answers' timings,
//! each weighted by the inverse square of its time (the fit minimizes relative error, so a
//! short turn counts as much as a compaction), older answers fading (each new one multiplies
//! the sums by [`FADE`]). Before any answer, a prior stands in: the backend's configured seeds,
//! else the built-in defaults ([`Seed::default`]), worth [`PRIOR_WEIGHT`] answers.

use crate::lock::Locked;
use std::sync::Mutex;

pub(crate) use crate::config::Seed;

/// Each new observation multiplies the sums by this (half-life of about 35 answers).
const FADE: f64 = 0.98;
/// How many answers the prior counts as (it is two points, at depth 0 and [`PRIOR_DEPTH`]).
const PRIOR_WEIGHT: f64 = 1.0;
/// The depth of the prior's second point.
const PRIOR_DEPTH: f64 = 32_768.0;
/// The least time an observation must take to be learned from (shorter ones are noise).
const LEAST_SECONDS: f64 = 0.000_5;

/// What one answer took, as its backend reported it (or the proxy timed it).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Observed {
    /// Prompt tokens read from cache.
    pub cached: u64,
    /// Prompt tokens processed.
    pub prompt: u64,
    /// Seconds the prompt took (`None`: not measured).
    pub prompt_s: Option<f64>,
    /// Tokens generated.
    pub generated: u64,
    /// Seconds the generation took.
    pub generated_s: Option<f64>,
}

impl Observed {
    /// Its GPU-seconds, prefill and decode (0 where not measured).
    pub fn seconds(&self) -> Work {
        Work {
            prefill: self.prompt_s.unwrap_or(0.0),
            decode: self.generated_s.unwrap_or(0.0),
        }
    }
}

/// GPU-seconds of a request, by phase.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Work {
    pub prefill: f64,
    pub decode: f64,
}

impl Work {
    pub fn total(&self) -> f64 {
        self.prefill + self.decode
    }
}

/// One phase's fit: sums of the weighted normal equations of `t = a·x1 + b·x2`.
#[derive(Debug, Clone, Copy, Default)]
struct Line {
    s11: f64,
    s12: f64,
    s22: f64,
    s1t: f64,
    s2t: f64,
    /// Answers learned (faded).
    n: f64,
}

/// The two features of `n` tokens from depth `d`: `n` and `n·(d + n/2)`.
fn features(n: f64, d: f64) -> (f64, f64) {
    (n, n * (d + n / 2.0))
}

impl Line {
    /// The prior of a phase running at `tps` at depth 0, halving at `half` (a per-token time
    /// of `1/tps` growing by `1/(tps·half)` per token of depth).
    fn prior(tps: f64, half: Option<f64>) -> Line {
        let a = 1.0 / tps;
        let b = half.map_or(0.0, |h| a / h);
        let mut line = Line::default();
        for d in [0.0, PRIOR_DEPTH] {
            let n = 1024.0;
            let (x1, x2) = features(n, d);
            line.add(x1, x2, a * x1 + b * x2, PRIOR_WEIGHT);
        }
        line.n = 0.0;
        line
    }

    fn add(&mut self, x1: f64, x2: f64, t: f64, weight: f64) {
        // Relative error: both sides over t.
        let w = weight / (t * t);
        self.s11 += w * x1 * x1;
        self.s12 += w * x1 * x2;
        self.s22 += w * x2 * x2;
        self.s1t += w * x1 * t;
        self.s2t += w * x2 * t;
        self.n += weight;
    }

    fn fade(&mut self) {
        for s in [
            &mut self.s11,
            &mut self.s12,
            &mut self.s22,
            &mut self.s1t,
            &mut self.s2t,
            &mut self.n,
        ] {
            *s *= FADE;
        }
    }

    /// `(a, b)`: the least-squares fit, `b` held at 0 where it would be negative.
    fn solve(&self) -> (f64, f64) {
        let det = self.s11 * self.s22 - self.s12 * self.s12;
        if det > f64::EPSILON * self.s11 * self.s22 {
            let a = (self.s1t * self.s22 - self.s2t * self.s12) / det;
            let b = (self.s11 * self.s2t - self.s12 * self.s1t) / det;
            if a > 0.0 && b >= 0.0 {
                return (a, b);
            }
        }
        // One feature only: no slowing with depth.
        (self.s1t / self.s11.max(f64::MIN_POSITIVE), 0.0)
    }
}

/// A fitted phase: seconds per token at depth 0 and their growth per token of depth.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    a: f64,
    b: f64,
}

impl Rate {
    /// Seconds for `n` tokens from depth `d`.
    pub(crate) fn seconds(&self, n: u64, d: u64) -> f64 {
        let (x1, x2) = features(n as f64, d as f64);
        self.a * x1 + self.b * x2
    }

    /// Tokens per second at depth 0.
    pub fn tokens_per_second(&self) -> f64 {
        1.0 / self.a
    }

    /// The depth at which the rate is half its rate at depth 0 (`None`: it does not slow).
    pub fn half_depth(&self) -> Option<f64> {
        (self.b > 0.0).then(|| self.a / self.b)
    }
}

/// What the model holds: both phases' fits, and the seed they started from.
#[derive(Debug, Clone, Copy)]
struct Fit {
    seed: Seed,
    prefill: Line,
    decode: Line,
}

impl Fit {
    fn new(seed: Seed) -> Fit {
        Fit {
            seed,
            prefill: Line::prior(seed.prefill_tps, seed.prefill_half_depth),
            decode: Line::prior(seed.decode_tps, seed.decode_half_depth),
        }
    }
}

/// One backend's cost model.
#[derive(Debug)]
pub struct CostModel {
    fit: Mutex<Fit>,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel::new(Seed::default())
    }
}

impl CostModel {
    pub(crate) fn new(seed: Seed) -> CostModel {
        CostModel {
            fit: Mutex::new(Fit::new(seed)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Fit> {
        self.fit.locked()
    }

    /// Start from `seed` when it is not the one in force (a reload changed it): what was
    /// learned is kept, the prior is the new seed's.
    pub(crate) fn seed(&self, seed: Seed) {
        let mut fit = self.lock();
        if fit.seed == seed {
            return;
        }
        let (old, new) = (Fit::new(fit.seed), Fit::new(seed));
        reprior(&mut fit.prefill, &old.prefill, &new.prefill);
        reprior(&mut fit.decode, &old.decode, &new.decode);
        fit.seed = seed;
    }

    /// Learn from one answer's timings.
    pub fn learn(&self, o: &Observed) {
        let mut fit = self.lock();
        if let Some(t) = o.prompt_s.filter(|t| *t >= LEAST_SECONDS && o.prompt > 0) {
            let (x1, x2) = features(o.prompt as f64, o.cached as f64);
            fit.prefill.fade();
            fit.prefill.add(x1, x2, t, 1.0);
        }
        if let Some(t) = o
            .generated_s
            .filter(|t| *t >= LEAST_SECONDS && o.generated > 0)
        {
            let depth = (o.cached + o.prompt) as f64;
            let (x1, x2) = features(o.generated as f64, depth);
            fit.decode.fade();
            fit.decode.add(x1, x2, t, 1.0);
        }
    }

    /// The prefill and decode rates in force.
    pub fn rates(&self) -> (Rate, Rate) {
        let fit = *self.lock();
        let rate = |l: &Line| {
            let (a, b) = l.solve();
            Rate { a, b }
        };
        (rate(&fit.prefill), rate(&fit.decode))
    }

    /// Answers learned, per phase (faded: recent ones count most).
    pub(crate) fn learned(&self) -> (f64, f64) {
        let fit = self.lock();
        (fit.prefill.n, fit.decode.n)
    }

    /// The GPU-seconds of `uncached` prompt tokens read after `cached` ones, then `output`
    /// tokens generated.
    pub fn predict(&self, cached: u64, uncached: u64, output: u64) -> Work {
        let (prefill, decode) = self.rates();
        Work {
            prefill: prefill.seconds(uncached, cached),
            decode: decode.seconds(output, cached + uncached),
        }
    }
}

/// `line` with the prior `old` it grew from swapped for `new`, at the weight the prior has
/// left after what `line` learned.
fn reprior(line: &mut Line, old: &Line, new: &Line) {
    let left = prior_left(line.n);
    line.s11 += (new.s11 - old.s11) * left;
    line.s12 += (new.s12 - old.s12) * left;
    line.s22 += (new.s22 - old.s22) * left;
    line.s1t += (new.s1t - old.s1t) * left;
    line.s2t += (new.s2t - old.s2t) * left;
}

/// What is left of the prior's weight once `learned` (faded) answers were added: the prior
/// fades with every answer as they do, so its share is `FADE^k` after `k` answers; `learned`
/// is `Σ FADE^i` for `i < k`.
fn prior_left(learned: f64) -> f64 {
    // Σ_{i<k} FADE^i = (1 - FADE^k) / (1 - FADE).
    (1.0 - learned * (1.0 - FADE)).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend of `tps` prompt tokens/s halving at `half`, `dtps` decode halving at `dhalf`.
    fn gpu(tps: f64, half: f64, dtps: f64, dhalf: f64) -> impl Fn(u64, u64, u64) -> Observed {
        move |cached, prompt, out| {
            let p = Rate {
                a: 1.0 / tps,
                b: 1.0 / (tps * half),
            };
            let d = Rate {
                a: 1.0 / dtps,
                b: 1.0 / (dtps * dhalf),
            };
            Observed {
                cached,
                prompt,
                prompt_s: Some(p.seconds(prompt, cached)),
                generated: out,
                generated_s: Some(d.seconds(out, cached + prompt)),
            }
        }
    }

    fn close(got: f64, want: f64, within: f64) -> bool {
        (got - want).abs() <= within * want.abs()
    }

    #[test]
    fn before_any_answer_the_seed_predicts() {
        let m = CostModel::new(Seed {
            prefill_tps: 4_000.0,
            prefill_half_depth: None,
            decode_tps: 40.0,
            decode_half_depth: None,
        });
        let w = m.predict(0, 40_000, 64);
        assert!(close(w.prefill, 10.0, 1e-6), "{w:?}");
        assert!(close(w.decode, 1.6, 1e-6), "{w:?}");
        // Cached tokens cost nothing to read.
        assert!(close(m.predict(39_000, 1_000, 0).prefill, 0.25, 1e-6));
    }

    #[test]
    fn it_learns_a_backend_other_than_its_seed_and_its_slowing_with_depth() {
        let m = CostModel::default();
        let real = gpu(4_000.0, 100_000.0, 40.0, 200_000.0);
        let mixed = [
            (0, 500, 16),
            (0, 40_000, 64),
            (2_000, 1_500, 64),
            (20_000, 1_500, 32),
            (0, 8_000, 256),
            (45_000, 2_000, 64),
        ];
        for _ in 0..20 {
            for &(c, p, o) in &mixed {
                m.learn(&real(c, p, o));
            }
        }
        let (prefill, decode) = m.rates();
        assert!(
            close(prefill.tokens_per_second(), 4_000.0, 0.05),
            "{prefill:?}"
        );
        assert!(
            close(prefill.half_depth().unwrap(), 100_000.0, 0.1),
            "{prefill:?}"
        );
        assert!(close(decode.tokens_per_second(), 40.0, 0.05), "{decode:?}");
        // Predictions of shapes it never saw.
        let want = real(100_000, 30_000, 100);
        let got = m.predict(100_000, 30_000, 100);
        assert!(
            close(got.prefill, want.prompt_s.unwrap(), 0.05),
            "{got:?} {want:?}"
        );
        assert!(
            close(got.decode, want.generated_s.unwrap(), 0.05),
            "{got:?} {want:?}"
        );
    }

    #[test]
    fn a_backend_that_does_not_slow_with_depth_fits_no_slowing() {
        let m = CostModel::default();
        for (c, p) in [(0, 1_000), (30_000, 1_000), (0, 20_000), (10_000, 5_000)] {
            m.learn(&Observed {
                cached: c,
                prompt: p,
                prompt_s: Some(p as f64 / 2_000.0),
                ..Observed::default()
            });
            m.learn(&Observed {
                cached: c,
                prompt: p,
                prompt_s: Some(p as f64 / 2_000.0),
                ..Observed::default()
            });
        }
        let (prefill, _) = m.rates();
        assert!(
            close(prefill.tokens_per_second(), 2_000.0, 0.1),
            "{prefill:?}"
        );
        let w = m.predict(50_000, 10_000, 0);
        assert!(close(w.prefill, 5.0, 0.15), "{w:?}");
    }

    #[test]
    fn answers_too_short_to_time_teach_nothing() {
        let m = CostModel::default();
        let before = m.rates();
        m.learn(&Observed {
            prompt: 3,
            prompt_s: Some(0.000_01),
            generated: 0,
            generated_s: Some(0.5),
            ..Observed::default()
        });
        assert_eq!(m.rates(), before);
        assert_eq!(m.learned(), (0.0, 0.0));
    }

    #[test]
    fn a_new_seed_keeps_what_was_learned() {
        let m = CostModel::default();
        let real = gpu(3_000.0, 80_000.0, 30.0, 150_000.0);
        for _ in 0..50 {
            for &(c, p, o) in &[(0, 2_000, 32), (10_000, 4_000, 64), (0, 30_000, 16)] {
                m.learn(&real(c, p, o));
            }
        }
        let learned = m.rates();
        m.seed(Seed {
            prefill_tps: 100.0,
            prefill_half_depth: None,
            decode_tps: 5.0,
            decode_half_depth: None,
        });
        let (p, d) = m.rates();
        assert!(close(
            p.tokens_per_second(),
            learned.0.tokens_per_second(),
            0.02
        ));
        assert!(close(
            d.tokens_per_second(),
            learned.1.tokens_per_second(),
            0.02
        ));
        // A fresh model takes the new seed whole.
        let fresh = CostModel::default();
        fresh.seed(Seed {
            prefill_tps: 100.0,
            prefill_half_depth: None,
            decode_tps: 5.0,
            decode_half_depth: None,
        });
        assert!(close(fresh.rates().0.tokens_per_second(), 100.0, 1e-6));
    }
}
