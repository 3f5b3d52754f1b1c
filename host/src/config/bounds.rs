//! Every bound of a setting (SPEC §8: no setting can make the host panic or hang), and the
//! check of the settings against them ([`validate`]), which names the setting and the bound.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::error::ConfigError;
use super::route::Route;
use super::service::{
    GrantConfig, IncomingHttpConfig, InstanceReuseConfig, KvLimitsConfig, OutgoingHttpConfig,
};

/// The wait before a failed service's first restart; each failure in a row doubles it.
pub const RESTART_BACKOFF_INITIAL: Duration = Duration::from_millis(100);
/// The longest `restart-backoff-max`: a service is never left down for longer than this
/// between two tries.
pub const MAX_RESTART_BACKOFF_MAX: Duration = Duration::from_hours(1);

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
/// The longest key-value key a limit may allow, in bytes.
pub const MAX_KV_KEY_BYTES: u64 = 4096;
/// The largest key-value value a limit may allow: 1 MiB, what portable guests assume (Spin's
/// SIP-010), and what one etcd request (1.5 MiB by default) still carries with its key.
pub const MAX_KV_VALUE_BYTES: u64 = 1 << 20;
/// The most keys a limit may allow in one namespace.
pub const MAX_KV_KEYS: u64 = 10_000_000;
/// The most bytes a limit may allow in one namespace: 8 GiB, etcd's largest recommended
/// database (its default quota is 2 GiB, for every namespace and the leases together).
pub const MAX_KV_BYTES: u64 = 8 << 30;
/// The highest key-value write rate a limit may allow, per service.
pub const MAX_KV_WRITES_PER_SECOND: u32 = 100_000;
/// The largest `write-burst`: ten seconds of the largest rate.
pub const MAX_KV_WRITE_BURST: u32 = 1_000_000;
/// The longest name of a key-value bucket.
pub const MAX_BUCKET_NAME: usize = 64;
/// The most outgoing HTTP requests one service may have in flight at once.
pub const MAX_OUTGOING_CONCURRENT: u32 = 10_000;
/// The shortest outgoing HTTP timeout (connect, first byte, between bytes).
pub const MIN_OUTGOING_TIMEOUT: Duration = Duration::from_millis(1);
/// The longest outgoing HTTP timeout: a request still waiting after an hour holds a slot of
/// its service's concurrency for nothing.
pub const MAX_OUTGOING_TIMEOUT: Duration = Duration::from_hours(1);

/// The most requests one HTTP service may be served at once.
pub const MAX_INCOMING_CONCURRENT: u32 = 100_000;
/// The most connections `max-connections` may allow (the open file limit bounds it too, at
/// start).
pub const MAX_CONNECTIONS: u32 = 1_000_000;
/// The shortest incoming request timeout (and header and keep-alive timeout).
pub const MIN_INCOMING_TIMEOUT: Duration = Duration::from_millis(1);
/// The longest incoming request timeout: a request still running after an hour holds a
/// store and a slot of its service's concurrency for nothing.
pub const MAX_INCOMING_TIMEOUT: Duration = Duration::from_hours(1);
/// The largest request body a limit may allow: 4 GiB.
pub const MAX_INCOMING_BODY_BYTES: u64 = 4 << 30;
/// The smallest request head a limit may allow: hyper's smallest read buffer, 8 KiB.
pub const MIN_INCOMING_HEADER_BYTES: u64 = 8 << 10;
/// The largest request head a limit may allow: 1 MiB.
pub const MAX_INCOMING_HEADER_BYTES: u64 = 1 << 20;

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

/// Checks what each `[service.NAME]` table bounds.
///
/// # Errors
/// Naming the service, the setting and the bound it breaks.
pub(super) fn check_services(grants: &BTreeMap<String, GrantConfig>) -> Result<(), ConfigError> {
    for (name, grant) in grants {
        if let Some(max) = grant.restart_backoff_max {
            check_restart_backoff_max(max).map_err(|reason| ConfigError::Invalid {
                name: "service.*.restart-backoff-max",
                reason: format!("service {name}: {reason}"),
            })?;
        }
        check_kv_limits("service.*.kv", &format!("service {name}: "), &grant.kv)?;
        check_outgoing_http(
            "service.*.outgoing-http",
            &format!("service {name}: "),
            &grant.outgoing_http,
        )?;
        check_instance_reuse(
            "service.*",
            &format!("service {name}: "),
            grant.instance_reuse(),
        )?;
        for bucket in &grant.kv_buckets {
            check_bucket_name(bucket).map_err(|reason| ConfigError::Invalid {
                name: "service.*.kv-buckets",
                reason: format!("service {name}: bucket {bucket:?} {reason}"),
            })?;
        }
        grant.schedule_settings(name)?;
        // A file's stem names a file service; a source's table names its service, so the
        // name must be one a file could have had (it goes into logs, metrics and store keys).
        if grant.source.is_some()
            && (name.is_empty() || name.contains('/') || name.chars().any(char::is_control))
        {
            return Err(ConfigError::Invalid {
                name: "service.*.source",
                reason: format!(
                    "service {name:?}: a service from a source needs a name a file could have \
                     (not empty, no / and no control character)"
                ),
            });
        }
        if let Some(key) = grant.config.keys().find(|k| k.is_empty()) {
            return Err(ConfigError::Invalid {
                name: "service.*.config",
                reason: format!("service {name}: config key {key:?} is empty"),
            });
        }
    }
    check_routes(grants)
}

