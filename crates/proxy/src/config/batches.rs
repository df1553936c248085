//! `[batches]`: the Batch API's bounds — how large a file, how many lines, what each client
//! may keep and run at once, how often a line is retried — as written, as validated. The
//! Batch API is served when the usage ledger is on (its state is kept there).

use std::time::Duration;

use serde::Deserialize;

use super::error::ConfigError;

/// `[batches]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBatches {
    pub max_file_bytes: Option<u64>,
    pub(crate) max_lines: Option<u64>,
    pub(crate) files_per_client: Option<u64>,
    pub(crate) bytes_per_client: Option<u64>,
    pub(crate) batches_in_progress_per_client: Option<u64>,
    pub(crate) max_concurrent: Option<u64>,
    pub(crate) max_concurrent_per_client: Option<u64>,
    pub(crate) line_retries: Option<u64>,
    pub(crate) retry_after_ms: Option<u64>,
    pub(crate) lease_ms: Option<u64>,
}

/// `[batches]`, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Batches {
    /// The largest file `POST /v1/files` takes.
    pub(crate) max_file_bytes: u64,
    /// The most lines one batch's input may have.
    pub(crate) max_lines: u64,
    /// What one client may keep: files, and their bytes together.
    pub(crate) files_per_client: u64,
    pub(crate) bytes_per_client: u64,
    /// Batches of one client validating, in progress or finalizing at once.
    pub(crate) batches_in_progress_per_client: u64,
    /// Lines of one batch, and of one client's batches together, running at once.
    pub(crate) max_concurrent: u64,
    pub(crate) max_concurrent_per_client: u64,
    /// Times a line that failed for a transient reason (a 5xx, a 429, a timeout, a backend
    /// down) is run again before it goes to the error file; and the wait before each.
    pub(crate) line_retries: u64,
    pub(crate) retry_after: Duration,
    /// How long a process's claim on a line holds without being renewed (it is renewed every
    /// second while the line runs): a process that died leaves its lines to others this long.
    pub(crate) lease: Duration,
}

impl Default for Batches {
    fn default() -> Batches {
        Batches {
            max_file_bytes: 200 * 1000 * 1000,
            max_lines: 50_000,
            files_per_client: 100,
            bytes_per_client: 1000 * 1000 * 1000,
            batches_in_progress_per_client: 10,
            max_concurrent: 4,
            max_concurrent_per_client: 8,
            line_retries: 3,
            retry_after: Duration::from_millis(1000),
            lease: Duration::from_secs(30),
        }
    }
}

pub fn validate(raw: RawBatches, errs: &mut Vec<ConfigError>) -> Batches {
    let d = Batches::default();
    let mut positive = |key: &str, v: Option<u64>, default: u64| match v {
        Some(0) => {
            errs.push(ConfigError::Zero {
                key: format!("batches.{key}"),
            });
            default
        }
        Some(v) => v,
        None => default,
    };
    Batches {
        max_file_bytes: positive("max_file_bytes", raw.max_file_bytes, d.max_file_bytes),
        max_lines: positive("max_lines", raw.max_lines, d.max_lines),
        files_per_client: positive("files_per_client", raw.files_per_client, d.files_per_client),
        bytes_per_client: positive("bytes_per_client", raw.bytes_per_client, d.bytes_per_client),
        batches_in_progress_per_client: positive(
            "batches_in_progress_per_client",
            raw.batches_in_progress_per_client,
            d.batches_in_progress_per_client,
        ),
        max_concurrent: positive("max_concurrent", raw.max_concurrent, d.max_concurrent),
        max_concurrent_per_client: positive(
            "max_concurrent_per_client",
            raw.max_concurrent_per_client,
            d.max_concurrent_per_client,
        ),
        line_retries: raw.line_retries.unwrap_or(d.line_retries),
        retry_after: raw
            .retry_after_ms
            .map_or(d.retry_after, Duration::from_millis),
        lease: match raw.lease_ms {
            Some(ms) if ms < 3000 => {
                errs.push(ConfigError::BadValue {
                    key: "batches.lease_ms".into(),
                    value: ms.to_string(),
                    reason: "is below 3000: a claim is renewed once a second".into(),
                });
                d.lease
            }
            ms => ms.map_or(d.lease, Duration::from_millis),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_keys_take_their_defaults_and_a_bad_bound_is_named() {
        let mut errs = Vec::new();
        assert_eq!(
            validate(RawBatches::default(), &mut errs),
            Batches::default()
        );
        assert!(errs.is_empty());
        let raw = RawBatches {
            max_concurrent: Some(0),
            line_retries: Some(0),
            lease_ms: Some(2999),
            ..RawBatches::default()
        };
        let got = validate(raw, &mut errs);
        assert_eq!(got.line_retries, 0);
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert_eq!(
            errs[0],
            ConfigError::Zero {
                key: "batches.max_concurrent".into()
            }
        );
        assert!(
            errs[1]
                .to_string()
                .starts_with("batches.lease_ms: \"2999\""),
            "{}",
            errs[1]
        );
    }
}
