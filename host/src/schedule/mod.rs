//! Schedules (SPEC §11): a service's cron expression in its time zone, its fire times, and
//! which of them a leader starts now. Pure: every function takes the time it reasons about,
//! nothing here reads a clock, the store or the runtime (which records each start with a
//! fenced insert-if-absent and runs the guest).
//!
//! This module owns [`Schedule`] (parsing, [`Schedule::next_after`], [`Schedule::fire_times`]),
//! [`FireTime`], and the plain policies a scheduled service is given: [`CatchUp`] and the
//! due computation ([`Schedule::due`], in `due`), and [`Concurrency`].
//!
//! # The dialect
//!
//! Expressions are parsed by croner 4 (Vixie/POSIX cron, as its README calls OCPS), with:
//!
//! - **5 fields** `minute hour day-of-month month day-of-week`, or **6** with a `second`
//!   field first (`"*/10 * * * * *"`). A 7th (year) field, which croner accepts, is refused.
//! - In every field `*`, numbers, ranges `1-5`, lists `1,15`, steps `*/5` and `10-50/10`.
//!   Month names `JAN`..`DEC` and day names `SUN`..`SAT`, any case. Day-of-week `0` and `7`
//!   are both Sunday. `?` is `*` in the two day fields.
//! - `L` (last day of the month; `5L` the last Friday), `W` (`15W` the weekday nearest the
//!   15th, `LW` the last weekday) and `#` (`5#2` the second Friday). croner implements and
//!   tests them, and so do the tests here.
//! - The aliases `@yearly` (`@annually`), `@monthly`, `@weekly`, `@daily` and `@hourly`,
//!   alone. Not `@every ...` or `@reboot`, which croner does not know either.
//! - When day-of-month and day-of-week are both restricted, a day matching **either** fires
//!   (Vixie cron, POSIX, Kubernetes). croner's `+` prefix for AND is refused, so that every
//!   accepted expression means what it means elsewhere. Spin's cron trigger ANDs the two and
//!   requires seconds: a Spin expression that restricts both days means something else here.
//!
//! # Time zones and DST
//!
//! A schedule's `timezone` is an IANA name (`"Europe/Berlin"`), the tz database built into
//! chrono-tz; the default is `UTC`. Across DST changes croner follows Vixie cron, and the tests
//! pin it down: a job at a fixed time (second, minute and hour all single numbers) that falls
//! in a spring-forward gap fires once, at the first instant after the gap (Berlin 2026-03-29
//! `30 2 * * *` fires at 03:00 CEST); in a repeated fall-back hour it fires once, in the first
//! pass (2026-10-25 02:30 CEST, not again at 02:30 CET). A job with a wildcard or a step in
//! those fields skips the times the gap removes and fires in both passes of a repeated hour.
//! Fire times are always in real-time order.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, TimeZone as _};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};

mod due;
mod policy;

pub use due::{
    Due, DueQuery, MAX_CATCH_UP, MAX_MISSED_LISTED, MIN_DEFAULT_STARTING_DEADLINE, Missed,
    MissedReason,
};
pub use policy::{CatchUp, Concurrency, UnknownPolicy};

/// The time zone of a schedule that names none.
pub const DEFAULT_TIMEZONE: &str = "UTC";

/// The aliases accepted alone in place of the fields (croner expands them).
const ALIASES: [&str; 6] = [
    "@yearly",
    "@annually",
    "@monthly",
    "@weekly",
    "@daily",
    "@hourly",
];

/// The instant from which [`Schedule::parse`] looks for a first fire time, to refuse an
/// expression that never fires (`0 0 30 2 *`, which croner parses). A fixed instant keeps
/// parsing pure and its verdict the same on every host and every day.
const NEVER_FIRES_PROBE: FireTime = FireTime::from_unix(946_684_800); // 2000-01-01T00:00:00Z

/// A fire time: an instant, in whole seconds since the Unix epoch (UTC). What the runtime
/// records in the store and hands the guest (`metadata.timestamp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FireTime(i64);

