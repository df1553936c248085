//! The ledger's settings as the config validated them (`[ledger]`): where it is kept, how its
//! rows are batched, how long raw rows are kept, how often budgets and the file are read.

use std::time::Duration;

use crate::db::LedgerUrl;

/// The ledger as configured.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
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

impl Settings {
    /// A ledger at `url` with every other setting at its default.
    pub fn at(url: LedgerUrl) -> Settings {
        Settings {
            url,
            batch_rows: 500,
            batch_interval: Duration::from_millis(1000),
            buffer_rows: 100_000,
            retention_days: 90,
            budget_refresh: Duration::from_millis(5000),
            check_interval: Duration::from_secs(3600),
            required: false,
        }
    }
}
