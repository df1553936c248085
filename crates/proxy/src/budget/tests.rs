//! Budgets of a day and a month on tokio's paused clock: reset at the zone's midnights, what a
//! request did not use given back, what other processes spent counted in its own periods.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use super::*;

fn ms(s: &str) -> i64 {
    s.parse::<jiff::Timestamp>().unwrap().as_millisecond()
}

fn tokens(day: Option<u64>, month: Option<u64>) -> Limits {
    Limits {
        tokens_per_day: day,
        tokens_per_month: month,
        ..Limits::default()
    }
}

#[tokio::test(start_paused = true)]
async fn the_day_resets_at_midnight_in_the_zone_and_the_month_does_not() {
    let berlin = Calendar::named("Europe/Berlin").unwrap();
    // 23:59 in Berlin on the 6th of December.
    let clock = Clock::at(ms("2026-12-06T22:59:00Z"));
    let b = Budgets::new("c", tokens(Some(1000), Some(1500)), berlin, None, clock);
    b.reserve(1000, 0).unwrap();
    let r = b.reserve(1, 0).unwrap_err();
    assert_eq!((r.kind, r.retry_after), (Kind::TokensDay, Some(60)));
    let [day, month, ..] = b.standing();
    assert_eq!(day.unwrap().reset, Duration::from_secs(60));
    assert_eq!(month.unwrap().remaining, 500);
    tokio::time::advance(Duration::from_secs(59)).await;
    assert!(b.reserve(1, 0).is_err());
    tokio::time::advance(Duration::from_secs(1)).await;
    // The 7th: a new day, the same month.
    b.reserve(400, 0).unwrap();
    let standing = b.standing();
    let [day, month, ..] = standing;
    assert_eq!(day.unwrap().remaining, 600);
    assert_eq!(month.unwrap().remaining, 100);
    // The headers tell the budget with the least left: here the month's.
    assert_eq!(least(&standing, false), month);
    assert_eq!(least(&standing, true), None);
    let r = b.reserve(200, 0).unwrap_err();
    assert_eq!(r.kind, Kind::TokensMonth);
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
    b.reserve(800, 0).unwrap();
    b.settle((800, 0), (300, 0));
    assert_eq!(b.standing()[0].unwrap().remaining, 700);
    b.reserve(100, 0).unwrap();
    b.settle((100, 0), (900, 0));
    assert_eq!(b.standing()[0].unwrap().remaining, 0);
    // More than the whole budget never fits, and says so.
    let r = b.reserve(1001, 0).unwrap_err();
    assert_eq!(r.retry_after, None);
}

#[tokio::test(start_paused = true)]
async fn what_other_processes_spent_counts_in_its_own_periods_only() {
    let cal = Calendar::default();
    let now = ms("2026-12-06T12:00:00Z");
    let board = Arc::new(Board::new(Some(cal.clone())));
    let limits = Limits {
        gpu_ms_per_day: Some(10_000),
        gpu_ms_per_month: Some(50_000),
        ..Limits::default()
    };
    let b = Budgets::new(
        "c",
        limits,
        cal.clone(),
        Some(Arc::clone(&board)),
        Clock::at(now),
    );
    let mut spent = Spent {
        periods: cal.periods(now),
        by_client: HashMap::from([("c".to_string(), [0.0, 0.0, 4_000.0, 30_000.0])]),
    };
    board.post(spent.clone());
    b.reserve(0, 5_000).unwrap();
    let s = b.standing();
    assert_eq!(
        (s[2].unwrap().remaining, s[3].unwrap().remaining),
        (1_000, 15_000)
    );
    let r = b.reserve(0, 2_000).unwrap_err();
    assert_eq!(r.kind, Kind::GpuDay);
    // Read yesterday: its day is not this one, its month is.
    spent.periods.day = (spent.periods.day.0 - 86_400_000, spent.periods.day.0);
    board.post(spent);
    let s = b.standing();
    assert_eq!(
        (s[2].unwrap().remaining, s[3].unwrap().remaining),
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
    b.reserve(600, 0).unwrap();
    b.reconfigure(tokens(Some(2000), None), Calendar::default(), None);
    assert_eq!(b.standing()[0].unwrap().remaining, 1400);
    b.reconfigure(
        tokens(Some(2000), None),
        Calendar::named("Asia/Tokyo").unwrap(),
        None,
    );
    let left = b.standing()[0].unwrap();
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
