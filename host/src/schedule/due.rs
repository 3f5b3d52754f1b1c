//! Which fire times a leader starts now (SPEC §11: "a new leader starts the fire times that
//! were due and not started, by the catch-up policy"), on an injected *now*.
//!
//! **The rule.** A fire time `f` is *due* at `now` when
//!
//! ```text
//! f <= now  and  now - f <= starting_deadline  and  f > last_started
//! ```
//!
//! (`last_started`: the latest fire time the store records as started, by any host; all
//! three in whole Unix seconds). Of the due fire times:
//!
//! - `latest` starts the newest; the older ones are missed ([`MissedReason::Superseded`]).
//! - `all` starts each, oldest first; past [`MAX_CATCH_UP`] of them only the newest
//!   [`MAX_CATCH_UP`] start and the older are missed ([`MissedReason::TooMany`]): like
//!   Kubernetes' 100-missed-schedules rule, which starts one, a long outage does not become a
//!   storm of runs.
//! - `none` starts the newest only if it came due while this host led (`f >=
//!   leading_since`): a continuing leader's own fire time, even one it reaches a little late,
//!   and a new leader's first fire time after it took over. What came due while no host led is
//!   missed ([`MissedReason::NotCaughtUp`]); an older fire time this leader reached together
//!   with a newer one is [`MissedReason::Superseded`].
//!
//! A fire time after `last_started` but past the deadline is missed
//! ([`MissedReason::PastDeadline`]). With no `last_started` (a new service, or one whose
//! records are gone) there is no history: only the fire times within the deadline count, and
//! nothing older is reported. A `last_started` ahead of `now` (a host whose clock ran ahead
//! recorded it) holds every fire time up to it back: they count as started.
//!
//! **Bounds.** The computation walks back from `now` one fire time at a time and stops after
//! at most [`MAX_CATCH_UP`] starts and [`MAX_MISSED_LISTED`] missed fire times: its cost does
//! not grow with the length of an outage. Older missed fire times are not listed; [`Due`]
//! says there were some.
//!
//! **The default deadline** is the schedule's interval around `now`, at least
//! [`MIN_DEFAULT_STARTING_DEADLINE`] ([`super::Schedule::default_starting_deadline`]).

use std::time::Duration;

use super::{CatchUp, FireTime, Schedule};

/// The most fire times `catch-up = "all"` starts at once.
pub const MAX_CATCH_UP: usize = 100;

/// The most missed fire times one [`Schedule::due`] lists (the newest ones).
pub const MAX_MISSED_LISTED: usize = 100;

/// The shortest default starting deadline: an every-second schedule's interval would let a
/// leader's ordinary lateness (a timer woken late, a store write before the start) miss its
/// fire times. Kubernetes' controller looks every 10 s for the same reason.
pub const MIN_DEFAULT_STARTING_DEADLINE: Duration = Duration::from_secs(10);

/// What [`Schedule::due`] is asked: the moment, what the store records, and the policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DueQuery {
    /// Now, in whole seconds since the Unix epoch (the wall clock, floored).
    pub now: i64,
    /// The latest fire time the store records as started, by any host; `None` if none is.
    pub last_started: Option<FireTime>,
    /// Since when this host has led the service (Unix seconds, floored): only
    /// [`CatchUp::None`] reads it.
    pub leading_since: i64,
    /// The setting `starting-deadline`; `None` for the default (the schedule's interval).
    pub starting_deadline: Option<Duration>,
    /// The setting `catch-up`.
    pub catch_up: CatchUp,
}

/// The answer of [`Schedule::due`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Due {
    /// The fire times to start now, oldest first; each still to be recorded in the store,
    /// which decides whether this host may run it.
    pub start: Vec<FireTime>,
    /// The newest missed fire times (at most [`MAX_MISSED_LISTED`]), oldest first.
    pub missed: Vec<Missed>,
    /// Whether older missed fire times exist beyond those listed.
    pub more_missed: bool,
    /// The starting deadline applied: the setting, or the default at `now`.
    pub starting_deadline: Duration,
    /// The first fire time after `now`, when the runtime looks next; `None` if there is none.
    pub next: Option<FireTime>,
}

/// A fire time that will not run, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Missed {
    /// The fire time.
    pub at: FireTime,
    /// Why it will not run.
    pub reason: MissedReason,
}

/// Why a fire time will not run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MissedReason {
    /// Not started within the starting deadline.
    PastDeadline,
    /// A newer due fire time starts instead (`latest`, `none`).
    Superseded,
    /// Beyond the [`MAX_CATCH_UP`] newest due fire times (`all`).
    TooMany,
    /// It came due while no host led the service (`none`).
    NotCaughtUp,
}

impl MissedReason {
    /// A short name for logs, `status` and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PastDeadline => "past-deadline",
            Self::Superseded => "superseded",
            Self::TooMany => "too-many",
            Self::NotCaughtUp => "not-caught-up",
        }
    }
}

impl Schedule {
    /// Which fire times to start at `query.now` and which are missed, by the rule of this
    /// module's header. Pure; at most [`MAX_CATCH_UP`] + [`MAX_MISSED_LISTED`] + 2 searches.
    pub fn due(&self, query: &DueQuery) -> Due {
        let now = FireTime::from_unix(query.now);
        let starting_deadline = query
            .starting_deadline
            .unwrap_or_else(|| self.default_starting_deadline(now));
        let deadline = i64::try_from(starting_deadline.as_secs()).unwrap_or(i64::MAX);
        let oldest_due = query.now.saturating_sub(deadline);
        let starts_allowed = match query.catch_up {
            CatchUp::Latest | CatchUp::None => 1,
            CatchUp::All => MAX_CATCH_UP,
        };

        let (mut start, mut missed, mut more_missed) = (Vec::new(), Vec::new(), false);
        let mut cursor = self.latest_at_or_before(now);
        while let Some(f) = cursor {
            if query.last_started.is_some_and(|last| f <= last) {
                break;
            }
            let reason = if f.unix() < oldest_due {
                if query.last_started.is_none() {
                    break;
                }
                MissedReason::PastDeadline
            } else if query.catch_up == CatchUp::None && f.unix() < query.leading_since {
                MissedReason::NotCaughtUp
            } else if start.len() < starts_allowed {
                start.push(f);
                cursor = self.previous(f, false);
                continue;
            } else if query.catch_up == CatchUp::All {
                MissedReason::TooMany
            } else {
                MissedReason::Superseded
            };
            // Walking back, no start can follow a missed fire time: every reason above holds
            // for all older ones too, or the starts are used up.
            if missed.len() == MAX_MISSED_LISTED {
                more_missed = true;
                break;
            }
            missed.push(Missed { at: f, reason });
            cursor = self.previous(f, false);
        }
        start.reverse();
        missed.reverse();
        Due {
            start,
            missed,
            more_missed,
            starting_deadline,
            next: self.next_after(now),
        }
    }
}
