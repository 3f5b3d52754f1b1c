//! The schedule: the dialect, fire times across DST changes and leap days, and the due
//! computation's every policy.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use chrono::{TimeZone as _, Utc};
use proptest::prelude::*;

use super::*;

/// The instant `y-m-d h:mi:s` UTC.
fn utc(y: i32, m: u32, d: u32, h: u32, mi: u32, s: u32) -> FireTime {
    FireTime::from_unix(Utc.with_ymd_and_hms(y, m, d, h, mi, s).unwrap().timestamp())
}

fn schedule(expression: &str) -> Schedule {
    Schedule::parse(expression, "UTC").unwrap()
}

/// The first `n` fire times after `from`.
fn next_n(s: &Schedule, from: FireTime, n: usize) -> Vec<FireTime> {
    std::iter::successors(s.next_after(from), |f| s.next_after(*f))
        .take(n)
        .collect()
}

#[test]
fn fire_times_display_as_utc_and_zones_default_to_utc() {
    assert_eq!(
        utc(2026, 3, 29, 1, 0, 0).to_string(),
        "2026-03-29T01:00:00Z"
    );
    assert_eq!(
        FireTime::from_unix(i64::MAX).to_string(),
        i64::MAX.to_string()
    );
    assert_eq!(schedule(" @daily ").expression(), "@daily");
    assert_eq!(schedule("@daily").timezone(), DEFAULT_TIMEZONE);
    let berlin = Schedule::parse("0 3 * * *", "Europe/Berlin").unwrap();
    assert_eq!(berlin.timezone(), "Europe/Berlin");
}

/// Every field form of the dialect and its first two fire times after 2026-01-01 00:00 UTC,
/// a Thursday.
fn field_forms() -> Vec<(&'static str, Vec<FireTime>)> {
    vec![
        // Numbers, ranges, lists, steps, a stepped range; 5 fields.
        (
            "30 4 * * *",
            vec![utc(2026, 1, 1, 4, 30, 0), utc(2026, 1, 2, 4, 30, 0)],
        ),
        (
            "0 9-10 * * *",
            vec![utc(2026, 1, 1, 9, 0, 0), utc(2026, 1, 1, 10, 0, 0)],
        ),
        (
            "0 0 1,15 * *",
            vec![utc(2026, 1, 15, 0, 0, 0), utc(2026, 2, 1, 0, 0, 0)],
        ),
        (
            "*/20 * * * *",
            vec![utc(2026, 1, 1, 0, 20, 0), utc(2026, 1, 1, 0, 40, 0)],
        ),
        (
            "10-50/20 1 * * *",
            vec![utc(2026, 1, 1, 1, 10, 0), utc(2026, 1, 1, 1, 30, 0)],
        ),
        // 6 fields: seconds first.
        (
            "15 */10 * * * *",
            vec![utc(2026, 1, 1, 0, 0, 15), utc(2026, 1, 1, 0, 10, 15)],
        ),
        (
            "*/1 * * * * *",
            vec![utc(2026, 1, 1, 0, 0, 1), utc(2026, 1, 1, 0, 0, 2)],
        ),
        // Names, any case; Sunday as 0 and 7; `?` in a day field.
        (
            "0 0 1 feb-MAR *",
            vec![utc(2026, 2, 1, 0, 0, 0), utc(2026, 3, 1, 0, 0, 0)],
        ),
        (
            "0 12 * * MON,fri",
            vec![utc(2026, 1, 2, 12, 0, 0), utc(2026, 1, 5, 12, 0, 0)],
        ),
        (
            "0 0 * * 0",
            vec![utc(2026, 1, 4, 0, 0, 0), utc(2026, 1, 11, 0, 0, 0)],
        ),
        (
            "0 0 * * 7",
            vec![utc(2026, 1, 4, 0, 0, 0), utc(2026, 1, 11, 0, 0, 0)],
        ),
        (
            "0 0 ? * SUN",
            vec![utc(2026, 1, 4, 0, 0, 0), utc(2026, 1, 11, 0, 0, 0)],
        ),
        // Both day fields restricted: either fires (Vixie OR): the 10th, and Sundays.
        (
            "0 0 10 * SUN",
            vec![utc(2026, 1, 4, 0, 0, 0), utc(2026, 1, 10, 0, 0, 0)],
        ),
        // L, W, #.
        (
            "0 0 L * *",
            vec![utc(2026, 1, 31, 0, 0, 0), utc(2026, 2, 28, 0, 0, 0)],
        ),
        (
            "0 0 * * 5L",
            vec![utc(2026, 1, 30, 0, 0, 0), utc(2026, 2, 27, 0, 0, 0)],
        ),
        (
            "0 0 * * FRI#2",
            vec![utc(2026, 1, 9, 0, 0, 0), utc(2026, 2, 13, 0, 0, 0)],
        ),
        // 2026-02-15 is a Sunday: the nearest weekday is Monday the 16th.
        (
            "0 0 15W * *",
            vec![utc(2026, 1, 15, 0, 0, 0), utc(2026, 2, 16, 0, 0, 0)],
        ),
        // 2026-01-31 is a Saturday: the last weekday is Friday the 30th.
        (
            "0 0 LW * *",
            vec![utc(2026, 1, 30, 0, 0, 0), utc(2026, 2, 27, 0, 0, 0)],
        ),
        // Aliases.
        (
            "@hourly",
            vec![utc(2026, 1, 1, 1, 0, 0), utc(2026, 1, 1, 2, 0, 0)],
        ),
        (
            "@DAILY",
            vec![utc(2026, 1, 2, 0, 0, 0), utc(2026, 1, 3, 0, 0, 0)],
        ),
        (
            "@weekly",
            vec![utc(2026, 1, 4, 0, 0, 0), utc(2026, 1, 11, 0, 0, 0)],
        ),
        (
            "@monthly",
            vec![utc(2026, 2, 1, 0, 0, 0), utc(2026, 3, 1, 0, 0, 0)],
        ),
        (
            "@yearly",
            vec![utc(2027, 1, 1, 0, 0, 0), utc(2028, 1, 1, 0, 0, 0)],
        ),
        (
            "@annually",
            vec![utc(2027, 1, 1, 0, 0, 0), utc(2028, 1, 1, 0, 0, 0)],
        ),
    ]
}

