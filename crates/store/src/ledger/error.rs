//! Why the ledger's database cannot be used, or a call to it failed. Its text may name the
//! database (a file's path, a server's host): the log and the status page show it, a client
//! is told only that the database did not answer (`ProxyError::database`).

use super::check::Problem;
use super::schema;
use crate::db::DbError;

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// A call to the database failed.
    #[error(transparent)]
    Db(#[from] DbError),
    /// The database at `at` (as it may be shown) failed as it was opened or migrated.
    #[error("{at}: {source}")]
    At { at: String, source: DbError },
    /// The database holds a schema newer than this build's.
    #[error("{}", schema::too_new(at, *version))]
    TooNew { at: String, version: i64 },
    /// A SQLite file found damaged, or that could not be read through.
    #[error("{}", .0.clone().text())]
    Check(Problem),
    /// The database is out of use (it could not be opened, or failed its check).
    #[error("the database is out of use")]
    OutOfUse,
    /// Writes fail, for the reason given when they started failing.
    #[error("{0}")]
    Failing(String),
    /// A width of buckets no roll-up has.
    #[error("no roll-up of {0} ms")]
    NoRollup(i64),
    /// The ledger's thread could not be started, or ended.
    #[error("the ledger's {0}")]
    Thread(String),
}
