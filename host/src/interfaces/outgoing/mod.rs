//! Outgoing HTTP for guests (SPEC §10): `wasi:http/outgoing-handler` through
//! `wasmtime-wasi-http`, with our own `send_request` hook ([`OutgoingHttp`]).
//!
//! Every path a request takes, and what holds it:
//! - `handle`, and every later call of the guest's (a body write, reading the response), is a
//!   host call: the per-call fence (the runtime's `fence`) traps it past the lease deadline.
//! - Deny by default: a request goes only where the service's allow-list (`allow`) lets it;
//!   else it fails with `HTTP-request-denied` inside `handle`, before any connection, and one
//!   log line names the service and the host. A name that a wildcard let through may not
//!   resolve to loopback, link-local or unspecified addresses (`connect`).
//! - The exchange runs on a task of the crate's after `handle` returns: connect, TLS, sending
//!   and the response head are raced against the deadline ([`LeaseDeadline::passed`]) and
//!   dropped when it passes; so is the connection's task, which sends the body and reads the
//!   response body; every request-body frame is checked just before it goes out
//!   (`body::request`), and the response body ends at the deadline.
//! - What is left is what the kernel took before the deadline (the socket's send buffer), as
//!   for a granted TCP socket. The fencing token closes it for a downstream that checks: every
//!   request carries `vvm-fencing-token: <term>` and `vvm-lease: <key>`, which a guest can
//!   neither set nor remove.
//! - Limits: requests in flight per service, connect, first-byte and between-bytes timeouts
//!   ([`OutgoingLimits`]); a guest's own `request-options` can only shorten them.
//! - Connections are kept alive per service and origin (`pool`), during one leadership: each
//!   request above is still its own, on a connection reused or new.

mod allow;
mod body;
mod connect;
mod handle;
mod pool;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::header::{HeaderName, HeaderValue};
use hyper::{Request, Response};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::p2::bindings::http::types::ErrorCode;
use wasmtime_wasi_http::{
    DEFAULT_FORBIDDEN_HEADERS, Error, ForbiddenHeaderFilter, RequestOptions, WasiBody,
    WasiHttpHooks,
};

use allow::AllowList;
use body::fenced;
use connect::Target;
pub(crate) use handle::link_handle;
use pool::{Conn, Lent, Origin, Pool};

use crate::config::OutgoingHttpConfig;
use crate::lease::LeaseDeadline;
use crate::ops::{HttpOutcome, Ops};
use crate::services::LeaseInfo;

/// The header carrying the lease term a request was sent under (the fencing token).
pub const TOKEN_HEADER: HeaderName = HeaderName::from_static("vvm-fencing-token");
/// The header naming the lease the term belongs to (`slot/1`, `service/NAME`).
pub const LEASE_HEADER: HeaderName = HeaderName::from_static("vvm-lease");

/// Limits on a service's outgoing HTTP requests (SPEC §10).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutgoingLimits {
    /// Requests in flight at once (from `handle` until the response body is read or
    /// dropped); more wait for one to end. Default 16.
    pub max_concurrent: u32,
    /// The longest name lookup, TCP connect and TLS handshake together. Default 10 s.
    pub connect_timeout: Duration,
    /// The longest wait for the response head once connected. Default 60 s.
    pub first_byte_timeout: Duration,
    /// The longest wait between two pieces of the response body. Default 60 s.
    pub between_bytes_timeout: Duration,
    /// The most idle keep-alive connections kept per origin; 0: a connection per request.
    /// Default 32.
    pub pool_max_idle_per_origin: u32,
    /// How long an idle keep-alive connection waits for its next request. Default 30 s.
    pub pool_idle_timeout: Duration,
}

impl Default for OutgoingLimits {
    fn default() -> Self {
        Self {
            max_concurrent: 16,
            connect_timeout: Duration::from_secs(10),
            first_byte_timeout: Duration::from_mins(1),
            between_bytes_timeout: Duration::from_mins(1),
            pool_max_idle_per_origin: 32,
            pool_idle_timeout: Duration::from_secs(30),
        }
    }
}

