//! Days and months in the budgets' time zone (`server.budget_timezone`, from the time zone
//! database bundled in the binary, so naming one reads no file), and the clock budgets run on.

use std::time::{SystemTime, UNIX_EPOCH};

use jiff::tz::TimeZone;
use jiff::{civil::Date, Timestamp, ZonedDateTime};

/// The time zone whose midnights start the budgets' days and months.
#[derive(Debug, Clone, PartialEq)]
pub struct Calendar {
    name: String,
    tz: TimeZone,
}

impl Default for Calendar {
    fn default() -> Calendar {
        Calendar {
            name: "UTC".into(),
            tz: TimeZone::UTC,
        }
    }
}

/// A name that is no zone of the IANA database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("is no time zone of the IANA database (e.g. UTC, Europe/Berlin)")]
pub struct NoSuchZone;

/// One day and one month of the calendar, each as `[start, end)` in milliseconds since the
/// Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Periods {
    pub(crate) day: (i64, i64),
    pub(crate) month: (i64, i64),
}

impl Calendar {
    /// The zone of an IANA name (`UTC`, `Europe/Berlin`); `Err`: no such zone.
    pub fn named(name: &str) -> Result<Calendar, NoSuchZone> {
        let tz = jiff::tz::db().get(name).map_err(|_| NoSuchZone)?;
        Ok(Calendar {
            name: name.into(),
            tz,
        })
    }

    /// Its IANA name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The day and the month holding `at_ms`.
    pub(crate) fn periods(&self, at_ms: i64) -> Periods {
        let fallback = Periods {
            day: (at_ms, at_ms + 86_400_000),
            month: (at_ms, at_ms + 86_400_000),
        };
        self.try_periods(at_ms).unwrap_or(fallback)
    }

    fn try_periods(&self, at_ms: i64) -> Option<Periods> {
        let now = Timestamp::from_millisecond(at_ms)
            .ok()?
            .to_zoned_datetime(self.tz.clone());
        let today = now.date();
        let first = today.first_of_month();
        let next_month = first.checked_add(jiff::Span::new().months(1)).ok()?;
        Some(Periods {
            day: (self.start(today)?, self.start(today.tomorrow().ok()?)?),
            month: (self.start(first)?, self.start(next_month)?),
        })
    }

    /// The first instant of `date` here (not always 00:00: a zone may skip midnight).
    fn start(&self, date: Date) -> Option<i64> {
        let z: ZonedDateTime = date.to_zoned_datetime(self.tz.clone()).ok()?;
        Some(z.timestamp().as_millisecond())
    }
}

/// The wall clock as budgets read it: read once, then moved on by tokio's clock (so a jump of
/// the system's clock moves no budget, and tests move it on tokio's paused clock).
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    wall_ms: i64,
    at: tokio::time::Instant,
}

impl Clock {
    /// A clock reading the system's time now.
    pub fn system() -> Clock {
        let wall_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        Clock::at(wall_ms)
    }

    /// A clock reading `wall_ms` now.
    pub(crate) fn at(wall_ms: i64) -> Clock {
        Clock {
            wall_ms,
            at: tokio::time::Instant::now(),
        }
    }

    /// Milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> i64 {
        self.wall_ms + self.at.elapsed().as_millis() as i64
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ms(s: &str) -> i64 {
        s.parse::<Timestamp>().unwrap().as_millisecond()
    }

    #[test]
    fn days_and_months_start_at_midnight_in_the_zone() {
        let utc = Calendar::default();
        let p = utc.periods(ms("2026-12-06T03:53:00Z"));
        assert_eq!(
            p.day,
            (ms("2026-12-06T00:00:00Z"), ms("2026-12-07T00:00:00Z"))
        );
        assert_eq!(
            p.month,
            (ms("2026-12-01T00:00:00Z"), ms("2027-01-01T00:00:00Z"))
        );
        // 03:53 UTC is still the 5th in New York.
        let ny = Calendar::named("America/New_York").unwrap();
        let p = ny.periods(ms("2026-12-06T03:53:00Z"));
        assert_eq!(
            p.day,
            (ms("2026-12-05T05:00:00Z"), ms("2026-12-06T05:00:00Z"))
        );
        // Kolkata is 5:30 ahead; February has 28 days in 2027.
        let k = Calendar::named("Asia/Kolkata").unwrap();
        let p = k.periods(ms("2027-02-14T12:00:00Z"));
        assert_eq!(
            p.month,
            (ms("2027-01-31T18:30:00Z"), ms("2027-02-28T18:30:00Z"))
        );
    }

    #[test]
    fn a_day_with_a_clock_change_is_23_or_25_hours() {
        let berlin = Calendar::named("Europe/Berlin").unwrap();
        let spring = berlin.periods(ms("2027-03-28T12:00:00Z")).day;
        assert_eq!(spring.1 - spring.0, 23 * 3_600_000);
        let autumn = berlin.periods(ms("2027-10-31T12:00:00Z")).day;
        assert_eq!(autumn.1 - autumn.0, 25 * 3_600_000);
    }

    #[test]
    fn a_zone_that_is_none_is_refused() {
        assert!(Calendar::named("Mars/Olympus").is_err());
        assert_eq!(Calendar::named("UTC").unwrap().name(), "UTC");
    }

    #[tokio::test(start_paused = true)]
    async fn the_clock_moves_with_tokio_time() {
        let c = Clock::at(1_000);
        tokio::time::advance(std::time::Duration::from_secs(90_000)).await;
        assert_eq!(c.now_ms(), 90_001_000);
    }
}
