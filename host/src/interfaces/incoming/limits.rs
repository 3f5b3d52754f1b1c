//! [`IncomingLimits`]: where HTTP services are served and the limits on their requests
//! (SPEC §10, "Incoming HTTP"); the defaults here, the operator's over them (`http-addr`,
//! `[incoming-http]`).

use std::net::SocketAddr;
use std::time::Duration;

use crate::config::{IncomingHttpConfig, InstanceReuseConfig};

/// How an HTTP service's instances are reused (SPEC §12): resolved for one service from its
/// settings, the host-wide ones and the defaults of its component's WASI generation, as
/// `wasmtime serve` defaults its flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InstanceReuse {
    /// How many requests one instance serves before it is dropped (1: a fresh instance per
    /// request).
    pub max_requests: u32,
    /// How many requests one instance serves at once.
    pub max_concurrent: u32,
    /// How long an instance waits idle for its next request before it is dropped.
    pub idle_timeout: Duration,
}

impl InstanceReuse {
    /// For a WASI 0.2 component: a fresh instance per request, as a component written for
    /// one expects; one request at a time per instance whatever is set (a WASI 0.2 export
    /// cannot be entered twice at once).
    pub const WASI_P2: Self = Self {
        max_requests: 1,
        max_concurrent: 1,
        idle_timeout: Duration::from_secs(1),
    };

    /// For a WASI 0.3 component, `wasmtime serve`'s defaults: 128 requests per instance, 16 at
    /// once.
    pub const WASI_P3: Self = Self {
        max_requests: 128,
        max_concurrent: 16,
        idle_timeout: Duration::from_secs(1),
    };

    /// The reuse of a WASI 0.3 component under `settings` (the service's over the host's).
    #[must_use]
    pub fn p3(settings: InstanceReuseConfig) -> Self {
        let d = Self::WASI_P3;
        Self {
            max_requests: settings.max_instance_reuse_count.unwrap_or(d.max_requests),
            max_concurrent: (settings.max_instance_concurrent_reuse_count)
                .unwrap_or(d.max_concurrent),
            idle_timeout: settings.idle_instance_timeout.unwrap_or(d.idle_timeout),
        }
    }

    /// The reuse of a WASI 0.2 component under `settings` (the service's over the host's).
    #[must_use]
    pub fn p2(settings: InstanceReuseConfig) -> Self {
        let d = Self::WASI_P2;
        Self {
            max_requests: settings.max_instance_reuse_count.unwrap_or(d.max_requests),
            max_concurrent: 1,
            idle_timeout: settings.idle_instance_timeout.unwrap_or(d.idle_timeout),
        }
    }
}

/// Where HTTP services are served and the limits on their requests (SPEC §10).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IncomingLimits {
    /// The address served on while leading; `None`: HTTP services are not served.
    pub addr: Option<SocketAddr>,
    /// The most requests of one service served at once; more are answered 503. Default 1000.
    pub max_concurrent: u32,
    /// The longest a request may take, from admission to the end of its response. Default
    /// 30 s.
    pub request_timeout: Duration,
    /// The largest request body; a larger one is refused with 413. Default 10 MiB.
    pub max_body_bytes: u64,
    /// The largest request head (request line and headers); a larger one is refused with
    /// 431. Default 64 KiB.
    pub max_header_bytes: usize,
    /// The most connections open at once, as set (`max-connections`); `None`: the default,
    /// from the open file limit (the runtime resolves it, [`super::Sandboxes::max_connections`]).
    pub max_connections: Option<u32>,
    /// The longest a connection may take to send a whole request head, from its accept or from
    /// the first byte of a later request's head; then it is closed. Default 10 s: a head
    /// takes a round trip (nginx's `client_header_timeout` is 60 s; `HAProxy` leaves its
    /// `timeout http-request` to the operator).
    pub header_timeout: Duration,
    /// The longest a connection may stay idle between two requests; then it is closed.
    /// Default 30 s.
    pub keep_alive_timeout: Duration,
    /// Every HTTP service's instance reuse, but where its own table sets it.
    pub instance_reuse: InstanceReuseConfig,
    /// How requests for services other hosts hold are forwarded; `None`: they are not
    /// (answered 503 with `Retry-After`).
    pub forwarding: Option<Forwarding>,
}

/// How this host forwards a request for a service another host of the group holds (SPEC §13).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Forwarding {
    /// This host, as its forwarded requests name it: its advertised address, or `http-addr`.
    pub by: SocketAddr,
    /// The longest a connection to a holder may take to be made: well under `L`.
    pub connect_timeout: Duration,
    /// The longest a request waits for a holder of its service to be known (`L`: a claim
    /// handed over or expired is taken within it).
    pub patience: Duration,
}

impl Forwarding {
    /// Forwarding by a host reached at `by`, in a group whose lease is `lease`.
    #[must_use]
    pub fn new(by: SocketAddr, lease: Duration) -> Self {
        Self {
            by,
            connect_timeout: (lease / 5).clamp(Duration::from_millis(10), Duration::from_secs(1)),
            patience: lease,
        }
    }
}

impl Default for IncomingLimits {
    fn default() -> Self {
        Self {
            addr: None,
            max_concurrent: 1000,
            request_timeout: Duration::from_secs(30),
            max_body_bytes: 10 << 20,
            max_header_bytes: 64 << 10,
            max_connections: None,
            header_timeout: Duration::from_secs(10),
            keep_alive_timeout: Duration::from_secs(30),
            instance_reuse: InstanceReuseConfig::default(),
            forwarding: None,
        }
    }
}

impl IncomingLimits {
    /// These limits with `file`'s where it sets them.
    #[must_use]
    pub fn with(self, addr: Option<SocketAddr>, file: IncomingHttpConfig) -> Self {
        Self {
            addr,
            max_concurrent: file.max_concurrent.unwrap_or(self.max_concurrent),
            request_timeout: file.request_timeout.unwrap_or(self.request_timeout),
            max_body_bytes: file.max_body_bytes.unwrap_or(self.max_body_bytes),
            // Bounded to at most 1 MiB by the settings' check.
            max_header_bytes: file.max_header_bytes.map_or(self.max_header_bytes, |n| {
                usize::try_from(n).unwrap_or(usize::MAX)
            }),
            max_connections: file.max_connections.or(self.max_connections),
            header_timeout: (file.header_timeout.or(file.idle_timeout))
                .unwrap_or(self.header_timeout),
            keep_alive_timeout: (file.keep_alive_timeout.or(file.idle_timeout))
                .unwrap_or(self.keep_alive_timeout),
            instance_reuse: file.instance_reuse().over(self.instance_reuse),
            forwarding: self.forwarding,
        }
    }
}
