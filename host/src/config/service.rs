//! `[service.NAME]` in `vvm.toml` (SPEC §6, §8): what one service may reach beyond its sandbox,
//! and what its failures do. The runtime turns it into its grants (`runtime::config`).

use std::time::Duration;

use serde::Deserialize;

use super::parse::opt_duration;

/// `[service.NAME]`: what one service may reach beyond its sandbox. Nothing by default.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct GrantConfig {
    /// Host directories to preopen, as `host-path` or `host-path:guest-path`.
    #[serde(default)]
    pub dirs: Vec<String>,
    /// Environment variables to pass, as `NAME=value`.
    #[serde(default)]
    pub env: Vec<String>,
    /// Whether the service may open network sockets.
    #[serde(default)]
    pub network: bool,
    /// The longest wait between restarts of this service; the host-wide
    /// `restart-backoff-max` when absent.
    #[serde(default, with = "opt_duration")]
    pub restart_backoff_max: Option<Duration>,
    /// What a failure of this service does beyond its restart. Default: nothing.
    #[serde(default)]
    pub on_failure: OnFailure,
}

/// What a service's failure does besides restarting it (SPEC §6).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum OnFailure {
    /// Restart it here with backoff; nothing else notices (the default: a guest's failure is
    /// the same on every host, so moving the slot cannot fix it).
    #[default]
    Restart,
    /// Hand the slot (or, under spread placement, the service's claim) to another host, for
    /// failures that may be this host's own (a missing granted directory, a dependency this
    /// host cannot reach). Once per service within [`HAND_OVER_MEMORY`]: a failure that
    /// follows the service to the next host keeps it in backoff there.
    HandOver,
}

/// How long a service's hand-over is remembered in the store: while it is, a failure of that
/// service on any host restarts it with backoff and does not move the slot again.
pub const HAND_OVER_MEMORY: Duration = Duration::from_hours(1);
