//! The checks of single values every section uses: addresses, the reasoning field, numbers
//! above zero, durations with their defaults, the CPU count defaults follow.

use std::net::SocketAddr;
use std::time::Duration;

use super::error::ConfigError;
use crate::reasoning::OutputField;

pub(super) fn socket_addr(
    key: &str,
    value: &str,
    errs: &mut Vec<ConfigError>,
) -> Option<SocketAddr> {
    match value.parse() {
        Ok(a) => Some(a),
        Err(_) => {
            errs.push(ConfigError::BadValue {
                key: key.into(),
                value: value.into(),
                reason: "is not an address of the form IP:PORT".into(),
            });
            None
        }
    }
}

pub(super) fn reasoning_field(key: &str, value: &str, errs: &mut Vec<ConfigError>) -> OutputField {
    value.parse().unwrap_or_else(|_| {
        errs.push(ConfigError::BadValue {
            key: key.into(),
            value: value.into(),
            reason: "is not one of reasoning_content, reasoning, both".into(),
        });
        OutputField::default()
    })
}

pub(super) fn nonzero(key: &str, value: u64, errs: &mut Vec<ConfigError>) -> u64 {
    if value == 0 {
        errs.push(ConfigError::Zero { key: key.into() });
    }
    value
}

/// `value` (or `default`) milliseconds, refused when zero.
pub(super) fn ms(
    key: &str,
    value: Option<u64>,
    default: u64,
    errs: &mut Vec<ConfigError>,
) -> Duration {
    Duration::from_millis(nonzero(key, value.unwrap_or(default), errs))
}

/// `value` (or `default`) seconds, refused when zero.
pub(super) fn secs(
    key: &str,
    value: Option<u64>,
    default: u64,
    errs: &mut Vec<ConfigError>,
) -> Duration {
    Duration::from_secs(nonzero(key, value.unwrap_or(default), errs))
}

/// One per CPU: the default of the worker and count concurrency.
pub(super) fn cores() -> u64 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u64)
}
