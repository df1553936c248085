//! `[ledger]`: where the usage ledger is kept (a SQLite file or a PostgreSQL database), how
//! its rows are batched and how long raw rows are kept; off while no `url` is set.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

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

/// The database a ledger is kept in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerUrl {
    /// A SQLite file (`sqlite:///abs/path.db`, `sqlite://relative.db`), made when missing.
    Sqlite(PathBuf),
    /// A PostgreSQL database, as `postgres://` or `postgresql://` URL (its password, if any,
    /// is never logged).
    Postgres(String),
}

impl LedgerUrl {
    /// The URL as it may be shown: a PostgreSQL password replaced by `***`.
    pub fn shown(&self) -> String {
        match self {
            LedgerUrl::Sqlite(p) => format!("sqlite://{}", p.display()),
            LedgerUrl::Postgres(u) => match url::Url::parse(u) {
                Ok(mut u) if u.password().is_some() => {
                    let _ = u.set_password(Some("***"));
                    u.to_string()
                }
                _ => u.clone(),
            },
        }
    }
}

/// The ledger as configured.
#[derive(Debug, Clone, PartialEq)]
pub struct Ledger {
    pub url: LedgerUrl,
    /// A batch is written once it holds this many rows (or its interval passed).
    pub batch_rows: usize,
    /// A batch is written at least this often while rows wait.
    pub batch_interval: Duration,
    /// Rows waiting for the database at most (in the queue and in batches not yet written);
    /// more are dropped and counted (`switchboard_ledger_rows_dropped_total`).
    pub buffer_rows: usize,
    /// Raw rows older than this many days are deleted (the hourly and daily roll-ups stay);
    /// 0 keeps them forever.
    pub retention_days: u64,
    /// How often what other processes spent of the clients' day and month budgets is read.
    pub budget_refresh: Duration,
    /// How often a SQLite ledger reads its file through for corruption (`PRAGMA quick_check`
    /// on a connection of its own); it also does at start and after a failed write or read.
    pub check_interval: Duration,
    /// A database that cannot be opened, or fails its check, at start stops the proxy; without,
    /// the proxy serves without the ledger and says so. (A reload to one fails either way.)
    pub required: bool,
}

impl Ledger {
    /// A ledger at `url` with every other key at its default.
    pub fn at(url: LedgerUrl) -> Ledger {
        Ledger {
            url,
            batch_rows: DEFAULTS.0 as usize,
            batch_interval: Duration::from_millis(DEFAULTS.1),
            buffer_rows: DEFAULTS.2 as usize,
            retention_days: DEFAULTS.3,
            budget_refresh: Duration::from_millis(DEFAULTS.4),
            check_interval: Duration::from_millis(CHECK_INTERVAL_MS),
            required: false,
        }
    }
}

/// `batch_rows`, `batch_interval_ms`, `buffer_rows`, `retention_days`, `budget_refresh_ms`
/// unset.
const DEFAULTS: (u64, u64, u64, u64, u64) = (500, 1000, 100_000, 90, 5000);

/// `check_interval_ms` unset: an hour.
const CHECK_INTERVAL_MS: u64 = 3_600_000;

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
    let url = match parse_url(&text) {
        Ok(u) => u,
        Err(reason) => {
            errs.push(bad("url", &text, &reason));
            return None;
        }
    };
    let mut bounded = |key: &str, v: Option<u64>, default: u64, range: (u64, u64)| {
        let v = v.unwrap_or(default);
        if v < range.0 || v > range.1 {
            let reason = format!("must be between {} and {}", range.0, range.1);
            errs.push(bad(key, &v.to_string(), &reason));
        }
        v
    };
    let (rows, ms, buffer, days, refresh) = DEFAULTS;
    let batch_rows = bounded("batch_rows", raw.batch_rows, rows, (1, 100_000));
    let interval = bounded(
        "batch_interval_ms",
        raw.batch_interval_ms,
        ms,
        (10, 600_000),
    );
    let buffer_rows = bounded("buffer_rows", raw.buffer_rows, buffer, (1, 10_000_000));
    let retention_days = bounded("retention_days", raw.retention_days, days, (0, 36_500));
    let budget_refresh = bounded(
        "budget_refresh_ms",
        raw.budget_refresh_ms,
        refresh,
        (10, 3_600_000),
    );
    let check_interval = bounded(
        "check_interval_ms",
        raw.check_interval_ms,
        CHECK_INTERVAL_MS,
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
        url,
        batch_rows: batch_rows as usize,
        batch_interval: Duration::from_millis(interval),
        buffer_rows: buffer_rows as usize,
        retention_days,
        budget_refresh: Duration::from_millis(budget_refresh),
        check_interval: Duration::from_millis(check_interval),
        required: raw.required.unwrap_or(false),
    })
}

/// `sqlite://PATH` (three slashes for an absolute path) or a `postgres://` URL.
pub fn parse_url(text: &str) -> Result<LedgerUrl, String> {
    if let Some(path) = text.strip_prefix("sqlite://") {
        if path.is_empty() {
            return Err("names no file (sqlite:///var/lib/switchboard/usage.db)".into());
        }
        return Ok(LedgerUrl::Sqlite(PathBuf::from(path)));
    }
    if text.starts_with("postgres://") || text.starts_with("postgresql://") {
        return match url::Url::parse(text) {
            Ok(u) if u.host_str().is_some_and(|h| !h.is_empty()) => {
                Ok(LedgerUrl::Postgres(text.to_string()))
            }
            Ok(_) => Err("names no host".into()),
            Err(e) => Err(format!("is not a URL: {e}")),
        };
    }
    Err("must start with sqlite:// or postgres://".into())
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

    #[test]
    fn a_postgres_password_is_not_shown() {
        let u = parse_url("postgres://sb:secret@db:5432/usage").unwrap();
        assert_eq!(u.shown(), "postgres://sb:***@db:5432/usage");
    }
}
