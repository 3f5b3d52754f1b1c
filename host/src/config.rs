//! Settings (SPEC §8): every default is a flag, an environment variable and a `vvm.toml` key.
//!
//! This module owns every default (`DEFAULT_*`), every bound (`MIN_*`, `MAX_*`) and the
//! resolution of [`Settings`]. Precedence: command-line flag, then environment variable (both
//! via clap, in `cli`, which hands them over as a [`FileConfig`] layer), then the
//! configuration file, then the built-in default.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::fs::{FileError, MAX_SETTINGS_FILE_BYTES, read_file};

/// The configuration file read when `--config` is not given and the file exists.
pub const DEFAULT_CONFIG_FILE: &str = "vvm.toml";

/// Why the settings are unusable. Each message names the setting or file and the reason.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The configuration file could not be read.
    #[error("config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: FileError,
    },
    /// The configuration file is not valid TOML or has an unknown key or a bad value.
    #[error("config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the parser said, with the line.
        message: String,
    },
    /// A setting has a value that cannot work.
    #[error("setting {name}: {reason}")]
    Invalid {
        /// The setting's key.
        name: &'static str,
        /// Why its value cannot work.
        reason: String,
    },
}

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
    /// Directory of the crash locks, shared by the hosts of one machine (see
    /// [`crate::holder::crash_lock`]). Default: `<store>.holders` beside a redb store; none for etcd,
    /// where it is worth setting when several hosts share a machine.
    pub lock_dir: Option<PathBuf>,
    /// How services are placed on the hosts: `together` (default) or `spread`.
    pub placement: Option<Placement>,
    /// The longest wait between restarts of a failing service, e.g. `"5m"`.
    #[serde(default, with = "opt_duration")]
    pub restart_backoff_max: Option<Duration>,
    /// etcd client options.
    pub etcd: Option<EtcdFileConfig>,
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

/// Parses a duration such as `20s`, `1500ms` or `2m`; zero and negative values are rejected.
///
/// # Errors
/// A message saying what is wrong with `text`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.starts_with('-') {
        return Err(format!("{text:?} is negative; durations must be positive"));
    }
    let d = humantime::parse_duration(text).map_err(|e| format!("{text:?}: {e}"))?;
    if d.is_zero() {
        return Err(format!("{text:?} is zero; durations must be positive"));
    }
    Ok(d)
}

/// Parses the operations endpoint's address, `IP:PORT` (port 0: any free port).
///
/// # Errors
/// A message naming the setting and what is wrong with `text`.
pub fn parse_metrics_addr(text: &str) -> Result<SocketAddr, String> {
    let text = text.trim();
    text.parse().map_err(|_| {
        format!("metrics-addr {text:?} is not an IP:PORT address such as 127.0.0.1:9464")
    })
}

mod opt_addr {
    use std::net::SocketAddr;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
        let text = String::deserialize(d)?;
        super::parse_metrics_addr(&text)
            .map(Some)
            .map_err(serde::de::Error::custom)
    }
}

mod opt_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let text = String::deserialize(d)?;
        super::parse_duration(&text)
            .map(Some)
            .map_err(serde::de::Error::custom)
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
/// The wait before a failed service's first restart; each failure in a row doubles it.
pub const RESTART_BACKOFF_INITIAL: Duration = Duration::from_millis(100);
/// A run at least this long is clean: the next failure waits [`RESTART_BACKOFF_INITIAL`]
/// again.
pub const RESTART_RESET_AFTER: Duration = Duration::from_mins(1);
/// The longest `restart-backoff-max`: a service is never left down for longer than this
/// between two tries.
pub const MAX_RESTART_BACKOFF_MAX: Duration = Duration::from_hours(1);
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

