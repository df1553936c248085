//! A client's budgets of a calendar day and month — tokens and GPU time — which reset at the
//! start of the day and the month in the budgets' time zone. What this process charged is
//! counted here; what other processes (and this client's earlier runs) spent comes from the
//! usage ledger, which posts it to a [`Board`] at start and every `ledger.budget_refresh_ms`.
//! Without a ledger a budget counts this process alone, from its start. With a ledger that has
//! not read what was spent since this process started it (its database could not be opened,
//! or is damaged), nothing is known of the rest: a client's requests are refused until it is
//! read, never let through on a guess. Once read, the figures last read stand while the ledger
//! cannot read again, this process's own charges added as they go.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::calendar::{Calendar, Clock, Periods};

/// A client's calendar budgets (each `None`: no such budget); GPU time in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub tokens_per_day: Option<u64>,
    pub tokens_per_month: Option<u64>,
    pub gpu_ms_per_day: Option<u64>,
    pub gpu_ms_per_month: Option<u64>,
}

impl Limits {
    fn get(&self) -> [Option<u64>; 4] {
        [
            self.tokens_per_day,
            self.tokens_per_month,
            self.gpu_ms_per_day,
            self.gpu_ms_per_month,
        ]
    }
}

/// Whether a refusal whose wait is `wait` (`None`: it never fits) tells more than the one
/// held (`held`: its wait, if one is held): never fitting first, else the longer wait.
pub fn worse(held: Option<Option<u64>>, wait: Option<u64>) -> bool {
    match (held, wait) {
        (None, _) => true,
        (Some(h), None) => h.is_some(),
        (Some(h), Some(w)) => h.is_some_and(|h| w > h),
    }
}

/// One of the four budgets, in the order of [`Limits`] and of every `[_; 4]` here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    TokensDay,
    TokensMonth,
    GpuDay,
    GpuMonth,
}

impl Kind {
    pub const ALL: [Kind; 4] = [
        Kind::TokensDay,
        Kind::TokensMonth,
        Kind::GpuDay,
        Kind::GpuMonth,
    ];

    /// Counted in GPU-milliseconds (else in tokens).
    pub fn gpu(self) -> bool {
        matches!(self, Kind::GpuDay | Kind::GpuMonth)
    }

    pub fn month(self) -> bool {
        matches!(self, Kind::TokensMonth | Kind::GpuMonth)
    }

    /// `tokens per day`, `GPU-seconds per month`, …
    pub fn words(self) -> &'static str {
        match self {
            Kind::TokensDay => "tokens per day",
            Kind::TokensMonth => "tokens per month",
            Kind::GpuDay => "GPU-seconds per day",
            Kind::GpuMonth => "GPU-seconds per month",
        }
    }
}

/// One limit as the rate-limit headers and the status page show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Left {
    pub limit: u64,
    pub remaining: u64,
    /// Until it is full again.
    pub reset: Duration,
}

/// Of a client's `standing` (as [`Budgets::standing`] gives it), its budget of tokens (`gpu`:
/// of GPU time) with the least left.
pub fn least(standing: &[Option<Left>; 4], gpu: bool) -> Option<Left> {
    Kind::ALL
        .iter()
        .zip(standing)
        .filter(|(kind, _)| kind.gpu() == gpu)
        .filter_map(|(_, left)| *left)
        .min_by_key(|left| left.remaining)
}

/// A request a budget does not let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    pub kind: Kind,
    pub limit: u64,
    pub needed: u64,
    /// Seconds until the budget resets; `None`: the request needs more than the whole budget.
    pub retry_after: Option<u64>,
}

/// What processes other than this one spent of each client's budgets in `periods`, as the
/// ledger last read it (tokens, then GPU-milliseconds; in [`Kind`]'s order).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Spent {
    pub periods: Periods,
    pub by_client: HashMap<String, [f64; 4]>,
}

/// Where the ledger posts [`Spent`] and reads the calendar the budgets count in: none while
/// no client has a budget of a day or a month (then nothing is read).
#[derive(Debug)]
pub struct Board {
    spent: Mutex<Arc<Spent>>,
    calendar: Mutex<Option<Calendar>>,
    /// Whether `spent` was posted once.
    read: AtomicBool,
}

impl Board {
    pub fn new(calendar: Option<Calendar>) -> Board {
        Board {
            spent: Mutex::default(),
            calendar: Mutex::new(calendar),
            read: AtomicBool::new(false),
        }
    }

    pub fn post(&self, spent: Spent) {
        *self.spent.lock().unwrap_or_else(PoisonError::into_inner) = Arc::new(spent);
        self.read.store(true, Ordering::Release);
    }

    /// Whether what was spent was read once (the ledger posted it).
    pub fn is_read(&self) -> bool {
        self.read.load(Ordering::Acquire)
    }

    pub fn spent(&self) -> Arc<Spent> {
        Arc::clone(&self.spent.lock().unwrap_or_else(PoisonError::into_inner))
    }

