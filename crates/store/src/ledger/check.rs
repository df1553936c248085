//! The ledger's self-check: a SQLite file read through for damage (`PRAGMA quick_check`) on a
//! connection of its own, so pages the writer's connection holds in memory hide nothing on
//! disk. A PostgreSQL server keeps its own pages; its ledger has nothing to check here.

use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OpenFlags};

use crate::db::LedgerUrl;

/// What keeps a check from passing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The file is damaged (or is no database): what the check found, naming the file.
    Corrupt(String),
    /// The check could not read the file (busy, unreadable): why.
    Unchecked(String),
}

impl Problem {
    pub(crate) fn text(self) -> String {
        match self {
            Problem::Corrupt(t) | Problem::Unchecked(t) => t,
        }
    }
}

/// The most damage a check reports (it stops there).
const FINDINGS: usize = 3;

/// Reads the ledger at `url` through: `Ok` for a sound file, a missing one (a new ledger) and a
/// PostgreSQL database.
pub(crate) fn check(url: &LedgerUrl) -> Result<(), Problem> {
    let LedgerUrl::Sqlite(path) = url else {
        return Ok(());
    };
    if !path.exists() {
        return Ok(());
    }
    let at = url.shown();
    let problem = |e: rusqlite::Error| match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => {
            Problem::Corrupt(format!("{at} is corrupt: {e}"))
        }
        _ => Problem::Unchecked(format!("{at}: {e}")),
    };
    // Read and write (never create): a file in WAL mode is read with its log.
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(problem)?;
    conn.busy_timeout(Duration::from_secs(10))
        .map_err(problem)?;
    let found: Vec<String> = conn
        .prepare(&format!("PRAGMA quick_check({FINDINGS})"))
        .and_then(|mut st| {
            st.query_map([], |r| r.get(0))?
                .collect::<Result<Vec<String>, _>>()
        })
        .map_err(problem)?;
    if found.iter().all(|f| f == "ok") {
        return Ok(());
    }
    // Each finding's lines but the heading naming the schema (`*** in database main ***`).
    let findings: Vec<&str> = found
        .iter()
        .flat_map(|f| f.lines())
        .filter(|l| !l.starts_with("***"))
        .collect();
    Err(Problem::Corrupt(format!(
        "{at} is corrupt: {}",
        findings.join("; ")
    )))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_sound_file_a_missing_one_and_postgres_pass_and_a_damaged_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage.db");
        let url = LedgerUrl::Sqlite(path.clone());
        assert_eq!(check(&url), Ok(()));
        let c = Connection::open(&path).unwrap();
        c.execute_batch(
            "CREATE TABLE t (x TEXT); WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL \
             SELECT i + 1 FROM n WHERE i < 5000) INSERT INTO t SELECT hex(randomblob(100)) FROM n;",
        )
        .unwrap();
        drop(c);
        assert_eq!(check(&url), Ok(()));
        assert_eq!(
            check(&LedgerUrl::Postgres("postgres://db/usage".into())),
            Ok(())
        );
        let mut bytes = std::fs::read(&path).unwrap();
        let page = 4096;
        let middle = bytes.len() / page / 2 * page;
        bytes[middle..middle + 4 * page].fill(0xa5);
        std::fs::write(&path, &bytes).unwrap();
        let Err(Problem::Corrupt(why)) = check(&url) else {
            panic!("a damaged file passed its check")
        };
        assert!(
            why.starts_with(&format!("{} is corrupt: ", url.shown())),
            "{why}"
        );
        assert!(!why.contains("***"), "{why}");
        std::fs::write(&path, vec![0x5a; 8192]).unwrap();
        let Err(Problem::Corrupt(why)) = check(&url) else {
            panic!("a file that is no database passed its check")
        };
        assert!(why.contains("not a database"), "{why}");
    }
}
