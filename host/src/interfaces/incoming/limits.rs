//! [`IncomingLimits`]: where HTTP services are served and the limits on their requests
//! (SPEC §10, "Incoming HTTP"); the defaults here, the operator's over them (`http-addr`,
//! `[incoming-http]`).

use std::net::SocketAddr;
use std::time::Duration;

use crate::config::IncomingHttpConfig;

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
    /// The longest a connection waits for a request's head (idle between requests, or a
    /// head sent slowly) before it is closed. Default 30 s.
    pub idle_timeout: Duration,
}

impl Default for IncomingLimits {
    fn default() -> Self {
        Self {
            addr: None,
            max_concurrent: 1000,
            request_timeout: Duration::from_secs(30),
            max_body_bytes: 10 << 20,
            max_header_bytes: 64 << 10,
            idle_timeout: Duration::from_secs(30),
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
            idle_timeout: file.idle_timeout.unwrap_or(self.idle_timeout),
        }
    }
}
