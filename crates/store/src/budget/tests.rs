//! Budgets of a day and a month on tokio's paused clock: reset at the zone's midnights, what a
//! request did not use given back, what other processes spent counted in its own periods.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use super::*;

fn ms(s: &str) -> i64 {
    s.parse::<jiff::Timestamp>().unwrap().as_millisecond()
}

const TOKENS_DAY: Limit = Limit::new(Resource::Tokens, Window::Day);
const TOKENS_MONTH: Limit = Limit::new(Resource::Tokens, Window::Month);
const GPU_DAY: Limit = Limit::new(Resource::Gpu, Window::Day);
const GPU_MONTH: Limit = Limit::new(Resource::Gpu, Window::Month);

fn tokens(day: Option<u64>, month: Option<u64>) -> Limits {
    let mut limits = Limits::default();
    limits[TOKENS_DAY] = day;
    limits[TOKENS_MONTH] = month;
    limits
}

/// `tokens` tokens and `gpu_ms` GPU-milliseconds.
fn take(tokens: u64, gpu_ms: u64) -> Amounts {
    Amounts {
        requests: 1.0,
        tokens: tokens as f64,
        output_tokens: 0.0,
        gpu_ms: gpu_ms as f64,
    }
}

#[tokio::test(start_paused = true)]
async fn the_day_resets_at_midnight_in_the_zone_and_the_month_does_not() {
    let berlin = Calendar::named("Europe/Berlin").unwrap();
    // 23:59 in Berlin on the 6th of December.
    let clock = Clock::at(ms("2026-12-06T22:59:00Z"));
    let b = Budgets::new("c", tokens(Some(1000), Some(1500)), berlin, None, clock);
    b.reserve(&take(1000, 0)).unwrap();
    let r = b.reserve(&take(1, 0)).unwrap_err();
    assert_eq!((r.kind, r.retry_after), (TOKENS_DAY, Some(60)));
    let s = b.standing();
    let (day, month) = (s[TOKENS_DAY], s[TOKENS_MONTH]);
    assert_eq!(day.unwrap().reset, Duration::from_secs(60));
    assert_eq!(month.unwrap().remaining, 500);
    tokio::time::advance(Duration::from_secs(59)).await;
    assert!(b.reserve(&take(1, 0)).is_err());
    tokio::time::advance(Duration::from_secs(1)).await;
    // The 7th: a new day, the same month.
    b.reserve(&take(400, 0)).unwrap();
    let standing = b.standing();
    let (day, month) = (standing[TOKENS_DAY], standing[TOKENS_MONTH]);
    assert_eq!(day.unwrap().remaining, 600);
    assert_eq!(month.unwrap().remaining, 100);
    // The headers tell the budget with the least left: here the month's.
    assert_eq!(least(&standing, Resource::Tokens), month);
    assert_eq!(least(&standing, Resource::Gpu), None);
    let r = b.reserve(&take(200, 0)).unwrap_err();
    assert_eq!(r.kind, TOKENS_MONTH);
    // Until the 1st of January, Berlin's midnight: 25 days from the 7th's.
    assert_eq!(r.retry_after, Some(25 * 86_400));
}

#[tokio::test(start_paused = true)]
async fn what_a_request_did_not_use_comes_back_and_what_it_overran_is_owed() {
    let b = Budgets::new(
        "c",
        tokens(Some(1000), None),
        Calendar::default(),
        None,
        Clock::at(ms("2026-12-06T12:00:00Z")),
    );
    b.reserve(&take(800, 0)).unwrap();
    b.settle(&take(800, 0), &take(300, 0));
    assert_eq!(b.standing()[TOKENS_DAY].unwrap().remaining, 700);
    b.reserve(&take(100, 0)).unwrap();
    b.settle(&take(100, 0), &take(900, 0));
    assert_eq!(b.standing()[TOKENS_DAY].unwrap().remaining, 0);
    // More than the whole budget never fits, and says so.
    let r = b.reserve(&take(1001, 0)).unwrap_err();
    assert_eq!(r.retry_after, None);
}

#[tokio::test(start_paused = true)]
async fn what_other_processes_spent_counts_in_its_own_periods_only() {
    let cal = Calendar::default();
    let now = ms("2026-12-06T12:00:00Z");
    let board = Arc::new(Board::new(Some(cal.clone())));
    let mut limits = Limits::default();
    limits[GPU_DAY] = Some(10_000);
    limits[GPU_MONTH] = Some(50_000);
    let b = Budgets::new(
        "c",
        limits,
        cal.clone(),
        Some(Arc::clone(&board)),
        Clock::at(now),
    );
    let mut spent = Spent {
        periods: cal.periods(now),
        ..Spent::default()
    };
    // 26 GPU-seconds earlier this month, 4 today.
    let gpu = |ms: u64| take(0, ms);
    spent.add("c", spent.periods.month.0, &gpu(26_000));
    spent.add("c", spent.periods.day.0, &gpu(4_000));
    board.post(spent.clone());
    b.reserve(&take(0, 5_000)).unwrap();
    let s = b.standing();
    assert_eq!(
        (
            s[GPU_DAY].unwrap().remaining,
            s[GPU_MONTH].unwrap().remaining
        ),
        (1_000, 15_000)
    );
    let r = b.reserve(&take(0, 2_000)).unwrap_err();
    assert_eq!(r.kind, GPU_DAY);
    // Read yesterday: its day is not this one, its month is.
    spent.periods.day = (spent.periods.day.0 - 86_400_000, spent.periods.day.0);
    board.post(spent);
    let s = b.standing();
    assert_eq!(
        (
            s[GPU_DAY].unwrap().remaining,
            s[GPU_MONTH].unwrap().remaining
        ),
        (5_000, 15_000)
    );
}

