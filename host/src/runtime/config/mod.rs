//! What the operator configures about the Wasm services (SPEC §6, §8): directories, limits,
//! grants, restarts. The defaults are [`crate::config`]'s; [`RuntimeConfig::from_settings`]
//! takes the resolved settings.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{
    self, ConfigError, GrantConfig, InstanceReuseConfig, KvLimitsConfig, OnFailure, Route, Settings,
};
use crate::interfaces::{
    Forwarding, HttpPolicy, IncomingLimits, KvLimits, OutgoingLimits, ServiceConfig,
};
use crate::sources::{RegistryOptions, SourceRef};

/// Configuration of the Wasm runtime. `RuntimeConfig::new(dir)` gives the defaults.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// Every `*.wasm` file here is a service named by its file stem.
    pub services_dir: PathBuf,
    /// Where compiled components are cached. Default: [`config::default_cache_dir`].
    pub cache_dir: PathBuf,
    /// How long a guest may take to return from `run` once `stopping` resolves before its
    /// instance is dropped. Default [`config::DEFAULT_GRACE_PERIOD`]. Plain WASI commands get
    /// no grace period.
    pub grace_period: Duration,
    /// The most linear memory one instance may use, in bytes. Default
    /// [`config::DEFAULT_MEMORY_LIMIT_MIB`] MiB.
    pub memory_cap: usize,
    /// The most handles (open files, sockets, streams, timers) one instance may hold at once;
    /// less for a service granted directories or network if the process's descriptors are
    /// too few to give each that many (`handles`). Default [`config::DEFAULT_HANDLE_LIMIT`].
    pub handle_limit: u32,
    /// How often the epoch ticks: the longest a spinning guest runs before the host can
    /// interrupt it. Default 1 ms; a host's is [`epoch_tick`] of its lease.
    pub epoch_tick: Duration,
    /// Use wasmtime's pooling allocator (address space reserved up front for
    /// `max_instances`). Default false: for small guests on-demand allocation measured as
    /// fast and used less memory (see `benches/runtime.rs`). On with `http-addr`
    /// ([`RuntimeConfig::from_settings`]): an instance per request is what the pool is for,
    /// as `wasmtime serve` has it; it serves 1.3× the requests of on-demand allocation, whose
    /// map and unmap of every instance's memory took most of the time (BENCHMARKS.md,
    /// "Incoming HTTP").
    pub pooling: bool,
    /// The most instances alive at once when pooling (sizes the pools). Default 1000.
    pub max_instances: u32,
    /// What each service may reach beyond its sandbox, by service name. Default: nothing.
    pub grants: HashMap<String, Grants>,
    /// How failed services are restarted.
    pub restart: RestartPolicy,
    /// Limits on each service's key-value data, but where its grant sets its own.
    pub kv: KvLimits,
    /// Limits on each service's outgoing HTTP requests, but where its grant sets its own.
    pub outgoing_http: OutgoingLimits,
    /// Where and how HTTP services are served (`http-addr`, `[incoming-http]`).
    pub incoming_http: IncomingLimits,
    /// Where the hosts of this machine hand each other `http-addr`'s listening socket: the
    /// crash locks' directory (`lock-dir`). `None`: the socket is not shared.
    pub http_share_dir: Option<PathBuf>,
    /// The services pulled from a registry (`[service.NAME] source`), by name (SPEC §13);
    /// a file of the same name in `services_dir` is ignored.
    pub sources: BTreeMap<String, SourceRef>,
    /// How registries are reached.
    pub registry: RegistryOptions,
}

impl RuntimeConfig {
    /// The defaults for the services in `services_dir`.
    pub fn new(services_dir: impl Into<PathBuf>) -> Self {
        let services_dir = services_dir.into();
        Self {
            cache_dir: config::default_cache_dir(&services_dir),
            services_dir,
            grace_period: config::DEFAULT_GRACE_PERIOD,
            memory_cap: memory_cap(config::mib_to_bytes(config::DEFAULT_MEMORY_LIMIT_MIB)),
            handle_limit: config::DEFAULT_HANDLE_LIMIT,
            epoch_tick: Duration::from_millis(1),
            pooling: false,
            max_instances: 1000,
            grants: HashMap::new(),
            restart: RestartPolicy::default(),
            kv: KvLimits::default(),
            outgoing_http: OutgoingLimits::default(),
            incoming_http: IncomingLimits::default(),
            http_share_dir: None,
            sources: BTreeMap::new(),
            registry: RegistryOptions::default(),
        }
    }

