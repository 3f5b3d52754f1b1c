//! Settings (SPEC §8): every default is a flag, an environment variable and a `vvm.toml` key.
//!
//! This module owns every default (`DEFAULT_*`) and the resolution of [`Settings`]; `bounds`
//! every bound (`MIN_*`, `MAX_*`) and their check, `service` the `[service.NAME]` table, `route`
//! an HTTP service's `route`, `schedule` a scheduled service's keys,
//! `parse` the text forms, `error` the [`ConfigError`]. Precedence: command-line flag, then
//! environment variable (both via clap, in `cli`, which hands them over as a [`FileConfig`]
//! layer), then the configuration file, then the built-in default.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

mod bounds;
mod error;
mod parse;
mod route;
mod schedule;
mod service;

pub use bounds::{
    Bounded, MAX_ACQUISITION_TIMEOUT, MAX_CLUSTER_SIZE, MAX_CONNECTIONS, MAX_GRACE_PERIOD,
    MAX_HANDLE_LIMIT, MAX_INCOMING_CONCURRENT, MAX_INCOMING_TIMEOUT, MAX_LEASE,
    MAX_MEMORY_LIMIT_MIB, MAX_OUTGOING_CONCURRENT, MAX_OUTGOING_TIMEOUT, MAX_RESTART_BACKOFF_MAX,
    MIN_HANDLE_LIMIT, MIN_INCOMING_TIMEOUT, MIN_LEASE, MIN_OUTGOING_TIMEOUT,
    RESTART_BACKOFF_INITIAL, check_bucket_name, validate,
};
pub use error::ConfigError;
pub use parse::{
    advertised, parse_advertise_addr, parse_duration, parse_http_addr, parse_metrics_addr,
};
use parse::{opt_addr, opt_advertise_addr, opt_duration, opt_http_addr};
pub use route::{Route, pick as pick_route};
pub use schedule::{
    MAX_RUN_TIMEOUT, MAX_STARTING_DEADLINE, MIN_STARTING_DEADLINE, ScheduleSettings,
};
pub use service::{
    ConfigValue, GrantConfig, HAND_OVER_MEMORY, IncomingHttpConfig, InstanceReuseConfig,
    KvLimitsConfig, OnFailure, OutgoingHttpConfig,
};

use crate::fs::{MAX_SETTINGS_FILE_BYTES, read_file};
use bounds::{
    check_incoming_http, check_instance_reuse, check_kv_limits, check_outgoing_http,
    check_services, check_store,
};

/// The configuration file read when `--config` is not given and the file exists.
pub const DEFAULT_CONFIG_FILE: &str = "vvm.toml";

/// The `vvm.toml` file: every key optional; unknown keys are an error. The flags and the
/// environment come as a layer of the same shape, over the file's.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    /// Directory of `*.wasm` services.
    pub services: Option<PathBuf>,
    /// Store: a redb file path, or `etcd://host:port[,host:port...]`.
    pub store: Option<String>,
    /// Cluster size N (slots 1..=N).
    pub cluster_size: Option<u32>,
    /// Lease duration L, e.g. `"10s"`.
    #[serde(default, with = "opt_duration")]
    pub lease: Option<Duration>,
    /// How long to campaign before giving up, e.g. `"5m"`.
    #[serde(default, with = "opt_duration")]
    pub acquisition_timeout: Option<Duration>,
    /// How long a stopping service may take before its instance is dropped, e.g. `"2s"`.
    #[serde(default, with = "opt_duration")]
    pub grace_period: Option<Duration>,
    /// Memory cap per service instance, in MiB.
    pub memory_limit_mib: Option<u64>,
    /// The most handles (open files, sockets, streams, timers) one service instance may
    /// hold at once.
    pub handle_limit: Option<u32>,
    /// Directory of the compiled-component cache.
    pub cache_dir: Option<PathBuf>,
    /// Address of the operations endpoint (`/healthz`, `/leader`, `/metrics`), e.g.
    /// `"127.0.0.1:9464"`; off when absent.
    #[serde(default, with = "opt_addr")]
    pub metrics_addr: Option<SocketAddr>,
    /// Address HTTP services are served on while this host leads, e.g. `"0.0.0.0:8080"`;
    /// off when absent.
    #[serde(default, with = "opt_http_addr")]
    pub http_addr: Option<SocketAddr>,
    /// The address the other hosts of the group reach this host's HTTP listener at, e.g.
    /// `"10.0.0.7:8080"`, for forwarding; default: `http-addr` when that is a concrete address.
    #[serde(default, with = "opt_advertise_addr")]
    pub advertise_addr: Option<SocketAddr>,
    /// Whether a request for a service another host of the group holds is forwarded to it
    /// (default: true when this host has an advertise address).
    pub forward: Option<bool>,
    /// Directory of the crash locks, shared by the hosts of one machine (see
    /// [`crate::holder::crash_lock`]). Default: `<store>.holders` beside a redb store; none for etcd,
    /// where it is worth setting when several hosts share a machine.
    pub lock_dir: Option<PathBuf>,
    /// How services are placed on the hosts: `together` (default) or `spread`.
    pub placement: Option<Placement>,
    /// The longest wait between restarts of a failing service, e.g. `"5m"`.
    #[serde(default, with = "opt_duration")]
    pub restart_backoff_max: Option<Duration>,
    /// Whether a standby whose services differ from the leader's stays out of the campaign
    /// (default false).
    pub require_same_services: Option<bool>,
    /// etcd client options.
    pub etcd: Option<EtcdFileConfig>,
    /// Registries (`host:port`) that registry sources reach over plain HTTP; every other one
    /// over HTTPS.
    pub insecure_registries: Option<Vec<String>>,
    /// A PEM file of CA certificates trusted beside the system's for registries.
    pub registry_ca_file: Option<PathBuf>,
    /// The longest pull of one registry source, e.g. `"5m"`.
    #[serde(default, with = "opt_duration")]
    pub pull_timeout: Option<Duration>,
    /// `[kv]`: every service's key-value limits, unless its own table sets one.
    pub kv: Option<KvLimitsConfig>,
    /// `[outgoing-http]`: every service's outgoing HTTP limits, unless its own table sets one.
    pub outgoing_http: Option<OutgoingHttpConfig>,
    /// `[incoming-http]`: limits on the connections and requests served to HTTP services
    /// (`max-connections`, `header-timeout` and `keep-alive-timeout` are flags too).
    pub incoming_http: Option<IncomingHttpConfig>,
    /// Per-service grants, keyed by service name (the `.wasm` file stem).
    #[serde(default)]
    pub service: BTreeMap<String, GrantConfig>,
}