impl OutgoingLimits {
    /// These limits with those `table` sets (`[outgoing-http]`, `[service.NAME.outgoing-http]`)
    /// in their place.
    #[must_use]
    pub fn with(self, table: OutgoingHttpConfig) -> Self {
        Self {
            max_concurrent: table.max_concurrent.unwrap_or(self.max_concurrent),
            connect_timeout: table.connect_timeout.unwrap_or(self.connect_timeout),
            first_byte_timeout: table.first_byte_timeout.unwrap_or(self.first_byte_timeout),
            between_bytes_timeout: table
                .between_bytes_timeout
                .unwrap_or(self.between_bytes_timeout),
            pool_max_idle_per_origin: table
                .pool_max_idle_per_origin
                .unwrap_or(self.pool_max_idle_per_origin),
            pool_idle_timeout: table.pool_idle_timeout.unwrap_or(self.pool_idle_timeout),
        }
    }

    /// The timeouts of one request: these, or shorter ones the guest asked for.
    fn shortened_by(self, options: Option<RequestOptions>) -> Self {
        let min = |ours: Duration, theirs: Option<Duration>| theirs.map_or(ours, |t| t.min(ours));
        let options = options.unwrap_or_default();
        Self {
            connect_timeout: min(self.connect_timeout, options.connect_timeout),
            first_byte_timeout: min(self.first_byte_timeout, options.first_byte_timeout),
            between_bytes_timeout: min(self.between_bytes_timeout, options.between_bytes_timeout),
            ..self
        }
    }
}

/// Where a service may send requests and how: its allow-list, TLS roots and limits. Made
/// once per settings (the CA file is read then) and shared by its instances.
#[derive(Clone, Default)]
pub struct HttpPolicy {
    allow: AllowList,
    /// `http-ca`, if set; `None` with no allow-list too (nothing is ever sent).
    ca: Option<PathBuf>,
    tls: Option<Arc<rustls::ClientConfig>>,
    limits: OutgoingLimits,
}

impl HttpPolicy {
    /// The policy of a service whose `http` list is `entries` and `http-ca` is `ca`.
    ///
    /// # Errors
    /// Naming the entry or the CA file that cannot work, and why.
    pub fn new(
        entries: &[String],
        ca: Option<&Path>,
        limits: OutgoingLimits,
    ) -> Result<Self, String> {
        let allow = AllowList::parse(entries)?;
        let tls = if entries.is_empty() && ca.is_none() {
            None
        } else {
            Some(connect::tls_config(ca).map_err(|e| format!("http-ca {e}"))?)
        };
        Ok(Self {
            allow,
            ca: ca.map(Path::to_owned),
            tls,
            limits,
        })
    }
}

impl HttpPolicy {
    /// True if it lets no request out (no `http` entry).
    pub(crate) fn denies_all(&self) -> bool {
        self.allow.is_empty()
    }
}

impl PartialEq for HttpPolicy {
    fn eq(&self, other: &Self) -> bool {
        (&self.allow, &self.ca, self.limits) == (&other.allow, &other.ca, other.limits)
    }
}

impl Eq for HttpPolicy {}

impl std::fmt::Debug for HttpPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpPolicy")
            .field("allow", &self.allow)
            .field("ca", &self.ca)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// What every instance of one service shares of its outgoing HTTP during one leadership: its
/// requests in flight, and its keep-alive connections.
pub(crate) struct OutgoingShared {
    in_flight: Arc<Semaphore>,
    pool: Arc<Pool>,
}

impl OutgoingShared {
    /// The requests in flight and the pool of a service with `policy`.
    pub(crate) fn new(policy: &HttpPolicy) -> Arc<Self> {
        let limits = policy.limits;
        Arc::new(Self {
            in_flight: Arc::new(Semaphore::new(limits.max_concurrent as usize)),
            pool: Pool::new(
                limits.pool_max_idle_per_origin as usize,
                limits.pool_idle_timeout,
            ),
        })
    }
}

