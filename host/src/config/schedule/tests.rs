//! Tests of a scheduled service's settings (`config::schedule`).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use super::super::tests::parse;
use super::super::*;

/// `schedule` and the keys of a scheduled service parse into its `ScheduleSettings`, with
/// their defaults.
#[test]
fn schedule_settings_parse_with_their_defaults() {
    use crate::schedule::{CatchUp, Concurrency};

    let file = parse(
        r#"
[service.export]
schedule = "30 2 * * *"
timezone = "Europe/Berlin"
starting-deadline = "30s"
catch-up = "all"
concurrency = "allow"
run-timeout = "10m"
retry-cut-runs = true

[service.tick]
schedule = "*/5 * * * * *"

[service.api]
env = []
"#,
    )
    .unwrap();
    bounds::check_services(&file.service).unwrap();
    let export = file.service["export"]
        .schedule_settings("export")
        .unwrap()
        .unwrap();
    assert_eq!(export.schedule.expression(), "30 2 * * *");
    assert_eq!(export.schedule.timezone(), "Europe/Berlin");
    assert_eq!(export.starting_deadline, Some(Duration::from_secs(30)));
    assert_eq!(export.catch_up, CatchUp::All);
    assert_eq!(export.concurrency, Concurrency::Allow);
    assert_eq!(export.run_timeout, Some(Duration::from_mins(10)));
    assert!(export.retry_cut_runs);
    let query = export.due_query(100, None, 50);
    assert_eq!(
        (query.catch_up, query.starting_deadline),
        (CatchUp::All, export.starting_deadline)
    );

    let tick = file.service["tick"]
        .schedule_settings("tick")
        .unwrap()
        .unwrap();
    assert_eq!(tick.schedule.timezone(), "UTC");
    assert_eq!(
        (
            tick.starting_deadline,
            tick.catch_up,
            tick.concurrency,
            tick.run_timeout
        ),
        (None, CatchUp::Latest, Concurrency::Skip, None)
    );
    assert!(!tick.retry_cut_runs);
    assert_eq!(file.service["api"].schedule_settings("api").unwrap(), None);
}

/// A scheduled service's bad value is refused when the settings are resolved, naming the
/// setting, the service, the value and why; and so is its key set without `schedule`.
#[test]
fn bad_schedule_settings_are_refused_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vvm.toml");
    let resolve = |table: &str| {
        std::fs::write(&path, format!("[service.job]\n{table}\n")).unwrap();
        Settings::resolve(FileConfig::default(), Some(&path))
            .unwrap_err()
            .to_string()
    };
    for (table, message) in [
        (
            "schedule = \"0 0 30 2 *\"",
            "setting service.*.schedule: service job: cron expression \"0 0 30 2 *\" never fires",
        ),
        (
            "schedule = \"* * * *\"",
            "setting service.*.schedule: service job: cron expression \"* * * *\" has 4 fields",
        ),
        (
            "schedule = \"@every 5m\"",
            "setting service.*.schedule: service job: cron expression \"@every 5m\" is not an alias",
        ),
        (
            "schedule = \"@daily\"\ntimezone = \"Berlin\"",
            "setting service.*.timezone: service job: time zone \"Berlin\" is not an IANA",
        ),
        (
            "schedule = \"@daily\"\nstarting-deadline = \"500ms\"",
            "setting service.*.starting-deadline: service job: starting-deadline 500ms is not \
             within 1s and 366 days",
        ),
        (
            "schedule = \"@daily\"\nrun-timeout = \"8days\"",
            "setting service.*.run-timeout: service job: run-timeout 8days is longer than 7 days",
        ),
        (
            "timezone = \"UTC\"",
            "setting service.*.timezone: service job: timezone is set but schedule is not",
        ),
        (
            "catch-up = \"none\"\nretry-cut-runs = false",
            "setting service.*.catch-up: service job: catch-up, retry-cut-runs are set but \
             schedule is not",
        ),
    ] {
        let e = resolve(table);
        assert!(e.contains(message), "{table}: {e}");
    }
    // A policy's or a duration's text is refused by the file's parser, with its key and line.
    for (table, message) in [
        (
            "schedule = \"@daily\"\ncatch-up = \"first\"",
            "\"first\" is not one of latest, all, none",
        ),
        (
            "schedule = \"@daily\"\nconcurrency = \"replace\"",
            "\"replace\" is not one of skip, allow",
        ),
        ("schedule = \"@daily\"\nstarting-deadline = \"0s\"", "zero"),
        (
            "schedule = \"@daily\"\nretry-cut-runs = \"yes\"",
            "retry-cut-runs",
        ),
        ("schedule = 5", "schedule"),
    ] {
        let e = resolve(table);
        assert!(
            e.contains("vvm.toml") && e.contains(message),
            "{table}: {e}"
        );
    }
}