/// The shortest lease: renewal runs every `L/4` and retries `L/20` apart.
pub const MIN_LEASE: Duration = Duration::from_millis(100);
/// The longest lease: a crashed leader's slot stays taken this long. Past a day a lease only
/// hides a dead host; it also keeps every deadline far from any clock's limits.
pub const MAX_LEASE: Duration = Duration::from_hours(24);
/// The longest acquisition timeout: 30 days (the shortest is [`MIN_LEASE`]).
pub const MAX_ACQUISITION_TIMEOUT: Duration = Duration::from_hours(720);
/// The longest grace period: the lease's record and the killer wait for it on shutdown.
pub const MAX_GRACE_PERIOD: Duration = Duration::from_hours(1);
/// The largest memory cap per instance: all a 32-bit Wasm memory can address.
pub const MAX_MEMORY_LIMIT_MIB: u64 = 4096;
/// The smallest handle limit: a guest needs a few handles for its output and its waits.
pub const MIN_HANDLE_LIMIT: u32 = 16;
/// The largest handle limit: wasmtime's own bound on the handles a store's guest holds.
pub const MAX_HANDLE_LIMIT: u32 = 100_000;
/// The largest cluster size: every standby tries every slot each round.
pub const MAX_CLUSTER_SIZE: u32 = 1024;
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
    /// Address of the operations endpoint, if it is on.
    pub metrics_addr: Option<SocketAddr>,
    /// Directory of the crash locks, if there is one.
    pub lock_dir: Option<PathBuf>,
    /// How services are placed on the hosts.
    pub placement: Placement,
    /// The longest wait between restarts of a failing service (per service: its grant).
    pub restart_backoff_max: Duration,
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
        let etcd_flags = flags.etcd.unwrap_or_default();
        let etcd_file = file.etcd.unwrap_or_default();
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
        if store.trim().is_empty() {
            return Err(ConfigError::Invalid {
                name: "store",
                reason: "is empty: give a redb file path or etcd://host:port".to_owned(),
            });
        }
        let settings = Self {
            lock_dir: flags
                .lock_dir
                .or(file.lock_dir)
                .or_else(|| default_lock_dir(&store)),
            store,
            etcd: EtcdFileConfig {
                user: etcd_flags.user.or(etcd_file.user),
                password: etcd_flags.password.or(etcd_file.password),
                ca: etcd_flags.ca.or(etcd_file.ca),
                cert: etcd_flags.cert.or(etcd_file.cert),
                key: etcd_flags.key.or(etcd_file.key),
                prefix: etcd_flags.prefix.or(etcd_file.prefix),
            },
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
            placement: flags.placement.or(file.placement).unwrap_or_default(),
            restart_backoff_max: flags
                .restart_backoff_max
                .or(file.restart_backoff_max)
                .unwrap_or(DEFAULT_RESTART_BACKOFF_MAX),
            services,
            grants: file.service,
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
        for (name, grant) in &settings.grants {
            if let Some(max) = grant.restart_backoff_max {
                check_restart_backoff_max(max).map_err(|reason| ConfigError::Invalid {
                    name: "service.*.restart-backoff-max",
                    reason: format!("service {name}: {reason}"),
                })?;
            }
        }
        Ok(settings)
    }
}

/// The values [`validate`] bounds.
#[derive(Clone, Copy, Debug)]
pub struct Bounded {
    /// Cluster size N.
    pub cluster_size: u32,
    /// Lease duration L.
    pub lease: Duration,
    /// Acquisition timeout.
    pub acquisition_timeout: Duration,
    /// Grace period.
    pub grace_period: Duration,
    /// Memory cap per instance, MiB.
    pub memory_limit_mib: u64,
    /// Handle limit per instance.
    pub handle_limit: u32,
    /// The longest wait between restarts.
    pub restart_backoff_max: Duration,
}

