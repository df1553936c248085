//! The Batch API's bounds as the config validated them (`[batches]`): how large a file, how
//! many lines, what each client may keep and run at once, how often a line is retried.

use std::time::Duration;

/// `[batches]`, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// The largest file `POST /v1/files` takes.
    pub max_file_bytes: u64,
    /// The most lines one batch's input may have.
    pub max_lines: u64,
    /// What one client may keep: files, and their bytes together.
    pub files_per_client: u64,
    pub bytes_per_client: u64,
    /// Batches of one client validating, in progress or finalizing at once.
    pub batches_in_progress_per_client: u64,
    /// Lines of one batch, and of one client's batches together, running at once.
    pub max_concurrent: u64,
    pub max_concurrent_per_client: u64,
    /// Times a line that failed for a transient reason (a 5xx, a 429, a timeout, a backend
    /// down) is run again before it goes to the error file; and the wait before each.
    pub line_retries: u64,
    pub retry_after: Duration,
    /// How long a process's claim on a line holds without being renewed (it is renewed every
    /// second while the line runs): a process that died leaves its lines to others this long.
    pub lease: Duration,
}

impl Default for Bounds {
    fn default() -> Bounds {
        Bounds {
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