/// `[etcd]`: credentials and TLS for the etcd store.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct EtcdFileConfig {
    /// User name for etcd authentication.
    pub user: Option<String>,
    /// Password for etcd authentication.
    pub password: Option<String>,
    /// CA certificate (PEM) to verify the cluster with; enables TLS.
    pub ca: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS.
    pub cert: Option<PathBuf>,
    /// Client key (PEM) for mutual TLS.
    pub key: Option<PathBuf>,
    /// Key prefix for every record vvm-host writes.
    pub prefix: Option<String>,
}

/// How services are placed on the hosts of a group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// A leader on a slot runs every service; the other hosts stand by.
    #[default]
    Together,
    /// Each service is claimed on its own (`service/<name>`); hosts keep a membership record
    /// and claim their fair share, so the services spread over every host.
    Spread,
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Together => "together",
            Self::Spread => "spread",
        })
    }
}

impl EtcdFileConfig {
    /// These options, each falling back to `lower`'s where this one has none.
    fn over(self, lower: Self) -> Self {
        Self {
            user: self.user.or(lower.user),
            password: self.password.or(lower.password),
            ca: self.ca.or(lower.ca),
            cert: self.cert.or(lower.cert),
            key: self.key.or(lower.key),
            prefix: self.prefix.or(lower.prefix),
        }
    }
}

impl FileConfig {
    /// Reads `path`; with `explicit == false` a missing file is an empty configuration.
    ///
    /// # Errors
    /// When the file cannot be read or parsed.
    pub fn load(path: &Path, explicit: bool) -> Result<Self, ConfigError> {
        let read_error = |source| ConfigError::Read {
            path: path.to_owned(),
            source,
        };
        let bytes = match read_file(path, MAX_SETTINGS_FILE_BYTES) {
            Ok(bytes) => bytes,
            Err(e) if !explicit && e.is_not_found() => return Ok(Self::default()),
            Err(e) => return Err(read_error(e)),
        };
        let text = String::from_utf8(bytes).map_err(|e| {
            read_error(std::io::Error::new(std::io::ErrorKind::InvalidData, e).into())
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string().trim_end().replace('\n', " "),
        })
    }
}

/// The default lease duration `L`.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(20);
/// The default acquisition timeout.
pub const DEFAULT_ACQUISITION_TIMEOUT: Duration = Duration::from_mins(2);
/// The default grace period of a stopping service.
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(5);
/// The default longest wait between restarts of a failing service (Kubernetes' cap).
pub const DEFAULT_RESTART_BACKOFF_MAX: Duration = Duration::from_mins(5);
/// A run at least this long is clean: the next failure waits [`RESTART_BACKOFF_INITIAL`]
/// again.
pub const RESTART_RESET_AFTER: Duration = Duration::from_mins(1);
/// The default memory cap per instance, MiB.
pub const DEFAULT_MEMORY_LIMIT_MIB: u64 = 64;
/// The default handle limit per instance.
pub const DEFAULT_HANDLE_LIMIT: u32 = 4096;
/// The default cluster size.
pub const DEFAULT_CLUSTER_SIZE: u32 = 1;
/// The default store: a redb file in the working directory.
pub const DEFAULT_STORE: &str = "vvm.redb";
/// The default services directory.
pub const DEFAULT_SERVICES_DIR: &str = "services";
/// The compile cache's directory inside the services directory, its default place.
pub const CACHE_DIR_NAME: &str = ".cache";

