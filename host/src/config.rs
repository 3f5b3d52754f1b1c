//! Settings (SPEC §8): every default is a flag, an environment variable and a `vvm.toml` key.
//!
//! Precedence: command-line flag, then environment variable (both via clap), then the
//! configuration file, then the built-in default.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

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
        source: std::io::Error,
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

/// The `vvm.toml` file: every key optional; unknown keys are an error.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    /// Directory of `*.wasm` services.
    pub services: Option<PathBuf>,
    /// Store: a redb file path, or `etcd://host:port[,host:port...]`.
    pub store: Option<String>,
    /// Cluster size N (slots 1..=N).
    pub cluster_size: Option<u32>,
    /// Lease duration L, e.g. `"20s"`.
    #[serde(default, with = "opt_duration")]
    pub lease: Option<Duration>,
    /// How long to campaign before giving up, e.g. `"120s"`.
    #[serde(default, with = "opt_duration")]
    pub acquisition_timeout: Option<Duration>,
    /// How long a stopping service may take before its instance is dropped, e.g. `"5s"`.
    #[serde(default, with = "opt_duration")]
    pub grace_period: Option<Duration>,
    /// Memory cap per service instance, in MiB.
    pub memory_limit_mib: Option<u64>,
    /// Directory of the compiled-component cache.
    pub cache_dir: Option<PathBuf>,
    /// etcd client options.
    pub etcd: Option<EtcdFileConfig>,
    /// Per-service grants, keyed by service name (the `.wasm` file stem).
    #[serde(default)]
    pub service: BTreeMap<String, GrantConfig>,
}

/// `[etcd]`: credentials and TLS for the etcd store.
#[derive(Clone, Debug, Default, Deserialize)]
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
}

impl FileConfig {
    /// Reads `path`; with `explicit == false` a missing file is an empty configuration.
    ///
    /// # Errors
    /// When the file cannot be read or parsed.
    pub fn load(path: &Path, explicit: bool) -> Result<Self, ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if !explicit && e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Self::default());
            }
            Err(source) => {
                return Err(ConfigError::Read {
                    path: path.to_owned(),
                    source,
                });
            }
        };
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

/// Checks the relations between settings that each parse fine alone.
///
/// # Errors
/// When the cluster size is zero or the lease is too short to renew.
pub fn validate(cluster_size: u32, lease: Duration) -> Result<(), ConfigError> {
    if cluster_size == 0 {
        return Err(ConfigError::Invalid {
            name: "cluster-size",
            reason: "must be at least 1".into(),
        });
    }
    if lease < Duration::from_millis(100) {
        return Err(ConfigError::Invalid {
            name: "lease",
            reason: format!("{lease:?} is too short; at least 100ms"),
        });
    }
    Ok(())
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
[service.ticker]
env = ["A=1"]
"#,
        )
        .unwrap();
        assert_eq!(cfg.cluster_size, Some(3));
        assert_eq!(cfg.lease, Some(Duration::from_secs(2)));
        assert_eq!(cfg.acquisition_timeout, Some(Duration::from_secs(60)));
        assert_eq!(cfg.grace_period, Some(Duration::from_millis(500)));
        assert_eq!(cfg.service["ticker"].env, ["A=1"]);
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
    fn relations_are_checked() {
        assert!(validate(0, Duration::from_secs(20)).is_err());
        assert!(validate(1, Duration::from_millis(10)).is_err());
        assert!(validate(1, Duration::from_secs(20)).is_ok());
    }
}