/// Every field form of the dialect, each with the fire times it must give.
#[test]
fn every_accepted_field_form_fires_as_written() {
    let from = utc(2026, 1, 1, 0, 0, 0);
    for (expression, expected) in field_forms() {
        assert_eq!(
            next_n(&schedule(expression), from, 2),
            expected,
            "{expression}"
        );
    }
}

#[test]
fn leap_day_fires_only_in_leap_years() {
    let s = schedule("0 0 29 2 *");
    assert_eq!(
        next_n(&s, utc(2026, 1, 1, 0, 0, 0), 3),
        [
            utc(2028, 2, 29, 0, 0, 0),
            utc(2032, 2, 29, 0, 0, 0),
            utc(2036, 2, 29, 0, 0, 0)
        ]
    );
    // 2100 is not a leap year.
    assert_eq!(
        s.next_after(utc(2096, 3, 1, 0, 0, 0)),
        Some(utc(2104, 2, 29, 0, 0, 0))
    );
}

#[test]
fn what_the_dialect_refuses_is_named_with_the_reason() {
    for (expression, reason) in [
        ("", "has 0 fields"),
        ("* * * *", "has 4 fields"),
        ("0 0 0 1 1 * 2030", "has 7 fields"),
        ("@every 5m", "is not an alias"),
        ("@reboot", "is not an alias"),
        ("@midnight", "is not an alias"),
        ("0 0 1 * +MON", "`+`"),
        ("0 0 * * LUNDI", "illegal character"),
        ("0 0 * * * ü", "not ASCII"),
        ("60 * * * *", "\"60 * * * *\""),
        ("0 24 * * *", "cron expression"),
        ("0 0 32 * *", "cron expression"),
        ("0 0 * 13 *", "cron expression"),
        ("0 0 * * 8", "cron expression"),
        ("*/0 * * * *", "cron expression"),
        ("0/10 * * * *", "cron expression"),
        ("5-1 * * * *", "cron expression"),
        ("0 0 * * 5#6", "cron expression"),
        ("0 0 L * L#", "cron expression"),
        ("0 0 30 2 *", "never fires"),
        ("0 0 31 4,6,9,11 *", "never fires"),
    ] {
        let e = Schedule::parse(expression, "UTC").unwrap_err().to_string();
        assert!(e.contains(reason), "{expression:?}: {e}");
        assert!(
            e.contains(&format!("{expression:?}")),
            "{expression:?}: {e}"
        );
    }
    for timezone in [
        "",
        "Berlin",
        "europe/berlin",
        "UTC+1",
        "Europe/Berlin ",
        "../etc/passwd",
    ] {
        let e = Schedule::parse("* * * * *", timezone).unwrap_err();
        assert_eq!(
            e,
            ScheduleError::Timezone {
                timezone: timezone.into()
            }
        );
        assert!(e.to_string().contains("IANA"), "{e}");
    }
}

