//! The store's one way to its database, SQLite or PostgreSQL: a connection opened from the
//! ledger's URL, statements run with values bound (`$1`, `$2`, … in both; translated for
//! SQLite here), rows read back as values, and a transaction around a closure. The ledger and
//! the Batch API write their statements once for both (the types and SQL they use mean the
//! same in each).

mod lite;
mod pg;
mod url;

use std::str::FromStr;
use std::time::Duration;

pub use url::{LedgerUrl, UrlError};

/// Why a call to the database failed. Its text may name the database (a file's path, a
/// server's host): a client is told only that the database did not answer.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The database at `at` (as it may be shown) could not be opened.
    #[error("{at}: {why}")]
    Open { at: String, why: String },
    /// The driver's error (PostgreSQL's: the server's own message where it sent one).
    #[error("{0}")]
    Sql(String),
    /// A column read back is not of the type asked.
    #[error("column {col} is {found}")]
    Column { col: usize, found: String },
    /// A statement that reads one row read none.
    #[error("no row")]
    NoRow,
}

impl From<rusqlite::Error> for DbError {
    fn from(e: rusqlite::Error) -> DbError {
        DbError::Sql(e.to_string())
    }
}

impl From<postgres::Error> for DbError {
    fn from(e: postgres::Error) -> DbError {
        DbError::Sql(match e.as_db_error() {
            Some(db) => format!("{}: {}", db.severity(), db.message()),
            None => e.to_string(),
        })
    }
}

/// A value bound to a statement or read from a row.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    Int(i64),
    Float(f64),
    Text(String),
    Bytes(Vec<u8>),
    /// NULL, of the column's type (PostgreSQL binds a NULL with its type).
    NoInt,
    NoFloat,
    NoText,
}

impl Val {
    fn is_null(&self) -> bool {
        matches!(self, Val::NoInt | Val::NoFloat | Val::NoText)
    }
}

impl From<i64> for Val {
    fn from(v: i64) -> Val {
        Val::Int(v)
    }
}

impl From<f64> for Val {
    fn from(v: f64) -> Val {
        Val::Float(v)
    }
}

impl From<&str> for Val {
    fn from(v: &str) -> Val {
        Val::Text(v.to_string())
    }
}

impl From<&String> for Val {
    fn from(v: &String) -> Val {
        Val::Text(v.clone())
    }
}

impl From<Option<i64>> for Val {
    fn from(v: Option<i64>) -> Val {
        v.map_or(Val::NoInt, Val::Int)
    }
}

impl From<Option<f64>> for Val {
    fn from(v: Option<f64>) -> Val {
        v.map_or(Val::NoFloat, Val::Float)
    }
}

impl From<Option<&str>> for Val {
    fn from(v: Option<&str>) -> Val {
        v.map_or(Val::NoText, |s| Val::Text(s.to_string()))
    }
}

/// A row read back.
#[derive(Debug, Clone, PartialEq)]
pub struct Row(pub(crate) Vec<Val>);

impl Row {
    fn wrong(&self, col: usize, want: &str) -> DbError {
        let found = match self.0.get(col) {
            Some(v) => format!("no {want}: {v:?}"),
            None => "missing".into(),
        };
        DbError::Column { col, found }
    }

    fn null(col: usize) -> DbError {
        DbError::Column {
            col,
            found: "NULL".into(),
        }
    }

    pub fn int(&self, i: usize) -> Result<i64, DbError> {
        self.opt_int(i)?.ok_or_else(|| Row::null(i))
    }

    pub(crate) fn opt_int(&self, i: usize) -> Result<Option<i64>, DbError> {
        match self.0.get(i) {
            Some(Val::Int(v)) => Ok(Some(*v)),
            Some(v) if v.is_null() => Ok(None),
            _ => Err(self.wrong(i, "integer")),
        }
    }

    /// A number (SQLite may hand back an integer where a real was summed).
    pub(crate) fn opt_float(&self, i: usize) -> Result<Option<f64>, DbError> {
        match self.0.get(i) {
            Some(Val::Float(v)) => Ok(Some(*v)),
            Some(Val::Int(v)) => Ok(Some(*v as f64)),
            Some(v) if v.is_null() => Ok(None),
            _ => Err(self.wrong(i, "number")),
        }
    }

    pub(crate) fn float(&self, i: usize) -> Result<f64, DbError> {
        self.opt_float(i)?.ok_or_else(|| Row::null(i))
    }

