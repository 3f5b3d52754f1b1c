//! `[service.NAME]` in `vvm.toml` (SPEC §6, §8, §10): what one service may reach beyond its
//! sandbox, its key-value buckets and limits, its configuration, and what its failures do. The
//! runtime turns it into its grants (`runtime::config`). A scheduled service's keys (`schedule`
//! and the keys only it reads) are parsed by `config::schedule`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::parse::{opt_duration, opt_from_str};
use crate::schedule::{CatchUp, Concurrency};

/// `[service.NAME]`: what one service may reach beyond its sandbox. Nothing by default.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct GrantConfig {
    /// `source`: where the component comes from when not from `NAME.wasm` in the services
    /// directory: `"oci://REGISTRY/REPOSITORY@sha256:DIGEST"` (or `:TAG`, or both), pulled
    /// from an OCI registry (SPEC §13). A file of the same name is then ignored.
    #[serde(default, with = "opt_from_str")]
    pub source: Option<crate::sources::SourceRef>,
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
    /// Named key-value buckets this service may open besides its own (`kv-buckets`); a
    /// bucket is shared by every service granted its name.
    #[serde(default)]
    pub kv_buckets: Vec<String>,
    /// `[service.NAME.kv]`: this service's key-value limits, over the host-wide `[kv]`.
    #[serde(default)]
    pub kv: KvLimitsConfig,
    /// `[service.NAME.config]`: what `wasi:config/store` gives the service.
    #[serde(default)]
    pub config: BTreeMap<String, ConfigValue>,
    /// Where the service may send outgoing HTTP requests (`http`), in Spin's syntax:
    /// `"https://api.example.com"`, `"https://*.slack.com:443"`, `"http://127.0.0.1:8080"`.
    /// Nothing by default.
    #[serde(default)]
    pub http: Vec<String>,
    /// A CA certificate file (PEM) the service's HTTPS requests also trust (`http-ca`), beside
    /// the bundled web PKI roots: for internal services.
    pub http_ca: Option<PathBuf>,
    /// `[service.NAME.outgoing-http]`: this service's outgoing HTTP limits, over the
    /// host-wide `[outgoing-http]`.
    #[serde(default)]
    pub outgoing_http: OutgoingHttpConfig,
    /// Where an HTTP service is served on `http-addr` (`route`), in Spin's form: a prefix
    /// ending in `/...` (`"/api/..."`, `"/..."` for every path) or an exact path
    /// (`"/hello"`). Default: `/NAME/...`.
    pub route: Option<String>,
    /// `schedule`: a cron expression (SPEC §11, dialect in [`crate::schedule`]); the service
    /// runs once per fire time, on the leader. Not scheduled when absent.
    pub schedule: Option<String>,
    /// `timezone`: the IANA zone of `schedule` (`"Europe/Berlin"`); UTC when absent.
    pub timezone: Option<String>,
    /// `starting-deadline`: how late a fire time may still start; the schedule's interval when
    /// absent.
    #[serde(default, with = "opt_duration")]
    pub starting_deadline: Option<Duration>,
    /// `catch-up`: `latest` (when absent), `all` or `none`.
    #[serde(default, with = "opt_from_str")]
    pub catch_up: Option<CatchUp>,
    /// `concurrency`: `skip` (when absent) or `allow`, for a fire time that comes while a run
    /// is still going.
    #[serde(default, with = "opt_from_str")]
    pub concurrency: Option<Concurrency>,
    /// `run-timeout`: the longest one run may take; unbounded when absent.
    #[serde(default, with = "opt_duration")]
    pub run_timeout: Option<Duration>,
    /// `retry-cut-runs`: whether a run cut by a lost lease is started again by the next
    /// leader; `false` when absent.
    pub retry_cut_runs: Option<bool>,
    /// How many requests one instance of this HTTP service serves before it is dropped
    /// (`max-instance-reuse-count`); the host-wide one when absent.
    pub max_instance_reuse_count: Option<u32>,
    /// How many requests one instance of this HTTP service serves at once
    /// (`max-instance-concurrent-reuse-count`; more than 1 only for a WASI 0.3 component).
    pub max_instance_concurrent_reuse_count: Option<u32>,
    /// How long an instance of this HTTP service waits idle for its next request
    /// (`idle-instance-timeout`).
    #[serde(default, with = "opt_duration")]
    pub idle_instance_timeout: Option<Duration>,
}

impl GrantConfig {
    /// Its instance reuse settings, as the file sets them.
    #[must_use]
    pub fn instance_reuse(&self) -> InstanceReuseConfig {
        InstanceReuseConfig {
            max_instance_reuse_count: self.max_instance_reuse_count,
            max_instance_concurrent_reuse_count: self.max_instance_concurrent_reuse_count,
            idle_instance_timeout: self.idle_instance_timeout,
        }
    }
}

