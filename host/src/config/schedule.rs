//! A scheduled service's settings (SPEC §11): `schedule` in `[service.NAME]`, and the keys only
//! a scheduled service reads (`timezone`, `starting-deadline`, `catch-up`, `concurrency`,
//! `run-timeout`, `retry-cut-runs`), parsed into a [`ScheduleSettings`] and bounded. The
//! settings check reads every service's at load, so a bad one is refused at start (and at a
//! reload) with the setting named; the runtime reads them again from the grant.

use std::time::Duration;

use super::error::ConfigError;
use super::service::GrantConfig;
use crate::schedule::{CatchUp, Concurrency, DEFAULT_TIMEZONE, DueQuery, FireTime, Schedule};

/// The shortest `starting-deadline`: fire times and the leader's *now* are whole seconds.
pub const MIN_STARTING_DEADLINE: Duration = Duration::from_secs(1);
/// The longest `starting-deadline`: a year and a day, so that a yearly schedule may set one.
pub const MAX_STARTING_DEADLINE: Duration = Duration::from_hours(366 * 24);
/// The longest `run-timeout`: a week. A run is cut by its timeout or by a lost lease.
pub const MAX_RUN_TIMEOUT: Duration = Duration::from_hours(7 * 24);

/// A scheduled service's settings, parsed and bounded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduleSettings {
    /// `schedule` in `timezone` (default [`DEFAULT_TIMEZONE`]).
    pub schedule: Schedule,
    /// `starting-deadline`: how late after its fire time a run may still start; `None` for
    /// the default, the schedule's interval ([`Schedule::default_starting_deadline`]).
    pub starting_deadline: Option<Duration>,
    /// `catch-up` (default `latest`).
    pub catch_up: CatchUp,
    /// `concurrency` (default `skip`).
    pub concurrency: Concurrency,
    /// `run-timeout`: the longest one run may take; `None`: no bound but the lease.
    pub run_timeout: Option<Duration>,
    /// `retry-cut-runs` (default `false`): whether a run cut by a lost lease is started again
    /// by the next leader, within the deadline; otherwise it stays recorded as cut.
    pub retry_cut_runs: bool,
}

impl ScheduleSettings {
    /// The question a leader asks at `now` ([`Schedule::due`]), with these settings' policy.
    pub fn due_query(
        &self,
        now: i64,
        last_started: Option<FireTime>,
        leading_since: i64,
    ) -> DueQuery {
        DueQuery {
            now,
            last_started,
            leading_since,
            starting_deadline: self.starting_deadline,
            catch_up: self.catch_up,
        }
    }
}

impl GrantConfig {
    /// The schedule settings of the service `service`: `None` if it has no `schedule`.
    ///
    /// # Errors
    /// Naming the setting and the service: an expression or zone that cannot be parsed, a
    /// duration out of bounds, or a key of a scheduled service set without `schedule`.
    pub fn schedule_settings(
        &self,
        service: &str,
    ) -> Result<Option<ScheduleSettings>, ConfigError> {
        let invalid = |name, reason: String| ConfigError::Invalid {
            name,
            reason: format!("service {service}: {reason}"),
        };
        let Some(expression) = &self.schedule else {
            let set = self.schedule_keys_set();
            return match set.first() {
                Some(&(name, _)) => {
                    let keys: Vec<&str> = set.iter().map(|(_, key)| *key).collect();
                    let (keys, verb) =
                        (keys.join(", "), if keys.len() == 1 { "is" } else { "are" });
                    Err(invalid(
                        name,
                        format!(
                            "{keys} {verb} set but schedule is not; only a scheduled service \
                             reads them"
                        ),
                    ))
                }
                None => Ok(None),
            };
        };
        let timezone = self.timezone.as_deref().unwrap_or(DEFAULT_TIMEZONE);
        let schedule = Schedule::parse(expression, timezone).map_err(|e| {
            let name = match e {
                crate::schedule::ScheduleError::Timezone { .. } => "service.*.timezone",
                _ => "service.*.schedule",
            };
            invalid(name, e.to_string())
        })?;
        if let Some(d) = self.starting_deadline
            && !(MIN_STARTING_DEADLINE..=MAX_STARTING_DEADLINE).contains(&d)
        {
            return Err(invalid(
                "service.*.starting-deadline",
                format!(
                    "starting-deadline {} is not within 1s and 366 days",
                    humantime::format_duration(d)
                ),
            ));
        }
        if let Some(d) = self.run_timeout
            && d > MAX_RUN_TIMEOUT
        {
            return Err(invalid(
                "service.*.run-timeout",
                format!(
                    "run-timeout {} is longer than 7 days",
                    humantime::format_duration(d)
                ),
            ));
        }
        Ok(Some(ScheduleSettings {
            schedule,
            starting_deadline: self.starting_deadline,
            catch_up: self.catch_up.unwrap_or_default(),
            concurrency: self.concurrency.unwrap_or_default(),
            run_timeout: self.run_timeout,
            retry_cut_runs: self.retry_cut_runs.unwrap_or(false),
        }))
    }

    /// The keys only a scheduled service reads that this table sets: the setting's name and
    /// the key.
    fn schedule_keys_set(&self) -> Vec<(&'static str, &'static str)> {
        [
            (self.timezone.is_some(), "service.*.timezone", "timezone"),
            (
                self.starting_deadline.is_some(),
                "service.*.starting-deadline",
                "starting-deadline",
            ),
            (self.catch_up.is_some(), "service.*.catch-up", "catch-up"),
            (
                self.concurrency.is_some(),
                "service.*.concurrency",
                "concurrency",
            ),
            (
                self.run_timeout.is_some(),
                "service.*.run-timeout",
                "run-timeout",
            ),
            (
                self.retry_cut_runs.is_some(),
                "service.*.retry-cut-runs",
                "retry-cut-runs",
            ),
        ]
        .into_iter()
        .filter(|(set, _, _)| *set)
        .map(|(_, name, key)| (name, key))
        .collect()
    }
}

#[cfg(test)]
mod tests;
