//! The ledger's writer thread: wakes every batch interval (or when a batch is full), takes
//! the rows queued and writes them in batches, one transaction each. A batch that failed is
//! kept and tried again (reconnecting to a PostgreSQL that went away), first looking whether
//! its commit did land; raw rows past their retention are deleted hourly; what other
//! processes spent of the budgets is read every `budget_refresh_ms`; a SQLite file is read
//! through for damage every `check_interval_ms` and after a failed write or read. A database
//! that cannot be opened, or is damaged, is out of use: nothing is written to it or read from
//! it, and it is opened (and checked) again after 0.25 s doubling to 30 s. Once every handle
//! is gone it writes what waits and ends.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::check::{self, Problem};
use super::{LedgerError, Row, Settings, Shared, Store};
use crate::budget::{Amounts, Spent};
use crate::calendar::{Calendar, Periods};
use crate::db::LedgerUrl;
use switchboard_sync::Locked;

const PRUNE_EVERY: Duration = Duration::from_secs(3600);
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
const READ_DAYS_EVERY: Duration = Duration::from_secs(60);

/// Starts the writer thread, which opens the database first (the PostgreSQL client blocks
/// on a runtime of its own, so it is never called from the proxy's); returns once it is open,
/// or out of use (said on the metric, the status page and the log), or with why it could not
/// be opened where the ledger is `required`.
pub(super) fn spawn(
    settings: Settings,
    shared: Arc<Shared>,
) -> Result<std::thread::JoinHandle<()>, LedgerError> {
    let (ready, opened) = mpsc::sync_channel(1);
    let thread = std::thread::Builder::new()
        .name("ledger".into())
        .spawn(move || {
            let store = match open(&settings.url) {
                Ok(s) => Some(s),
                Err(e) if settings.required => return drop(ready.send(Err(e))),
                Err(e) => {
                    tracing::error!(
                        ledger = %settings.url.shown(),
                        error = %e,
                        "usage ledger: cannot be used; serving without it (opened again \
                         every 30 s at most; rows wait up to ledger.buffer_rows)"
                    );
                    shared.set_trouble(Some(e.to_string()));
                    None
                }
            };
            let now = Instant::now();
            let mut w = Writer {
                read_at: None,
                spent_at: None,
                counted: None,
                before_today: None,
                settings,
                shared,
                // Names this process's rows: a batch written twice is found by it.
                process: format!("{:016x}", rand::random::<u64>()),
                pending: VecDeque::new(),
                failed: None,
                retry_at: store.is_none().then_some(now + FIRST_BACKOFF),
                backoff: FIRST_BACKOFF * 2,
                pruned_at: None,
                check_at: now,
                store: None,
            };
            if let Some(s) = store {
                w.opened(s, now);
            }
            // The budgets count what was spent before this process from its first request.
            w.read_spent(Instant::now());
            let _ = ready.send(Ok(()));
            w.run();
        })
        .map_err(|e| LedgerError::Thread(format!("thread: {e}")))?;
    opened
        .recv()
        .map_err(|_| LedgerError::Thread("thread ended".into()))??;
    Ok(thread)
}

/// `f` on the database at `url`, opened on a thread of its own (see [`spawn`]).
pub fn with_store<T: Send + 'static>(
    url: &LedgerUrl,
    f: impl FnOnce(&mut Store) -> Result<T, LedgerError> + Send + 'static,
) -> Result<T, LedgerError> {
    let url = url.clone();
    std::thread::spawn(move || f(&mut Store::open(&url)?))
        .join()
        .map_err(|_| LedgerError::Thread("reader failed".into()))?
}

/// What each client's requests took in a span, as [`Store::spent`] reads it.
type Sums = Vec<(String, Amounts)>;