/// How many requests an HTTP service's instance serves, in its life and at once, and how long
/// it waits idle (SPEC §12), as `[service.NAME]` or the host-wide settings set them; a key
/// left out is the next layer's, then the default of the component's WASI generation
/// (`interfaces::InstanceReuse`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InstanceReuseConfig {
    /// `max-instance-reuse-count`.
    pub max_instance_reuse_count: Option<u32>,
    /// `max-instance-concurrent-reuse-count`.
    pub max_instance_concurrent_reuse_count: Option<u32>,
    /// `idle-instance-timeout`.
    pub idle_instance_timeout: Option<Duration>,
}

impl InstanceReuseConfig {
    /// These settings, each falling back to `lower`'s where this one has none.
    #[must_use]
    pub fn over(self, lower: Self) -> Self {
        Self {
            max_instance_reuse_count: self
                .max_instance_reuse_count
                .or(lower.max_instance_reuse_count),
            max_instance_concurrent_reuse_count: self
                .max_instance_concurrent_reuse_count
                .or(lower.max_instance_concurrent_reuse_count),
            idle_instance_timeout: self.idle_instance_timeout.or(lower.idle_instance_timeout),
        }
    }
}

/// `[incoming-http]`: limits on the requests the host serves to HTTP services on `http-addr`
/// (SPEC §10). A key left out is the default (`interfaces::IncomingLimits`).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct IncomingHttpConfig {
    /// The most requests of one service served at once; more are answered 503.
    pub max_concurrent: Option<u32>,
    /// The longest a request may take, from its admission to the end of its response.
    #[serde(default, with = "opt_duration")]
    pub request_timeout: Option<Duration>,
    /// The largest request body; a larger one is refused (413), unread when it says its
    /// length.
    pub max_body_bytes: Option<u64>,
    /// The largest request head (request line and headers); a larger one is refused (431).
    pub max_header_bytes: Option<u64>,
    /// The most connections open on `http-addr` at once (`max-connections`); at the cap the
    /// host closes the one that has waited longest for a request head to take a new one, or
    /// stops accepting while none waits. Default: well under the open file limit.
    pub max_connections: Option<u32>,
    /// The longest a connection may take to send a whole request head (`header-timeout`),
    /// from its accept or from the first byte of a later request's head; then it is closed.
    #[serde(default, with = "opt_duration")]
    pub header_timeout: Option<Duration>,
    /// The longest a connection may stay idle between two requests (`keep-alive-timeout`);
    /// then it is closed.
    #[serde(default, with = "opt_duration")]
    pub keep_alive_timeout: Option<Duration>,
    /// The former name of `header-timeout` and `keep-alive-timeout` together: each of them
    /// left out takes this.
    #[serde(default, with = "opt_duration")]
    pub idle_timeout: Option<Duration>,
    /// Every HTTP service's `max-instance-reuse-count`, but where its table sets one.
    pub max_instance_reuse_count: Option<u32>,
    /// Every HTTP service's `max-instance-concurrent-reuse-count`, but where its table sets
    /// one.
    pub max_instance_concurrent_reuse_count: Option<u32>,
    /// Every HTTP service's `idle-instance-timeout`, but where its table sets one.
    #[serde(default, with = "opt_duration")]
    pub idle_instance_timeout: Option<Duration>,
}

impl IncomingHttpConfig {
    /// These limits, each falling back to `lower`'s where this one has none.
    #[must_use]
    pub fn over(self, lower: Self) -> Self {
        Self {
            max_concurrent: self.max_concurrent.or(lower.max_concurrent),
            request_timeout: self.request_timeout.or(lower.request_timeout),
            max_body_bytes: self.max_body_bytes.or(lower.max_body_bytes),
            max_header_bytes: self.max_header_bytes.or(lower.max_header_bytes),
            max_connections: self.max_connections.or(lower.max_connections),
            header_timeout: self.header_timeout.or(lower.header_timeout),
            keep_alive_timeout: self.keep_alive_timeout.or(lower.keep_alive_timeout),
            idle_timeout: self.idle_timeout.or(lower.idle_timeout),
            max_instance_reuse_count: self
                .max_instance_reuse_count
                .or(lower.max_instance_reuse_count),
            max_instance_concurrent_reuse_count: self
                .max_instance_concurrent_reuse_count
                .or(lower.max_instance_concurrent_reuse_count),
            idle_instance_timeout: self.idle_instance_timeout.or(lower.idle_instance_timeout),
        }
    }

    /// The host-wide instance reuse settings.
    #[must_use]
    pub fn instance_reuse(&self) -> InstanceReuseConfig {
        InstanceReuseConfig {
            max_instance_reuse_count: self.max_instance_reuse_count,
            max_instance_concurrent_reuse_count: self.max_instance_concurrent_reuse_count,
            idle_instance_timeout: self.idle_instance_timeout,
        }
    }
}

