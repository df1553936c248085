//! Why a call of the Batch API's state failed: its database, the ledger it opens through, or
//! the folder its files' contents are kept in. Its text may name a path or a host: a client is
//! told only that the database did not answer (`ProxyError::database`).

use crate::db::DbError;
use crate::ledger::LedgerError;

#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error(transparent)]
    Db(#[from] DbError),
    /// The ledger's database could not be opened (or migrated).
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// A file's content could not be written or read.
    #[error("{0}")]
    File(#[from] std::io::Error),
    /// An upload's content could not be written.
    #[error("a file's content cannot be written: {0}")]
    Upload(std::io::Error),
    /// The files' folder could not be made.
    #[error("{path}: {source}")]
    Folder {
        path: String,
        source: std::io::Error,
    },
    /// The database keeps no content for the file.
    #[error("{0}: no content")]
    NoContent(String),
    /// The lane's connection is down, for the reason its last call failed with.
    #[error("{0}")]
    Down(String),
    /// A lane's thread could not be started, or ended.
    #[error("{0}")]
    Thread(String),
    /// Another process ended the batch first (its end is rolled back: nothing to do).
    #[error("ended by another process")]
    EndedElsewhere,
}
