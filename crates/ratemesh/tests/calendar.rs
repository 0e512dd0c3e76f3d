//! Calendar windows against a deliberately naive calendar: years stepped one by one with the
//! Gregorian leap rule, a table of month lengths, weekdays counted from Thursday 1 January 1970,
//! and Europe/Berlin's DST as the EU rule states it (last Sunday of March to last Sunday of
//! October, 01:00 UTC, in force since 1996). Month ends, leap years (2000 yes, 2100 no) and DST
//! days of 23 and 25 hours come out of the model, never out of the code under test.

use proptest::prelude::*;
use ratemesh::{Calendar, CalendarUnit};

const DAY_S: i64 = 86_400;
const NANOS: i64 = 1_000_000_000;

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn month_days(year: i64, month: i64) -> i64 {
    const DAYS: [i64; 12] = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    DAYS[(month - 1) as usize] + i64::from(month == 2 && is_leap(year))
}

/// Days from 1970-01-01 to `year-month-day` (1970 or later), counted naively.
fn days_of(year: i64, month: i64, day: i64) -> i64 {
    let years: i64 = (1970..year).map(|y| if is_leap(y) { 366 } else { 365 }).sum();
    let months: i64 = (1..month).map(|m| month_days(year, m)).sum();
    years + months + day - 1
}

/// The civil date of `days` since 1970-01-01, counted naively.
fn date_of(mut days: i64) -> (i64, i64, i64) {
    let mut year = 1970;
    while days >= if is_leap(year) { 366 } else { 365 } {
        days -= if is_leap(year) { 366 } else { 365 };
        year += 1;
    }
    let mut month = 1;
    while days >= month_days(year, month) {
        days -= month_days(year, month);
        month += 1;
    }
    (year, month, days + 1)
}

/// Monday = 0; 1970-01-01 was a Thursday.
fn weekday(days: i64) -> i64 {
    (days + 3).rem_euclid(7)
}

/// Europe/Berlin's offset from UTC at Unix second `t` (1996 and later): CEST from the last
/// Sunday of March 01:00 UTC to the last Sunday of October 01:00 UTC, CET otherwise.
fn berlin_offset(t: i64) -> i64 {
    let (year, _, _) = date_of(t.div_euclid(DAY_S));
    let last_sunday = |month: i64| {
        let last = days_of(year, month, month_days(year, month));
        // Sunday is weekday 6: step back from the month's last day to it.
        last - (weekday(last) + 1) % 7
    };
    let begins = last_sunday(3) * DAY_S + 3600;
    let ends = last_sunday(10) * DAY_S + 3600;
    if (begins..ends).contains(&t) { 7200 } else { 3600 }
}

/// The model's offset function of a zone.
type Offset = fn(i64) -> i64;

fn utc(_: i64) -> i64 {
    0
}

/// The Unix second at which the local day `days` begins in a zone whose DST changes are never at
/// midnight (UTC, Berlin): the local midnight minus the offset in force then.
fn local_midnight(days: i64, offset: Offset) -> i64 {
    let local = days * DAY_S;
    [0, 3600, 7200].into_iter().map(|o| local - o).find(|&t| offset(t) == local - t).expect("an offset fits")
}

/// The model's window `[start, end)`, in Unix seconds, holding second `t`.
fn model(unit: CalendarUnit, offset: Offset, t: i64) -> (i64, i64) {
    let local = t + offset(t);
    let fixed = |len: i64| {
        let start = local - local.rem_euclid(len) - offset(t);
        (start, start + len)
    };
    let today = local.div_euclid(DAY_S);
    let (first, next) = match unit {
        CalendarUnit::Minute => return fixed(60),
        CalendarUnit::Hour => return fixed(3600),
        CalendarUnit::Day => (today, today + 1),
        CalendarUnit::Week => (today - weekday(today), today - weekday(today) + 7),
        CalendarUnit::Month => {
            let (year, month, day) = date_of(today);
            (today - (day - 1), today - (day - 1) + month_days(year, month))
        }
    };
    // The node's clock runs on Unix time, so a window that began before 1970 (the week of
    // 1 January 1970 began on Monday 29 December 1969) starts at the epoch.
    (local_midnight(first, offset).max(0), local_midnight(next, offset))
}

/// The code's window holding second `t` (and a few nanoseconds into it), in Unix seconds.
fn code(calendar: &Calendar, t: i64, nanos: i64) -> (i64, i64) {
    let window = calendar.window_at((t * NANOS + nanos) as u64);
    let (start, end) = (window.start.as_nanos() as i64, window.end.as_nanos() as i64);
    assert_eq!((start % NANOS, end % NANOS), (0, 0), "windows start on whole seconds");
    (start / NANOS, end / NANOS)
}