impl FireTime {
    /// The fire time `seconds` after the Unix epoch.
    pub const fn from_unix(seconds: i64) -> Self {
        Self(seconds)
    }

    /// Seconds since the Unix epoch.
    pub const fn unix(self) -> i64 {
        self.0
    }

    /// This instant in `tz`, or `None` outside chrono's range (some 262 000 years).
    fn in_zone(self, tz: Tz) -> Option<DateTime<Tz>> {
        tz.timestamp_opt(self.0, 0).single()
    }
}

impl fmt::Display for FireTime {
    /// RFC 3339 in UTC (`2026-03-29T01:00:00Z`); the bare number outside chrono's range.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match DateTime::from_timestamp(self.0, 0) {
            Some(t) => write!(f, "{}", t.format("%Y-%m-%dT%H:%M:%SZ")),
            None => write!(f, "{}", self.0),
        }
    }
}

/// Why an expression or a time zone is refused. Each message names it and says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// The cron expression is not one of the accepted dialect.
    #[error("cron expression {expression:?} {reason}")]
    Expression {
        /// The expression as written.
        expression: String,
        /// Why it is refused, as a predicate (`has 4 fields`).
        reason: String,
    },
    /// The expression parses but no instant matches it (`0 0 30 2 *`).
    #[error("cron expression {expression:?} never fires")]
    NeverFires {
        /// The expression as written.
        expression: String,
    },
    /// The time zone is not an IANA name.
    #[error(
        "time zone {timezone:?} is not an IANA time zone name such as \"Europe/Berlin\" or \
         \"UTC\" (names are case-sensitive)"
    )]
    Timezone {
        /// The name as written.
        timezone: String,
    },
}

/// A cron expression in a time zone: the fire times of one scheduled service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    expression: String,
    timezone: Tz,
    cron: Cron,
}

impl Schedule {
    /// Parses `expression` (the dialect is the module's) in the IANA zone `timezone`, and
    /// checks that it fires at all. Never panics, whatever the strings; takes a few
    /// milliseconds at most (the search that proves `0 0 30 2 *` never fires).
    ///
    /// # Errors
    /// [`ScheduleError`], naming the expression or the zone and the reason.
    pub fn parse(expression: &str, timezone: &str) -> Result<Self, ScheduleError> {
        let timezone = timezone
            .parse::<Tz>()
            .map_err(|_| ScheduleError::Timezone {
                timezone: timezone.to_owned(),
            })?;
        let refuse = |reason: &str| ScheduleError::Expression {
            expression: expression.to_owned(),
            reason: reason.to_owned(),
        };
        check_dialect(expression).map_err(|reason| refuse(&reason))?;
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .dom_and_dow(false)
            .alternative_weekdays(false)
            .sloppy_ranges(false)
            .build()
            .parse(expression)
            .map_err(|e| refuse(&format!("is not valid: {e}")))?;
        let schedule = Self {
            expression: expression.trim().to_owned(),
            timezone,
            cron,
        };
        if schedule.next_after(NEVER_FIRES_PROBE).is_none() {
            return Err(ScheduleError::NeverFires {
                expression: expression.to_owned(),
            });
        }
        Ok(schedule)
    }