    pub(crate) fn text(&self, i: usize) -> Result<String, DbError> {
        self.opt_text(i)?.ok_or_else(|| Row::null(i))
    }

    pub(crate) fn opt_text(&self, i: usize) -> Result<Option<String>, DbError> {
        match self.0.get(i) {
            Some(Val::Text(v)) => Ok(Some(v.clone())),
            Some(v) if v.is_null() => Ok(None),
            _ => Err(self.wrong(i, "text")),
        }
    }

    pub(crate) fn bytes(&self, i: usize) -> Result<Vec<u8>, DbError> {
        match self.0.get(i) {
            Some(Val::Bytes(v)) => Ok(v.clone()),
            _ => Err(self.wrong(i, "bytes")),
        }
    }
}

/// What statements are run on: a connection or a transaction, of either database.
pub trait Db {
    /// Runs `sql` with `params`; the rows it changed.
    fn exec(&mut self, sql: &str, params: &[Val]) -> Result<u64, DbError>;
    /// The rows `sql` with `params` reads.
    fn rows(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Row>, DbError>;
    /// Runs `sql`, one or more statements with no parameters.
    fn batch(&mut self, sql: &str) -> Result<(), DbError>;
}

impl dyn Db + '_ {
    /// The one row `sql` with `params` reads (a count, a sum).
    pub fn one(&mut self, sql: &str, params: &[Val]) -> Result<Row, DbError> {
        self.rows(sql, params)?
            .into_iter()
            .next()
            .ok_or(DbError::NoRow)
    }
}

/// An open database.
pub(crate) enum Conn {
    Sqlite(rusqlite::Connection),
    Postgres(Box<postgres::Client>),
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Conn::Sqlite(_) => "Conn(sqlite)",
            Conn::Postgres(_) => "Conn(postgres)",
        })
    }
}

impl Conn {
    /// Opens the database at `url` (a SQLite file in WAL mode, waiting up to 10 s for a lock;
    /// a PostgreSQL server, within 5 s unless the URL says otherwise); an error names the
    /// database as it may be shown.
    pub(crate) fn open(url: &LedgerUrl) -> Result<Conn, DbError> {
        let at = url.shown();
        let open = |e: &dyn std::fmt::Display| DbError::Open {
            at: at.clone(),
            why: e.to_string(),
        };
        match url {
            LedgerUrl::Sqlite(path) => {
                let conn = rusqlite::Connection::open(path).map_err(|e| open(&e))?;
                conn.busy_timeout(Duration::from_secs(10))
                    .map_err(|e| open(&e))?;
                // The first read tells a file that is no database. In WAL mode a commit
                // survives the process (kill -9) without an fsync of its own; the log is synced
                // at checkpoints (a power cut may take the last commits).
                conn.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(()))
                    .map_err(|e| open(&e))?;
                conn.execute_batch("PRAGMA synchronous=NORMAL")
                    .map_err(|e| open(&e))?;
                Ok(Conn::Sqlite(conn))
            }
            LedgerUrl::Postgres(text) => {
                let mut cfg = postgres::Config::from_str(text).map_err(|e| open(&e))?;
                if cfg.get_connect_timeout().is_none() {
                    cfg.connect_timeout(Duration::from_secs(5));
                }
                let client = cfg.connect(postgres::NoTls).map_err(|e| open(&e))?;
                Ok(Conn::Postgres(Box::new(client)))
            }
        }
    }

    /// `f` in one transaction: committed when it returns `Ok`, rolled back otherwise.
    pub(crate) fn tx<T, E: From<DbError>>(
        &mut self,
        f: impl FnOnce(&mut dyn Db) -> Result<T, E>,
    ) -> Result<T, E> {
        self.tx_as(rusqlite::TransactionBehavior::Deferred, f)
    }

    /// [`Conn::tx`] holding SQLite's write lock from its start (a transaction that reads, then
    /// writes what it read: no other may write in between); PostgreSQL's is the same.
    pub(crate) fn tx_writing<T, E: From<DbError>>(
        &mut self,
        f: impl FnOnce(&mut dyn Db) -> Result<T, E>,
    ) -> Result<T, E> {
        self.tx_as(rusqlite::TransactionBehavior::Immediate, f)
    }

    fn tx_as<T, E: From<DbError>>(
        &mut self,
        how: rusqlite::TransactionBehavior,
        f: impl FnOnce(&mut dyn Db) -> Result<T, E>,
    ) -> Result<T, E> {
        match self {
            Conn::Sqlite(c) => {
                let mut tx = c.transaction_with_behavior(how).map_err(DbError::from)?;
                let out = f(&mut tx)?;
                tx.commit().map_err(DbError::from)?;
                Ok(out)
            }
            Conn::Postgres(c) => {
                let mut tx = c.transaction().map_err(DbError::from)?;
                let out = f(&mut tx)?;
                tx.commit().map_err(DbError::from)?;
                Ok(out)
            }
        }
    }

    /// Whether it is a PostgreSQL database (several processes may share it).
    pub(crate) fn shared(&self) -> bool {
        matches!(self, Conn::Postgres(_))
    }

    /// Whether the connection is lost for good (PostgreSQL's, its server gone).
    pub(crate) fn is_closed(&self) -> bool {
        matches!(self, Conn::Postgres(c) if c.is_closed())
    }
}