    /// The runtime's configuration from the resolved settings: directories, limits and
    /// per-service grants; the rest as [`RuntimeConfig::new`].
    ///
    /// # Errors
    /// When a grant in the file is malformed.
    pub fn from_settings(settings: &Settings) -> Result<Self, ConfigError> {
        let mut config = Self::new(&settings.services);
        config.cache_dir.clone_from(&settings.cache_dir);
        config.grace_period = settings.grace_period;
        config.memory_cap = memory_cap(settings.memory_limit);
        config.handle_limit = settings.handle_limit;
        config.restart.max_backoff = settings.restart_backoff_max;
        config.kv = KvLimits::default().with(settings.kv);
        config.outgoing_http = OutgoingLimits::default().with(settings.outgoing_http);
        config.incoming_http =
            IncomingLimits::default().with(settings.http_addr, settings.incoming_http);
        // Under spread placement, where the members say who holds each service. (A standby of a
        // slot does not listen yet, so there is no one to forward from.)
        let spread = settings.placement == crate::config::Placement::Spread;
        config.incoming_http.forwarding = (settings.http_addr)
            .filter(|_| settings.forward && spread)
            .map(|http| Forwarding::new(settings.advertise_addr.unwrap_or(http), settings.lease));
        config.pooling = settings.http_addr.is_some();
        config.epoch_tick = epoch_tick(settings.lease);
        config.http_share_dir.clone_from(&settings.lock_dir);
        config.registry = settings.registry.clone();
        for (name, grant) in &settings.grants {
            let grants = grants(name, grant, config.outgoing_http)?;
            config.grants.insert(name.clone(), grants);
            if let Some(source) = &grant.source {
                config.sources.insert(name.clone(), source.clone());
            }
        }
        Ok(config)
    }
}

/// How often the epoch ticks under a lease `lease` long: `L/50`, at least 1 ms and at most
/// 10 ms.
///
/// The tick is how long a guest may run past its lease's deadline (or its request's timeout)
/// before it is interrupted, and how long a background write it left may go on (SPEC §7): a
/// fiftieth of `L` keeps that a tenth of the `0.2·L` between the deadline and the record's
/// expiry. It is also how often every running guest yields its thread. Each tick wakes the
/// ticker thread and every running guest, so ticking faster than that only costs: at 1 ms
/// the wake-ups took a fifth of a hello's throughput on two cores (BENCHMARKS.md, "Instance
/// reuse").
pub fn epoch_tick(lease: Duration) -> Duration {
    (lease / 50).clamp(Duration::from_millis(1), Duration::from_millis(10))
}

/// A memory cap in bytes as wasmtime takes it.
fn memory_cap(bytes: u64) -> usize {
    usize::try_from(bytes).unwrap_or(usize::MAX)
}

/// Turns a `[service.NAME]` table into runtime grants: `dirs` entries are `host[:guest][:ro]`,
/// with `host` an existing directory, `env` entries `NAME=value`, `http` entries
/// `scheme://host[:port]`; its outgoing HTTP limits over the host-wide `outgoing_http`.
fn grants(
    name: &str,
    grant: &GrantConfig,
    outgoing_http: OutgoingLimits,
) -> Result<Grants, ConfigError> {
    let invalid = |reason: String| ConfigError::Invalid {
        name: "service.*",
        reason: format!("service {name}: {reason}"),
    };
    let mut dirs = Vec::new();
    for spec in &grant.dirs {
        let (spec, read_only) = match spec.strip_suffix(":ro") {
            Some(rest) => (rest, true),
            None => (spec.as_str(), false),
        };
        let (host, guest) = spec.split_once(':').unwrap_or((spec, spec));
        if host.is_empty() || guest.is_empty() {
            return Err(invalid(format!(
                "dir grant {spec:?} is not host[:guest][:ro]"
            )));
        }
        // Checked now: else every start of the service would fail, under the lease.
        match std::fs::metadata(host) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err(invalid(format!("dir grant {host:?} is not a directory"))),
            Err(e) => return Err(invalid(format!("dir grant {host:?}: {e}"))),
        }
        dirs.push(DirGrant {
            host: host.into(),
            guest: guest.into(),
            read_only,
        });
    }
    let mut env = Vec::new();
    for pair in &grant.env {
        let Some((k, v)) = pair.split_once('=') else {
            return Err(invalid(format!("env grant {pair:?} is not NAME=value")));
        };
        if k.is_empty() {
            return Err(invalid(format!("env grant {pair:?} has no NAME")));
        }
        env.push((k.to_owned(), v.to_owned()));
    }
    Ok(Grants {
        dirs,
        env,
        network: grant.network,
        restart_backoff_max: grant.restart_backoff_max,
        on_failure: grant.on_failure,
        kv_buckets: grant.kv_buckets.iter().cloned().collect(),
        kv: grant.kv,
        config: ServiceConfig::resolve(name, &grant.config)?,
        schedule: grant.schedule_settings(name)?,
        instance_reuse: grant.instance_reuse(),
        route: match &grant.route {
            None => None,
            Some(route) => Some(Route::parse(route).map_err(|reason| ConfigError::Invalid {
                name: "service.*.route",
                reason: format!("service {name}: route {route:?} {reason}"),
            })?),
        },
        http: Arc::new(
            HttpPolicy::new(
                &grant.http,
                grant.http_ca.as_deref(),
                outgoing_http.with(grant.outgoing_http),
            )
            .map_err(|reason| ConfigError::Invalid {
                name: "service.*.http",
                reason: format!("service {name}: {reason}"),
            })?,
        ),
    })
}

