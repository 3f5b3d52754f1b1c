//! The TLS side of [`super::Server::start_tls`]: a throw-away CA and a server certificate it
//! signed, for `localhost` and 127.0.0.1.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls::ServerConfig;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

/// A rustls server configuration with a fresh certificate, and the path of `dir/ca.pem`: the
/// certificate (PEM) of the CA that signed it, the one a client must trust.
pub(super) fn server_config(dir: &Path) -> (Arc<ServerConfig>, PathBuf) {
    let (ca_pem, cert, key) = issue(dir);
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("rustls protocol versions")
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], key)
        .expect("rustls server certificate");
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    (Arc::new(config), ca_pem)
}

/// PEM files of a fresh CA (`dir/ca.pem`) and of a certificate it signed for `localhost` and
/// 127.0.0.1 (`dir/server.pem`, key `dir/server-key.pem`), for a server other than this
/// crate's (a registry): `(ca, certificate, key)`.
pub fn server_files(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let (ca, cert, key) = issue(dir);
    let (cert_pem, key_pem) = (dir.join("server.pem"), dir.join("server-key.pem"));
    std::fs::write(&cert_pem, cert.pem()).expect("write the server certificate");
    std::fs::write(&key_pem, key.serialize_pem()).expect("write the server key");
    (ca, cert_pem, key_pem)
}

/// A fresh CA, written to `dir/ca.pem`, and a certificate it signed with its key.
fn issue(dir: &Path) -> (PathBuf, rcgen::Certificate, KeyPair) {
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "testkit HTTP test CA");
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().expect("CA key"))
        .expect("self-signed CA");
    let key = KeyPair::generate().expect("server key");
    let cert = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .expect("server certificate parameters")
        .signed_by(&key, &ca)
        .expect("server certificate signed by the CA");
    let ca_pem = dir.join("ca.pem");
    std::fs::write(&ca_pem, ca.pem()).unwrap_or_else(|e| panic!("write {}: {e}", ca_pem.display()));
    (ca_pem, cert, key)
}
