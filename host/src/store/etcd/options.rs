//! How to reach an etcd cluster: endpoints, key prefix, credentials, TLS and timeouts.

use std::path::PathBuf;
use std::time::Duration;

use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};

use crate::store::StoreError;

/// Where the etcd backend keeps its keys and how it talks to the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdOptions {
    /// Client endpoints as `host:port` (no scheme; `https` is used when [`Self::tls`] is set).
    pub endpoints: Vec<String>,
    /// Every key this store writes starts with this prefix (default `vvm/`), so several
    /// deployments can share one cluster.
    pub prefix: String,
    /// etcd user name, when the cluster has authentication enabled.
    pub user: Option<String>,
    /// Password of [`Self::user`].
    pub password: Option<String>,
    /// TLS settings; `None` talks plain HTTP/2.
    pub tls: Option<EtcdTls>,
    /// How long to wait for a TCP (and TLS) connection to an endpoint (default 3 s).
    pub connect_timeout: Duration,
    /// Upper bound for every request, so a dead or quorum-less cluster never blocks a caller
    /// longer than this (default 3 s). The operation then fails with a transient error.
    pub request_timeout: Duration,
}

/// TLS files for talking to etcd over `https`, all PEM encoded.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct EtcdTls {
    /// CA certificate that signed the servers' certificates; `None` trusts no extra CA.
    pub ca: Option<PathBuf>,
    /// Client certificate, for clusters that require client authentication (with `key`).
    pub cert: Option<PathBuf>,
    /// Private key of the client certificate.
    pub key: Option<PathBuf>,
}

/// Why an `etcd://` store address was refused. Each variant names the offending part.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum EtcdUrlError {
    /// The address does not start with `etcd://`.
    #[error("etcd store address {0:?} must start with \"etcd://\"")]
    Scheme(String),
    /// No endpoint between `etcd://` and the end (or the `/prefix`).
    #[error("etcd store address {0:?} names no endpoint: expected etcd://host:port[,host:port...]")]
    NoEndpoints(String),
    /// One endpoint is not `host:port`.
    #[error("etcd endpoint {endpoint:?} in {url:?}: {reason}")]
    Endpoint {
        /// The whole address.
        url: String,
        /// The endpoint that is wrong.
        endpoint: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl Default for EtcdOptions {
    fn default() -> Self {
        Self {
            endpoints: Vec::new(),
            prefix: "vvm/".to_owned(),
            user: None,
            password: None,
            tls: None,
            connect_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(3),
        }
    }
}

impl EtcdOptions {
    /// Parses `etcd://host:port[,host:port...][/prefix/]` into options with default prefix
    /// (unless one is given after the endpoints), no credentials and no TLS.
    ///
    /// Credentials and TLS are deliberately not part of the address, so it can be logged.
    ///
    /// # Errors
    /// An [`EtcdUrlError`] naming what is wrong with `url`.
    pub fn from_url(url: &str) -> Result<Self, EtcdUrlError> {
        let rest = url
            .strip_prefix("etcd://")
            .ok_or_else(|| EtcdUrlError::Scheme(url.to_owned()))?;
        let (hosts, prefix) = match rest.split_once('/') {
            Some((hosts, prefix)) if !prefix.is_empty() => (hosts, Some(prefix)),
            Some((hosts, _)) => (hosts, None),
            None => (rest, None),
        };
        if hosts.is_empty() {
            return Err(EtcdUrlError::NoEndpoints(url.to_owned()));
        }
        let endpoints = hosts
            .split(',')
            .map(|endpoint| {
                check_endpoint(endpoint)
                    .map(|()| endpoint.to_owned())
                    .map_err(|reason| EtcdUrlError::Endpoint {
                        url: url.to_owned(),
                        endpoint: endpoint.to_owned(),
                        reason,
                    })
            })
            .collect::<Result<_, _>>()?;
        let mut options = Self {
            endpoints,
            ..Self::default()
        };
        if let Some(prefix) = prefix {
            options.prefix = if prefix.ends_with('/') {
                prefix.to_owned()
            } else {
                format!("{prefix}/")
            };
        }
        Ok(options)
    }

    /// The endpoints joined by commas, for messages.
    pub(super) fn endpoint_list(&self) -> String {
        self.endpoints.join(",")
    }

    /// The etcd-client options these settings stand for; reads the TLS files.
    pub(super) fn connect_options(&self) -> Result<ConnectOptions, StoreError> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(self.connect_timeout)
            .with_timeout(self.request_timeout)
            // Detects a silently dead connection (e.g. a partitioned member) under a watch.
            // etcd answers pings more often than every 5 s with GOAWAY "too_many_pings".
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            // A member without a leader answers at once instead of serving a stale watch.
            .with_require_leader(true)
            // etcd's simple auth tokens expire after 5 minutes; log in again when they do.
            .with_auto_token_refresh(true);
        match (&self.user, &self.password) {
            (Some(user), password) => {
                options = options.with_user(user, password.clone().unwrap_or_default());
            }
            (None, Some(_)) => {
                return Err(StoreError::permanent(
                    format!("etcd {}", self.endpoint_list()),
                    "a password was given without a user name",
                ));
            }
            (None, None) => {}
        }
        if let Some(tls) = &self.tls {
            options = options.with_tls(self.tls_options(tls)?);
        }
        Ok(options)
    }

    fn tls_options(&self, tls: &EtcdTls) -> Result<TlsOptions, StoreError> {
        let read = |what: &str, path: &PathBuf| {
            crate::fs::read_file(path, crate::fs::MAX_SETTINGS_FILE_BYTES).map_err(|e| {
                StoreError::permanent(
                    format!(
                        "etcd {}: reading TLS {what} {}",
                        self.endpoint_list(),
                        path.display()
                    ),
                    e,
                )
            })
        };
        let mut options = TlsOptions::new();
        if let Some(ca) = &tls.ca {
            options = options.ca_certificate(Certificate::from_pem(read("CA certificate", ca)?));
        }
        match (&tls.cert, &tls.key) {
            (Some(cert), Some(key)) => {
                let identity =
                    Identity::from_pem(read("client certificate", cert)?, read("client key", key)?);
                options = options.identity(identity);
            }
            (None, None) => {}
            _ => {
                return Err(StoreError::permanent(
                    format!("etcd {}", self.endpoint_list()),
                    "a TLS client certificate and its key must be given together",
                ));
            }
        }
        Ok(options)
    }
}

