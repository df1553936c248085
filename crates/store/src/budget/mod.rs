//! A client's budgets of a calendar day and month — each a [`Limit`] of a calendar window —
//! which reset at the start of the day and the month in the budgets' time zone. What this
//! process charged is counted here; what other processes (and this client's earlier runs)
//! spent comes from the usage ledger, which posts it to a [`Board`] at start and every
//! `ledger.budget_refresh_ms`. Without a ledger a budget counts this process alone, from its
//! start. With a ledger that has not read what was spent since this process started it (its
//! database could not be opened, or is damaged), nothing is known of the rest: a client's
//! requests are refused until it is read, never let through on a guess. Once read, the figures
//! last read stand while the ledger cannot read again, this process's own charges added as
//! they go. What a budget counts of a request is [`amount`]'s: the one place a resource is
//! measured.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::calendar::{Calendar, Clock, Periods};
use crate::kinds::PerKind;
use crate::limits::{ByLimit, Limit, Resource, Window};
use switchboard_sync::Locked;

/// A client's limits of each kind (`None`: no such limit; GPU time in milliseconds); the
/// budgets count those of a calendar window.
pub type Limits = ByLimit<Option<u64>>;

/// A value for each window.
pub(crate) type ByWindow<T> = PerKind<Window, T, { Window::ALL.len() }>;

/// What a request takes (reserved) or took, or what requests took together: each figure a
/// budget of some resource counts ([`amount`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Amounts {
    pub requests: f64,
    /// Tokens charged: prompt and output.
    pub tokens: f64,
    pub output_tokens: f64,
    pub gpu_ms: f64,
}

impl Amounts {
    /// Each figure of `self` and `other` as `f` makes them one.
    fn zip(&self, other: &Amounts, f: impl Fn(f64, f64) -> f64) -> Amounts {
        Amounts {
            requests: f(self.requests, other.requests),
            tokens: f(self.tokens, other.tokens),
            output_tokens: f(self.output_tokens, other.output_tokens),
            gpu_ms: f(self.gpu_ms, other.gpu_ms),
        }
    }

    pub(crate) fn plus(&self, other: &Amounts) -> Amounts {
        self.zip(other, |a, b| a + b)
    }
}

/// What a budget of `resource` counts of `a`.
pub(crate) fn amount(resource: Resource, a: &Amounts) -> f64 {
    match resource {
        Resource::Requests => a.requests,
        Resource::Tokens => a.tokens,
        Resource::Gpu => a.gpu_ms,
        Resource::OutputTokens => a.output_tokens,
    }
}

/// The most output a request whose prompt is `prompt` tokens may reserve within `limits`:
/// what each budget that counts output leaves of it once the prompt is counted (`None`: no
/// budget counts output).
pub fn room_for_output(limits: &Limits, prompt: u64) -> Option<u64> {
    let with_prompt = Amounts {
        tokens: prompt as f64,
        ..Amounts::default()
    };
    let one_more = Amounts {
        tokens: 1.0,
        output_tokens: 1.0,
        ..Amounts::default()
    };
    limits
        .iter()
        .filter_map(|(l, n)| Some((l.resource, (*n)?)))
        .filter(|(r, _)| amount(*r, &one_more) > 0.0)
        .map(|(r, n)| n.saturating_sub(amount(r, &with_prompt) as u64))
        .min()
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

/// One limit as the rate-limit headers and the status page show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Left {
    pub limit: u64,
    pub remaining: u64,
    /// Until it is full again.
    pub reset: Duration,
}

/// Of a client's `standing` (as [`Budgets::standing`] gives it), its budget of `resource`
/// (of a calendar window) with the least left.
pub fn least(standing: &ByLimit<Option<Left>>, resource: Resource) -> Option<Left> {
    standing
        .iter()
        .filter(|(kind, _)| kind.resource == resource && kind.window.calendar())
        .filter_map(|(_, left)| *left)
        .min_by_key(|left| left.remaining)
}

/// A request a budget does not let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    pub kind: Limit,
    pub limit: u64,
    pub needed: u64,
    /// Seconds until the budget resets; `None`: the request needs more than the whole budget.
    pub retry_after: Option<u64>,
}

/// `[start, end)` of `window`'s period in `p`; `None`: no calendar period (a minute).
fn span(p: &Periods, window: Window) -> Option<(i64, i64)> {
    match window {
        Window::Minute => None,
        Window::Day => Some(p.day),
        Window::Month => Some(p.month),
    }
}

/// What processes other than this one spent of each client's budgets in `periods`, as the
/// ledger last read it: each client's amounts in each window's period.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Spent {
    pub(crate) periods: Periods,
    pub(crate) by_client: HashMap<String, ByWindow<Amounts>>,
}

impl Spent {
    /// `client` spent `amounts` from `from_ms` on: counted in each window whose period holds
    /// that time.
    pub(crate) fn add(&mut self, client: &str, from_ms: i64, amounts: &Amounts) {
        let periods = self.periods;
        let e = self.by_client.entry(client.to_string()).or_default();
        for (window, sum) in e.iter_mut() {
            if span(&periods, window).is_some_and(|(start, end)| start <= from_ms && from_ms < end)
            {
                *sum = sum.plus(amounts);
            }
        }
    }
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
    pub(crate) fn new(calendar: Option<Calendar>) -> Board {
        Board {
            spent: Mutex::default(),
            calendar: Mutex::new(calendar),
            read: AtomicBool::new(false),
        }
    }

