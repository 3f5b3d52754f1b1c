//! The connection of an outgoing request (SPEC §10): name lookup, the address guard, TCP and
//! TLS. Our own rather than `wasmtime-wasi-http`'s `default_send_request`, which connects to
//! whatever a name resolves to: here a name that an allow-list wildcard let through may not
//! resolve to loopback, link-local or unspecified addresses (SSRF, DNS rebinding), and TLS
//! trusts a service's own CA beside the web PKI roots.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use wasmtime_wasi_http::Error;

/// A connection's byte stream: TCP, or TLS over TCP.
pub(super) trait Stream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Stream for T {}

/// Where a request goes, from its URL.
#[derive(Clone, Debug)]
pub(super) struct Target {
    pub https: bool,
    /// As the URL names it (an IPv6 address without brackets).
    pub host: String,
    pub port: u16,
}

/// Whether a request to an address that a wildcard entry let through must be refused:
/// loopback, link-local (the cloud metadata address 169.254.169.254 among them), unspecified
/// and `0.0.0.0/8` (which Linux connects to loopback), also as IPv4-mapped IPv6; and the
/// cloud metadata addresses outside those ranges (AWS's IPv6 `fd00:ec2::254`, Alibaba's
/// `100.100.100.200`).
pub(super) fn is_guarded(ip: IpAddr) -> bool {
    const METADATA_V4: std::net::Ipv4Addr = std::net::Ipv4Addr::new(100, 100, 100, 200);
    const METADATA_V6: std::net::Ipv6Addr =
        std::net::Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);
    match ip.to_canonical() {
        IpAddr::V4(a) => {
            a.is_loopback() || a.is_link_local() || a.octets()[0] == 0 || a == METADATA_V4
        }
        IpAddr::V6(a) => {
            a.is_loopback()
                || a.is_unspecified()
                || (a.segments()[0] & 0xffc0) == 0xfe80
                || a == METADATA_V6
        }
    }
}

/// The addresses `target` may be reached at: its IP, or what its name resolves to; with
/// `literal` false, without the guarded ones ([`is_guarded`]).
///
/// # Errors
/// The name does not resolve ([`Error::DnsError`]), or resolves to guarded addresses only
/// ([`Error::DestinationIpProhibited`]).
pub(super) async fn resolve(target: &Target, literal: bool) -> Result<Vec<SocketAddr>, Error> {
    let addrs: Vec<SocketAddr> = match target.host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, target.port)],
        Err(_) => tokio::net::lookup_host((target.host.as_str(), target.port))
            .await
            .map_err(|e| Error::DnsError {
                rcode: Some(e.to_string()),
                info_code: None,
            })?
            .collect(),
    };
    if addrs.is_empty() {
        return Err(Error::DestinationNotFound);
    }
    if literal {
        return Ok(addrs);
    }
    let allowed: Vec<SocketAddr> = addrs
        .iter()
        .copied()
        .filter(|a| !is_guarded(a.ip()))
        .collect();
    if allowed.is_empty() {
        return Err(Error::DestinationIpProhibited);
    }
    Ok(allowed)
}

/// Connects to the first of `addrs` that answers, then, for https, makes TLS with `tls`.
///
/// # Errors
/// The last address's connect error, or the TLS handshake's.
pub(super) async fn connect(
    target: &Target,
    addrs: &[SocketAddr],
    tls: &Arc<rustls::ClientConfig>,
) -> Result<Box<dyn Stream>, Error> {
    let mut last = None;
    let mut tcp = None;
    for addr in addrs {
        match TcpStream::connect(addr).await {
            Ok(stream) => {
                tcp = Some(stream);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let Some(tcp) = tcp else {
        return Err(last.map_or(Error::DestinationNotFound, Error::Connect));
    };
    // Requests are small and latency counts: no Nagle delay.
    let _ = tcp.set_nodelay(true);
    if !target.https {
        return Ok(Box::new(tcp));
    }
    let name = match target.host.parse::<IpAddr>() {
        Ok(ip) => ServerName::from(ip),
        Err(_) => ServerName::try_from(target.host.clone()).map_err(|_| Error::TlsProtocolError)?,
    };
    let stream = tokio_rustls::TlsConnector::from(Arc::clone(tls))
        .connect(name, tcp)
        .await
        .map_err(Error::Tls)?;
    Ok(Box::new(stream))
}

/// The TLS configuration of a service: the bundled web PKI roots, and with an `http-ca`
/// every certificate in that PEM file.
///
/// # Errors
/// Naming the file and why it cannot serve as a CA.
pub(super) fn tls_config(ca: Option<&Path>) -> Result<Arc<rustls::ClientConfig>, String> {
    let Some(ca) = ca else {
        return client_config(Vec::new()).map(Arc::new);
    };
    let bytes = crate::fs::read_file(ca, 1 << 20).map_err(|e| format!("{}: {e}", ca.display()))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: not PEM certificates: {e}", ca.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: holds no PEM certificate", ca.display()));
    }
    client_config(certs)
        .map(Arc::new)
        .map_err(|e| format!("{}: {e}", ca.display()))
}

fn client_config(extra: Vec<CertificateDer<'static>>) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    for cert in extra {
        roots
            .add(cert)
            .map_err(|e| format!("not a CA certificate: {e}"))?;
    }
    // The provider named, not the process default: nothing else in the process decides it.
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The guard refuses loopback, link-local (the metadata address among them),
    /// unspecified and IPv4-mapped forms of them; private and public addresses pass.
    #[test]
    fn the_guard_refuses_loopback_link_local_and_unspecified() {
        for ip in [
            "127.0.0.1",
            "127.8.9.10",
            "169.254.169.254",
            "0.0.0.0",
            "0.1.2.3",
            "::1",
            "::",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "fd00:ec2::254",
            "100.100.100.200",
        ] {
            assert!(is_guarded(ip.parse().unwrap()), "{ip}");
        }
        for ip in [
            "10.0.0.1",
            "192.168.1.1",
            "8.8.8.8",
            "2001:db8::1",
            "fd00::1",
        ] {
            assert!(!is_guarded(ip.parse().unwrap()), "{ip}");
        }
    }

    /// A name a wildcard let through that resolves to loopback only is refused; named
    /// literally it may go.
    #[tokio::test]
    async fn a_name_resolving_to_loopback_passes_only_when_named_literally() {
        let target = Target {
            https: false,
            host: "localhost".into(),
            port: 8080,
        };
        assert!(matches!(
            resolve(&target, false).await,
            Err(Error::DestinationIpProhibited)
        ));
        let addrs = resolve(&target, true).await.unwrap();
        assert!(addrs.iter().all(|a| a.ip().is_loopback()), "{addrs:?}");
    }

    /// A CA file that is missing, empty or not PEM is refused naming the file.
    #[test]
    fn a_bad_ca_file_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(
            &junk,
            "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        for path in [dir.path().join("missing.pem"), empty, junk] {
            let e = tls_config(Some(&path)).unwrap_err();
            assert!(e.contains(&*path.to_string_lossy()), "{e}");
        }
    }
}
