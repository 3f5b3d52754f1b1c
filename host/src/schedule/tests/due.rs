//! The due computation: one table of cases per rule of `due`'s header.

use super::*;

/// 2026-01-01 12:00 UTC plus `minutes` minutes and `seconds` seconds.
fn at(minutes: i64, seconds: i64) -> FireTime {
    FireTime::from_unix(utc(2026, 1, 1, 12, 0, 0).unix() + minutes * 60 + seconds)
}

fn missed(reason: MissedReason, minutes: impl IntoIterator<Item = i64>) -> Vec<Missed> {
    minutes
        .into_iter()
        .map(|m| Missed {
            at: at(m, 0),
            reason,
        })
        .collect()
}

fn query(now: FireTime, last: Option<i64>, leading_since: FireTime, catch_up: CatchUp) -> DueQuery {
    DueQuery {
        now: now.unix(),
        last_started: last.map(|m| at(m, 0)),
        leading_since: leading_since.unix(),
        starting_deadline: Some(Duration::from_mins(2)),
        catch_up,
    }
}

/// Every minute; a leader looks at `now`. Each row: the query, the fire times started, the
/// missed ones (oldest first).
type Case = (&'static str, DueQuery, Vec<FireTime>, Vec<Missed>);

/// The rows of [`each_catch_up_policy_starts_and_misses_as_its_rule_says`].
fn catch_up_cases() -> Vec<Case> {
    use CatchUp::{All, Latest, None as NoCatchUp};
    use MissedReason::{NotCaughtUp, PastDeadline, Superseded};
    let outage = at(10, 5); // the last start was 12:04; a leader looks at 12:10:05
    let cat = |a: Vec<Missed>, b: Vec<Missed>| [a, b].concat();
    vec![
        (
            "on time",
            query(at(5, 3), Some(4), at(0, 0), Latest),
            vec![at(5, 0)],
            vec![],
        ),
        (
            "on time, all",
            query(at(5, 3), Some(4), at(0, 0), All),
            vec![at(5, 0)],
            vec![],
        ),
        (
            "on time, none",
            query(at(5, 3), Some(4), at(0, 0), NoCatchUp),
            vec![at(5, 0)],
            vec![],
        ),
        (
            "latest after an outage: the newest in the deadline",
            query(outage, Some(4), outage, Latest),
            vec![at(10, 0)],
            cat(missed(PastDeadline, 5..=8), missed(Superseded, [9])),
        ),
        (
            "all after an outage: each in the deadline",
            query(outage, Some(4), outage, All),
            vec![at(9, 0), at(10, 0)],
            missed(PastDeadline, 5..=8),
        ),
        (
            "none after an outage: nothing that came due without a leader",
            query(outage, Some(4), outage, NoCatchUp),
            vec![],
            cat(missed(PastDeadline, 5..=8), missed(NotCaughtUp, 9..=10)),
        ),
        (
            "none: a leader since the fire time starts it",
            query(outage, Some(4), at(10, 0), NoCatchUp),
            vec![at(10, 0)],
            cat(missed(PastDeadline, 5..=8), missed(NotCaughtUp, [9])),
        ),
        (
            "none: a continuing leader that stalled starts its newest",
            query(outage, Some(4), at(0, 0), NoCatchUp),
            vec![at(10, 0)],
            cat(missed(PastDeadline, 5..=8), missed(Superseded, [9])),
        ),
        (
            "no record: only the deadline's fire times, nothing older reported",
            query(outage, None, outage, Latest),
            vec![at(10, 0)],
            missed(Superseded, [9]),
        ),
        (
            "no record, all",
            query(outage, None, outage, All),
            vec![at(9, 0), at(10, 0)],
            vec![],
        ),
        (
            "already started",
            query(outage, Some(10), outage, Latest),
            vec![],
            vec![],
        ),
        (
            "recorded ahead of now",
            query(outage, Some(20), outage, All),
            vec![],
            vec![],
        ),
        (
            "a fire time is due at its second",
            query(at(10, 0), Some(9), at(0, 0), Latest),
            vec![at(10, 0)],
            vec![],
        ),
        (
            "not yet",
            query(at(9, 59), Some(9), at(0, 0), Latest),
            vec![],
            vec![],
        ),
    ]
}

#[test]
fn each_catch_up_policy_starts_and_misses_as_its_rule_says() {
    let s = schedule("* * * * *");
    for (name, q, start, miss) in catch_up_cases() {
        let due = s.due(&q);
        assert_eq!(
            (&due.start, &due.missed, due.more_missed),
            (&start, &miss, false),
            "{name}"
        );
        assert_eq!(due.starting_deadline, Duration::from_mins(2), "{name}");
        assert_eq!(due.next, s.next_after(FireTime::from_unix(q.now)), "{name}");
    }
}

/// `now - f <= starting_deadline`, in whole seconds: the deadline's last second is in.
#[test]
fn the_deadline_includes_its_last_second() {
    let s = schedule("* * * * *");
    let with = |now, deadline| DueQuery {
        starting_deadline: Some(Duration::from_millis(deadline)),
        ..query(now, Some(9), at(0, 0), CatchUp::Latest)
    };
    assert_eq!(s.due(&with(at(10, 30), 30_000)).start, [at(10, 0)]);
    assert_eq!(s.due(&with(at(10, 30), 30_999)).start, [at(10, 0)]);
    let late = s.due(&with(at(10, 31), 30_000));
    assert!(late.start.is_empty());
    assert_eq!(late.missed, missed(MissedReason::PastDeadline, [10]));
    // The default: every minute's interval, 60 s.
    let default = DueQuery {
        starting_deadline: None,
        ..query(at(11, 0), Some(9), at(0, 0), CatchUp::All)
    };
    let due = s.due(&default);
    assert_eq!(due.starting_deadline, Duration::from_mins(1));
    assert_eq!(due.start, [at(10, 0), at(11, 0)]);
}

/// `all` starts at most `MAX_CATCH_UP`, the newest; what one look lists is bounded however
/// long the outage.
#[test]
fn catching_up_and_listing_are_bounded() {
    let s = schedule("* * * * * *");
    let t = utc(2026, 1, 1, 12, 0, 0).unix();
    let second = |k: i64| FireTime::from_unix(t + k);
    let all = s.due(&DueQuery {
        now: t + 1000,
        last_started: Some(second(0)),
        leading_since: t,
        starting_deadline: Some(Duration::from_mins(5)),
        catch_up: CatchUp::All,
    });
    assert_eq!(all.start, (901..=1000).map(second).collect::<Vec<_>>());
    assert_eq!(all.missed.len(), MAX_MISSED_LISTED);
    assert_eq!(all.missed[0].at, second(801));
    assert!(all.missed.iter().all(|m| m.reason == MissedReason::TooMany));
    assert!(all.more_missed);

    // A year without a leader, every second, the default deadline (10 s).
    let latest = s.due(&DueQuery {
        now: t,
        last_started: Some(second(-366 * 24 * 3600)),
        leading_since: t,
        starting_deadline: None,
        catch_up: CatchUp::Latest,
    });
    assert_eq!(latest.starting_deadline, MIN_DEFAULT_STARTING_DEADLINE);
    assert_eq!(latest.start, [second(0)]);
    let reasons: Vec<_> = latest.missed.iter().map(|m| (m.at, m.reason)).collect();
    let expected: Vec<_> = (-100..=-11)
        .map(|k| (second(k), MissedReason::PastDeadline))
        .chain((-10..=-1).map(|k| (second(k), MissedReason::Superseded)))
        .collect();
    assert_eq!(reasons, expected);
    assert!(latest.more_missed);
}

#[test]
fn policies_read_and_print_their_setting_names() {
    for p in [CatchUp::Latest, CatchUp::All, CatchUp::None] {
        assert_eq!(p.to_string().parse::<CatchUp>(), Ok(p));
    }
    for c in [Concurrency::Skip, Concurrency::Allow] {
        assert_eq!(c.to_string().parse::<Concurrency>(), Ok(c));
    }
    assert_eq!(CatchUp::default(), CatchUp::Latest);
    assert_eq!(Concurrency::default(), Concurrency::Skip);
    let e = "Latest".parse::<CatchUp>().unwrap_err().to_string();
    assert_eq!(e, "\"Latest\" is not one of latest, all, none");
    assert_eq!(MissedReason::PastDeadline.as_str(), "past-deadline");
}