/// One instance's outgoing HTTP: `wasmtime-wasi-http`'s hooks, with the service's policy,
/// its lease, and what its instances share.
pub(crate) struct OutgoingHttp {
    service: Arc<str>,
    token: HeaderValue,
    lease: HeaderValue,
    deadline: LeaseDeadline,
    ops: Ops,
    policy: Arc<HttpPolicy>,
    shared: Arc<OutgoingShared>,
    /// The origins denied so far and said at warn level.
    denied: HashSet<(bool, String, u16)>,
}

impl OutgoingHttp {
    /// The hooks of an instance of `service` under `lease` with `policy`; `shared` is every
    /// instance's of the service.
    pub(crate) fn new(
        service: &Arc<str>,
        lease: &LeaseInfo,
        deadline: LeaseDeadline,
        ops: Ops,
        policy: Arc<HttpPolicy>,
        shared: Arc<OutgoingShared>,
    ) -> Self {
        Self {
            service: Arc::clone(service),
            token: HeaderValue::from(lease.term),
            // A lease key is ASCII (`slot/N`, `service/NAME`); a bad one sends no name.
            lease: HeaderValue::from_str(&lease.key).unwrap_or(HeaderValue::from_static("")),
            deadline,
            ops,
            policy,
            shared,
            denied: HashSet::new(),
        }
    }
}

/// What `send_request` hands back: the response, and the task that drives the connection.
type Sent = (
    Response<WasiBody>,
    Box<dyn Future<Output = Result<(), Error>> + Send>,
);

impl WasiHttpHooks for OutgoingHttp {
    fn forbidden_header_filter(&mut self) -> ForbiddenHeaderFilter {
        Arc::new(|name| {
            *name == TOKEN_HEADER
                || *name == LEASE_HEADER
                || DEFAULT_FORBIDDEN_HEADERS.contains(name)
        })
    }

    fn send_request(
        &mut self,
        mut request: Request<WasiBody>,
        options: Option<RequestOptions>,
        _response_errors: Box<dyn Future<Output = Result<(), Error>> + Send>,
    ) -> Box<dyn Future<Output = Result<Sent, Error>> + Send> {
        let started = Instant::now();
        let Some(target) = target_of(request.uri()) else {
            return Box::new(async { Err(Error::HttpRequestUriInvalid) });
        };
        // `handle` has denied what the list does not name (`handle.rs`); asked again for
        // how the list names it, and so that no path past `handle` skips it.
        let (Some(by), Some(tls)) = (self.admit(&target), self.policy.tls.clone()) else {
            return Box::new(async { Err(Error::HttpRequestDenied) });
        };
        // Set here, after the guest's headers: whatever it tried, these are the host's.
        let headers = request.headers_mut();
        headers.insert(TOKEN_HEADER, self.token.clone());
        headers.insert(LEASE_HEADER, self.lease.clone());
        let exchange = Exchange {
            service: Arc::clone(&self.service),
            ops: self.ops.clone(),
            deadline: self.deadline.clone(),
            shared: Arc::clone(&self.shared),
            limits: self.policy.limits.shortened_by(options),
            tls,
            literal: by.literal,
            target,
        };
        Box::new(exchange.run(request, started))
    }

    fn p2_error_from_hyper(&mut self, err: &hyper::Error) -> ErrorCode {
        tracing::debug!(service = &*self.service, error = %err, "outgoing HTTP request failed");
        if err.is_incomplete_message() {
            ErrorCode::HttpResponseIncomplete
        } else {
            ErrorCode::HttpProtocolError
        }
    }