/// `[outgoing-http]` (host-wide) and `[service.NAME.outgoing-http]`: limits on a service's
/// outgoing HTTP requests. A key a service's table leaves out is the host-wide one, and one
/// left out there too is the default (`runtime::OutgoingLimits`).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct OutgoingHttpConfig {
    /// The most requests of one service in flight at once; more wait for one to end.
    pub max_concurrent: Option<u32>,
    /// The longest a connection may take: name lookup, TCP connect and TLS handshake.
    #[serde(default, with = "opt_duration")]
    pub connect_timeout: Option<Duration>,
    /// The longest wait for the response head once the request is sent.
    #[serde(default, with = "opt_duration")]
    pub first_byte_timeout: Option<Duration>,
    /// The longest wait between two pieces of the response body.
    #[serde(default, with = "opt_duration")]
    pub between_bytes_timeout: Option<Duration>,
    /// The most idle keep-alive connections kept per origin (`pool-max-idle-per-origin`); 0
    /// opens a connection per request.
    pub pool_max_idle_per_origin: Option<u32>,
    /// How long an idle keep-alive connection waits for its next request
    /// (`pool-idle-timeout`).
    #[serde(default, with = "opt_duration")]
    pub pool_idle_timeout: Option<Duration>,
}

impl OutgoingHttpConfig {
    /// These limits, each falling back to `lower`'s where this one has none.
    #[must_use]
    pub fn over(self, lower: Self) -> Self {
        Self {
            max_concurrent: self.max_concurrent.or(lower.max_concurrent),
            connect_timeout: self.connect_timeout.or(lower.connect_timeout),
            first_byte_timeout: self.first_byte_timeout.or(lower.first_byte_timeout),
            between_bytes_timeout: self.between_bytes_timeout.or(lower.between_bytes_timeout),
            pool_max_idle_per_origin: self
                .pool_max_idle_per_origin
                .or(lower.pool_max_idle_per_origin),
            pool_idle_timeout: self.pool_idle_timeout.or(lower.pool_idle_timeout),
        }
    }
}

/// `[kv]` (host-wide) and `[service.NAME.kv]`: limits on a service's key-value data. A key a
/// service's table leaves out is the host-wide one, and one that is left out there too is the
/// default (`runtime::KvLimits`).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct KvLimitsConfig {
    /// The longest key, in bytes.
    pub max_key_bytes: Option<u64>,
    /// The largest value, in bytes.
    pub max_value_bytes: Option<u64>,
    /// The most keys in one namespace.
    pub max_keys: Option<u64>,
    /// The most bytes (keys and values) in one namespace.
    pub max_bytes: Option<u64>,
    /// Writes per second, on average (a token bucket); no rate unless set.
    pub writes_per_second: Option<u32>,
    /// How many writes may come at once under `writes-per-second` (default: a second's).
    pub write_burst: Option<u32>,
}

impl KvLimitsConfig {
    /// These limits, each falling back to `lower`'s where this one has none.
    #[must_use]
    pub fn over(self, lower: Self) -> Self {
        Self {
            max_key_bytes: self.max_key_bytes.or(lower.max_key_bytes),
            max_value_bytes: self.max_value_bytes.or(lower.max_value_bytes),
            max_keys: self.max_keys.or(lower.max_keys),
            max_bytes: self.max_bytes.or(lower.max_bytes),
            writes_per_second: self.writes_per_second.or(lower.writes_per_second),
            write_burst: self.write_burst.or(lower.write_burst),
        }
    }
}

/// One value of `[service.NAME.config]`: written in the file, or read when the settings are
/// (at start and at SIGHUP) from the host's environment or from a file. A value read from
/// the environment or a file is a secret: its `Debug` shows where it comes from, never what
/// it is, and no error message or log line carries it.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "toml::Value")]
pub enum ConfigValue {
    /// `key = "value"` (a number or a boolean is taken as its text).
    Plain(String),
    /// `key = { env = "VAR" }`.
    Env(String),
    /// `key = { file = "PATH" }` (systemd `LoadCredential=`, Kubernetes secrets).
    File(PathBuf),
}

impl fmt::Debug for ConfigValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Plain(v) => write!(f, "{v:?}"),
            Self::Env(var) => write!(f, "{{ env = {var:?} }}"),
            Self::File(path) => write!(f, "{{ file = {path:?} }}"),
        }
    }
}

impl TryFrom<toml::Value> for ConfigValue {
    type Error = String;

    fn try_from(raw: toml::Value) -> Result<Self, String> {
        const SHAPE: &str = r#"a config value is a string, { env = "VAR" } or { file = "PATH" }"#;
        let table = match raw {
            toml::Value::String(v) => return Ok(Self::Plain(v)),
            toml::Value::Integer(v) => return Ok(Self::Plain(v.to_string())),
            toml::Value::Float(v) => return Ok(Self::Plain(v.to_string())),
            toml::Value::Boolean(v) => return Ok(Self::Plain(v.to_string())),
            toml::Value::Table(table) => table,
            toml::Value::Datetime(_) | toml::Value::Array(_) => return Err(SHAPE.to_owned()),
        };
        let mut entries = table.into_iter();
        match (entries.next(), entries.next()) {
            (Some((k, toml::Value::String(var))), None) if k == "env" && !var.is_empty() => {
                Ok(Self::Env(var))
            }
            (Some((k, toml::Value::String(path))), None) if k == "file" && !path.is_empty() => {
                Ok(Self::File(path.into()))
            }
            _ => Err(SHAPE.to_owned()),
        }
    }
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
