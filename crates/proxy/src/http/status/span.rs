//! A span of time as the page writes it, in its two largest units.

use std::time::Duration;

/// A span of time in its two largest units: `42 s`, `3 min 5 s`, `2 h 10 min`, `3 d 4 h`.
pub(crate) fn span(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{} min {} s", s / 60, s % 60),
        3600..=86_399 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86_400, s % 86_400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_read_in_their_two_largest_units() {
        assert_eq!(span(Duration::from_secs(42)), "42 s");
        assert_eq!(span(Duration::from_secs(185)), "3 min 5 s");
        assert_eq!(span(Duration::from_secs(7800)), "2 h 10 min");
        assert_eq!(span(Duration::from_secs(3 * 86_400 + 4 * 3600)), "3 d 4 h");
    }
}