    fn p2_error_from_connect(&mut self, err: &std::io::Error) -> ErrorCode {
        tracing::debug!(service = &*self.service, error = %err, "outgoing HTTP connect failed");
        match err.kind() {
            std::io::ErrorKind::TimedOut => ErrorCode::ConnectionTimeout,
            std::io::ErrorKind::HostUnreachable | std::io::ErrorKind::NetworkUnreachable => {
                ErrorCode::DestinationUnavailable
            }
            _ => ErrorCode::ConnectionRefused,
        }
    }

    fn p2_error_from_tls(&mut self, err: &std::io::Error) -> ErrorCode {
        tracing::debug!(service = &*self.service, error = %err, "outgoing HTTP TLS failed");
        let certificate = err
            .get_ref()
            .and_then(|e| e.downcast_ref::<rustls::Error>())
            .is_some_and(|e| matches!(e, rustls::Error::InvalidCertificate(_)));
        if certificate {
            ErrorCode::TlsCertificateError
        } else {
            ErrorCode::TlsProtocolError
        }
    }
}

impl OutgoingHttp {
    /// Whether the allow-list lets a request to `target` go, and how it names it; a denial is
    /// counted, and logged at warn the first time for each origin in this instance (at
    /// debug after that: a guest retrying in a loop cannot flood the log).
    fn admit(&mut self, target: &Target) -> Option<allow::AllowedBy> {
        let by = self
            .policy
            .allow
            .check(target.https, &target.host, target.port);
        if by.is_none() {
            self.ops
                .http_request(&self.service, HttpOutcome::Denied, None);
            let origin = (target.https, target.host.clone(), target.port);
            let first = self.denied.len() < MAX_DENIED_SAID && self.denied.insert(origin);
            let (service, host, port, https) =
                (&*self.service, &target.host, target.port, target.https);
            if first {
                tracing::warn!(
                    service,
                    host,
                    port,
                    https,
                    "outgoing HTTP request denied: not in the service's http allow-list"
                );
            } else {
                tracing::debug!(
                    service,
                    host,
                    port,
                    https,
                    "outgoing HTTP request denied: not in the service's http allow-list"
                );
            }
        }
        by
    }
}

/// How many denied origins an instance says at warn level.
const MAX_DENIED_SAID: usize = 64;

/// Where a request's URL points; `None` without a host.
fn target_of(uri: &hyper::Uri) -> Option<Target> {
    let https = uri.scheme() == Some(&hyper::http::uri::Scheme::HTTPS);
    let host = uri.host()?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    Some(Target {
        https,
        host: host.to_owned(),
        port: uri.port_u16().unwrap_or_else(|| allow::default_port(https)),
    })
}

/// One request on its way, off the guest's call.
struct Exchange {
    service: Arc<str>,
    ops: Ops,
    deadline: LeaseDeadline,
    shared: Arc<OutgoingShared>,
    limits: OutgoingLimits,
    tls: Arc<rustls::ClientConfig>,
    literal: bool,
    target: Target,
}

impl Exchange {
    /// Sends `request` and waits for the response head, raced against the deadline; counts
    /// and logs how it ended.
    async fn run(self, request: Request<WasiBody>, started: Instant) -> Result<Sent, Error> {
        let deadline = self.deadline.clone();
        let method = request.method().clone();
        let result = tokio::select! {
            biased;
            () = deadline.passed() => Err(fenced()),
            result = self.head(request) => result,
        };
        let took = started.elapsed();
        let outcome = match &result {
            Ok(_) => HttpOutcome::Ok,
            Err(_) if deadline.has_passed() => HttpOutcome::Fenced,
            Err(
                Error::ConnectionTimeout
                | Error::ConnectionReadTimeout
                | Error::HttpResponseTimeout
                | Error::DnsTimeout,
            ) => HttpOutcome::Timeout,
            Err(_) => HttpOutcome::Error,
        };
        self.ops.http_request(&self.service, outcome, Some(took));
        let service = &*self.service;
        let host = &self.target.host;
        let duration_ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
        match &result {
            Ok((response, _)) => {
                let status = response.status().as_u16();
                tracing::debug!(service, %method, host, status, duration_ms, "outgoing HTTP request");
            }
            Err(_) if outcome == HttpOutcome::Fenced => {
                self.ops.effect_refused(service);
                tracing::warn!(
                    service,
                    what = "outgoing HTTP request",
                    host,
                    "effect refused: lease deadline passed"
                );
            }
            Err(error) => {
                tracing::debug!(service, %method, host, %error, duration_ms, "outgoing HTTP request failed");
            }
        }
        result
    }