#[tokio::test(start_paused = true)]
async fn a_reload_keeps_what_was_spent_and_a_new_zone_starts_a_new_day() {
    let now = ms("2026-12-06T12:00:00Z");
    let b = Budgets::new(
        "c",
        tokens(Some(1000), None),
        Calendar::default(),
        None,
        Clock::at(now),
    );
    b.reserve(&take(600, 0)).unwrap();
    b.reconfigure(tokens(Some(2000), None), Calendar::default(), None);
    assert_eq!(b.standing()[TOKENS_DAY].unwrap().remaining, 1400);
    b.reconfigure(
        tokens(Some(2000), None),
        Calendar::named("Asia/Tokyo").unwrap(),
        None,
    );
    let left = b.standing()[TOKENS_DAY].unwrap();
    assert_eq!(left.remaining, 2000);
    // 21:00 in Tokyo: three hours to its midnight.
    assert_eq!(left.reset, Duration::from_secs(3 * 3600));
}

#[test]
fn what_was_spent_is_known_without_a_ledger_and_with_one_once_it_read_it() {
    let clock = Clock::at(ms("2026-12-06T12:00:00Z"));
    let limits = tokens(Some(1000), None);
    let alone = Budgets::new("c", limits, Calendar::default(), None, clock);
    assert!(alone.known());
    let board = Arc::new(Board::new(Some(Calendar::default())));
    let b = Budgets::new("c", limits, Calendar::default(), Some(board.clone()), clock);
    assert!(!b.known(), "nothing read yet");
    board.post(Spent::default());
    assert!(b.known());
}

#[test]
fn the_output_reserved_by_default_leaves_the_prompt_within_each_token_budget() {
    let mut limits = tokens(Some(1000), Some(800));
    limits[Limit::new(Resource::Tokens, Window::Minute)] = Some(600);
    limits[GPU_DAY] = Some(10);
    limits[Limit::new(Resource::Requests, Window::Minute)] = Some(1);
    // GPU time and requests count no output: the smallest token budget bounds it.
    assert_eq!(room_for_output(&limits, 100), Some(500));
    assert_eq!(room_for_output(&limits, 700), Some(0));
    assert_eq!(room_for_output(&Limits::default(), 100), None);
}

#[test]
fn what_was_spent_counts_in_each_window_whose_period_holds_it() {
    let cal = Calendar::default();
    let p = cal.periods(ms("2026-12-06T12:00:00Z"));
    let mut spent = Spent {
        periods: p,
        ..Spent::default()
    };
    spent.add("c", p.day.0, &take(10, 0));
    spent.add("c", p.month.0, &take(5, 0));
    // Before this month: in no window.
    spent.add("c", p.month.0 - 1, &take(1000, 0));
    let c = &spent.by_client["c"];
    assert_eq!(
        (c[Window::Day].tokens, c[Window::Month].tokens),
        (10.0, 15.0)
    );
    assert_eq!(c[Window::Minute], Amounts::default());
}

#[tokio::test(start_paused = true)]
async fn a_budget_of_output_tokens_counts_the_output_alone() {
    let cal = Calendar::default();
    let now = ms("2026-12-06T12:00:00Z");
    let (day, month) = (
        Limit::new(Resource::OutputTokens, Window::Day),
        Limit::new(Resource::OutputTokens, Window::Month),
    );
    let mut limits = Limits::default();
    limits[day] = Some(100);
    limits[month] = Some(1000);
    let board = Arc::new(Board::new(Some(cal.clone())));
    let b = Budgets::new(
        "c",
        limits,
        cal.clone(),
        Some(board.clone()),
        Clock::at(now),
    );
    // 30 output tokens other processes spent today, counted in the day and the month.
    let mut spent = Spent {
        periods: cal.periods(now),
        ..Spent::default()
    };
    let output = |prompt: u64, output: u64| Amounts {
        output_tokens: output as f64,
        ..take(prompt + output, 0)
    };
    spent.add("c", spent.periods.day.0, &output(5_000, 30));
    board.post(spent);
    // A long prompt takes nothing of it; the output reserved, 60, is all it counts.
    b.reserve(&output(50_000, 60)).unwrap();
    let s = b.standing();
    assert_eq!(
        (s[day].unwrap().remaining, s[month].unwrap().remaining),
        (10, 910)
    );
    assert_eq!(least(&s, Resource::OutputTokens), s[day]);
    assert_eq!(least(&s, Resource::Tokens), None);
    let r = b.reserve(&output(1, 20)).unwrap_err();
    assert_eq!((r.kind, r.needed, r.limit), (day, 20, 100));
    assert_eq!(r.retry_after, Some(12 * 3600));
    // It used 10 of its 60: 50 come back.
    b.settle(&output(50_000, 60), &output(50_000, 10));
    b.reserve(&output(1, 20)).unwrap();
    assert_eq!(b.reserve(&output(0, 101)).unwrap_err().retry_after, None);
    // Its output reserved by default leaves it within the smallest: whatever the prompt.
    assert_eq!(room_for_output(&limits, 50_000), Some(100));
}
