//! The rate-limit headers a client with limits gets on every answer: OpenAI's
//! `x-ratelimit-*` and, on `/v1/messages`, Anthropic's `anthropic-ratelimit-*`; its GPU budgets
//! as `x-switchboard-ratelimit-*-gpu-seconds`. Each resource a header tells
//! ([`crate::config::Resource::header`]) is told of its minute's limit, else of its budget of
//! the day or month with the least left.

use std::time::{Duration, SystemTime};

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use super::limiter::Left;
use crate::config::{ByLimit, Limit, Resource, Window};

/// Write `standing` into `headers`: of each resource a header tells, its minute's limit, else
/// its budget of a day or month with the least left; `anthropic`: in Anthropic's names (reset
/// as an RFC 3339 time) instead of OpenAI's (reset as a duration).
pub(crate) fn write(headers: &mut HeaderMap, standing: &ByLimit<Option<Left>>, anthropic: bool) {
    for resource in Resource::ALL {
        let Some(kind) = resource.header() else {
            continue;
        };
        let minute = standing[Limit::new(resource, Window::Minute)];
        let Some(left) = minute.or_else(|| crate::budget::least(standing, resource)) else {
            continue;
        };
        match resource.millis() {
            true => write_millis(headers, kind, left),
            false => write_count(headers, kind, left, anthropic),
        }
    }
}

/// One limit of a count (requests, tokens) as `x-ratelimit-{limit,remaining,reset}-{kind}` (or
/// Anthropic's `anthropic-ratelimit-{kind}-*`).
fn write_count(headers: &mut HeaderMap, kind: &str, left: Left, anthropic: bool) {
    let reset = if anthropic {
        rfc3339(SystemTime::now() + left.reset)
    } else {
        duration(left.reset)
    };
    let values = [
        ("limit", left.limit.to_string()),
        ("remaining", left.remaining.to_string()),
        ("reset", reset),
    ];
    for (what, value) in values {
        let name = if anthropic {
            format!("anthropic-ratelimit-{kind}-{what}")
        } else {
            format!("x-ratelimit-{what}-{kind}")
        };
        insert(headers, name, value);
    }
}

fn insert(headers: &mut HeaderMap, name: String, value: String) {
    if let (Ok(n), Ok(v)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
        headers.insert(n, v);
    }
}

/// The headers of `caller`'s standing now, when it has limits.
pub(crate) fn of_caller(headers: &mut HeaderMap, caller: Option<&super::Caller>, anthropic: bool) {
    if let Some(c) = caller.filter(|c| c.spec.limited()) {
        let standing = c.state.standing(std::time::Instant::now());
        write(headers, &standing, anthropic);
    }
}

/// A limit kept in milliseconds (GPU time) as
/// `x-switchboard-ratelimit-{limit,remaining,reset}-{kind}`, in seconds.
fn write_millis(headers: &mut HeaderMap, kind: &str, left: Left) {
    let seconds = |ms: u64| format!("{:.3}", ms as f64 / 1000.0);
    let values = [
        ("limit", seconds(left.limit)),
        ("remaining", seconds(left.remaining)),
        ("reset", duration(left.reset)),
    ];
    for (what, value) in values {
        insert(
            headers,
            format!("x-switchboard-ratelimit-{what}-{kind}"),
            value,
        );
    }
}

/// OpenAI's spelling of a duration: `1s`, `6m0s`, `20ms`.
pub(crate) fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let s = d.as_secs_f64().ceil() as u64;
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, m, s) => format!("{h}h{m}m{s}s"),
    }
}

/// `2026-12-02T04:05:06Z`.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// A limit nothing has been taken of (for tests and the status page).
#[cfg(test)]
pub(crate) fn full(limit: u64) -> Left {
    Left {
        limit,
        remaining: limit,
        reset: Duration::ZERO,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    #[test]
    fn durations_and_times_are_spelled_as_clients_read_them() {
        assert_eq!(duration(Duration::from_millis(20)), "20ms");
        assert_eq!(duration(Duration::from_secs(1)), "1s");
        assert_eq!(duration(Duration::from_secs(360)), "6m0s");
        assert_eq!(duration(Duration::from_secs(3661)), "1h1m1s");
        let t = UNIX_EPOCH + Duration::from_secs(1_795_752_306);
        assert_eq!(rfc3339(t), "2026-11-27T04:05:06Z");
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
    }

    #[test]
    fn gpu_budgets_are_told_in_seconds() {
        let mut standing = ByLimit::default();
        standing[Limit::new(Resource::Gpu, Window::Day)] = Some(Left {
            limit: 120_000,
            remaining: 90_500,
            reset: Duration::from_secs(15),
        });
        let mut h = HeaderMap::new();
        write(&mut h, &standing, false);
        assert_eq!(h["x-switchboard-ratelimit-limit-gpu-seconds"], "120.000");
        assert_eq!(h["x-switchboard-ratelimit-remaining-gpu-seconds"], "90.500");
        assert_eq!(h["x-switchboard-ratelimit-reset-gpu-seconds"], "15s");
    }

    #[test]
    fn both_spellings_are_written() {
        let mut s = ByLimit::default();
        s[Limit::new(Resource::Requests, Window::Minute)] = Some(full(10));
        s[Limit::new(Resource::Tokens, Window::Day)] = Some(Left {
            limit: 1000,
            remaining: 400,
            reset: Duration::from_secs(61),
        });
        s[Limit::new(Resource::Tokens, Window::Month)] = Some(full(5000));
        let mut h = HeaderMap::new();
        write(&mut h, &s, false);
        assert_eq!(h["x-ratelimit-limit-requests"], "10");
        assert_eq!(h["x-ratelimit-remaining-tokens"], "400");
        assert_eq!(h["x-ratelimit-reset-tokens"], "1m1s");
        let mut a = HeaderMap::new();
        write(&mut a, &s, true);
        assert_eq!(a["anthropic-ratelimit-tokens-remaining"], "400");
        assert!(a["anthropic-ratelimit-requests-reset"]
            .to_str()
            .unwrap()
            .ends_with('Z'));
    }
}
