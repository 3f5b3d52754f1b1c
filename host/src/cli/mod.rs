//! The command line (SPEC §8): `vvm-host serve`, `status`, `kv`, `check` and `new`: the clap
//! types and the dispatch. Settings are resolved by [`crate::config`], the store opened by
//! [`crate::store::open`].

mod config_watch;
mod kv;
mod new;
mod push;
mod serve;
mod status;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{self, ConfigError, EtcdFileConfig, FileConfig, IncomingHttpConfig, Settings};
use crate::log_output::{Stderr, one_line};
pub use kv::KvCommand;
pub use new::{Kind, Lang, NewArgs, NewError};

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
// Parsed once per process: the size of `serve`'s flags costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// Serve the services directory while holding a slot; stand by otherwise.
    #[command(after_help = SERVE_EXAMPLES)]
    Serve(ServeArgs),
    /// Show who holds each slot, with term and time left.
    #[command(after_help = STATUS_EXAMPLES)]
    Status {
        /// Print one JSON object instead of a table, for scripts.
        #[arg(long)]
        json: bool,
        /// Also show log lines (on stderr); without it only the result is printed.
        #[arg(short, long)]
        verbose: bool,
        /// Settings.
        #[command(flatten)]
        settings: StoreArgs,
    },
    /// Look at the guests' key-value data, without writing.
    #[command(subcommand, after_help = KV_EXAMPLES)]
    Kv(KvCommand),
    /// Validate every component in a directory without serving; non-zero exit if any is bad.
    #[command(after_help = CHECK_EXAMPLES)]
    Check {
        /// The directory to check, or one `.wasm` file (default: the configured services
        /// directory).
        path: Option<PathBuf>,
        /// Also show log lines (on stderr); without it only the result is printed.
        #[arg(short, long)]
        verbose: bool,
        /// Settings.
        #[command(flatten)]
        settings: StoreArgs,
    },
    /// Make a guest project (Rust, Python or JavaScript; a service or an HTTP service) ready to
    /// build with its ./build.sh.
    #[command(after_help = new::EXAMPLES)]
    New(NewArgs),
    /// Push a component to an OCI registry (the CNCF Wasm layout) and print the reference
    /// pinned to its digest, for `[service.NAME] source`.
    #[command(after_help = PUSH_EXAMPLES)]
    Push {
        /// The component file.
        file: PathBuf,
        /// Where to push it: `oci://REGISTRY/REPOSITORY:TAG`.
        reference: String,
        /// Also show log lines (on stderr).
        #[arg(short, long)]
        verbose: bool,
        /// Settings (`insecure-registries`, `registry-ca-file`, `pull-timeout`).
        #[command(flatten)]
        settings: StoreArgs,
    },
}

const PUSH_EXAMPLES: &str = "\
Examples:
  vvm-host push hello.wasm oci://ghcr.io/acme/hello:v1
  # prints oci://ghcr.io/acme/hello:v1@sha256:...; pin it in vvm.toml:
  #   [service.hello]
  #   source = \"oci://ghcr.io/acme/hello@sha256:...\"
  vvm-host push hello.wasm oci://127.0.0.1:5000/hello:v1 --insecure-registries 127.0.0.1:5000";

const SERVE_EXAMPLES: &str = "\
Examples:
  # Serve ./services from ./vvm.redb, cluster size 1
  vvm-host serve

  # Start a standby: the same command beside the leader, on the same store file; it takes
  # over when the leader stops or its lease expires
  vvm-host serve --store /srv/vvm/vvm.redb --services /srv/vvm/services

  # Point two hosts at etcd: run this on each machine
  vvm-host serve --store etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379

  # Grant the service ticker.wasm a directory (read-write; add :ro for read-only), in vvm.toml:
  #   [service.ticker]
  #   dirs = [\"/var/lib/ticker:/data\"]
  vvm-host serve --config vvm.toml

  # Serve /healthz, /leader (200 only on a leader) and Prometheus /metrics
  vvm-host serve --metrics-addr 127.0.0.1:9464

  # Serve HTTP components (wasi:http/proxy) while leading; hello.wasm answers /hello/...
  vvm-host serve --http-addr 0.0.0.0:8080";