struct Writer {
    /// `None` while out of use: it could not be opened, or failed its check.
    store: Option<Store>,
    settings: Settings,
    shared: Arc<Shared>,
    process: String,
    pending: VecDeque<Row>,
    /// The length of the batch whose last write failed, the first rows of `pending` (it is
    /// written again as it was, once it is known not to be in the database).
    failed: Option<usize>,
    retry_at: Option<Instant>,
    backoff: Duration,
    pruned_at: Option<Instant>,
    /// When the days of the status page were last read from the database.
    read_at: Option<Instant>,
    /// When what was spent of the budgets was last read, and in which calendar.
    spent_at: Option<Instant>,
    counted: Option<Calendar>,
    /// What other processes spent this month before today, per client (tokens, GPU-seconds),
    /// for the month and day starting at the key's times: read again once a day.
    before_today: Option<((i64, i64), Sums)>,
    /// When a SQLite file is next read through for damage.
    check_at: Instant,
}

impl Writer {
    fn run(&mut self) {
        let interval = self.settings.batch_interval;
        let mut tick = Instant::now() + interval;
        loop {
            if !self.shared.closing.load(Ordering::Acquire) {
                // Out of use, the database is read from and checked only as it is opened again
                // (`retry_at`).
                let open = self.store.is_some();
                let refresh = self.spent_at.filter(|_| open);
                let refresh = refresh.map(|r| r + self.settings.budget_refresh);
                let check = open.then_some(self.check_at);
                let wake = self.retry_at.unwrap_or(tick).min(tick);
                let wake = [refresh, check]
                    .into_iter()
                    .flatten()
                    .fold(wake, Instant::min);
                std::thread::park_timeout(wake.saturating_duration_since(Instant::now()));
            }
            let closing = self.shared.closing.load(Ordering::Acquire);
            self.take();
            let now = Instant::now();
            let due = now >= tick || closing;
            if due {
                tick = now + interval;
            }
            self.reopen(now);
            if closing || self.retry_at.is_none_or(|r| r <= now) {
                self.write_due(due, closing);
            }
            self.prune(now);
            self.read_days(now);
            self.read_spent(now);
            self.check(now);
            if closing {
                self.take();
                if self.pending.is_empty() {
                    return;
                }
            }
        }
    }

    /// Writes the full batches, and (`due`) what else waits.
    fn write_due(&mut self, due: bool, closing: bool) {
        loop {
            let full = self.pending.len() >= self.settings.batch_rows;
            if !(full || (due && !self.pending.is_empty())) {
                return;
            }
            if !self.write_one() {
                if closing {
                    // Ending: a few more tries (reconnecting), then what the database will
                    // not take is counted as dropped.
                    self.last_tries();
                }
                return;
            }
        }
    }

    /// Takes the rows queued since.
    fn take(&mut self) {
        let rows = std::mem::take(&mut *self.shared.queue.locked());
        self.pending.extend(rows);
    }

    /// Reads the status page's days from the database, once a minute (what this process
    /// writes is added to them as it goes; this adds what other processes wrote).
    fn read_days(&mut self, now: Instant) {
        if self.read_at.is_some_and(|r| now < r + READ_DAYS_EVERY) {
            return;
        }
        let Some(store) = self.store.as_mut() else {
            return;
        };
        self.read_at = Some(now);
        let at = now_ms();
        match store.daily(super::Daily::first_for(at)) {
            Ok(rows) => self.shared.set_daily(super::Daily::of(&rows, at)),
            Err(e) => {
                tracing::debug!(error = %e, "usage ledger: the days could not be read");
                self.check_at = now;
            }
        }
    }

