//! The usage ledger: one row per request that reached a model endpoint, kept in SQLite or
//! PostgreSQL with hourly and daily roll-ups per client and alias.
//!
//! Serving never waits for it: a request's row is pushed on a queue as its record ends, and a
//! thread of the ledger's own writes the rows in batches, one transaction each: every
//! `batch_interval_ms` what is queued, sooner when `batch_rows` are. The thread is woken once
//! a batch, not once a row (a wake a row cost more than the row's insert). While the
//! database is slow or down, rows wait up to `buffer_rows`; more are dropped, counted and
//! logged once. The same thread reads what other processes spent of the clients' budgets of a
//! day and a month, at start and every `budget_refresh_ms`, for [`crate::budget`]. A database
//! that cannot be opened, or a SQLite file found damaged (read through at start, every
//! `check_interval_ms` and after a failed write or read), is out of use: the proxy serves
//! without it and says so (`switchboard_ledger_up` 0, the status page, the log), or, where the
//! ledger is `required`, does not start.

mod check;
mod error;
pub mod report;
mod schema;
mod settings;
pub(crate) mod store;
mod sums;
mod writer;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

pub(crate) use error::LedgerError;
pub use schema::LATEST as SCHEMA_VERSION;
pub use settings::Settings;
pub use store::{Bucketed, Dim, Store, Total};
pub use writer::{now_ms, with_store};

use crate::budget::Board;
use crate::calendar::Calendar;
use switchboard_sync::Locked;

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
    /// Who owns its usage (what the usage API and the status page show a key) when not its
    /// client: the owner of a key of `server.api_keys_env` (`key-…`).
    pub owner: Option<String>,
    /// The alias that answered (after any fallback), as the client named it when none did.
    pub alias: String,
    /// `-` when no backend was tried.
    pub backend: String,
    /// The API the client spoke, as its endpoint label: `chat_completions`, `responses`, …
    pub api: &'static str,
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
    /// What its client was charged against its budgets (`None`: no client's).
    pub charged_tokens: Option<i64>,
    pub charged_gpu_s: Option<f64>,
}

/// The ledger's metric handles, registered with the others in `observe::metrics`.
#[derive(Debug, Clone, Default)]
pub struct Counters {
    /// Rows committed to the database.
    pub written: Counter,
    /// Rows given up: `buffer_rows` were waiting.
    pub dropped: Counter,
    /// 1 while the database is open and its last write succeeded; 0 while writes fail or it
    /// is out of use (it could not be opened, or is damaged).
    pub up: Gauge,
    /// Rows handed in and not yet written or dropped (what `buffer_rows` bounds).
    pub waiting: Gauge,
}

/// A started ledger: rows go in through [`Ledger::record`]; its thread ends, writing what
/// waits, once the last handle is dropped.
#[derive(Debug)]
pub struct Ledger {
    /// The writer, until [`Ledger::close`] waits for it.
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The writer's handle, to wake it.
    waker: std::thread::Thread,
    settings: Settings,
    shared: Arc<Shared>,
}

/// How many days [`Daily`] holds.
pub const DAYS: usize = 14;
const DAY_MS: i64 = 86_400_000;

/// Tokens (prompt and output) and GPU-seconds per UTC day and owner over the last [`DAYS`]
/// days, as the status page charts them: read from the daily roll-up, then kept up with
/// each batch written (and read again every minute, for what other processes wrote).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Daily {
    /// The first day's start, in milliseconds since the epoch (a UTC midnight).
    pub first_ms: i64,
    /// Per owner (a client, or a key of `server.api_keys_env`), each day's tokens and
    /// GPU-seconds, oldest first.
    pub clients: BTreeMap<String, [(i64, f64); DAYS]>,
}

impl Daily {
    /// The days up to the one holding `now_ms`.
    fn first_for(now_ms: i64) -> i64 {
        (now_ms.div_euclid(DAY_MS) - (DAYS as i64 - 1)) * DAY_MS
    }

    /// From the roll-up's `(day, owner, tokens, GPU-seconds)` rows, for the days to `now_ms`.
    fn of(rows: &[(i64, String, i64, f64)], now_ms: i64) -> Daily {
        let mut d = Daily {
            first_ms: Daily::first_for(now_ms),
            clients: BTreeMap::new(),
        };
        for (day, client, tokens, gpu) in rows {
            d.put(*day, client, *tokens, *gpu);
        }
        d
    }

    fn put(&mut self, at_ms: i64, client: &str, tokens: i64, gpu: f64) {
        let i = (at_ms - self.first_ms).div_euclid(DAY_MS);
        let Ok(i) = usize::try_from(i) else { return };
        if i >= DAYS {
            return;
        }
        let days = self
            .clients
            .entry(client.to_string())
            .or_insert([(0, 0.0); DAYS]);
        days[i].0 += tokens;
        days[i].1 += gpu;
    }

    /// With `rows` added, its days moved on to the one holding `now_ms`.
    fn with(&self, rows: &[Row], now_ms: i64) -> Daily {
        let first = Daily::first_for(now_ms);
        let shift = usize::try_from((first - self.first_ms) / DAY_MS).unwrap_or(0);
        let mut d = Daily {
            first_ms: first,
            clients: self
                .clients
                .iter()
                .map(|(c, days)| {
                    let mut moved = [(0, 0.0); DAYS];
                    for (i, v) in days.iter().enumerate().skip(shift) {
                        moved[i - shift] = *v;
                    }
                    (c.clone(), moved)
                })
                .collect(),
        };
        for r in rows {
            d.put(
                r.at_ms,
                r.owner.as_deref().unwrap_or(&r.client),
                r.prompt_tokens + r.output_tokens,
                r.gpu_prefill_s + r.gpu_decode_s,
            );
        }
        d
    }
}

