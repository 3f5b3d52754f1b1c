//! The command line (SPEC §8): `vvm-host serve`, `status` and `check`: the clap types and
//! the dispatch. Settings are resolved by [`crate::config`], the store opened by
//! [`crate::store::open`].

mod serve;
mod status;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{self, ConfigError, EtcdFileConfig, FileConfig, Settings};

/// Exit code for bad settings or a store that cannot be opened.
pub const EXIT_SETUP: u8 = 1;
/// Exit code when a second signal interrupts the shutdown sequence.
pub const EXIT_INTERRUPTED: u8 = 130;

/// Leader-elected WebAssembly service host.
#[derive(Debug, Parser)]
#[command(name = "vvm-host", version, about)]
pub struct Cli {
    /// Log line format.
    #[arg(long, global = true, env = "VVM_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Log line formats; `RUST_LOG` sets the filter (default `info`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the services directory while holding a slot; stand by otherwise.
    Serve(ServeArgs),
    /// Show who holds each slot, with term and time left.
    Status(StoreArgs),
    /// Validate every component in a directory without serving; non-zero exit if any is bad.
    Check {
        /// The directory to check (default: the configured services directory).
        dir: Option<PathBuf>,
        /// Settings.
        #[command(flatten)]
        settings: StoreArgs,
    },
}

/// Where the store is and how big the cluster is: shared by every subcommand.
#[derive(Debug, Args)]
pub struct StoreArgs {
    /// Configuration file [default: [`config::DEFAULT_CONFIG_FILE`] if it exists].
    #[arg(long, env = "VVM_CONFIG",
        help = format!("Configuration file [default: ./{} if it exists]", config::DEFAULT_CONFIG_FILE))]
    pub config: Option<PathBuf>,
    /// Store: a redb file, or etcd://host:port[,host:port...] [default:
    /// [`config::DEFAULT_STORE`]].
    #[arg(long, env = "VVM_STORE",
        help = format!("Store: a redb file, or etcd://host:port[,host:port...] [default: ./{}]", config::DEFAULT_STORE))]
    pub store: Option<String>,
    /// Cluster size N: at most N hosts serve at once, on slots 1..=N [default:
    /// [`config::DEFAULT_CLUSTER_SIZE`]].
    #[arg(long, env = "VVM_CLUSTER_SIZE",
        help = format!("Cluster size N: at most N hosts serve at once, on slots 1..=N [default: {}]", config::DEFAULT_CLUSTER_SIZE))]
    pub cluster_size: Option<u32>,
    /// Directory of *.wasm services [default: [`config::DEFAULT_SERVICES_DIR`]].
    #[arg(long, env = "VVM_SERVICES",
        help = format!("Directory of *.wasm services [default: ./{}]", config::DEFAULT_SERVICES_DIR))]
    pub services: Option<PathBuf>,
    /// etcd user name.
    #[arg(long, env = "VVM_ETCD_USER")]
    pub etcd_user: Option<String>,
    /// etcd password.
    #[arg(long, env = "VVM_ETCD_PASSWORD", hide_env_values = true)]
    pub etcd_password: Option<String>,
    /// CA certificate (PEM) for TLS to etcd.
    #[arg(long, env = "VVM_ETCD_CA")]
    pub etcd_ca: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS to etcd.
    #[arg(long, env = "VVM_ETCD_CERT")]
    pub etcd_cert: Option<PathBuf>,
    /// Client key (PEM) for mutual TLS to etcd.
    #[arg(long, env = "VVM_ETCD_KEY")]
    pub etcd_key: Option<PathBuf>,
}

/// `serve` settings beyond the store.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Store and cluster.
    #[command(flatten)]
    pub store: StoreArgs,
    /// Lease duration L [default: [`config::DEFAULT_LEASE`]].
    #[arg(long, env = "VVM_LEASE", value_parser = config::parse_duration, allow_hyphen_values = true,
        help = format!("Lease duration L [default: {}]", show(config::DEFAULT_LEASE)))]
    pub lease: Option<Duration>,
    /// How long to campaign before reporting a problem and starting over [default:
    /// [`config::DEFAULT_ACQUISITION_TIMEOUT`]].
    #[arg(long, env = "VVM_ACQUISITION_TIMEOUT", value_parser = config::parse_duration, allow_hyphen_values = true,
        help = format!("How long to campaign before reporting a problem and starting over [default: {}]", show(config::DEFAULT_ACQUISITION_TIMEOUT)))]
    pub acquisition_timeout: Option<Duration>,
    /// How long a stopping service may take before its instance is dropped [default:
    /// [`config::DEFAULT_GRACE_PERIOD`]].
    #[arg(long, env = "VVM_GRACE_PERIOD", value_parser = config::parse_duration, allow_hyphen_values = true,
        help = format!("How long a stopping service may take before its instance is dropped [default: {}]", show(config::DEFAULT_GRACE_PERIOD)))]
    pub grace_period: Option<Duration>,
    /// Memory cap per service instance, MiB [default: [`config::DEFAULT_MEMORY_LIMIT_MIB`]].
    #[arg(long, env = "VVM_MEMORY_LIMIT_MIB",
        help = format!("Memory cap per service instance, MiB [default: {}]", config::DEFAULT_MEMORY_LIMIT_MIB))]
    pub memory_limit_mib: Option<u64>,
    /// Directory of the compiled-component cache [default: [`config::default_cache_dir`]].
    #[arg(long, env = "VVM_CACHE_DIR",
        help = format!("Directory of the compiled-component cache [default: <services>/{}]", config::CACHE_DIR_NAME))]
    pub cache_dir: Option<PathBuf>,
}

