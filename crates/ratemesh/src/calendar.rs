//! Calendar windows: fixed windows aligned to the calendar (a minute, an hour, a day, a week
//! starting on Monday, a month) in UTC or an IANA time zone, with month lengths, leap years and
//! DST changes as the tz database has them (bundled into the binary: no `/usr/share/zoneinfo`
//! needed).
//!
//! The core does no calendar arithmetic: [`Calendar::window_at`] turns a wall-clock time into the
//! window's bounds, and a [`CalendarPolicy`] hands the core a limit for the current window (a
//! fixed window of `limit` hits whose period is that window, see
//! [`ratemesh_core::CalendarWindow`]). The node's clock runs on Unix time, so the bounds are the
//! same numbers on every node and a forwarded check carries its window to the owner.
//!
//! Minute and hour windows follow the zone's offset at the time (an hour is 3600 s even across
//! a DST change: in a zone with whole-hour offsets they are the UTC hours). Day, week and month
//! windows are civil: from local midnight to local midnight, so a day is 23 or 25 hours long
//! across a DST change, and a month 28 to 31 days.

use std::sync::Arc;

use jiff::ToSpan as _;
use jiff::civil::Date;
use jiff::tz::TimeZone;
use ratemesh_core::{
    Audit, CalendarWindow, Fallback, Instant, Limit, LimitError, LimitSpec, Mode, Policy, PolicyRegion,
};

use crate::sync::Mutex;

/// The length of a calendar window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CalendarUnit {
    /// From one minute of the local clock to the next.
    Minute,
    /// From one hour of the local clock to the next.
    Hour,
    /// From local midnight to local midnight.
    Day,
    /// From Monday 00:00 to the next Monday 00:00, local time.
    Week,
    /// From the 1st 00:00 to the next month's 1st 00:00, local time.
    Month,
}

impl CalendarUnit {
    /// Every unit, shortest first.
    pub const ALL: [CalendarUnit; 5] = [
        CalendarUnit::Minute,
        CalendarUnit::Hour,
        CalendarUnit::Day,
        CalendarUnit::Week,
        CalendarUnit::Month,
    ];

    /// The name used in configuration and APIs (`minute`, `hour`, `day`, `week`, `month`).
    pub const fn name(self) -> &'static str {
        match self {
            CalendarUnit::Minute => "minute",
            CalendarUnit::Hour => "hour",
            CalendarUnit::Day => "day",
            CalendarUnit::Week => "week",
            CalendarUnit::Month => "month",
        }
    }

    /// The unit called `name`, if any.
    pub fn from_name(name: &str) -> Option<CalendarUnit> {
        CalendarUnit::ALL.into_iter().find(|unit| unit.name() == name)
    }
}

/// Why a calendar could not be made. The caller's input is at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CalendarError {
    /// The time zone is not in the bundled tz database.
    #[error("unknown time zone {0:?} (use an IANA name such as \"Europe/Berlin\", or \"UTC\")")]
    UnknownZone(String),
    /// The limit is invalid.
    #[error(transparent)]
    Limit(#[from] LimitError),
}

/// Calendar windows of one unit in one time zone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Calendar {
    unit: CalendarUnit,
    zone_name: String,
    zone: TimeZone,
}

impl Calendar {
    /// Windows of `unit` in the time zone `zone` (an IANA name, or `UTC`).
    pub fn new(unit: CalendarUnit, zone: &str) -> Result<Calendar, CalendarError> {
        let tz = TimeZone::get(zone).map_err(|_| CalendarError::UnknownZone(zone.to_owned()))?;
        Ok(Calendar { unit, zone_name: zone.to_owned(), zone: tz })
    }

    /// The unit.
    pub fn unit(&self) -> CalendarUnit {
        self.unit
    }

    /// The time zone's name, as given.
    pub fn zone_name(&self) -> &str {
        &self.zone_name
    }

    /// The window holding `unix_nanos` (nanoseconds since the Unix epoch), as instants of the
    /// node's clock (which runs on Unix time). Times before 1970 or after 2554 are clamped.
    pub fn window_at(&self, unix_nanos: u64) -> CalendarWindow {
        let (start, end) = self.bounds(i128::from(unix_nanos));
        let instant = |nanos: i128| Instant::from_nanos(u64::try_from(nanos.max(0)).unwrap_or(u64::MAX));
        CalendarWindow { start: instant(start), end: instant(end) }
    }