/// What the request path and the writer thread both read.
#[derive(Debug)]
struct Shared {
    counters: Counters,
    seq: AtomicI64,
    /// Whether the drop of a row was logged since the ledger last wrote.
    drop_logged: AtomicBool,
    /// Rows handed in, not yet taken by the writer.
    queue: Mutex<Vec<Row>>,
    /// Set when the last handle goes: the writer writes what waits and ends.
    closing: AtomicBool,
    daily: Mutex<Arc<Daily>>,
    /// Why writes fail, while they do.
    trouble: Mutex<Option<String>>,
    /// Where what other processes spent of the budgets is posted.
    board: Arc<Board>,
}

impl Shared {
    fn set_daily(&self, d: Daily) {
        *self.daily.locked() = Arc::new(d);
    }

    fn daily(&self) -> Arc<Daily> {
        Arc::clone(&self.daily.locked())
    }

    fn set_trouble(&self, t: Option<String>) {
        *self.trouble.locked() = t;
    }

    fn trouble(&self) -> Option<String> {
        self.trouble.locked().clone()
    }
}

impl Ledger {
    /// Opens the database (checking and migrating it) and reads what was spent of the budgets
    /// of the day and month of `calendar` (none: no client has such a budget, nothing is read),
    /// then starts the writer thread. A database that cannot be used is an error saying why
    /// where the ledger is `required` (the serve command fails with it at start); otherwise the
    /// ledger starts out of use, and tries again.
    pub fn start(
        settings: &Settings,
        counters: Counters,
        calendar: Option<Calendar>,
    ) -> Result<Ledger, LedgerError> {
        let shared = Arc::new(Shared {
            counters,
            seq: AtomicI64::new(0),
            drop_logged: AtomicBool::new(false),
            queue: Mutex::default(),
            closing: AtomicBool::new(false),
            daily: Mutex::default(),
            trouble: Mutex::default(),
            board: Arc::new(Board::new(calendar)),
        });
        let thread = writer::spawn(settings.clone(), Arc::clone(&shared))?;
        Ok(Ledger {
            waker: thread.thread().clone(),
            thread: Mutex::new(Some(thread)),
            settings: settings.clone(),
            shared,
        })
    }

    /// [`Ledger::start`] for a snapshot of the proxy's: at start, one out of use is served
    /// without; for a `reload`, a database that cannot be used is an error, `required` or not
    /// (the reload fails and keeps the ledger in force).
    pub fn start_for(
        settings: &Settings,
        counters: &Counters,
        calendar: &Option<Calendar>,
        reload: bool,
    ) -> Result<Ledger, LedgerError> {
        let ledger = Ledger::start(settings, counters.clone(), calendar.clone())?;
        match ledger.shared.trouble() {
            Some(why) if reload => Err(LedgerError::Failing(why)),
            _ => Ok(ledger),
        }
    }

    /// Writes what waits and ends the writer, waiting for it (what dropping the last handle
    /// does without waiting): the end of a graceful shutdown. Rows handed in after it are
    /// counted as dropped.
    pub fn close(&self) {
        self.end();
        let thread = self.thread.locked().take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }

    fn end(&self) {
        self.shared.closing.store(true, Ordering::Release);
        self.waker.unpark();
    }

    /// The last [`DAYS`] days per client, as last read and kept up.
    pub fn daily(&self) -> Arc<Daily> {
        self.shared.daily()
    }

    /// Why writes fail, while they do; and how many rows wait and were dropped.
    pub fn trouble(&self) -> (Option<String>, i64, u64) {
        let s = &self.shared;
        (
            s.trouble(),
            s.counters.waiting.get(),
            s.counters.dropped.get(),
        )
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// What other processes spent of the clients' budgets, as last read.
    pub fn board(&self) -> &Arc<Board> {
        &self.shared.board
    }

    /// The budgets count days and months of `calendar` now (a reload; none: no client has
    /// such a budget): when it is another, what was spent is read again at once.
    pub fn set_calendar(&self, calendar: Option<Calendar>) {
        if self.shared.board.set_calendar(calendar) {
            self.waker.unpark();
        }
    }

    /// Hands `row` to the writer; never waits. Dropped (counted, logged once until the
    /// ledger writes again) while `buffer_rows` wait.
    pub fn record(&self, mut row: Row) {
        let s = &self.shared;
        if s.closing.load(Ordering::Acquire) {
            s.counters.dropped.inc();
            return;
        }
        let waited = s.counters.waiting.inc();
        if usize::try_from(waited).unwrap_or(0) >= self.settings.buffer_rows {
            s.counters.waiting.dec();
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
        let queued = {
            let mut q = s.queue.locked();
            q.push(row);
            q.len()
        };
        // A batch is full: the writer need not wait for its interval.
        if queued == self.settings.batch_rows {
            self.waker.unpark();
        }
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        self.end();
    }
}

#[cfg(test)]
mod tests;