/// No string reaches a panic in the parser or the first search (croner's included).
#[test]
fn odd_strings_are_refused_without_a_panic() {
    for odd in [
        "\0",
        "\n\t",
        "@",
        "@@hourly",
        "@hourly *",
        "* * * * * * * * * *",
        "- - - - -",
        ", , , , ,",
        "/ / / / /",
        "*/ * * * *",
        "1-/2 * * * *",
        "# # # # #",
        "L L L L L",
        "W W W W W",
        "? ? ? ? ?",
        "0 0 LW * L",
        "0 0 1W-5 * *",
        "0 0 W * *",
        "0 0 * * #1",
        "0 0 * * 1#",
        "0 0 * * 1#0",
        "99999999999999999999 * * * *",
        "-1 * * * *",
        "0 0 * * SUNSUN",
        "0 0 * JANFEB *",
        "0 0 * * -SUN",
        "0 0 * * SUN-",
        "1,,,2 * * * *",
        "*/65535 * * * *",
        "0-59/1 0-23/1 1-31/1 1-12/1 0-7/1",
        "0 0 L-3 * *",
        "0 0 5L-1 * *",
        "  ",
        "\u{feff}* * * * *",
        "* * * * *\u{0}",
        "ⅫⅫⅫ * * * *",
        "ǅ * * * *",
    ] {
        let _ = Schedule::parse(odd, "UTC");
        let _ = Schedule::parse("* * * * *", odd);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn random_expressions_never_panic(
        fields in prop::collection::vec("[0-9*/,?LW#A-Za-z+@-]{0,6}", 0..8),
        separator in "[ \t]{1,2}",
    ) {
        let expression = fields.join(&separator);
        if let Ok(s) = Schedule::parse(&expression, "Europe/Berlin") {
            let from = utc(2026, 1, 1, 0, 0, 0);
            let _ = s.next_after(from);
            let _ = s.due(&DueQuery {
                now: from.unix(),
                last_started: Some(FireTime::from_unix(0)),
                leading_since: from.unix(),
                starting_deadline: None,
                catch_up: CatchUp::All,
            });
        }
    }
}

/// Berlin springs forward on 2026-03-29 (02:00 CET becomes 03:00 CEST): a job fixed at 02:30
/// fires once that day, at 03:00 CEST, the first instant after the gap; then 02:30 again.
#[test]
fn a_fixed_time_in_the_spring_forward_gap_fires_once_just_after_it() {
    let s = Schedule::parse("30 2 * * *", "Europe/Berlin").unwrap();
    assert_eq!(
        next_n(&s, utc(2026, 3, 27, 12, 0, 0), 3),
        [
            utc(2026, 3, 28, 1, 30, 0), // 02:30 CET
            utc(2026, 3, 29, 1, 0, 0),  // 03:00 CEST
            utc(2026, 3, 30, 0, 30, 0), // 02:30 CEST
        ]
    );
    // An interval job skips the times the gap removes.
    let every_half_hour = Schedule::parse("*/30 * * * *", "Europe/Berlin").unwrap();
    assert_eq!(
        next_n(&every_half_hour, utc(2026, 3, 28, 23, 45, 0), 4),
        [
            utc(2026, 3, 29, 0, 0, 0),  // 01:00 CET
            utc(2026, 3, 29, 0, 30, 0), // 01:30 CET
            utc(2026, 3, 29, 1, 0, 0),  // 03:00 CEST
            utc(2026, 3, 29, 1, 30, 0), // 03:30 CEST
        ]
    );
    // Every minute of the gap hour only: nothing that day.
    let in_the_gap = Schedule::parse("*/15 2 * * *", "Europe/Berlin").unwrap();
    assert_eq!(
        in_the_gap.next_after(utc(2026, 3, 28, 23, 0, 0)),
        Some(utc(2026, 3, 30, 0, 0, 0)) // 03-30 02:00 CEST
    );
}

/// Berlin falls back on 2026-10-25 (03:00 CEST becomes 02:00 CET, 02:00-03:00 twice): a job
/// fixed at 02:30 fires once, in the first pass; an interval job fires in both.
#[test]
fn a_fixed_time_in_the_repeated_hour_fires_once_and_an_interval_job_twice() {
    let s = Schedule::parse("30 2 * * *", "Europe/Berlin").unwrap();
    assert_eq!(
        next_n(&s, utc(2026, 10, 23, 12, 0, 0), 3),
        [
            utc(2026, 10, 24, 0, 30, 0), // 02:30 CEST
            utc(2026, 10, 25, 0, 30, 0), // 02:30 CEST, first pass; not 01:30Z (02:30 CET)
            utc(2026, 10, 26, 1, 30, 0), // 02:30 CET
        ]
    );
    // Searching from inside the second pass does not fire it again.
    assert_eq!(
        s.next_after(utc(2026, 10, 25, 1, 15, 0)),
        Some(utc(2026, 10, 26, 1, 30, 0))
    );
    let every_half_hour = Schedule::parse("*/30 * * * *", "Europe/Berlin").unwrap();
    assert_eq!(
        next_n(&every_half_hour, utc(2026, 10, 24, 23, 45, 0), 5),
        [
            utc(2026, 10, 25, 0, 0, 0),  // 02:00 CEST
            utc(2026, 10, 25, 0, 30, 0), // 02:30 CEST
            utc(2026, 10, 25, 1, 0, 0),  // 02:00 CET
            utc(2026, 10, 25, 1, 30, 0), // 02:30 CET
            utc(2026, 10, 25, 2, 0, 0),  // 03:00 CET
        ]
    );
}

/// The due computation walks back: the backward search must give the forward one's fire
/// times, in reverse, across both DST changes and a leap day.
#[test]
fn walking_back_meets_the_fire_times_walking_forward_met() {
    for (expression, zone, from, to) in [
        (
            "30 2 * * *",
            "Europe/Berlin",
            utc(2026, 3, 25, 0, 0, 0),
            utc(2026, 4, 2, 0, 0, 0),
        ),
        (
            "30 2 * * *",
            "Europe/Berlin",
            utc(2026, 10, 20, 0, 0, 0),
            utc(2026, 10, 30, 0, 0, 0),
        ),
        (
            "*/30 * * * *",
            "Europe/Berlin",
            utc(2026, 3, 28, 20, 0, 0),
            utc(2026, 3, 29, 4, 0, 0),
        ),
        (
            "*/30 * * * *",
            "Europe/Berlin",
            utc(2026, 10, 24, 20, 0, 0),
            utc(2026, 10, 25, 5, 0, 0),
        ),
        (
            "0 * * * *",
            "America/New_York",
            utc(2026, 11, 1, 3, 0, 0),
            utc(2026, 11, 1, 9, 0, 0),
        ),
        (
            "0 0 29 2 *",
            "UTC",
            utc(2026, 1, 1, 0, 0, 0),
            utc(2037, 1, 1, 0, 0, 0),
        ),
    ] {
        let s = Schedule::parse(expression, zone).unwrap();
        let forward: Vec<FireTime> = s.fire_times(from, to).collect();
        let mut backward = Vec::new();
        let mut cursor = s.previous(to, false);
        while let Some(f) = cursor.filter(|f| *f >= from) {
            backward.push(f);
            cursor = s.previous(f, false);
        }
        backward.reverse();
        assert!(forward.len() >= 3, "{expression} {zone}: {forward:?}");
        assert_eq!(forward, backward, "{expression} {zone}");
    }
}

#[test]
fn fire_times_of_a_range_are_half_open() {
    let s = schedule("*/10 * * * * *");
    let at = |sec| utc(2026, 1, 1, 0, 0, sec);
    assert_eq!(
        s.fire_times(at(0), at(30)).collect::<Vec<_>>(),
        [at(0), at(10), at(20)]
    );
    assert_eq!(
        s.fire_times(at(1), at(31)).collect::<Vec<_>>(),
        [at(10), at(20), at(30)]
    );
    assert_eq!(s.fire_times(at(30), at(30)).count(), 0);
    assert_eq!(s.fire_times(at(30), at(0)).count(), 0);
    let mut it = s.fire_times(at(0), at(11));
    assert_eq!(
        (it.next(), it.next(), it.next(), it.next()),
        (Some(at(0)), Some(at(10)), None, None)
    );
}

#[test]
fn the_default_deadline_is_the_interval_around_now_and_at_least_ten_seconds() {
    let now = utc(2026, 1, 7, 10, 20, 0); // a Wednesday
    let hours = |h: u64| Duration::from_secs(h * 3600);
    assert_eq!(
        schedule("0 * * * *").default_starting_deadline(now),
        hours(1)
    );
    assert_eq!(
        schedule("0 9 * * MON-FRI").default_starting_deadline(now),
        hours(24)
    );
    // Over a weekend, Friday 09:00 to Monday 09:00.
    let saturday = utc(2026, 1, 10, 12, 0, 0);
    assert_eq!(
        schedule("0 9 * * MON-FRI").default_starting_deadline(saturday),
        hours(72)
    );
    // On a fire time, the gap that begins there.
    assert_eq!(
        schedule("0 0,6 * * *").interval_around(utc(2026, 1, 7, 6, 0, 0)),
        Some(hours(18))
    );
    assert_eq!(
        schedule("* * * * * *").interval_around(now),
        Some(Duration::from_secs(1))
    );
    assert_eq!(
        schedule("* * * * * *").default_starting_deadline(now),
        MIN_DEFAULT_STARTING_DEADLINE
    );
    // The day that springs forward is 23 hours long.
    let berlin = Schedule::parse("0 12 * * *", "Europe/Berlin").unwrap();
    assert_eq!(
        berlin.interval_around(utc(2026, 3, 29, 0, 0, 0)),
        Some(hours(23))
    );
}

mod due;