/// What the operator set for one service (`[service.NAME]`): the ambient authority granted to
/// it, and how its failures are met. The default grants nothing and restarts it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grants {
    /// Host directories the guest may open.
    pub dirs: Vec<DirGrant>,
    /// Environment variables the guest sees.
    pub env: Vec<(String, String)>,
    /// Whether the guest may open TCP/UDP sockets and resolve names.
    pub network: bool,
    /// The longest wait between its restarts, if not [`RestartPolicy::max_backoff`].
    pub restart_backoff_max: Option<Duration>,
    /// What a failure does besides the restart.
    pub on_failure: OnFailure,
    /// The shared key-value buckets it may open besides its own namespace (shared with each
    /// instance, not copied).
    pub kv_buckets: Arc<[String]>,
    /// Its key-value limits, where it sets its own ([`RuntimeConfig::kv`] otherwise).
    pub kv: KvLimitsConfig,
    /// What `wasi:config/store` gives it.
    pub config: ServiceConfig,
    /// Where its outgoing HTTP requests may go, and their limits (nowhere by default).
    pub http: Arc<HttpPolicy>,
    /// Where it is served on `http-addr`, if it is an HTTP service; `/NAME/...` when `None`.
    pub route: Option<Route>,
    /// Its schedule (`schedule` and the keys a scheduled service reads), if it has one: run
    /// once per fire time (`scheduler`) rather than for as long as it leads.
    pub schedule: Option<crate::config::ScheduleSettings>,
    /// How many requests an instance of it serves, and how long one waits idle, where it sets
    /// its own (the host-wide `[incoming-http]` ones otherwise).
    pub instance_reuse: InstanceReuseConfig,
}

impl Grants {
    /// The key-value limits of a service with these grants (or none) on a host whose own are
    /// `host_wide`.
    pub(crate) fn kv_limits(grants: Option<&Self>, host_wide: KvLimits) -> KvLimits {
        grants.map_or(host_wide, |g| host_wide.with(g.kv))
    }
}

/// One host directory made visible to a guest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirGrant {
    /// The directory on the host.
    pub host: PathBuf,
    /// Where the guest sees it (e.g. `/data`).
    pub guest: String,
    /// If true the guest may only read.
    pub read_only: bool,
}

/// How a failed service is restarted (SPEC §6): after a wait that doubles with each failure in
/// a row, from `initial_backoff` up to `max_backoff`, and starts over from `initial_backoff`
/// once a run has lasted `reset_after` (the schedule is `restart::Backoff`'s). A failure never
/// stops, restarts or delays another service, and never costs the host its lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestartPolicy {
    /// The wait before the first restart. Default [`config::RESTART_BACKOFF_INITIAL`].
    pub initial_backoff: Duration,
    /// The longest wait between restarts, for services that set none of their own. Default
    /// [`config::DEFAULT_RESTART_BACKOFF_MAX`] (`restart-backoff-max`).
    pub max_backoff: Duration,
    /// A run at least this long was clean: the next failure waits `initial_backoff` again.
    /// Default [`config::RESTART_RESET_AFTER`].
    pub reset_after: Duration,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        Self {
            initial_backoff: config::RESTART_BACKOFF_INITIAL,
            max_backoff: config::DEFAULT_RESTART_BACKOFF_MAX,
            reset_after: config::RESTART_RESET_AFTER,
        }
    }
}

#[cfg(test)]
mod tests;