/// Checks every bounded setting and the relations between settings that each parse fine
/// alone.
///
/// # Errors
/// Naming the setting and the bound it breaks.
pub fn validate(v: &Bounded) -> Result<(), ConfigError> {
    let invalid = |name: &'static str, reason: String| Err(ConfigError::Invalid { name, reason });
    if v.cluster_size == 0 || v.cluster_size > MAX_CLUSTER_SIZE {
        return invalid(
            "cluster-size",
            format!("{} is out of range 1..={MAX_CLUSTER_SIZE}", v.cluster_size),
        );
    }
    let durations = [
        ("lease", v.lease, MIN_LEASE, MAX_LEASE),
        (
            "acquisition-timeout",
            v.acquisition_timeout,
            MIN_LEASE,
            MAX_ACQUISITION_TIMEOUT,
        ),
        (
            "grace-period",
            v.grace_period,
            Duration::ZERO,
            MAX_GRACE_PERIOD,
        ),
    ];
    for (name, value, min, max) in durations {
        if value < min {
            return invalid(
                name,
                format!("{} is too short; at least {}", show(value), show(min)),
            );
        }
        if value > max {
            return invalid(
                name,
                format!("{} is too long; at most {}", show(value), show(max)),
            );
        }
    }
    check_restart_backoff_max(v.restart_backoff_max)
        .or_else(|reason| invalid("restart-backoff-max", reason))?;
    if v.memory_limit_mib == 0 || v.memory_limit_mib > MAX_MEMORY_LIMIT_MIB {
        return invalid(
            "memory-limit-mib",
            format!(
                "{} is out of range 1..={MAX_MEMORY_LIMIT_MIB}",
                v.memory_limit_mib
            ),
        );
    }
    if !(MIN_HANDLE_LIMIT..=MAX_HANDLE_LIMIT).contains(&v.handle_limit) {
        return invalid(
            "handle-limit",
            format!(
                "{} is out of range {MIN_HANDLE_LIMIT}..={MAX_HANDLE_LIMIT}",
                v.handle_limit
            ),
        );
    }
    Ok(())
}

/// Whether `max` can be a restart backoff's cap: no shorter than the first wait, no longer
/// than [`MAX_RESTART_BACKOFF_MAX`].
fn check_restart_backoff_max(max: Duration) -> Result<(), String> {
    if max < RESTART_BACKOFF_INITIAL {
        return Err(format!(
            "{} is too short; at least {} (the first restart's wait)",
            show(max),
            show(RESTART_BACKOFF_INITIAL)
        ));
    }
    if max > MAX_RESTART_BACKOFF_MAX {
        return Err(format!(
            "{} is too long; at most {}",
            show(max),
            show(MAX_RESTART_BACKOFF_MAX)
        ));
    }
    Ok(())
}