/// Checks the `route` of each `[service.NAME]` table: well formed, and no two services with
/// one route (a table without `route` has `/NAME/...`).
///
/// # Errors
/// Naming the service and the route, and the service that already has it.
fn check_routes(grants: &BTreeMap<String, GrantConfig>) -> Result<(), ConfigError> {
    let mut taken: HashMap<Route, &str> = HashMap::new();
    for (name, grant) in grants {
        let route = match &grant.route {
            Some(text) => Route::parse(text).map_err(|reason| ConfigError::Invalid {
                name: "service.*.route",
                reason: format!("service {name}: route {text:?} {reason}"),
            })?,
            None => Route::default_for(name),
        };
        if let Some(first) = taken.get(&route) {
            return Err(ConfigError::Invalid {
                name: "service.*.route",
                reason: format!(
                    "service {name}: route \"{route}\" is already service {first}'s; two \
                     services cannot share a route"
                ),
            });
        }
        taken.insert(route, name);
    }
    Ok(())
}

/// Checks the key-value limits of `[kv]` (`setting` `"kv"`, `whose` empty) or of one
/// service's table.
///
/// # Errors
/// Naming the setting, the limit and its bounds.
pub(super) fn check_kv_limits(
    setting: &'static str,
    whose: &str,
    limits: &KvLimitsConfig,
) -> Result<(), ConfigError> {
    let checks = [
        ("max-key-bytes", limits.max_key_bytes, MAX_KV_KEY_BYTES),
        (
            "max-value-bytes",
            limits.max_value_bytes,
            MAX_KV_VALUE_BYTES,
        ),
        ("max-keys", limits.max_keys, MAX_KV_KEYS),
        ("max-bytes", limits.max_bytes, MAX_KV_BYTES),
        (
            "writes-per-second",
            limits.writes_per_second.map(u64::from),
            u64::from(MAX_KV_WRITES_PER_SECOND),
        ),
        (
            "write-burst",
            limits.write_burst.map(u64::from),
            u64::from(MAX_KV_WRITE_BURST),
        ),
    ];
    for (key, value, max) in checks {
        if let Some(value) = value
            && !(1..=max).contains(&value)
        {
            return Err(ConfigError::Invalid {
                name: setting,
                reason: format!("{whose}{key} = {value} is out of range 1..={max}"),
            });
        }
    }
    Ok(())
}

/// Checks the outgoing HTTP limits of `[outgoing-http]` (`setting` `"outgoing-http"`, `whose`
/// empty) or of one service's table.
///
/// # Errors
/// Naming the setting, the limit and its bounds.
pub(super) fn check_outgoing_http(
    setting: &'static str,
    whose: &str,
    limits: &OutgoingHttpConfig,
) -> Result<(), ConfigError> {
    let invalid = |reason: String| {
        Err(ConfigError::Invalid {
            name: setting,
            reason: format!("{whose}{reason}"),
        })
    };
    if let Some(n) = limits.max_concurrent
        && !(1..=MAX_OUTGOING_CONCURRENT).contains(&n)
    {
        return invalid(format!(
            "max-concurrent = {n} is out of range 1..={MAX_OUTGOING_CONCURRENT}"
        ));
    }
    if let Some(n) = limits.pool_max_idle_per_origin
        && n > MAX_OUTGOING_CONCURRENT
    {
        return invalid(format!(
            "pool-max-idle-per-origin = {n} is out of range 0..={MAX_OUTGOING_CONCURRENT}"
        ));
    }
    let timeouts = [
        ("connect-timeout", limits.connect_timeout),
        ("first-byte-timeout", limits.first_byte_timeout),
        ("between-bytes-timeout", limits.between_bytes_timeout),
        ("pool-idle-timeout", limits.pool_idle_timeout),
    ];
    for (key, value) in timeouts {
        if let Some(d) = value
            && !(MIN_OUTGOING_TIMEOUT..=MAX_OUTGOING_TIMEOUT).contains(&d)
        {
            return invalid(format!(
                "{key} = {} is out of range {}..={}",
                show(d),
                show(MIN_OUTGOING_TIMEOUT),
                show(MAX_OUTGOING_TIMEOUT)
            ));
        }
    }
    Ok(())
}

