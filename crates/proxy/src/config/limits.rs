//! A client's limits as written under `[clients.NAME]` (`tokens_per_day`,
//! `gpu_seconds_per_minute`, …), checked and read into a [`ByLimit`] of the store's limits.

use std::num::NonZeroU64;

pub use switchboard_store::limits::{ByLimit, Limit, Resource, Window};

use super::error::ConfigError;

/// A limit as written: a count, or (GPU time) seconds.
pub(super) enum Written {
    Count(u64),
    Seconds(f64),
}

/// The limits a client sets (`written`: what it writes of each), checked (each greater than
/// zero; GPU time at least a millisecond), its keys named `clients.NAME.KEY` in errors by
/// `key`.
pub(super) fn read(
    written: impl Fn(Limit) -> Option<Written>,
    key: &dyn Fn(&str) -> String,
    errs: &mut Vec<ConfigError>,
) -> ByLimit<Option<NonZeroU64>> {
    ByLimit::from_fn(|limit| match written(limit)? {
        Written::Count(n) => NonZeroU64::new(n).or_else(|| {
            errs.push(ConfigError::Zero {
                key: key(&limit.key()),
            });
            None
        }),
        Written::Seconds(s) => gpu_ms(&key(&limit.key()), s, errs),
    })
}

/// A budget of GPU-seconds, in milliseconds: a number of seconds of at least a millisecond.
fn gpu_ms(key: &str, seconds: f64, errs: &mut Vec<ConfigError>) -> Option<NonZeroU64> {
    let ms = (seconds * 1000.0).round();
    if seconds.is_finite() && ms >= 1.0 && ms < u64::MAX as f64 {
        return NonZeroU64::new(ms as u64);
    }
    errs.push(ConfigError::BadValue {
        key: key.into(),
        value: seconds.to_string(),
        reason: "is not a number of seconds of at least 0.001".into(),
    });
    None
}
