//! What a backend reports of a request's work — its usage and llama.cpp's `timings` — held to
//! what the request could have taken, once, as it ends: the cost model, the fair order, the
//! charge, the ledger, the metrics and every `Duration` count these figures, never the raw ones.

use std::time::Duration;

use crate::wire::usage::{Timings, Usage};

/// The most tokens of either kind a request is believed to have taken where nothing smaller
/// is known: the proxy counts a request's tokens in `u32`s (the guard, output limits).
const MOST_TOKENS: u64 = u32::MAX as u64;

/// What one request could have taken of its backend.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Bounds {
    /// Prompt tokens, cached ones included: its alias's context window (the guard held the
    /// request to it, and a slot holds no more).
    pub(crate) prompt: u64,
    /// Output tokens: its output limit, else the window, for each of its choices.
    pub(crate) output: u64,
    /// GPU-seconds: its wall time on the backend, from sending it to its end, times the
    /// backend's slots. A slot works on one request at a time, so a request's own time is at
    /// most its wall time; counted over every slot, a backend that splits a request (its
    /// choices) over several still fits, while no backend can have spent more.
    pub(crate) seconds: f64,
}

impl Bounds {
    /// Of a request whose work is not known (no time on a backend, no size): its counts held
    /// to the most a request is counted in, its timings to nothing.
    pub(crate) const ANY: Bounds = Bounds {
        prompt: MOST_TOKENS,
        output: MOST_TOKENS,
        seconds: 0.0,
    };

    /// The bounds of a request guarded against `window`, asking `output` tokens (its limit,
    /// where it sets one) for each of its `choices`, `wall` on a backend of `slots` slots.
    pub(crate) fn of(
        window: Option<u32>,
        (output, choices): (Option<u32>, u32),
        (slots, wall): (u32, Duration),
    ) -> Bounds {
        let window = window.map_or(MOST_TOKENS, u64::from);
        let each = output.map_or(window, u64::from);
        Bounds {
            prompt: window,
            output: each
                .saturating_mul(u64::from(choices.max(1)))
                .min(MOST_TOKENS),
            seconds: wall.as_secs_f64() * f64::from(slots.max(1)),
        }
    }
}

/// `u` as believed within `b`: each count no more than the request could have taken (its
/// cached tokens no more than its prompt, its reasoning no more than its output), its timings
/// as [`timings`] holds them, its speeds those of the timings believed.
pub(crate) fn believed(u: Usage, b: &Bounds) -> Usage {
    let prompt = u.prompt.min(b.prompt);
    let completion = u.completion.min(b.output);
    let timings = u.timings.and_then(|t| timings(t, b));
    Usage {
        prompt,
        completion,
        reasoning: u.reasoning.map(|r| r.min(completion)),
        cached: u.cached.map(|c| c.min(prompt)),
        prefill_tps: timings.and_then(|t| t.prompt_per_second),
        decode_tps: timings.and_then(|t| t.predicted_per_second),
        timings,
    }
}

/// `t` as believed within `b`: none when a time in it is no number of milliseconds (negative,
/// infinite, not a number), so the proxy's own clock measures the request as for a backend
/// that sends no timings; else its counts within the request's size and its two times within
/// its wall time (both shortened alike where together they are longer), each speed as
/// [`speed`] holds it.
fn timings(t: Timings, b: &Bounds) -> Option<Timings> {
    let times = [t.prompt_ms, t.predicted_ms];
    if !times.into_iter().flatten().all(is_amount) {
        return None;
    }
    let total = times.iter().flatten().sum::<f64>() / 1000.0;
    let scale = if total > b.seconds {
        b.seconds / total
    } else {
        1.0
    };
    let cache_n = t.cache_n.map(|n| n.min(b.prompt));
    let prompt_n = t.prompt_n.map(|n| n.min(b.prompt - cache_n.unwrap_or(0)));
    let predicted_n = t.predicted_n.map(|n| n.min(b.output));
    let prompt_ms = t.prompt_ms.map(|ms| ms * scale);
    let predicted_ms = t.predicted_ms.map(|ms| ms * scale);
    Some(Timings {
        cache_n,
        prompt_n,
        prompt_ms,
        prompt_per_second: speed(
            t.prompt_per_second,
            (t.prompt_n, t.prompt_ms),
            (prompt_n, prompt_ms),
        ),
        predicted_n,
        predicted_ms,
        predicted_per_second: speed(
            t.predicted_per_second,
            (t.predicted_n, t.predicted_ms),
            (predicted_n, predicted_ms),
        ),
    })
}

/// A phase's speed as believed: as `reported` where its count and time were believed as
/// they came (`was` is `is`) and it is a number (llama.cpp reports one from its unrounded
/// time, where the time it writes may read 0), else its tokens believed over its time
/// believed (none where that time is 0).
fn speed(
    reported: Option<f64>,
    was: (Option<u64>, Option<f64>),
    is: (Option<u64>, Option<f64>),
) -> Option<f64> {
    if was == is {
        return reported.filter(|r| is_amount(*r));
    }
    let (n, ms) = (is.0?, is.1?);
    (ms > 0.0).then(|| n as f64 * 1000.0 / ms)
}