    /// Reads what processes other than this one spent of the clients' budgets of the day and
    /// month, every `budget_refresh_ms` (at once when the calendar changed), and posts it;
    /// nothing while no client has such a budget.
    fn read_spent(&mut self, now: Instant) {
        let Some(calendar) = self.shared.board.calendar() else {
            (self.counted, self.spent_at) = (None, None);
            return;
        };
        if self.store.is_none() {
            return;
        }
        let same = self.counted.as_ref() == Some(&calendar);
        let due = self
            .spent_at
            .is_none_or(|r| now >= r + self.settings.budget_refresh);
        if same && !due {
            return;
        }
        self.spent_at = Some(now);
        let periods = calendar.periods(now_ms());
        match self.spent(periods) {
            Ok(spent) => {
                self.shared.board.post(spent);
                self.counted = Some(calendar);
            }
            Err(e) => {
                tracing::debug!(error = %e, "usage ledger: the budgets could not be read");
                self.check_at = now;
            }
        }
    }

    /// What other processes spent in `p`: this month before today (read once a day), and
    /// today.
    fn spent(&mut self, p: Periods) -> Result<Spent, LedgerError> {
        let store = self.store.as_mut().ok_or(LedgerError::OutOfUse)?;
        let key = (p.month.0, p.day.0);
        if self.before_today.as_ref().is_none_or(|(k, _)| *k != key) {
            let sums = store.spent(p.month.0, p.day.0, &self.process)?;
            self.before_today = Some((key, sums));
        }
        let mut spent = Spent {
            periods: p,
            ..Spent::default()
        };
        for (client, amounts) in store.spent(p.day.0, i64::MAX, &self.process)? {
            spent.add(&client, p.day.0, &amounts);
        }
        for (client, amounts) in self.before_today.iter().flat_map(|(_, m)| m) {
            spent.add(client, p.month.0, amounts);
        }
        Ok(spent)
    }

    /// Writes the next batch; whether it is in the database now.
    fn write_one(&mut self) -> bool {
        let len = self
            .failed
            .unwrap_or_else(|| self.settings.batch_rows.min(self.pending.len()));
        let batch: Vec<Row> = self.pending.iter().take(len).cloned().collect();
        match self.try_write(&batch) {
            Ok(()) => {
                self.pending.drain(..batch.len());
                self.done(batch.len());
                let days = self.shared.daily().with(&batch, now_ms());
                self.shared.set_daily(days);
                true
            }
            Err(e) => {
                if self.shared.trouble().is_none() {
                    tracing::warn!(
                        ledger = %self.settings.url.shown(),
                        error = %e,
                        waiting = self.pending.len(),
                        "usage ledger: a write failed; rows wait and are written again"
                    );
                    // A write that fails may have met a damaged page.
                    self.check_at = Instant::now();
                }
                self.failed = Some(batch.len());
                self.shared.counters.up.set(0);
                self.shared.set_trouble(Some(e.to_string()));
                self.retry_at = Some(Instant::now() + self.backoff);
                self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
                false
            }
        }
    }

    fn try_write(&mut self, batch: &[Row]) -> Result<(), LedgerError> {
        let stale = self.failed.is_some() || self.store.as_ref().is_some_and(Store::is_closed);
        if stale && self.store.as_ref().is_some_and(Store::shared) {
            // After a failure the connection is made anew (a PostgreSQL that restarted
            // leaves the old one dead, not always closed); while it cannot be, the database
            // is out of use and opened again as it is retried.
            self.store = None;
            self.store = Some(Store::open(&self.settings.url)?);
        }
        let Some(store) = self.store.as_mut() else {
            return Err(self
                .shared
                .trouble()
                .map_or(LedgerError::OutOfUse, LedgerError::Failing));
        };
        if let (Some(_), Some(first)) = (self.failed, batch.first()) {
            // The failed write may have committed before its answer was lost.
            if store.holds(&self.process, first.seq)? {
                return Ok(());
            }
        }
        store.write(&self.process, batch)
    }

    /// `n` rows are in the database.
    fn done(&mut self, n: usize) {
        let s = &self.shared;
        s.counters.waiting.dec_by(n as i64);
        s.counters.written.inc_by(n as u64);
        s.counters.up.set(1);
        s.drop_logged.store(false, Ordering::Relaxed);
        s.set_trouble(None);
        if self.failed.take().is_some() {
            tracing::info!(ledger = %self.settings.url.shown(), "usage ledger: writing again");
        }
        self.retry_at = None;
        self.backoff = FIRST_BACKOFF;
    }