/// The most requests `max-instance-reuse-count` lets one instance serve in its life.
pub const MAX_INSTANCE_REUSE: u32 = 1_000_000;
/// The most requests `max-instance-concurrent-reuse-count` lets one instance serve at once.
pub const MAX_INSTANCE_CONCURRENT_REUSE: u32 = 1000;

/// Checks instance reuse settings (of `setting`, `whose`: a service's, or none).
///
/// # Errors
/// Naming the key, the value and its bounds.
pub(super) fn check_instance_reuse(
    setting: &'static str,
    whose: &str,
    reuse: InstanceReuseConfig,
) -> Result<(), ConfigError> {
    let invalid = |reason: String| {
        Err(ConfigError::Invalid {
            name: setting,
            reason: format!("{whose}{reason}"),
        })
    };
    for (key, value, most) in [
        (
            "max-instance-reuse-count",
            reuse.max_instance_reuse_count,
            MAX_INSTANCE_REUSE,
        ),
        (
            "max-instance-concurrent-reuse-count",
            reuse.max_instance_concurrent_reuse_count,
            MAX_INSTANCE_CONCURRENT_REUSE,
        ),
    ] {
        if let Some(n) = value
            && !(1..=most).contains(&n)
        {
            return invalid(format!("{key} = {n} is out of range 1..={most}"));
        }
    }
    if let Some(d) = reuse.idle_instance_timeout
        && !(MIN_INCOMING_TIMEOUT..=MAX_INCOMING_TIMEOUT).contains(&d)
    {
        return invalid(format!(
            "idle-instance-timeout = {} is out of range {}..={}",
            show(d),
            show(MIN_INCOMING_TIMEOUT),
            show(MAX_INCOMING_TIMEOUT)
        ));
    }
    Ok(())
}

/// Checks the limits of `[incoming-http]`.
///
/// # Errors
/// Naming the setting, the limit and its bounds.
pub(super) fn check_incoming_http(limits: &IncomingHttpConfig) -> Result<(), ConfigError> {
    let invalid = |reason: String| {
        Err(ConfigError::Invalid {
            name: "incoming-http",
            reason,
        })
    };
    if let Some(n) = limits.max_concurrent
        && !(1..=MAX_INCOMING_CONCURRENT).contains(&n)
    {
        return invalid(format!(
            "max-concurrent = {n} is out of range 1..={MAX_INCOMING_CONCURRENT}"
        ));
    }
    if let Some(n) = limits.max_connections
        && !(1..=MAX_CONNECTIONS).contains(&n)
    {
        return invalid(format!(
            "max-connections = {n} is out of range 1..={MAX_CONNECTIONS}"
        ));
    }
    for (key, value) in [
        ("request-timeout", limits.request_timeout),
        ("header-timeout", limits.header_timeout),
        ("keep-alive-timeout", limits.keep_alive_timeout),
        ("idle-timeout", limits.idle_timeout),
    ] {
        if let Some(d) = value
            && !(MIN_INCOMING_TIMEOUT..=MAX_INCOMING_TIMEOUT).contains(&d)
        {
            return invalid(format!(
                "{key} = {} is out of range {}..={}",
                show(d),
                show(MIN_INCOMING_TIMEOUT),
                show(MAX_INCOMING_TIMEOUT)
            ));
        }
    }
    for (key, value, range) in [
        (
            "max-body-bytes",
            limits.max_body_bytes,
            1..=MAX_INCOMING_BODY_BYTES,
        ),
        (
            "max-header-bytes",
            limits.max_header_bytes,
            MIN_INCOMING_HEADER_BYTES..=MAX_INCOMING_HEADER_BYTES,
        ),
    ] {
        if let Some(n) = value
            && !range.contains(&n)
        {
            return invalid(format!(
                "{key} = {n} is out of range {}..={}",
                range.start(),
                range.end()
            ));
        }
    }
    Ok(())
}

/// Whether `name` can name a shared bucket: 1 to [`MAX_BUCKET_NAME`] letters, digits, `.`,
/// `_` or `-`, and not `default` (the service's own namespace).
///
/// # Errors
/// Why not, as words that follow the name.
pub fn check_bucket_name(name: &str) -> Result<(), String> {
    if name == "default" {
        return Err("is the service's own namespace; name a shared bucket".to_owned());
    }
    let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if name.is_empty() || name.len() > MAX_BUCKET_NAME || !name.chars().all(valid) {
        return Err(format!(
            "is not 1 to {MAX_BUCKET_NAME} letters, digits, '.', '_' or '-'"
        ));
    }
    Ok(())
}

/// Checks that a store was named at all.
///
/// # Errors
/// `store` is empty.
pub(super) fn check_store(store: &str) -> Result<(), ConfigError> {
    if store.trim().is_empty() {
        return Err(ConfigError::Invalid {
            name: "store",
            reason: "is empty: give a redb file path or etcd://host:port".to_owned(),
        });
    }
    Ok(())
}
