//! Seconds counted in floats as a `Duration`, without a panic: a figure that comes of what a
//! backend reported (a prediction, a debt) may be any number a float holds.

use std::time::Duration;

/// `secs` seconds: none when it is not above zero (a negative number, not a number), the
/// longest `Duration` when it is longer.
pub(crate) fn duration(secs: f64) -> Duration {
    if secs.is_nan() || secs <= 0.0 {
        return Duration::ZERO;
    }
    Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_float_is_a_duration() {
        assert_eq!(duration(1.5), Duration::from_millis(1500));
        for none in [0.0, -0.0, -1.0, f64::NAN, f64::NEG_INFINITY] {
            assert_eq!(duration(none), Duration::ZERO, "{none}");
        }
        for longest in [1e30, f64::MAX, f64::INFINITY] {
            assert_eq!(duration(longest), Duration::MAX, "{longest}");
        }
    }
}
