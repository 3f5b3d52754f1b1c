//! The text forms of settings: durations (`20s`, `1500ms`), addresses, names of a policy
//! (anything [`std::str::FromStr`]), and their serde glue for `vvm.toml`.

use std::net::SocketAddr;
use std::time::Duration;

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

/// Parses the address HTTP services are served on, `IP:PORT` (port 0: any free port).
///
/// # Errors
/// A message naming the setting and what is wrong with `text`.
pub fn parse_http_addr(text: &str) -> Result<SocketAddr, String> {
    let text = text.trim();
    text.parse()
        .map_err(|_| format!("http-addr {text:?} is not an IP:PORT address such as 0.0.0.0:8080"))
}

/// Parses the address a host's peers reach its HTTP listener at, `IP:PORT`: a concrete one
/// (not `0.0.0.0`, `::` or port 0), since other hosts connect to it.
///
/// # Errors
/// A message naming the setting and what is wrong with `text`.
pub fn parse_advertise_addr(text: &str) -> Result<SocketAddr, String> {
    let text = text.trim();
    let addr: SocketAddr = text.parse().map_err(|_| {
        format!("advertise-addr {text:?} is not an IP:PORT address such as 10.0.0.7:8080")
    })?;
    if addr.ip().is_unspecified() || addr.port() == 0 {
        return Err(format!(
            "advertise-addr {text:?} is not an address other hosts can connect to: \
             name this host's own IP and port, such as 10.0.0.7:8080"
        ));
    }
    Ok(addr)
}

/// The address a host advertises to its peers: `advertise`, or else `http_addr` when that is
/// concrete (not a wildcard, not port 0); `None` when neither is.
#[must_use]
pub fn advertised(
    advertise: Option<SocketAddr>,
    http_addr: Option<SocketAddr>,
) -> Option<SocketAddr> {
    advertise.or_else(|| http_addr.filter(|a| !a.ip().is_unspecified() && a.port() != 0))
}

pub(super) mod opt_advertise_addr {
    use std::net::SocketAddr;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
        let text = String::deserialize(d)?;
        super::parse_advertise_addr(&text)
            .map(Some)
            .map_err(serde::de::Error::custom)
    }
}

pub(super) mod opt_http_addr {
    use std::net::SocketAddr;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
        let text = String::deserialize(d)?;
        super::parse_http_addr(&text)
            .map(Some)
            .map_err(serde::de::Error::custom)
    }
}

pub(super) mod opt_addr {
    use std::net::SocketAddr;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
        let text = String::deserialize(d)?;
        super::parse_metrics_addr(&text)
            .map(Some)
            .map_err(serde::de::Error::custom)
    }
}

pub(super) mod opt_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let text = String::deserialize(d)?;
        super::parse_duration(&text)
            .map(Some)
            .map_err(serde::de::Error::custom)
    }
}

pub(super) mod opt_from_str {
    use std::fmt::Display;
    use std::str::FromStr;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
    where
        D: Deserializer<'de>,
        T: FromStr<Err: Display>,
    {
        let text = String::deserialize(d)?;
        text.parse().map(Some).map_err(serde::de::Error::custom)
    }
}