impl StoreArgs {
    /// The flags and environment as a settings layer over the configuration file.
    fn layer(&self) -> FileConfig {
        FileConfig {
            services: self.services.clone(),
            store: self.store.clone(),
            cluster_size: self.cluster_size,
            etcd: Some(EtcdFileConfig {
                user: self.etcd_user.clone(),
                password: self.etcd_password.clone(),
                ca: self.etcd_ca.clone(),
                cert: self.etcd_cert.clone(),
                key: self.etcd_key.clone(),
                prefix: None,
            }),
            ..FileConfig::default()
        }
    }

    /// The settings of a command that does not serve: these flags over the file.
    ///
    /// # Errors
    /// As [`Settings::resolve`].
    pub fn settings(&self) -> Result<Settings, ConfigError> {
        Settings::resolve(self.layer(), self.config.as_deref())
    }
}

impl ServeArgs {
    /// The settings of `serve`: its flags and the store's over the file.
    ///
    /// # Errors
    /// As [`Settings::resolve`].
    pub fn settings(&self) -> Result<Settings, ConfigError> {
        let flags = FileConfig {
            lease: self.lease,
            acquisition_timeout: self.acquisition_timeout,
            grace_period: self.grace_period,
            memory_limit_mib: self.memory_limit_mib,
            cache_dir: self.cache_dir.clone(),
            ..self.store.layer()
        };
        Settings::resolve(flags, self.store.config.as_deref())
    }
}

/// A default duration as the help text shows it: whole seconds as `120s`.
fn show(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        humantime::format_duration(d).to_string()
    }
}

/// Sets up logging to stderr: `RUST_LOG` filter (default `info`), text or JSON lines.
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Runs the parsed command line and returns the process exit code.
pub async fn run(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Serve(args) => serve::serve(&args).await,
        Command::Status(args) => status::status(&args).await,
        Command::Check { dir, settings } => status::check(dir, &settings).await,
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            // One clear line, then a non-zero exit.
            eprintln!("vvm-host: error: {e:#}");
            ExitCode::from(EXIT_SETUP)
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Duration texts a user might type, from sensible to absurd.
    fn duration_text() -> impl Strategy<Value = String> {
        let unit = prop::sample::select(vec!["ns", "ms", "s", "m", "h", "d", "w", "y", ""]);
        prop_oneof![
            (any::<u64>(), unit.clone()).prop_map(|(n, u)| format!("{n}{u}")),
            (0u64..100_000, unit).prop_map(|(n, u)| format!("{n}{u}")),
            "[-0-9a-z. ]{0,12}",
        ]
    }

    /// Resolves settings from `vvm.toml` text and then from flags; returns both outcomes.
    fn resolve_both(file: &str, flags: &[&str]) -> [Result<Settings, String>; 2] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vvm.toml");
        std::fs::write(&path, file).unwrap();
        let from_file = {
            let args = ["vvm-host", "serve", "--config", path.to_str().unwrap()];
            let Command::Serve(serve) = Cli::try_parse_from(args).unwrap().command else {
                unreachable!()
            };
            serve.settings().map_err(|e| e.to_string())
        };
        let from_flags = {
            let none = dir.path().join("empty.toml");
            std::fs::write(&none, "").unwrap();
            let mut args = vec!["vvm-host", "serve", "--config", none.to_str().unwrap()];
            args.extend_from_slice(flags);
            match Cli::try_parse_from(args) {
                Ok(Cli {
                    command: Command::Serve(serve),
                    ..
                }) => serve.settings().map_err(|e| e.to_string()),
                Ok(_) => unreachable!(),
                Err(e) => Err(e.to_string()),
            }
        };
        [from_file, from_flags]
    }

    fn within_bounds(s: &Settings) -> bool {
        (1..=config::MAX_CLUSTER_SIZE).contains(&s.cluster_size)
            && (config::MIN_LEASE..=config::MAX_LEASE).contains(&s.lease)
            && s.acquisition_timeout <= config::MAX_ACQUISITION_TIMEOUT
            && s.grace_period <= config::MAX_GRACE_PERIOD
            && (1..=config::mib_to_bytes(config::MAX_MEMORY_LIMIT_MIB)).contains(&s.memory_limit)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// SPEC §8: no setting can make the host panic or hang. Whatever a flag or the file
        /// says, resolving either refuses it with a message naming the setting, or gives
        /// values within every bound. (The environment goes through the same parsers as the
        /// flags, by clap; it is process-wide, so not varied in parallel tests.)
        #[test]
        fn any_setting_is_refused_by_name_or_within_bounds(
            lease in duration_text(),
            acquisition in duration_text(),
            grace in duration_text(),
            cluster in any::<u32>(),
            memory in any::<u64>(),
        ) {
            let file = format!(
                "lease = \"{lease}\"\nacquisition-timeout = \"{acquisition}\"\n\
                 grace-period = \"{grace}\"\ncluster-size = {cluster}\n\
                 memory-limit-mib = {memory}\n"
            );
            let (cluster, memory) = (cluster.to_string(), memory.to_string());
            let flags = [
                "--lease", &lease, "--acquisition-timeout", &acquisition,
                "--grace-period", &grace, "--cluster-size", &cluster,
                "--memory-limit-mib", &memory,
            ];
            for outcome in resolve_both(&file, &flags) {
                match outcome {
                    Ok(settings) => prop_assert!(within_bounds(&settings), "{settings:?}"),
                    Err(message) => prop_assert!(
                        ["lease", "acquisition", "grace", "cluster", "memory", "duration"]
                            .iter()
                            .any(|name| message.contains(name)),
                        "{message}"
                    ),
                }
            }
        }
    }
}