/// Whether `x` is an amount: a finite number, not below zero.
fn is_amount(x: f64) -> bool {
    x.is_finite() && x >= 0.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request of a 4,096-token window asking 100 tokens, 2 s on a backend of 2 slots.
    fn bounds() -> Bounds {
        Bounds::of(Some(4096), (Some(100), 1), (2, Duration::from_secs(2)))
    }

    fn usage(t: Timings) -> Usage {
        Usage {
            prompt: 50,
            completion: 10,
            timings: Some(t),
            prefill_tps: t.prompt_per_second,
            decode_tps: t.predicted_per_second,
            ..Usage::default()
        }
    }

    fn sane() -> Timings {
        Timings {
            cache_n: Some(10),
            prompt_n: Some(40),
            prompt_ms: Some(20.0),
            prompt_per_second: Some(2000.0),
            predicted_n: Some(10),
            predicted_ms: Some(250.0),
            predicted_per_second: Some(40.0),
        }
    }

    #[test]
    fn the_bounds_are_the_window_the_limit_for_each_choice_and_the_slots_wall_time() {
        assert_eq!(
            bounds(),
            Bounds {
                prompt: 4096,
                output: 100,
                seconds: 4.0
            }
        );
        let b = Bounds::of(Some(4096), (None, 3), (1, Duration::ZERO));
        assert_eq!((b.output, b.seconds), (3 * 4096, 0.0));
        // Nothing known: the most a request's tokens are counted in.
        let b = Bounds::of(None, (None, u32::MAX), (1, Duration::ZERO));
        assert_eq!((b.prompt, b.output), (MOST_TOKENS, MOST_TOKENS));
    }

    #[test]
    fn a_sane_report_is_believed_as_it_is() {
        let u = usage(sane());
        assert_eq!(believed(u, &bounds()), u);
        // A speed of a time written as 0 (llama.cpp writes whole microseconds).
        let u = usage(Timings {
            prompt_ms: Some(0.0),
            prompt_per_second: Some(4e7),
            ..sane()
        });
        assert_eq!(believed(u, &bounds()).prefill_tps, Some(4e7));
    }

    #[test]
    fn a_speed_that_is_no_amount_is_not_believed() {
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            let u = usage(Timings {
                prompt_per_second: Some(bad),
                predicted_per_second: Some(bad),
                ..sane()
            });
            let b = believed(u, &bounds());
            assert_eq!((b.prefill_tps, b.decode_tps), (None, None), "{bad}");
            assert!(b.timings.is_some());
        }
    }

    #[test]
    fn counts_past_the_requests_size_are_held_to_it() {
        let mut u = usage(Timings {
            cache_n: Some(4000),
            prompt_n: Some(1_000_000_000_000_000),
            predicted_n: Some(u64::MAX),
            ..sane()
        });
        u.prompt = u64::MAX;
        u.completion = 10_000_000_000_000_000_000;
        u.reasoning = Some(u64::MAX);
        u.cached = Some(u64::MAX);
        let b = believed(u, &bounds());
        assert_eq!((b.prompt, b.completion), (4096, 100));
        assert_eq!((b.reasoning, b.cached), (Some(100), Some(4096)));
        let t = b.timings.unwrap();
        assert_eq!((t.cache_n, t.prompt_n), (Some(4000), Some(96)));
        assert_eq!(t.predicted_n, Some(100));
        // The speeds are the counts believed over the times.
        assert_eq!(b.prefill_tps, Some(96.0 * 1000.0 / 20.0));
        assert_eq!(b.decode_tps, Some(100.0 * 1000.0 / 250.0));
    }

    #[test]
    fn times_past_the_wall_time_are_shortened_alike_to_it() {
        let u = usage(Timings {
            prompt_ms: Some(1e300),
            predicted_ms: Some(1e300),
            ..sane()
        });
        let t = believed(u, &bounds()).timings.unwrap();
        for ms in [t.prompt_ms.unwrap(), t.predicted_ms.unwrap()] {
            assert!((ms - 2000.0).abs() < 1e-6, "{ms}");
        }
        let u = usage(Timings {
            prompt_ms: Some(6000.0),
            predicted_ms: Some(2000.0),
            ..sane()
        });
        let t = believed(u, &bounds()).timings.unwrap();
        assert_eq!((t.prompt_ms, t.predicted_ms), (Some(3000.0), Some(1000.0)));
    }

    #[test]
    fn a_time_that_is_no_number_of_milliseconds_leaves_no_timings_believed() {
        for bad in [-1e9, -0.5, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            for t in [
                Timings {
                    prompt_ms: Some(bad),
                    ..sane()
                },
                Timings {
                    predicted_ms: Some(bad),
                    ..sane()
                },
            ] {
                let b = believed(usage(t), &bounds());
                assert_eq!(b.timings, None, "{bad}");
                assert_eq!((b.prefill_tps, b.decode_tps), (None, None), "{bad}");
                assert_eq!((b.prompt, b.completion), (50, 10));
            }
        }
    }
}