/// Checks that `endpoint` is `host:port` with a non-empty host and a port in 1..=65535.
fn check_endpoint(endpoint: &str) -> Result<(), &'static str> {
    if endpoint.is_empty() {
        return Err("empty endpoint (stray comma?)");
    }
    if endpoint.contains("://") {
        return Err("give host:port without a scheme");
    }
    let Some((host, port)) = endpoint.rsplit_once(':') else {
        return Err("missing :port");
    };
    if host.is_empty() || host == "[]" {
        return Err("missing host before :port");
    }
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return Err("write an IPv6 host in brackets, e.g. [::1]:2379");
    }
    match port.parse::<u16>() {
        Ok(0) | Err(_) => Err("port must be a number from 1 to 65535"),
        Ok(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_endpoints_and_default_prefix() {
        let o = EtcdOptions::from_url("etcd://10.0.0.1:2379,[::1]:2380,etcd.local:1").unwrap();
        assert_eq!(o.endpoints, ["10.0.0.1:2379", "[::1]:2380", "etcd.local:1"]);
        assert_eq!(o.prefix, "vvm/");
        assert_eq!((o.user, o.password, o.tls), (None, None, None));
    }

    #[test]
    fn a_path_sets_the_prefix() {
        let o = EtcdOptions::from_url("etcd://h:1/team/a").unwrap();
        assert_eq!(o.prefix, "team/a/");
        assert_eq!(EtcdOptions::from_url("etcd://h:1/x/").unwrap().prefix, "x/");
        assert_eq!(EtcdOptions::from_url("etcd://h:1/").unwrap().prefix, "vvm/");
    }

    #[test]
    fn errors_name_the_bad_part() {
        let err = |url: &str| EtcdOptions::from_url(url).unwrap_err();
        assert_eq!(err("http://h:1"), EtcdUrlError::Scheme("http://h:1".into()));
        assert_eq!(err("etcd://"), EtcdUrlError::NoEndpoints("etcd://".into()));
        for (url, bad) in [
            ("etcd://h:1,,h:2", ""),
            ("etcd://h:1,h", "h"),
            ("etcd://h:1,:2", ":2"),
            ("etcd://h:0", "h:0"),
            ("etcd://h:99999", "h:99999"),
            ("etcd://h:x", "h:x"),
            ("etcd://::1:2379", "::1:2379"),
        ] {
            match err(url) {
                EtcdUrlError::Endpoint { endpoint, .. } => assert_eq!(endpoint, bad, "{url}"),
                other => panic!("{url}: {other:?}"),
            }
        }
        assert!(err("etcd://h:1,h").to_string().contains("\"h\""));
    }

    #[test]
    fn half_given_credentials_are_refused() {
        let o = EtcdOptions {
            endpoints: vec!["h:1".into()],
            password: Some("pw".into()),
            ..EtcdOptions::default()
        };
        assert!(!o.connect_options().unwrap_err().is_transient());
        let o = EtcdOptions {
            endpoints: vec!["h:1".into()],
            tls: Some(EtcdTls {
                cert: Some("c.pem".into()),
                ..EtcdTls::default()
            }),
            ..EtcdOptions::default()
        };
        assert!(!o.connect_options().unwrap_err().is_transient());
    }

    #[test]
    fn missing_tls_file_is_permanent_and_named() {
        let o = EtcdOptions {
            endpoints: vec!["h:1".into()],
            tls: Some(EtcdTls {
                ca: Some("/nonexistent/ca.pem".into()),
                ..EtcdTls::default()
            }),
            ..EtcdOptions::default()
        };
        let e = o.connect_options().unwrap_err();
        assert!(!e.is_transient());
        assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
    }
}