    pub fn calendar(&self) -> Option<Calendar> {
        self.calendar
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// A new calendar (from a reload); whether it differs from the one before.
    pub fn set_calendar(&self, calendar: Option<Calendar>) -> bool {
        let mut c = self.calendar.lock().unwrap_or_else(PoisonError::into_inner);
        let changed = *c != calendar;
        *c = calendar;
        changed
    }
}

/// One client's calendar budgets.
#[derive(Debug)]
pub struct Budgets {
    client: String,
    clock: Clock,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    limits: Limits,
    calendar: Calendar,
    board: Option<Arc<Board>>,
    /// The day and month counted in `own`.
    periods: Periods,
    /// What this process charged (and reserved) of each budget in `periods`.
    own: [f64; 4],
}

impl Budgets {
    pub fn new(
        client: &str,
        limits: Limits,
        calendar: Calendar,
        board: Option<Arc<Board>>,
        clock: Clock,
    ) -> Budgets {
        let periods = calendar.periods(clock.now_ms());
        Budgets {
            client: client.into(),
            clock,
            inner: Mutex::new(Inner {
                limits,
                calendar,
                board,
                periods,
                own: [0.0; 4],
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether what was spent of its budgets is known: always without a ledger (this process
    /// counts alone), with one once it has read what was spent.
    pub fn known(&self) -> bool {
        self.lock().board.as_ref().is_none_or(|b| b.is_read())
    }

    /// Take `tokens` and `gpu_ms` from every budget, or say which refuses them: one that can
    /// never hold them first, else the one that resets last.
    pub fn reserve(&self, tokens: u64, gpu_ms: u64) -> Result<(), Refused> {
        let now = self.clock.now_ms();
        let mut inner = self.lock();
        inner.roll(now);
        let used = inner.used(&self.client);
        let mut refused: Option<Refused> = None;
        for (i, kind) in Kind::ALL.into_iter().enumerate() {
            let Some(limit) = inner.limits.get()[i] else {
                continue;
            };
            let needed = if kind.gpu() { gpu_ms } else { tokens };
            if used[i] + needed as f64 <= limit as f64 {
                continue;
            }
            let retry_after = (needed <= limit).then(|| inner.reset(kind, now).as_secs().max(1));
            if worse(refused.map(|r| r.retry_after), retry_after) {
                refused = Some(Refused {
                    kind,
                    limit,
                    needed,
                    retry_after,
                });
            }
        }
        if let Some(r) = refused {
            return Err(r);
        }
        inner.add(tokens as f64, gpu_ms as f64);
        Ok(())
    }

    /// A request reserved `reserved` tokens and GPU-milliseconds and used `used`.
    pub fn settle(&self, reserved: (u64, u64), used: (u64, u64)) {
        let now = self.clock.now_ms();
        let mut inner = self.lock();
        inner.roll(now);
        inner.add(
            used.0 as f64 - reserved.0 as f64,
            used.1 as f64 - reserved.1 as f64,
        );
    }

    /// Where each budget stands now (`None` where none is set).
    pub fn standing(&self) -> [Option<Left>; 4] {
        let now = self.clock.now_ms();
        let mut inner = self.lock();
        inner.roll(now);
        let used = inner.used(&self.client);
        let limits = inner.limits.get();
        let mut out = [None; 4];
        for (i, kind) in Kind::ALL.into_iter().enumerate() {
            out[i] = limits[i].map(|limit| Left {
                limit,
                remaining: (limit as f64 - used[i]).max(0.0).floor() as u64,
                reset: inner.reset(kind, now),
            });
        }
        out
    }

    /// New limits, calendar and ledger from a reload; what was used in the same day and month
    /// is kept.
    pub fn reconfigure(&self, limits: Limits, calendar: Calendar, board: Option<Arc<Board>>) {
        let now = self.clock.now_ms();
        let mut inner = self.lock();
        inner.limits = limits;
        inner.board = board;
        if inner.calendar != calendar {
            inner.calendar = calendar;
            let periods = inner.calendar.periods(now);
            inner.roll_to(periods);
        }
    }
}

impl Inner {
    /// Moves on to the day (and month) holding `now`, forgetting what was spent before.
    fn roll(&mut self, now: i64) {
        if now >= self.periods.day.1 || now < self.periods.day.0 {
            let p = self.calendar.periods(now);
            self.roll_to(p);
        }
    }

    fn roll_to(&mut self, p: Periods) {
        for kind in Kind::ALL {
            let (was, is) = match kind.month() {
                true => (self.periods.month, p.month),
                false => (self.periods.day, p.day),
            };
            if was != is {
                self.own[kind as usize] = 0.0;
            }
        }
        self.periods = p;
    }

    fn add(&mut self, tokens: f64, gpu_ms: f64) {
        for kind in Kind::ALL {
            let v = &mut self.own[kind as usize];
            *v = (*v + if kind.gpu() { gpu_ms } else { tokens }).max(0.0);
        }
    }

    /// What was spent of each budget: here, and by others in the same periods.
    fn used(&self, client: &str) -> [f64; 4] {
        let mut used = self.own;
        let Some(board) = &self.board else {
            return used;
        };
        let spent = board.spent();
        if let Some(others) = spent.by_client.get(client) {
            for kind in Kind::ALL {
                let same = match kind.month() {
                    true => spent.periods.month == self.periods.month,
                    false => spent.periods.day == self.periods.day,
                };
                if same {
                    used[kind as usize] += others[kind as usize];
                }
            }
        }
        used
    }

    /// Until `kind`'s period ends.
    fn reset(&self, kind: Kind, now: i64) -> Duration {
        let end = match kind.month() {
            true => self.periods.month.1,
            false => self.periods.day.1,
        };
        Duration::from_millis(end.saturating_sub(now).max(0) as u64)
    }
}

#[cfg(test)]
mod tests;