/// The default compile cache directory of the services in `services`.
pub fn default_cache_dir(services: &Path) -> PathBuf {
    services.join(CACHE_DIR_NAME)
}

/// The default crash lock directory of `store`: `<store>.holders` beside a redb file; none for
/// etcd, whose hosts may be on other machines (a lock only tells about this machine).
pub fn default_lock_dir(store: &str) -> Option<PathBuf> {
    (!store.starts_with("etcd://"))
        .then(|| crate::holder::crash_lock::HolderLockDir::beside(Path::new(store)))
}

/// `mib` MiB in bytes (saturating; [`MAX_MEMORY_LIMIT_MIB`] bounds the settings).
pub fn mib_to_bytes(mib: u64) -> u64 {
    mib.saturating_mul(1 << 20)
}

/// Settings after flags, environment, file and defaults are merged, and validated.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Store location: a redb file path, or `etcd://host:port[,host:port...]`.
    pub store: String,
    /// etcd options from flags and file.
    pub etcd: EtcdFileConfig,
    /// Cluster size N.
    pub cluster_size: u32,
    /// Services directory.
    pub services: PathBuf,
    /// Lease duration L.
    pub lease: Duration,
    /// Acquisition timeout.
    pub acquisition_timeout: Duration,
    /// Grace period for stopping services.
    pub grace_period: Duration,
    /// Memory cap per instance, bytes.
    pub memory_limit: u64,
    /// The most handles one instance may hold at once.
    pub handle_limit: u32,
    /// Compiled-component cache directory.
    pub cache_dir: PathBuf,
    /// Per-service grants, as the file wrote them (`RuntimeConfig` parses them).
    pub grants: BTreeMap<String, GrantConfig>,
    /// How registry sources are pulled (`insecure-registries`, `registry-ca-file`,
    /// `pull-timeout`).
    pub registry: crate::sources::RegistryOptions,
    /// Address of the operations endpoint, if it is on.
    pub metrics_addr: Option<SocketAddr>,
    /// Address HTTP services are served on while leading, if it is on.
    pub http_addr: Option<SocketAddr>,
    /// The address the group's other hosts reach this host's HTTP listener at: `advertise-addr`,
    /// or `http-addr` when concrete; `None`: this host is no forwarding target.
    pub advertise_addr: Option<SocketAddr>,
    /// Whether requests for services other hosts hold are forwarded to them.
    pub forward: bool,
    /// Directory of the crash locks, if there is one.
    pub lock_dir: Option<PathBuf>,
    /// How services are placed on the hosts.
    pub placement: Placement,
    /// The longest wait between restarts of a failing service (per service: its grant).
    pub restart_backoff_max: Duration,
    /// Whether a standby whose services differ from the leader's stays out of the campaign.
    pub require_same_services: bool,
    /// Key-value limits of every service (per service: its grant), from the file's `[kv]`.
    pub kv: KvLimitsConfig,
    /// Outgoing HTTP limits of every service (per service: its grant), from the file's
    /// `[outgoing-http]`.
    pub outgoing_http: OutgoingHttpConfig,
    /// Limits on the requests served to HTTP services, from the file's `[incoming-http]`.
    pub incoming_http: IncomingHttpConfig,
}

impl Settings {
    /// What the store needs of these settings ([`crate::store::open`]).
    pub fn store_settings(&self) -> crate::store::StoreSettings {
        let etcd = &self.etcd;
        let tls = (etcd.ca.is_some() || etcd.cert.is_some() || etcd.key.is_some()).then(|| {
            crate::store::EtcdTls {
                ca: etcd.ca.clone(),
                cert: etcd.cert.clone(),
                key: etcd.key.clone(),
            }
        });
        crate::store::StoreSettings {
            location: self.store.clone(),
            user: etcd.user.clone(),
            password: etcd.password.clone(),
            tls,
            prefix: etcd.prefix.clone(),
            // Lock waits bounded well inside the renewal's retries (SPEC §8).
            lock_patience: crate::lease::attempt_patience(self.lease)
                .clamp(Duration::from_millis(10), Duration::from_secs(2)),
        }
    }