    /// The expression, as written (trimmed).
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// The IANA name of the schedule's time zone.
    pub fn timezone(&self) -> &'static str {
        self.timezone.name()
    }

    /// The first fire time strictly after `t`; `None` if there is none within croner's search
    /// (past the year 5000, or an expression rarer than its search limit).
    pub fn next_after(&self, t: FireTime) -> Option<FireTime> {
        let from = t.in_zone(self.timezone)?;
        let next = self.cron.find_next_occurrence(&from, false).ok()?;
        Some(FireTime(next.timestamp()))
    }

    /// The last fire time at or before `t`, or `None` if there is none within croner's search.
    pub fn latest_at_or_before(&self, t: FireTime) -> Option<FireTime> {
        self.previous(t, true)
    }

    /// The last fire time strictly before `t`.
    fn previous(&self, t: FireTime, inclusive: bool) -> Option<FireTime> {
        let from = t.in_zone(self.timezone)?;
        let previous = self.cron.find_previous_occurrence(&from, inclusive).ok()?;
        Some(FireTime(previous.timestamp()))
    }

    /// The fire times `f` with `from <= f < to`, in order. Each step is one search; the range
    /// bounds the iteration (an every-second schedule yields one per second of it).
    pub fn fire_times(&self, from: FireTime, to: FireTime) -> FireTimes<'_> {
        FireTimes {
            schedule: self,
            after: FireTime(from.0.saturating_sub(1)),
            to,
        }
    }

    /// The gap between the two fire times around `now`: the last at or before it and the
    /// next after it (or, with no earlier one, the first two after it). `None` if croner
    /// finds no such pair. Uneven for some expressions (`0 9 * * MON-FRI`, a day changing
    /// length at DST): the gap in force at `now`.
    pub fn interval_around(&self, now: FireTime) -> Option<Duration> {
        let next = self.next_after(now)?;
        let Some(before) = self.latest_at_or_before(now) else {
            return gap(next, self.next_after(next)?);
        };
        gap(before, next)
    }

    /// The starting deadline of a schedule whose settings name none, at `now`: its interval
    /// around `now` ([`Schedule::interval_around`]), and at least
    /// [`MIN_DEFAULT_STARTING_DEADLINE`]. With it a leader that comes late, for any reason,
    /// still starts the latest fire time until the next one comes.
    pub fn default_starting_deadline(&self, now: FireTime) -> Duration {
        self.interval_around(now)
            .unwrap_or(MIN_DEFAULT_STARTING_DEADLINE)
            .max(MIN_DEFAULT_STARTING_DEADLINE)
    }
}

/// `later - earlier` as a duration, if positive.
fn gap(earlier: FireTime, later: FireTime) -> Option<Duration> {
    let seconds = later.0.checked_sub(earlier.0)?;
    u64::try_from(seconds)
        .ok()
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
}

/// Checks what croner would accept but the dialect does not: a field count other than 5 or
/// 6, an unknown `@` alias, the `+` AND prefix, characters outside ASCII. What croner refuses
/// itself it reports.
fn check_dialect(expression: &str) -> Result<(), String> {
    let text = expression.trim();
    if !text.is_ascii() {
        return Err("has a character that is not ASCII".into());
    }
    if text.starts_with('@') {
        return if ALIASES.iter().any(|a| a.eq_ignore_ascii_case(text)) {
            Ok(())
        } else {
            Err(format!(
                "is not an alias of {}; or write the fields",
                ALIASES.join(", ")
            ))
        };
    }
    let fields = text.split_ascii_whitespace().count();
    if !(5..=6).contains(&fields) {
        return Err(format!(
            "has {fields} fields; a schedule has 5 (minute hour day-of-month month \
             day-of-week), or 6 with seconds first"
        ));
    }
    if text.contains('+') {
        return Err(
            "uses `+` (day-of-month AND day-of-week), which is not accepted: a day matching \
                    either field fires, as in Vixie cron"
                .into(),
        );
    }
    Ok(())
}

/// The fire times of a range, in order ([`Schedule::fire_times`]).
#[derive(Debug)]
pub struct FireTimes<'a> {
    schedule: &'a Schedule,
    after: FireTime,
    to: FireTime,
}

impl Iterator for FireTimes<'_> {
    type Item = FireTime;

    fn next(&mut self) -> Option<FireTime> {
        if self.after >= self.to {
            return None;
        }
        // croner's rule for a repeated hour: search on from the exact instant it returned.
        match self.schedule.next_after(self.after) {
            Some(next) if next < self.to => {
                self.after = next;
                Some(next)
            }
            _ => {
                self.after = self.to;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests;
