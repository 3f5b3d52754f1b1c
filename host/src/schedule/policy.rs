//! The plain policies of a scheduled service (SPEC §11): `catch-up` ([`CatchUp`]) and
//! `concurrency` ([`Concurrency`]), by their setting names.

use std::fmt;
use std::str::FromStr;

/// What a new or continuing leader does with the fire times that came due and were not
/// started (`catch-up`). See [`super::Schedule::due`] for the exact rule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CatchUp {
    /// Start the latest due fire time; older due ones are missed (the default, and what
    /// Kubernetes' `CronJob` controller does).
    #[default]
    Latest,
    /// Start every due fire time, oldest first, at most [`super::MAX_CATCH_UP`] of them.
    All,
    /// Start a fire time only if it came due while this host led; drop what came due while
    /// no host did.
    None,
}

/// What a fire time does while the previous run of the service is still going
/// (`concurrency`), as Kubernetes' `concurrencyPolicy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Concurrency {
    /// The fire time is skipped, and recorded as skipped (the default; Kubernetes' `Forbid`).
    #[default]
    Skip,
    /// A second run starts beside the first (Kubernetes' `Allow`).
    Allow,
}

/// A policy's name is not one of its values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not one of {expected}")]
pub struct UnknownPolicy {
    /// The name as written.
    pub value: String,
    /// The names accepted.
    pub expected: &'static str,
}

impl FromStr for CatchUp {
    type Err = UnknownPolicy;

    /// `latest`, `all` or `none`.
    fn from_str(s: &str) -> Result<Self, UnknownPolicy> {
        match s {
            "latest" => Ok(Self::Latest),
            "all" => Ok(Self::All),
            "none" => Ok(Self::None),
            _ => Err(UnknownPolicy {
                value: s.to_owned(),
                expected: "latest, all, none",
            }),
        }
    }
}

impl fmt::Display for CatchUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Latest => "latest",
            Self::All => "all",
            Self::None => "none",
        })
    }
}

impl FromStr for Concurrency {
    type Err = UnknownPolicy;

    /// `skip` or `allow`.
    fn from_str(s: &str) -> Result<Self, UnknownPolicy> {
        match s {
            "skip" => Ok(Self::Skip),
            "allow" => Ok(Self::Allow),
            _ => Err(UnknownPolicy {
                value: s.to_owned(),
                expected: "skip, allow",
            }),
        }
    }
}

impl fmt::Display for Concurrency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Skip => "skip",
            Self::Allow => "allow",
        })
    }
}