    /// Merges `flags` (flags and environment; its `service` grants are ignored: grants are
    /// set in the file only) over the configuration file over the defaults, and validates the
    /// result. The file is `config_file`, which must exist, or else [`DEFAULT_CONFIG_FILE`]
    /// if it exists.
    ///
    /// # Errors
    /// When the file cannot be read or a value cannot work.
    pub fn resolve(flags: FileConfig, config_file: Option<&Path>) -> Result<Self, ConfigError> {
        let file = match config_file {
            Some(path) => FileConfig::load(path, true)?,
            None => FileConfig::load(DEFAULT_CONFIG_FILE.as_ref(), false)?,
        };
        let (http_addr, advertise_addr, forward) = front_door(&flags, &file);
        let etcd = flags
            .etcd
            .unwrap_or_default()
            .over(file.etcd.unwrap_or_default());
        let services = flags
            .services
            .or(file.services)
            .unwrap_or_else(|| DEFAULT_SERVICES_DIR.into());
        let memory_limit_mib = flags
            .memory_limit_mib
            .or(file.memory_limit_mib)
            .unwrap_or(DEFAULT_MEMORY_LIMIT_MIB);
        let store = flags
            .store
            .or(file.store)
            .unwrap_or_else(|| DEFAULT_STORE.into());
        check_store(&store)?;
        let settings = Self {
            lock_dir: flags
                .lock_dir
                .or(file.lock_dir)
                .or_else(|| default_lock_dir(&store)),
            store,
            etcd,
            cluster_size: flags
                .cluster_size
                .or(file.cluster_size)
                .unwrap_or(DEFAULT_CLUSTER_SIZE),
            lease: flags.lease.or(file.lease).unwrap_or(DEFAULT_LEASE),
            acquisition_timeout: flags
                .acquisition_timeout
                .or(file.acquisition_timeout)
                .unwrap_or(DEFAULT_ACQUISITION_TIMEOUT),
            grace_period: flags
                .grace_period
                .or(file.grace_period)
                .unwrap_or(DEFAULT_GRACE_PERIOD),
            memory_limit: mib_to_bytes(memory_limit_mib),
            handle_limit: flags
                .handle_limit
                .or(file.handle_limit)
                .unwrap_or(DEFAULT_HANDLE_LIMIT),
            cache_dir: flags
                .cache_dir
                .or(file.cache_dir)
                .unwrap_or_else(|| default_cache_dir(&services)),
            metrics_addr: flags.metrics_addr.or(file.metrics_addr),
            http_addr,
            advertise_addr,
            forward,
            placement: flags.placement.or(file.placement).unwrap_or_default(),
            restart_backoff_max: flags
                .restart_backoff_max
                .or(file.restart_backoff_max)
                .unwrap_or(DEFAULT_RESTART_BACKOFF_MAX),
            require_same_services: flags
                .require_same_services
                .or(file.require_same_services)
                .unwrap_or(false),
            services,
            kv: file.kv.unwrap_or_default(),
            outgoing_http: file.outgoing_http.unwrap_or_default(),
            incoming_http: flags
                .incoming_http
                .unwrap_or_default()
                .over(file.incoming_http.unwrap_or_default()),
            grants: file.service,
            registry: crate::sources::RegistryOptions {
                insecure: flags
                    .insecure_registries
                    .or(file.insecure_registries)
                    .unwrap_or_default(),
                ca_file: flags.registry_ca_file.or(file.registry_ca_file),
                timeout: flags
                    .pull_timeout
                    .or(file.pull_timeout)
                    .unwrap_or(crate::sources::DEFAULT_PULL_TIMEOUT),
                ..crate::sources::RegistryOptions::default()
            },
        };
        validate(&Bounded {
            cluster_size: settings.cluster_size,
            lease: settings.lease,
            acquisition_timeout: settings.acquisition_timeout,
            grace_period: settings.grace_period,
            memory_limit_mib,
            handle_limit: settings.handle_limit,
            restart_backoff_max: settings.restart_backoff_max,
        })?;
        check_kv_limits("kv", "", &settings.kv)?;
        check_outgoing_http("outgoing-http", "", &settings.outgoing_http)?;
        check_incoming_http(&settings.incoming_http)?;
        check_instance_reuse("incoming-http", "", settings.incoming_http.instance_reuse())?;
        check_services(&settings.grants)?;
        Ok(settings)
    }
}

/// `http-addr`, the address advertised to the group's other hosts, and whether requests for
/// their services are forwarded to them: `flags` over `file`.
fn front_door(
    flags: &FileConfig,
    file: &FileConfig,
) -> (Option<SocketAddr>, Option<SocketAddr>, bool) {
    let http_addr = flags.http_addr.or(file.http_addr);
    let advertise = advertised(flags.advertise_addr.or(file.advertise_addr), http_addr);
    let forward = (flags.forward.or(file.forward)).unwrap_or(advertise.is_some());
    (http_addr, advertise, forward)
}

#[cfg(test)]
mod tests;