    /// `[start, end)` of the window holding `nanos`, in Unix nanoseconds.
    fn bounds(&self, nanos: i128) -> (i128, i128) {
        const NANOS_PER_S: i128 = 1_000_000_000;
        let timestamp = jiff::Timestamp::from_nanosecond(nanos).unwrap_or(jiff::Timestamp::MAX);
        let fixed = |len_s: i128| {
            let offset = i128::from(self.zone.to_offset(timestamp).seconds()) * NANOS_PER_S;
            let local = nanos + offset;
            let start = local - local.rem_euclid(len_s * NANOS_PER_S) - offset;
            (start, start + len_s * NANOS_PER_S)
        };
        let date = timestamp.to_zoned_datetime(self.zone.clone()).date();
        let (first, next) = match self.unit {
            CalendarUnit::Minute => return fixed(60),
            CalendarUnit::Hour => return fixed(3600),
            CalendarUnit::Day => (date, date.tomorrow().unwrap_or(date)),
            CalendarUnit::Week => {
                let monday = date.checked_sub(i64::from(date.weekday().to_monday_zero_offset()).days());
                let monday = monday.unwrap_or(date);
                (monday, monday.checked_add(7.days()).unwrap_or(monday))
            }
            CalendarUnit::Month => {
                let first = date.first_of_month();
                (first, first.checked_add(1.month()).unwrap_or(first))
            }
        };
        (self.midnight(first), self.midnight(next))
    }

    /// Unix nanoseconds of the start of `date` in the zone (the first instant of that day: if
    /// midnight falls in a DST gap, the first instant after it).
    fn midnight(&self, date: Date) -> i128 {
        date.to_zoned_datetime(self.zone.clone()).map_or(i128::MAX, |start| start.timestamp().as_nanosecond())
    }
}

/// A calendar limit: `limit` hits per window of a [`Calendar`], resolved into the core's
/// [`Policy`] for the window a check falls in (cached until the window ends).
#[derive(Debug)]
pub struct CalendarPolicy {
    calendar: Calendar,
    limit: u64,
    mode: Mode,
    fallback: Fallback,
    audit: Audit,
    region: PolicyRegion,
    current: Mutex<Arc<Policy>>,
}

impl CalendarPolicy {
    /// `limit` hits per window of `calendar`, in `mode`, with `fallback`, audited as `audit`,
    /// under `region`'s terms between regions.
    pub fn new(
        calendar: Calendar,
        limit: u64,
        (mode, fallback, audit, region): (Mode, Fallback, Audit, PolicyRegion),
    ) -> Result<Self, CalendarError> {
        let rule = (limit, mode, fallback, audit, region);
        let first = resolve(&calendar, rule, crate::durable::unix_nanos_now())?;
        let current = Mutex::new(Arc::new(first));
        Ok(CalendarPolicy { calendar, limit, mode, fallback, audit, region, current })
    }

    /// The calendar.
    pub fn calendar(&self) -> &Calendar {
        &self.calendar
    }

    /// Hits per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The fallback.
    pub fn fallback(&self) -> Fallback {
        self.fallback
    }

    /// The policy of the window holding `unix_nanos`.
    pub fn policy_at(&self, unix_nanos: u64) -> Arc<Policy> {
        let mut current = self.current.lock();
        let now = Instant::from_nanos(unix_nanos);
        let covered = current.limit.spec().calendar.is_some_and(|w| w.start <= now && now < w.end);
        if !covered {
            // The limit was valid for one window, so it is for every other; a window that cannot
            // be computed (beyond the year 2554) keeps the last one, which the core treats as
            // stale: counted in the bucket's own window.
            let rule = (self.limit, self.mode, self.fallback, self.audit, self.region);
            if let Ok(policy) = resolve(&self.calendar, rule, unix_nanos) {
                *current = Arc::new(policy);
            }
        }
        Arc::clone(&current)
    }

    /// The policy of the window holding the wall clock's now.
    pub fn policy_now(&self) -> Arc<Policy> {
        self.policy_at(crate::durable::unix_nanos_now())
    }
}

impl PartialEq for CalendarPolicy {
    /// The same rule (the cached window aside).
    fn eq(&self, other: &Self) -> bool {
        (&self.calendar, self.limit, self.mode, self.fallback, self.audit, self.region)
            == (&other.calendar, other.limit, other.mode, other.fallback, other.audit, other.region)
    }
}

impl Eq for CalendarPolicy {}

fn resolve(
    calendar: &Calendar,
    (limit, mode, fallback, audit, region): (u64, Mode, Fallback, Audit, PolicyRegion),
    unix_nanos: u64,
) -> Result<Policy, LimitError> {
    let limit = Limit::new(LimitSpec::calendar(limit, calendar.window_at(unix_nanos)))?;
    Ok(Policy { limit, mode, fallback, audit, region })
}
