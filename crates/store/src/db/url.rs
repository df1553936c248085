//! Where a store is kept: a SQLite file or a PostgreSQL database, read from its URL
//! (`sqlite://PATH`, `postgres://…`), shown without a password.

use std::path::PathBuf;

/// The database a ledger (and the Batch API's state) is kept in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerUrl {
    /// A SQLite file (`sqlite:///abs/path.db`, `sqlite://relative.db`), made when missing.
    Sqlite(PathBuf),
    /// A PostgreSQL database, as `postgres://` or `postgresql://` URL (its password, if any,
    /// is never logged).
    Postgres(String),
}

/// Why a text is no ledger URL; its text is the reason, the URL itself not repeated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("names no file (sqlite:///var/lib/switchboard/usage.db)")]
    NoFile,
    #[error("names no host")]
    NoHost,
    #[error("is not a URL: {0}")]
    NotUrl(#[from] url::ParseError),
    #[error("must start with sqlite:// or postgres://")]
    Scheme,
}

impl LedgerUrl {
    /// `sqlite://PATH` (three slashes for an absolute path) or a `postgres://` URL.
    pub fn parse(text: &str) -> Result<LedgerUrl, UrlError> {
        if let Some(path) = text.strip_prefix("sqlite://") {
            if path.is_empty() {
                return Err(UrlError::NoFile);
            }
            return Ok(LedgerUrl::Sqlite(PathBuf::from(path)));
        }
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            let u = url::Url::parse(text)?;
            return match u.host_str().is_some_and(|h| !h.is_empty()) {
                true => Ok(LedgerUrl::Postgres(text.to_string())),
                false => Err(UrlError::NoHost),
            };
        }
        Err(UrlError::Scheme)
    }

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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_read_or_told_why_not() {
        assert_eq!(
            LedgerUrl::parse("sqlite:///var/lib/switchboard/usage.db").unwrap(),
            LedgerUrl::Sqlite("/var/lib/switchboard/usage.db".into())
        );
        assert_eq!(LedgerUrl::parse("sqlite://"), Err(UrlError::NoFile));
        assert_eq!(LedgerUrl::parse("postgres://"), Err(UrlError::NoHost));
        assert_eq!(LedgerUrl::parse("mysql://x/db"), Err(UrlError::Scheme));
    }

    #[test]
    fn a_postgres_password_is_not_shown() {
        let u = LedgerUrl::parse("postgres://sb:secret@db:5432/usage").unwrap();
        assert_eq!(u.shown(), "postgres://sb:***@db:5432/usage");
    }
}