    fn last_tries(&mut self) {
        for _ in 0..3 {
            std::thread::sleep(self.backoff.min(Duration::from_secs(2)));
            self.retry_at = None;
            self.reopen(Instant::now());
            self.write_due(true, false);
            if self.pending.is_empty() {
                return;
            }
        }
        self.give_up_all();
    }

    fn give_up_all(&mut self) {
        let n = self.pending.len();
        self.pending.clear();
        let s = &self.shared;
        s.counters.waiting.dec_by(n as i64);
        s.counters.dropped.inc_by(n as u64);
        tracing::error!(rows = n, "usage ledger: rows not written at exit");
    }

    /// Deletes raw rows past their retention, once an hour.
    fn prune(&mut self, now: Instant) {
        let days = self.settings.retention_days;
        if days == 0 || self.pruned_at.is_some_and(|p| now < p + PRUNE_EVERY) {
            return;
        }
        let Some(store) = self.store.as_mut() else {
            return;
        };
        self.pruned_at = Some(now);
        let before = now_ms() - days as i64 * 86_400_000;
        match store.prune(before) {
            Ok(0) => {}
            Ok(n) => tracing::info!(rows = n, "usage ledger: raw rows past retention deleted"),
            Err(e) => {
                tracing::warn!(error = %e, "usage ledger: pruning failed");
                self.check_at = now;
            }
        }
    }

    /// `store` is open (and checked): in use from `now`.
    fn opened(&mut self, store: Store, now: Instant) {
        tracing::info!(ledger = %store.at(), "usage ledger open");
        self.store = Some(store);
        self.check_at = now + self.settings.check_interval;
        // What was spent, and the page's days, are read at once.
        (self.spent_at, self.read_at) = (None, None);
        self.shared.counters.up.set(1);
        self.shared.set_trouble(None);
        (self.retry_at, self.backoff) = (None, FIRST_BACKOFF);
    }

    /// Opens the database again while it is out of use, once its retry is due.
    fn reopen(&mut self, now: Instant) {
        if self.store.is_some() || self.retry_at.is_some_and(|r| now < r) {
            return;
        }
        match open(&self.settings.url) {
            Ok(store) => self.opened(store, now),
            Err(e) => {
                self.shared.set_trouble(Some(e.to_string()));
                self.retry_at = Some(now + self.backoff);
                self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
            }
        }
    }

    /// Reads a SQLite file through, when its check is due: a damaged one is out of use from
    /// now (said on `switchboard_ledger_up`, the status page and the log).
    fn check(&mut self, now: Instant) {
        if self.store.is_none() || now < self.check_at {
            return;
        }
        self.check_at = now + self.settings.check_interval;
        match check::check(&self.settings.url) {
            Ok(()) => {}
            Err(Problem::Unchecked(e)) => {
                tracing::warn!(error = %e, "usage ledger: the file could not be checked");
            }
            Err(Problem::Corrupt(e)) => {
                tracing::error!(
                    ledger = %self.settings.url.shown(),
                    error = %e,
                    waiting = self.shared.counters.waiting.get(),
                    "usage ledger: the database is corrupt; serving without it (opened again \
                     every 30 s at most; rows wait up to ledger.buffer_rows)"
                );
                self.store = None;
                self.shared.counters.up.set(0);
                self.shared.set_trouble(Some(e));
                self.retry_at = Some(now + self.backoff);
            }
        }
    }
}

/// The database at `url`, a SQLite file read through for damage first (nothing is written to a
/// damaged one, not even a migration); an error says why it cannot be used.
fn open(url: &LedgerUrl) -> Result<Store, LedgerError> {
    check::check(url).map_err(LedgerError::Check)?;
    Store::open(url)
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