const STATUS_EXAMPLES: &str = "\
Examples:
  vvm-host status
  vvm-host status --store etcd://10.0.0.1:2379 --cluster-size 2
  vvm-host status --json | jq -r '.slots[0].holder'";

const KV_EXAMPLES: &str = "\
Examples:
  vvm-host kv list ticker
  vvm-host kv list ticker --prefix seen/ --json | jq '.usage'
  vvm-host kv list orders --bucket
  vvm-host kv get ticker last-run";

const CHECK_EXAMPLES: &str = "\
Examples:
  # The configured services directory
  vvm-host check
  # Another directory, with the log lines
  vvm-host check ./new-services -v";

impl Command {
    /// Whether log lines are shown: always for `serve`; for the tools only with `-v`, so
    /// that they print their result and nothing else.
    pub fn logs(&self) -> bool {
        match self {
            Self::Serve(_) => true,
            Self::Status { verbose, .. }
            | Self::Check { verbose, .. }
            | Self::Push { verbose, .. } => *verbose,
            Self::Kv(_) | Self::New(_) => false,
        }
    }
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
    /// Registries (host:port, comma-separated) reached over plain HTTP; every other one over
    /// HTTPS [default: none].
    #[arg(
        long,
        env = "VVM_INSECURE_REGISTRIES",
        value_delimiter = ',',
        value_name = "HOST:PORT"
    )]
    pub insecure_registries: Option<Vec<String>>,
    /// A PEM file of CA certificates trusted beside the system's for registries.
    #[arg(long, env = "VVM_REGISTRY_CA_FILE", value_name = "FILE")]
    pub registry_ca_file: Option<PathBuf>,
    /// The longest pull of one registry source, retries included [default:
    /// [`crate::sources::DEFAULT_PULL_TIMEOUT`]].
    #[arg(long, env = "VVM_PULL_TIMEOUT", value_parser = config::parse_duration, allow_hyphen_values = true,
        help = format!("The longest pull of one registry source, retries included [default: {}]", show(crate::sources::DEFAULT_PULL_TIMEOUT)))]
    pub pull_timeout: Option<Duration>,
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
    /// The most handles (open files, sockets, streams, timers) one service instance may hold
    /// at once [default: [`config::DEFAULT_HANDLE_LIMIT`]].
    #[arg(long, env = "VVM_HANDLE_LIMIT",
        help = format!("The most handles (open files, sockets, streams, timers) one service instance may hold at once [default: {}]", config::DEFAULT_HANDLE_LIMIT))]
    pub handle_limit: Option<u32>,
    /// Directory of the compiled-component cache [default: [`config::default_cache_dir`]].
    #[arg(long, env = "VVM_CACHE_DIR",
        help = format!("Directory of the compiled-component cache [default: <services>/{}]", config::CACHE_DIR_NAME))]
    pub cache_dir: Option<PathBuf>,
    /// Serve /healthz, /leader and Prometheus /metrics on this address, e.g. 127.0.0.1:9464
    /// [default: off].
    #[arg(long, env = "VVM_METRICS_ADDR", value_name = "ADDR", value_parser = config::parse_metrics_addr)]
    pub metrics_addr: Option<SocketAddr>,
    /// Serve the HTTP services (components exporting wasi:http/incoming-handler) on this
    /// address while this host leads, e.g. 0.0.0.0:8080; a standby does not listen [default:
    /// off].
    #[arg(long, env = "VVM_HTTP_ADDR", value_name = "ADDR", value_parser = config::parse_http_addr)]
    pub http_addr: Option<SocketAddr>,
    /// The address the group's other hosts reach this host's HTTP listener at, for
    /// forwarding, e.g. 10.0.0.7:8080 [default: http-addr when it is a concrete address].
    #[arg(long, env = "VVM_ADVERTISE_ADDR", value_name = "ADDR", value_parser = config::parse_advertise_addr)]
    pub advertise_addr: Option<SocketAddr>,
    /// Forward a request for a service another host of the group holds to that host, one hop
    /// [default: true when this host has an advertise address].
    #[arg(long, env = "VVM_FORWARD", value_name = "BOOL", num_args = 0..=1,
        default_missing_value = "true", action = clap::ArgAction::Set)]
    pub forward: Option<bool>,
    /// Directory of the crash locks, shared by the hosts of one machine: a standby there takes
    /// over from a killed leader at once [default: <store>.holders for redb; none for etcd].
    #[arg(long, env = "VVM_LOCK_DIR", value_name = "DIR")]
    pub lock_dir: Option<PathBuf>,
    /// How services are placed: `together` (a leader on a slot runs every service) or
    /// `spread` (each service is claimed on its own; the hosts share them out) [default:
    /// together].
    #[arg(long, env = "VVM_PLACEMENT", value_enum)]
    pub placement: Option<crate::config::Placement>,
    /// The longest wait between restarts of a failing service; each failure in a row doubles
    /// the wait from 100 ms up to this [default: [`config::DEFAULT_RESTART_BACKOFF_MAX`]].
    #[arg(long, env = "VVM_RESTART_BACKOFF_MAX", value_parser = config::parse_duration, allow_hyphen_values = true,
        help = format!("The longest wait between restarts of a failing service; each failure in a row doubles the wait from 100ms up to this [default: {}]", show(config::DEFAULT_RESTART_BACKOFF_MAX)))]
    pub restart_backoff_max: Option<Duration>,
    /// A standby whose services (their versions) differ from the leader's does not campaign,
    /// and its /healthz is 503, until they are the same [default: false].
    #[arg(long, env = "VVM_REQUIRE_SAME_SERVICES", value_name = "BOOL", num_args = 0..=1,
        default_missing_value = "true", action = clap::ArgAction::Set)]
    pub require_same_services: Option<bool>,
    /// The most connections open on http-addr at once; at the cap the one that has waited
    /// longest for a request head is closed for a new one [default: half the open file limit
    /// the host does not keep, at most 10000].
    #[arg(long, env = "VVM_MAX_CONNECTIONS", value_name = "N")]
    pub max_connections: Option<u32>,
    /// The longest a connection may take to send a whole request head [default:
    /// [`crate::interfaces::IncomingLimits`]'s].
    #[arg(long, env = "VVM_HEADER_TIMEOUT", value_parser = config::parse_duration, allow_hyphen_values = true,
        help = format!("The longest a connection may take to send a whole request head [default: {}]", show(crate::interfaces::IncomingLimits::default().header_timeout)))]
    pub header_timeout: Option<Duration>,
    /// The longest a connection may stay idle between two requests [default:
    /// [`crate::interfaces::IncomingLimits`]'s].
    #[arg(long, env = "VVM_KEEP_ALIVE_TIMEOUT", value_parser = config::parse_duration, allow_hyphen_values = true,
        help = format!("The longest a connection may stay idle between two requests [default: {}]", show(crate::interfaces::IncomingLimits::default().keep_alive_timeout)))]
    pub keep_alive_timeout: Option<Duration>,
    /// How many requests one instance of an HTTP service serves before it is dropped, but
    /// where its [service.NAME] sets its own [default: 1 for a WASI 0.2 component, 128 for a
    /// WASI 0.3 one].
    #[arg(long, env = "VVM_MAX_INSTANCE_REUSE_COUNT", value_name = "N")]
    pub max_instance_reuse_count: Option<u32>,
    /// How many requests one instance of an HTTP service serves at once (more than 1 only for
    /// a WASI 0.3 component) [default: 1; 16 for a WASI 0.3 component].
    #[arg(
        long,
        env = "VVM_MAX_INSTANCE_CONCURRENT_REUSE_COUNT",
        value_name = "N"
    )]
    pub max_instance_concurrent_reuse_count: Option<u32>,
    /// How long an instance of an HTTP service waits idle for its next request before it is
    /// dropped [default: 1s].
    #[arg(long, env = "VVM_IDLE_INSTANCE_TIMEOUT", value_parser = config::parse_duration, allow_hyphen_values = true)]
    pub idle_instance_timeout: Option<Duration>,
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
            insecure_registries: self.insecure_registries.clone(),
            registry_ca_file: self.registry_ca_file.clone(),
            pull_timeout: self.pull_timeout,
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
            handle_limit: self.handle_limit,
            cache_dir: self.cache_dir.clone(),
            metrics_addr: self.metrics_addr,
            http_addr: self.http_addr,
            advertise_addr: self.advertise_addr,
            forward: self.forward,
            lock_dir: self.lock_dir.clone(),
            placement: self.placement,
            restart_backoff_max: self.restart_backoff_max,
            require_same_services: self.require_same_services,
            incoming_http: Some(IncomingHttpConfig {
                max_connections: self.max_connections,
                header_timeout: self.header_timeout,
                keep_alive_timeout: self.keep_alive_timeout,
                max_instance_reuse_count: self.max_instance_reuse_count,
                max_instance_concurrent_reuse_count: self.max_instance_concurrent_reuse_count,
                idle_instance_timeout: self.idle_instance_timeout,
                ..IncomingHttpConfig::default()
            }),
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