fn show(d: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<FileConfig, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vvm.toml");
        std::fs::write(&path, text).unwrap();
        FileConfig::load(&path, true)
    }

    #[test]
    fn the_crash_lock_directory_is_beside_a_redb_store_and_off_for_etcd_unless_set() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("vvm.toml");
        std::fs::write(&file, "").unwrap();
        let resolve = |store: &str, lock_dir: Option<&str>| {
            let flags = FileConfig {
                store: Some(store.into()),
                lock_dir: lock_dir.map(PathBuf::from),
                ..FileConfig::default()
            };
            Settings::resolve(flags, Some(&file)).unwrap().lock_dir
        };
        assert_eq!(
            resolve("/srv/vvm.redb", None),
            Some(PathBuf::from("/srv/vvm.redb.holders"))
        );
        assert_eq!(resolve("etcd://127.0.0.1:2379", None), None);
        assert_eq!(
            resolve("etcd://127.0.0.1:2379", Some("/run/vvm")),
            Some(PathBuf::from("/run/vvm"))
        );
        std::fs::write(&file, "lock-dir = \"/run/vvm-file\"\n").unwrap();
        assert_eq!(
            resolve("etcd://127.0.0.1:2379", None),
            Some(PathBuf::from("/run/vvm-file"))
        );
    }

    #[test]
    fn full_file_parses() {
        let cfg = parse(
            r#"
services = "svc"
store = "etcd://127.0.0.1:2379"
cluster-size = 3
lease = "2s"
acquisition-timeout = "1m"
grace-period = "500ms"
memory-limit-mib = 32
metrics-addr = "127.0.0.1:9464"
[service.ticker]
env = ["A=1"]
"#,
        )
        .unwrap();
        assert_eq!(cfg.cluster_size, Some(3));
        assert_eq!(cfg.lease, Some(Duration::from_secs(2)));
        assert_eq!(cfg.acquisition_timeout, Some(Duration::from_mins(1)));
        assert_eq!(cfg.grace_period, Some(Duration::from_millis(500)));
        assert_eq!(cfg.service["ticker"].env, ["A=1"]);
        assert_eq!(cfg.metrics_addr, Some(([127, 0, 0, 1], 9464).into()));
        let err = parse("metrics-addr = \"localhost\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("metrics-addr \"localhost\" is not"), "{err}");
    }

    #[test]
    fn unknown_key_is_named() {
        let err = parse("leese = \"2s\"").unwrap_err().to_string();
        assert!(err.contains("unknown field `leese`"), "{err}");
        assert!(err.contains("vvm.toml"), "{err}");
    }

    #[test]
    fn negative_and_zero_durations_are_rejected() {
        let err = parse("lease = \"-5s\"").unwrap_err().to_string();
        assert!(err.contains("negative"), "{err}");
        assert!(parse_duration("0s").unwrap_err().contains("zero"));
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn missing_default_file_is_empty_but_missing_explicit_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent.toml");
        assert!(FileConfig::load(&path, false).unwrap().store.is_none());
        let err = FileConfig::load(&path, true).unwrap_err().to_string();
        assert!(err.contains("absent.toml"), "{err}");
    }

    #[test]
    fn placement_names_parse_from_the_file() {
        #[derive(serde::Deserialize)]
        struct File {
            placement: Placement,
        }
        let f: File = toml::from_str("placement = \"spread\"").unwrap();
        assert_eq!(f.placement, Placement::Spread);
        assert!(toml::from_str::<File>("placement = \"apart\"").is_err());
        assert_eq!(Placement::default().to_string(), "together");
    }

    fn bounded(lease: Duration) -> Bounded {
        Bounded {
            cluster_size: 1,
            lease,
            acquisition_timeout: DEFAULT_ACQUISITION_TIMEOUT,
            grace_period: DEFAULT_GRACE_PERIOD,
            memory_limit_mib: DEFAULT_MEMORY_LIMIT_MIB,
            handle_limit: DEFAULT_HANDLE_LIMIT,
            restart_backoff_max: DEFAULT_RESTART_BACKOFF_MAX,
        }
    }

    #[test]
    fn relations_and_bounds_are_checked() {
        let ok = bounded(DEFAULT_LEASE);
        assert!(validate(&ok).is_ok());
        assert!(validate(&bounded(Duration::from_millis(10))).is_err());
        let cases = [
            (
                "cluster-size",
                Bounded {
                    cluster_size: 0,
                    ..ok
                },
            ),
            (
                "cluster-size",
                Bounded {
                    cluster_size: MAX_CLUSTER_SIZE + 1,
                    ..ok
                },
            ),
            ("lease", bounded(MAX_LEASE + Duration::from_secs(1))),
            (
                "acquisition-timeout",
                Bounded {
                    acquisition_timeout: Duration::MAX,
                    ..ok
                },
            ),
            (
                "grace-period",
                Bounded {
                    grace_period: Duration::MAX,
                    ..ok
                },
            ),
            (
                "memory-limit-mib",
                Bounded {
                    memory_limit_mib: 0,
                    ..ok
                },
            ),
            (
                "memory-limit-mib",
                Bounded {
                    memory_limit_mib: u64::MAX,
                    ..ok
                },
            ),
            (
                "handle-limit",
                Bounded {
                    handle_limit: MIN_HANDLE_LIMIT - 1,
                    ..ok
                },
            ),
            (
                "handle-limit",
                Bounded {
                    handle_limit: MAX_HANDLE_LIMIT + 1,
                    ..ok
                },
            ),
            (
                "restart-backoff-max",
                Bounded {
                    restart_backoff_max: Duration::from_millis(99),
                    ..ok
                },
            ),
            (
                "restart-backoff-max",
                Bounded {
                    restart_backoff_max: Duration::MAX,
                    ..ok
                },
            ),
        ];
        for (name, v) in cases {
            let err = validate(&v).unwrap_err().to_string();
            assert!(err.contains(name), "{v:?}: {err}");
        }
    }
}
