//! `[ledger]`: where the usage ledger is kept (a SQLite file or a PostgreSQL database), how
//! its rows are batched and how long raw rows are kept; off while no `url` is set.

use std::time::Duration;

use serde::Deserialize;
pub use switchboard_store::db::LedgerUrl;
pub use switchboard_store::ledger::Settings as Ledger;

use super::error::ConfigError;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLedger {
    pub url: Option<String>,
    pub(crate) batch_rows: Option<u64>,
    pub(crate) batch_interval_ms: Option<u64>,
    pub(crate) buffer_rows: Option<u64>,
    pub(crate) retention_days: Option<u64>,
    pub(crate) budget_refresh_ms: Option<u64>,
    pub(crate) check_interval_ms: Option<u64>,
    pub(crate) required: Option<bool>,
}

/// The `[ledger]` section: `None` when no `url` is set and no `data_dir` (no ledger); without a
/// `url`, a SQLite file `usage.db` in `data_dir`.
pub fn validate(
    raw: RawLedger,
    data_dir: Option<&std::path::Path>,
    errs: &mut Vec<ConfigError>,
) -> Option<Ledger> {
    let bad = |key: &str, value: &str, reason: &str| ConfigError::BadValue {
        key: format!("ledger.{key}"),
        value: value.to_string(),
        reason: reason.to_string(),
    };
    let text = match (raw.url, data_dir) {
        (Some(url), _) => url,
        (None, Some(dir)) => format!("sqlite://{}", dir.join("usage.db").display()),
        (None, None) => return None,
    };
    let url = match LedgerUrl::parse(&text) {
        Ok(u) => u,
        Err(reason) => {
            errs.push(bad("url", &text, &reason.to_string()));
            return None;
        }
    };
    let d = Ledger::at(url);
    let mut bounded = |key: &str, v: Option<u64>, default: u64, range: (u64, u64)| {
        let v = v.unwrap_or(default);
        if v < range.0 || v > range.1 {
            let reason = format!("must be between {} and {}", range.0, range.1);
            errs.push(bad(key, &v.to_string(), &reason));
        }
        v
    };
    let ms = |d: Duration| d.as_millis() as u64;
    let rows = (d.batch_rows as u64, d.buffer_rows as u64);
    let batch_rows = bounded("batch_rows", raw.batch_rows, rows.0, (1, 100_000));
    let interval = bounded(
        "batch_interval_ms",
        raw.batch_interval_ms,
        ms(d.batch_interval),
        (10, 600_000),
    );
    let buffer_rows = bounded("buffer_rows", raw.buffer_rows, rows.1, (1, 10_000_000));
    let retention_days = bounded(
        "retention_days",
        raw.retention_days,
        d.retention_days,
        (0, 36_500),
    );
    let budget_refresh = bounded(
        "budget_refresh_ms",
        raw.budget_refresh_ms,
        ms(d.budget_refresh),
        (10, 3_600_000),
    );
    let check_interval = bounded(
        "check_interval_ms",
        raw.check_interval_ms,
        ms(d.check_interval),
        (10, 86_400_000),
    );
    if buffer_rows < batch_rows {
        errs.push(bad(
            "buffer_rows",
            &buffer_rows.to_string(),
            "must be at least ledger.batch_rows",
        ));
    }
    Some(Ledger {
        batch_rows: batch_rows as usize,
        batch_interval: Duration::from_millis(interval),
        buffer_rows: buffer_rows as usize,
        retention_days,
        budget_refresh: Duration::from_millis(budget_refresh),
        check_interval: Duration::from_millis(check_interval),
        required: raw.required.unwrap_or(false),
        ..d
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(toml: &str) -> (Option<Ledger>, Vec<String>) {
        use figment::providers::{Format, Toml};
        let raw: RawLedger = figment::Figment::new()
            .merge(Toml::string(toml))
            .extract()
            .unwrap_or_default();
        let mut errs = Vec::new();
        let l = validate(raw, None, &mut errs);
        (l, errs.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn a_ledger_is_off_without_a_url_and_has_defaults_with_one() {
        assert_eq!(check("").0, None);
        let (l, errs) = check(r#"url = "sqlite:///var/lib/switchboard/usage.db""#);
        assert!(errs.is_empty(), "{errs:?}");
        let l = l.unwrap();
        assert_eq!(
            l.url,
            LedgerUrl::Sqlite("/var/lib/switchboard/usage.db".into())
        );
        assert_eq!(
            (l.batch_rows, l.buffer_rows, l.retention_days),
            (500, 100_000, 90)
        );
        assert_eq!(l.batch_interval, Duration::from_secs(1));
    }

    #[test]
    fn a_data_dir_holds_the_ledger_a_url_does_not_name() {
        let mut errs = Vec::new();
        let dir = std::path::Path::new("/var/lib/switchboard");
        let l = validate(RawLedger::default(), Some(dir), &mut errs).unwrap();
        assert_eq!(
            l.url,
            LedgerUrl::Sqlite("/var/lib/switchboard/usage.db".into())
        );
        let raw = RawLedger {
            url: Some("postgres://db/usage".into()),
            ..RawLedger::default()
        };
        let l = validate(raw, Some(dir), &mut errs).unwrap();
        assert_eq!(l.url, LedgerUrl::Postgres("postgres://db/usage".into()));
        assert!(errs.is_empty());
    }

    #[test]
    fn a_bad_url_or_bound_is_named() {
        for (toml, key) in [
            (r#"url = "mysql://x/db""#, "ledger.url"),
            (r#"url = "sqlite://""#, "ledger.url"),
            (r#"url = "postgres://""#, "ledger.url"),
            (
                "url = \"sqlite://a.db\"\nbatch_rows = 0",
                "ledger.batch_rows",
            ),
            (
                "url = \"sqlite://a.db\"\nbatch_rows = 10\nbuffer_rows = 5",
                "ledger.buffer_rows",
            ),
        ] {
            let (_, errs) = check(toml);
            assert!(errs.iter().any(|e| e.contains(key)), "{toml}: {errs:?}");
        }
    }
}
