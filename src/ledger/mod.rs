//! The usage ledger: one row per request that reached a model endpoint, kept in SQLite or
//! PostgreSQL with hourly and daily roll-ups per client and alias.
//!
//! Serving never waits for it: a request's row is handed to a queue as its record ends, and
//! a thread of the ledger's own writes the rows in batches (`batch_rows`, or whatever waited
//! `batch_interval_ms`), one transaction each. While the database is slow or down, rows wait
//! up to `buffer_rows`; more are dropped, counted and logged once.

pub mod report;
mod schema;
pub mod store;
mod writer;

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

pub use schema::LATEST as SCHEMA_VERSION;
pub use store::{Bucketed, Dim, Store, Total};
pub use writer::{now_ms, with_store};

use crate::config;

/// One request as the ledger keeps it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Row {
    /// Its number in this process (set by [`Ledger::record`]).
    pub seq: i64,
    /// When it arrived, in milliseconds since the Unix epoch.
    pub at_ms: i64,
    pub request_id: String,
    /// The client's name, `-` without one.
    pub client: String,
    /// The alias that answered (after any fallback), as the client named it when none did.
    pub alias: String,
    /// `-` when no backend was tried.
    pub backend: String,
    /// The API the client spoke: `chat`, `responses`, `messages`, …
    pub api: String,
    pub status: i64,
    pub prompt_tokens: i64,
    pub cached_tokens: i64,
    pub output_tokens: i64,
    pub gpu_prefill_s: f64,
    pub gpu_decode_s: f64,
    pub ttft_ms: Option<i64>,
    pub duration_ms: i64,
    /// Time it waited for a slot.
    pub queue_ms: i64,
    /// The client went away before the answer ended.
    pub cancelled: bool,
    /// Times its slot was taken before it sent a byte.
    pub preempted: i64,
    /// An alias other than the one asked for answered.
    pub fell_back: bool,
}

/// The ledger's metric handles, registered with the others in `observe::metrics`.
#[derive(Debug, Clone, Default)]
pub struct Counters {
    /// Rows committed to the database.
    pub written: Counter,
    /// Rows given up: `buffer_rows` were waiting.
    pub dropped: Counter,
    /// 1 while the last write (or the start) succeeded, 0 while writes fail.
    pub up: Gauge,
    /// Rows waiting to be written.
    pub waiting: Gauge,
}

/// A started ledger: rows go in through [`Ledger::record`]; its thread ends, writing what
/// waits, once the last handle is dropped.
#[derive(Debug)]
pub struct Ledger {
    tx: Sender<Row>,
    thread: std::thread::JoinHandle<()>,
    settings: config::Ledger,
    shared: Arc<Shared>,
}

/// What the request path and the writer thread both read.
#[derive(Debug)]
struct Shared {
    counters: Counters,
    /// Rows handed in and not yet written or dropped.
    waiting: AtomicUsize,
    seq: AtomicI64,
    /// Whether the drop of a row was logged since the ledger last wrote.
    drop_logged: AtomicBool,
}

impl Ledger {
    /// Opens the database (migrating it), then starts the writer thread. An error says why
    /// the database cannot be used (the serve command fails with it at start).
    pub fn start(settings: &config::Ledger, counters: Counters) -> Result<Ledger, String> {
        let shared = Arc::new(Shared {
            counters,
            waiting: AtomicUsize::new(0),
            seq: AtomicI64::new(0),
            drop_logged: AtomicBool::new(false),
        });
        let (tx, rx) = mpsc::channel();
        let thread = writer::spawn(settings.clone(), rx, Arc::clone(&shared))?;
        shared.counters.up.set(1);
        tracing::info!(ledger = %settings.url.shown(), "usage ledger open");
        Ok(Ledger {
            tx,
            thread,
            settings: settings.clone(),
            shared,
        })
    }

    /// Writes what waits and ends the writer (what dropping the last handle does, waited for).
    pub fn close(self) {
        drop(self.tx);
        let _ = self.thread.join();
    }

    pub fn settings(&self) -> &config::Ledger {
        &self.settings
    }

    /// Hands `row` to the writer; never waits. Dropped (counted, logged once until the
    /// ledger writes again) while `buffer_rows` wait.
    pub fn record(&self, mut row: Row) {
        let s = &self.shared;
        if s.waiting.fetch_add(1, Ordering::Relaxed) >= self.settings.buffer_rows {
            s.waiting.fetch_sub(1, Ordering::Relaxed);
            s.counters.dropped.inc();
            if !s.drop_logged.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    buffer_rows = self.settings.buffer_rows,
                    "usage ledger: rows dropped, the database is not keeping up"
                );
            }
            return;
        }
        row.seq = s.seq.fetch_add(1, Ordering::Relaxed);
        s.counters.waiting.inc();
        if self.tx.send(row).is_err() {
            s.waiting.fetch_sub(1, Ordering::Relaxed);
            s.counters.waiting.dec();
            s.counters.dropped.inc();
        }
    }
}

#[cfg(test)]
mod tests;
