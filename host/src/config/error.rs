//! Why settings are unusable ([`ConfigError`]): each message names the setting or file and the
//! reason.

use std::path::PathBuf;

use crate::fs::FileError;

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