    /// Sends `request` on a kept-alive connection to its origin, or on a new one (and again
    /// on a new one if the kept one turns out closed before the request went out), and
    /// returns the response head; its body holds the connection and the request's place among
    /// those in flight until it has been read or dropped.
    async fn head(&self, request: Request<WasiBody>) -> Result<Sent, Error> {
        let permit = Arc::clone(&self.shared.in_flight)
            .acquire_owned()
            .await
            .map_err(|_| Error::ConnectionLimitReached)?;
        let (mut parts, body) = request.into_parts();
        // On the wire the request line names the path only (the URL's host is in `host`).
        parts.uri = parts.uri.path_and_query().map_or_else(
            || hyper::Uri::from_static("/"),
            |p| hyper::Uri::from(p.clone()),
        );
        let mut request = Request::from_parts(parts, body::request(body, self.deadline.clone()));
        let origin = Origin {
            https: self.target.https,
            host: self.target.host.clone(),
            port: self.target.port,
            literal: self.literal,
        };
        let pool = &self.shared.pool;
        let (mut conn, mut reused) = match pool.take(&origin) {
            Some(conn) => (conn, true),
            None => (self.connect().await?, false),
        };
        self.ops.http_connection(&self.service, reused);
        let response = loop {
            let send = conn.sender.try_send_request(request);
            match tokio::time::timeout(self.limits.first_byte_timeout, send).await {
                Err(_) => return Err(Error::ConnectionReadTimeout),
                Ok(Ok(response)) => break response,
                Ok(Err(mut failed)) => match failed.take_message() {
                    // Not sent: a kept connection the server had closed. A new one.
                    Some(unsent) if reused => {
                        request = unsent;
                        conn = self.connect().await?;
                        reused = false;
                        self.ops.http_connection(&self.service, reused);
                    }
                    _ => return Err(Error::from(failed.into_error())),
                },
            }
        };
        let held = Exchanged {
            lent: Lent::new(pool, origin, conn),
            _in_flight: permit,
        };
        let deadline = self.deadline.clone();
        let between_bytes = self.limits.between_bytes_timeout;
        let response =
            response.map(|incoming| body::response(incoming, deadline, between_bytes, held));
        // The connection is driven by its own task (`pool::Conn`): nothing more to drive here.
        Ok((response, Box::new(async { Ok(()) })))
    }

    /// A new connection to the target: name lookup, address guard, TCP, TLS and HTTP/1
    /// handshake, within the connect timeout.
    async fn connect(&self) -> Result<Conn, Error> {
        let (sender, conn) = tokio::time::timeout(self.limits.connect_timeout, async {
            let addrs = connect::resolve(&self.target, self.literal).await?;
            let stream = connect::connect(&self.target, &addrs, &self.tls).await?;
            hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(Error::from)
        })
        .await
        .map_err(|_| Error::ConnectionTimeout)??;
        Ok(Conn::new(
            sender,
            conn,
            self.deadline.clone(),
            self.shared.pool.idle_timeout(),
            Arc::clone(&self.service),
        ))
    }
}

/// What an exchange's response body holds: the connection, given back to the pool when the
/// body was read to its end (else closed), and the request's place among those in flight.
struct Exchanged {
    lent: Lent,
    _in_flight: OwnedSemaphorePermit,
}

impl body::Held for Exchanged {
    fn finished(&mut self) {
        self.lent.returned();
    }
}

#[cfg(test)]
mod tests;