    pub(crate) fn post(&self, spent: Spent) {
        *self.spent.locked() = Arc::new(spent);
        self.read.store(true, Ordering::Release);
    }

    /// Whether what was spent was read once (the ledger posted it).
    pub(crate) fn is_read(&self) -> bool {
        self.read.load(Ordering::Acquire)
    }

    pub(crate) fn spent(&self) -> Arc<Spent> {
        Arc::clone(&self.spent.locked())
    }

    pub(crate) fn calendar(&self) -> Option<Calendar> {
        self.calendar.locked().clone()
    }

    /// A new calendar (from a reload); whether it differs from the one before.
    pub(crate) fn set_calendar(&self, calendar: Option<Calendar>) -> bool {
        let mut c = self.calendar.locked();
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
    /// What this process charged (and reserved) in each window's period of `periods`.
    own: ByWindow<Amounts>,
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
                own: ByWindow::default(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.locked()
    }

    /// Whether what was spent of its budgets is known: always without a ledger (this process
    /// counts alone), with one once it has read what was spent.
    pub fn known(&self) -> bool {
        self.lock().board.as_ref().is_none_or(|b| b.is_read())
    }

    /// Take `want` from every budget, or say which refuses it: one that can never hold it
    /// first, else the one that resets last.
    pub fn reserve(&self, want: &Amounts) -> Result<(), Refused> {
        let now = self.clock.now_ms();
        let mut inner = self.lock();
        inner.roll(now);
        let used = inner.used(&self.client);
        let mut refused: Option<Refused> = None;
        for (kind, limit) in inner.budgets() {
            let needed = amount(kind.resource, want);
            if amount(kind.resource, &used[kind.window]) + needed <= limit as f64 {
                continue;
            }
            let retry_after =
                (needed <= limit as f64).then(|| inner.reset(kind.window, now).as_secs().max(1));
            if worse(refused.map(|r| r.retry_after), retry_after) {
                refused = Some(Refused {
                    kind,
                    limit,
                    needed: needed.ceil() as u64,
                    retry_after,
                });
            }
        }
        if let Some(r) = refused {
            return Err(r);
        }
        inner.add(want);
        Ok(())
    }

    /// A request reserved `reserved` and used `used`.
    pub fn settle(&self, reserved: &Amounts, used: &Amounts) {
        let now = self.clock.now_ms();
        let mut inner = self.lock();
        inner.roll(now);
        inner.add(&used.zip(reserved, |u, r| u - r));
    }

    /// Where each budget stands now (`None` where none is set, and for a minute's limits,
    /// which are not kept here).
    pub fn standing(&self) -> ByLimit<Option<Left>> {
        let now = self.clock.now_ms();
        let mut inner = self.lock();
        inner.roll(now);
        let used = inner.used(&self.client);
        let mut out = ByLimit::default();
        for (kind, limit) in inner.budgets() {
            let spent = amount(kind.resource, &used[kind.window]);
            out[kind] = Some(Left {
                limit,
                remaining: (limit as f64 - spent).max(0.0).floor() as u64,
                reset: inner.reset(kind.window, now),
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
    /// Its budgets: the limits of a calendar window it sets.
    fn budgets(&self) -> Vec<(Limit, u64)> {
        self.limits
            .iter()
            .filter(|(kind, _)| kind.window.calendar())
            .filter_map(|(kind, n)| Some((kind, (*n)?)))
            .collect()
    }

    /// Moves on to the day (and month) holding `now`, forgetting what was spent before.
    fn roll(&mut self, now: i64) {
        if now >= self.periods.day.1 || now < self.periods.day.0 {
            let p = self.calendar.periods(now);
            self.roll_to(p);
        }
    }

    fn roll_to(&mut self, p: Periods) {
        let was = self.periods;
        for (window, own) in self.own.iter_mut() {
            if span(&was, window) != span(&p, window) {
                *own = Amounts::default();
            }
        }
        self.periods = p;
    }

    /// Adds `a` (a part of it less, where it is below zero) to what was spent in each window,
    /// never below nothing.
    fn add(&mut self, a: &Amounts) {
        for (_, own) in self.own.iter_mut() {
            *own = own.zip(a, |v, x| (v + x).max(0.0));
        }
    }

    /// What was spent in each window: here, and by others in the same periods.
    fn used(&self, client: &str) -> ByWindow<Amounts> {
        let mut used = self.own;
        let Some(board) = &self.board else {
            return used;
        };
        let spent = board.spent();
        if let Some(others) = spent.by_client.get(client) {
            for (window, u) in used.iter_mut() {
                if span(&spent.periods, window) == span(&self.periods, window) {
                    *u = u.plus(&others[window]);
                }
            }
        }
        used
    }

    /// Until `window`'s period ends.
    fn reset(&self, window: Window, now: i64) -> Duration {
        let end = span(&self.periods, window).map_or(now, |(_, end)| end);
        Duration::from_millis(end.saturating_sub(now).max(0) as u64)
    }
}

#[cfg(test)]
mod tests;
