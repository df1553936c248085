//! `[batches]`: the Batch API's bounds — how large a file, how many lines, what each client
//! may keep and run at once, how often a line is retried — as written, validated into the
//! store's [`Batches`] bounds. The Batch API is served when the usage ledger is on (its state
//! is kept there).

use std::time::Duration;

use serde::Deserialize;
pub(crate) use switchboard_store::batches::Bounds as Batches;

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