/// The filter directive that keeps the registry client's debug lines (a token response among
/// them) out of every log.
const NO_REGISTRY_TOKENS: &str = "oci_client=info";

/// Stderr for the log lines of this process.
static STDERR: std::sync::OnceLock<Stderr> = std::sync::OnceLock::new();

/// Sets up logging to stderr for `cli`: `RUST_LOG` filter (default `info`), text or JSON
/// lines, none at all for a tool run without `-v`. Colour only on a terminal, and never with
/// `NO_COLOR` set (journald and log shippers get plain text).
pub fn init_logging(cli: &Cli) {
    let filter = if cli.command.logs() {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
        // oci-client 0.17 logs a registry's token response whole at debug level: a secret,
        // which no `RUST_LOG` may let into the log.
        filter.add_directive(NO_REGISTRY_TOKENS.parse().unwrap_or_default())
    } else {
        tracing_subscriber::EnvFilter::new("off")
    };
    let colour = use_colour(
        std::io::IsTerminal::is_terminal(&std::io::stderr()),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let format = cli.log_format;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        // Never waits for the reader, and drops what finds no room (`log_output`): a stalled
        // or closed log pipe must cost lines, not the lease.
        .with_writer(|| STDERR.get_or_init(Stderr::open));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Whether to colour log lines: only on a terminal, and not when `NO_COLOR` is set to anything
/// but the empty string (<https://no-color.org>).
fn use_colour(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(std::ffi::OsStr::is_empty)
}

/// Runs the parsed command line and returns the process exit code.
pub async fn run(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Serve(args) => serve::serve(&args).await,
        Command::Status { json, settings, .. } => status::status(&settings, json).await,
        Command::Check { path, settings, .. } => status::check(path, &settings).await,
        Command::Kv(command) => kv::kv(command).await,
        Command::New(args) => new::new(&args),
        Command::Push {
            file,
            reference,
            settings,
            ..
        } => push::push(&file, &reference, &settings).await,
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            // One clear line, then a non-zero exit.
            eprintln!("vvm-host: error: {}", one_line(e.as_ref()));
            ExitCode::from(EXIT_SETUP)
        }
    }
}

#[cfg(test)]
mod tests;