fn unit() -> impl Strategy<Value = CalendarUnit> {
    proptest::sample::select(CalendarUnit::ALL.to_vec())
}

const Y1996: i64 = 820_454_400;
const Y2100: i64 = 4_102_444_800;
const Y2200: i64 = 7_258_118_400;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn utc_windows_match_the_naive_calendar(unit in unit(), t in 0..Y2200, nanos in 0..NANOS) {
        let calendar = Calendar::new(unit, "UTC").expect("UTC");
        prop_assert_eq!(code(&calendar, t, nanos), model(unit, utc, t), "{:?} at {}", unit, t);
    }

    #[test]
    fn berlin_windows_match_the_naive_calendar(unit in unit(), t in Y1996..Y2100, nanos in 0..NANOS) {
        let calendar = Calendar::new(unit, "Europe/Berlin").expect("bundled tz database");
        prop_assert_eq!(code(&calendar, t, nanos), model(unit, berlin_offset, t), "{:?} at {}", unit, t);
    }

    /// Around every boundary: the last nanosecond of a window and the first of the next.
    #[test]
    fn consecutive_windows_meet(unit in unit(), t in Y1996..Y2100) {
        let calendar = Calendar::new(unit, "Europe/Berlin").expect("bundled tz database");
        let window = calendar.window_at((t * NANOS) as u64);
        let next = calendar.window_at(window.end.as_nanos());
        prop_assert_eq!(next.start, window.end);
        prop_assert_eq!(calendar.window_at(window.end.as_nanos() - 1), window);
    }
}

/// Unix second of `year-month-day hh:00` UTC.
fn utc_time(year: i64, month: i64, day: i64, hour: i64) -> i64 {
    days_of(year, month, day) * DAY_S + hour * 3600
}

#[test]
fn month_ends_leap_years_and_dst_days_have_their_lengths() {
    let length_h = |unit, zone, t: i64| {
        let (start, end) = code(&Calendar::new(unit, zone).expect("zone"), t, 0);
        (end - start) / 3600
    };
    let cases = [
        (CalendarUnit::Month, "UTC", utc_time(2024, 2, 10, 0), 29 * 24), // leap year
        (CalendarUnit::Month, "UTC", utc_time(2000, 2, 10, 0), 29 * 24), // divisible by 400
        (CalendarUnit::Month, "UTC", utc_time(2100, 2, 10, 0), 28 * 24), // divisible by 100
        (CalendarUnit::Month, "UTC", utc_time(2026, 4, 30, 23), 30 * 24),
        (CalendarUnit::Month, "UTC", utc_time(2026, 12, 31, 23), 31 * 24),
        (CalendarUnit::Day, "Europe/Berlin", utc_time(2026, 3, 29, 12), 23), // spring forward
        (CalendarUnit::Day, "Europe/Berlin", utc_time(2026, 10, 25, 12), 25), // fall back
        (CalendarUnit::Month, "Europe/Berlin", utc_time(2026, 3, 15, 0), 31 * 24 - 1),
        (CalendarUnit::Month, "Europe/Berlin", utc_time(2026, 10, 15, 0), 31 * 24 + 1),
        (CalendarUnit::Week, "Europe/Berlin", utc_time(2026, 3, 27, 0), 7 * 24 - 1),
        (CalendarUnit::Hour, "Europe/Berlin", utc_time(2026, 10, 25, 1), 1),
    ];
    for (unit, zone, t, hours) in cases {
        assert_eq!(length_h(unit, zone, t), hours, "{unit:?} in {zone} at {t}");
    }
    // A day in Berlin starts at local midnight: 23:00 UTC in winter, 22:00 UTC in summer.
    let day = Calendar::new(CalendarUnit::Day, "Europe/Berlin").expect("zone");
    assert_eq!(code(&day, utc_time(2026, 1, 15, 12), 0).0, utc_time(2026, 1, 14, 23));
    assert_eq!(code(&day, utc_time(2026, 7, 15, 12), 0).0, utc_time(2026, 7, 14, 22));
    // Weeks start on Monday: 2026-03-02 was a Monday.
    let week = Calendar::new(CalendarUnit::Week, "UTC").expect("UTC");
    assert_eq!(code(&week, utc_time(2026, 3, 8, 23), 0), (utc_time(2026, 3, 2, 0), utc_time(2026, 3, 9, 0)));
}

#[test]
fn unknown_zones_are_refused() {
    for zone in ["Mars/Olympus", "", "europe/berlin "] {
        assert!(Calendar::new(CalendarUnit::Day, zone).is_err(), "{zone:?}");
    }
}