impl Db for Conn {
    fn exec(&mut self, sql: &str, params: &[Val]) -> Result<u64, DbError> {
        match self {
            Conn::Sqlite(c) => lite::exec(c, sql, params),
            Conn::Postgres(c) => pg::exec(c.as_mut(), sql, params),
        }
    }

    fn rows(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Row>, DbError> {
        match self {
            Conn::Sqlite(c) => lite::rows(c, sql, params),
            Conn::Postgres(c) => pg::rows(c.as_mut(), sql, params),
        }
    }

    fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        match self {
            Conn::Sqlite(c) => Ok(c.execute_batch(sql)?),
            Conn::Postgres(c) => Ok(c.batch_execute(sql)?),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn numbered_parameters_bind_by_number_in_sqlite_and_values_come_back_typed() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Conn::open(&LedgerUrl::Sqlite(dir.path().join("t.db"))).unwrap();
        c.batch("CREATE TABLE t (a BIGINT, b TEXT, c DOUBLE PRECISION, d BYTEA)")
            .unwrap();
        // `$2` before `$1`: bound by its number, not by where it first appears.
        let p = [
            Val::Text("x".into()),
            7.into(),
            0.5.into(),
            Val::Bytes(vec![1]),
        ];
        c.exec("INSERT INTO t (a, b, c, d) VALUES ($2, $1, $3, $4)", &p)
            .unwrap();
        c.exec("INSERT INTO t (a) VALUES ($1)", &[Val::NoInt])
            .unwrap();
        let rows = c.rows("SELECT a, b, c, d FROM t ORDER BY a", &[]).unwrap();
        let r = &rows[1];
        assert_eq!(
            (r.int(0).unwrap(), r.text(1).unwrap(), r.float(2).unwrap()),
            (7, "x".to_string(), 0.5)
        );
        assert_eq!(r.bytes(3).unwrap(), [1]);
        assert_eq!(rows[0].opt_int(0).unwrap(), None);
        assert_eq!(rows[0].opt_text(1).unwrap(), None);
        assert!(r.int(1).is_err(), "text read as an integer");
        let sum = c.rows("SELECT CAST(sum(a) AS BIGINT) FROM t", &[]).unwrap();
        assert_eq!(sum[0].int(0).unwrap(), 7);
    }

    #[test]
    fn a_transaction_is_rolled_back_when_its_closure_fails() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Conn::open(&LedgerUrl::Sqlite(dir.path().join("t.db"))).unwrap();
        c.batch("CREATE TABLE t (a BIGINT)").unwrap();
        let failed: Result<(), DbError> = c.tx(|tx| {
            tx.exec("INSERT INTO t (a) VALUES ($1)", &[1.into()])?;
            Err(DbError::NoRow)
        });
        assert!(failed.is_err());
        c.tx_writing(|tx| tx.exec("INSERT INTO t (a) VALUES ($1)", &[2.into()]))
            .unwrap();
        let db: &mut dyn Db = &mut c;
        assert_eq!(
            db.one("SELECT count(*) FROM t", &[])
                .unwrap()
                .int(0)
                .unwrap(),
            1
        );
    }

    #[test]
    fn an_unopenable_database_is_named_as_it_may_be_shown() {
        let url = LedgerUrl::Postgres("postgres://u:secret@127.0.0.1:1/x".into());
        let e = Conn::open(&url).unwrap_err().to_string();
        assert!(e.starts_with("postgres://u:***@127.0.0.1:1/x: "), "{e}");
        assert!(!e.contains("secret"), "{e}");
    }
}
