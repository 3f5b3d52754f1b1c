//! Pulling a registry source (SPEC §13, "Components by digest"): a tag resolved to its
//! digest, the manifest and the component layer fetched, each verified against its digest,
//! bounded in size and time, and kept in the content-addressed cache (`blobs`). A pinned
//! digest already cached is taken from there without a request.
//!
//! Each pull runs on a runtime of its own (one thread, made for the pull), so a slow or
//! hostile registry costs the host's async workers nothing, and a panic in the client is an
//! error of that one service.

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use oci_client::{Client, RegistryOperation};
use tokio::io::AsyncWrite;

use super::auth::credentials;
use super::blobs::{BlobCache, sha256_digest};
use super::reference::{SourceRef, valid_digest};

/// The largest manifest taken, 4 MiB: what distribution itself accepts on a push.
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;
/// The default longest whole pull (every attempt, and the waits between them).
pub const DEFAULT_PULL_TIMEOUT: Duration = Duration::from_mins(5);
/// How many times a pull is tried when the registry cannot be reached or fails (5xx).
const ATTEMPTS: u32 = 3;
/// The wait before the second attempt; doubled before each later one.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// The longest a connection may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest wait for the next bytes of a response.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How registries are reached: host-wide settings (`insecure-registries`, `registry-ca-file`,
/// `pull-timeout`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegistryOptions {
    /// Registries (`host:port`, as in the reference) reached over plain HTTP; every other
    /// one over HTTPS.
    pub insecure: Vec<String>,
    /// A PEM file of CA certificates trusted beside the system's, for a private registry.
    pub ca_file: Option<PathBuf>,
    /// The longest whole pull.
    pub timeout: Duration,
    /// The largest component layer taken.
    pub max_blob_bytes: u64,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        Self {
            insecure: Vec::new(),
            ca_file: None,
            timeout: DEFAULT_PULL_TIMEOUT,
            max_blob_bytes: 256 << 20,
        }
    }
}

/// A component pulled (or taken from the cache).
#[derive(Clone, Debug)]
pub struct Pulled {
    /// The reference pinned to the manifest digest that was pulled.
    pub reference: SourceRef,
    /// The component's bytes (the layer).
    pub bytes: Vec<u8>,
    /// Whether it came from the cache, with no request.
    pub from_cache: bool,
}

/// Why a registry source could not be pulled. Messages name the reference and the reason;
/// no credential is ever part of one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PullError {
    /// The registry could not be reached (refused, unresolved, TLS, timed out reading).
    #[error("registry {registry} unreachable: {reason}")]
    Unreachable {
        /// `host:port`.
        registry: String,
        /// What the connection said.
        reason: String,
    },
    /// The registry wants credentials it was not given, or refused them (401, 403).
    #[error("registry {registry} refused access ({status}){hint}")]
    Unauthorized {
        /// `host:port`.
        registry: String,
        /// `401 Unauthorized` or `403 Denied`.
        status: &'static str,
        /// What to do.
        hint: &'static str,
    },
    /// No manifest or blob by that name.
    #[error("not found in the registry ({what})")]
    NotFound {
        /// What was missing, as the registry says.
        what: String,
    },
    /// Bytes received that do not hash to the digest they were asked by.
    #[error(
        "{what} does not match its digest: expected {expected}, received bytes hash to {actual}"
    )]
    DigestMismatch {
        /// `manifest` or `component layer`.
        what: &'static str,
        /// The digest asked for.
        expected: String,
        /// What the bytes hash to.
        actual: String,
    },
    /// The artifact is not a CNCF Wasm component.
    #[error("{digest} is not a Wasm component: {reason}")]
    NotAComponent {
        /// The manifest digest it resolved to.
        digest: String,
        /// What it is instead.
        reason: String,
    },
    /// The registry's TLS certificate is not one the host trusts.
    #[error("registry {registry}: its TLS certificate is not trusted: {reason}")]
    Untrusted {
        /// `host:port`.
        registry: String,
        /// What the TLS client said.
        reason: String,
    },
    /// A manifest or layer over its cap.
    #[error("{what} is {size} bytes, over the cap of {cap}")]
    TooLarge {
        /// `manifest` or `component layer`.
        what: &'static str,
        /// Its size (as declared, or as far as it was read).
        size: u64,
        /// The cap.
        cap: u64,
    },
    /// The whole pull took longer than `pull-timeout`.
    #[error("pull not done within {}", humantime::format_duration(*.0))]
    Timeout(Duration),
    /// Any other answer of the registry.
    #[error("registry {registry}: {reason}")]
    Registry {
        /// `host:port`.
        registry: String,
        /// What it answered.
        reason: String,
    },
    /// The CA file could not be read, or the client could not be set up.
    #[error("registry client: {0}")]
    Setup(String),
    /// The host is stopping: the pull was given up.
    #[error("given up: the host is stopping")]
    Stopped,
    /// The cache could not be written.
    #[error("component cache {path}: {source}")]
    Cache {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

impl PullError {
    /// What to do about it, where there is more to say than the error does.
    pub fn help(&self) -> Option<&'static str> {
        match self {
            Self::Unreachable { .. } | Self::Timeout(_) => Some(
                "check the registry's address and that it runs; a registry served over plain \
                 HTTP must be listed in insecure-registries, and one with a private CA needs \
                 registry-ca-file; a digest pulled once starts from the cache with the \
                 registry down",
            ),
            Self::Untrusted { .. } => Some(
                "give the CA that signed the registry's certificate as registry-ca-file (a \
                 PEM file), or list a registry without TLS in insecure-registries",
            ),
            Self::Unauthorized { .. } => Some(
                "log in with `docker login REGISTRY` (Docker's config.json or a credential \
                 helper), as the user vvm-host runs as",
            ),
            Self::NotAComponent { .. } => Some(
                "push a component in the CNCF Wasm layout: `vvm-host push FILE.wasm REF`, \
                 `wkg oci push` or `oras push` with the media types in docs/operations.md",
            ),
            Self::DigestMismatch { .. } => Some(
                "the registry served other bytes than the digest names: nothing was cached; \
                 check the registry, or the digest pinned",
            ),
            _ => None,
        }
    }

    /// Whether another attempt may succeed: the registry was unreachable or failed (5xx).
    fn is_transient(&self) -> bool {
        matches!(self, Self::Unreachable { .. })
            || matches!(self, Self::Registry { reason, .. } if reason.starts_with("server error 5"))
    }
}

/// Whether the host is stopping: a pull in progress then ends at once.
pub type StopFn = Arc<dyn Fn() -> bool + Send + Sync>;

/// How often a pull looks at its [`StopFn`].
const STOP_CHECK: Duration = Duration::from_millis(50);

/// Pulls registry sources into a cache.
#[derive(Clone)]
pub struct Puller {
    options: RegistryOptions,
    cache: BlobCache,
    stop: Option<StopFn>,
}

impl std::fmt::Debug for Puller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Puller")
            .field("options", &self.options)
            .field("cache", &self.cache)
            .finish_non_exhaustive()
    }
}

impl Puller {
    /// A puller keeping what it pulls in `cache`.
    pub fn new(options: RegistryOptions, cache: BlobCache) -> Self {
        Self {
            options,
            cache,
            stop: None,
        }
    }

    /// The same puller, giving up a pull (as [`PullError::Stopped`]) once `stop` says so: a
    /// host told to stop does not wait out a slow registry.
    #[must_use]
    pub fn until(self, stop: StopFn) -> Self {
        Self {
            stop: Some(stop),
            ..self
        }
    }

    /// The component `source` names: from the cache when pinned there, else from the
    /// registry (a tag resolved to its digest first), verified and then cached. Blocks, on a
    /// runtime of its own, for at most the pull timeout: never call it on an async worker.
    ///
    /// # Errors
    /// As [`PullError`] says; nothing is cached then.
    pub fn pull(&self, source: &SourceRef) -> Result<Pulled, PullError> {
        if let Some(pulled) = source
            .digest
            .as_deref()
            .and_then(|d| self.cached(source, d))
        {
            return Ok(pulled);
        }
        let (this, source) = (self.clone(), source.clone());
        let timeout = self.options.timeout;
        let stop = self.stop.clone();
        on_own_runtime(async move {
            let pull = tokio::time::timeout(timeout, this.attempts(&source));
            tokio::select! {
                pulled = pull => pulled.unwrap_or(Err(PullError::Timeout(timeout))),
                () = stopped(stop) => Err(PullError::Stopped),
            }
        })
    }

    /// The component of manifest `digest` from the cache, if both are there and match.
    fn cached(&self, source: &SourceRef, digest: &str) -> Option<Pulled> {
        let manifest = self.cache.get(digest, MAX_MANIFEST_BYTES)?;
        let manifest: OciImageManifest = serde_json::from_slice(&manifest).ok()?;
        let layer = component_layer(&manifest).ok()?;
        let bytes = self.cache.get(&layer.digest, self.options.max_blob_bytes)?;
        Some(Pulled {
            reference: source.pinned(digest),
            bytes,
            from_cache: true,
        })
    }

    /// Tries the pull up to [`ATTEMPTS`] times while it fails for a reason that may pass,
    /// waiting [`FIRST_BACKOFF`], then twice as long, between attempts.
    async fn attempts(&self, source: &SourceRef) -> Result<Pulled, PullError> {
        let mut backoff = FIRST_BACKOFF;
        let mut attempt = 1;
        loop {
            match self.once(source).await {
                Err(e) if e.is_transient() && attempt < ATTEMPTS => {
                    tracing::warn!(source = %source, attempt, error = %e, retry_in = ?backoff, "pull failed; trying again");
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                    attempt += 1;
                }
                done => return done,
            }
        }
    }

    /// One attempt: resolve, fetch and verify the manifest, then the layer; cache both.
    async fn once(&self, source: &SourceRef) -> Result<Pulled, PullError> {
        let fail = |e| classify(&source.registry, e);
        let client = client(&self.options)?;
        let auth = credentials(&source.registry);
        let reference = source.oci();
        client
            .auth(&reference, &auth, RegistryOperation::Pull)
            .await
            .map_err(fail)?;
        let digest = if let Some(digest) = &source.digest {
            digest.clone()
        } else {
            let digest = client
                .fetch_manifest_digest(&reference, &auth)
                .await
                .map_err(fail)?;
            if !valid_digest(&digest) {
                return Err(PullError::Registry {
                    registry: source.registry.clone(),
                    reason: format!("{source} resolves to {digest:?}, not a sha256 digest"),
                });
            }
            if let Some(pulled) = self.cached(source, &digest) {
                return Ok(pulled);
            }
            digest
        };
        let reference = reference.clone_with_digest(digest.clone());
        let pinned = source.pinned(&digest);
        let accept = [oci_client::manifest::OCI_IMAGE_MEDIA_TYPE];
        let (manifest, _) = client
            .pull_manifest_raw(&reference, &auth, &accept)
            .await
            .map_err(fail)?;
        let layer = checked_manifest(&manifest, &digest)?;
        let bytes = self.layer(&client, &reference, &layer, source).await?;
        let cache_err = |source| PullError::Cache {
            path: self.cache.dir().to_owned(),
            source,
        };
        self.cache.put(&bytes).map_err(cache_err)?;
        self.cache.put(&manifest).map_err(cache_err)?;
        Ok(Pulled {
            reference: pinned,
            bytes,
            from_cache: false,
        })
    }

    /// The component layer `layer`, at most the cap, and verified.
    async fn layer(
        &self,
        client: &Client,
        reference: &oci_client::Reference,
        layer: &OciDescriptor,
        source: &SourceRef,
    ) -> Result<Vec<u8>, PullError> {
        let cap = self.options.max_blob_bytes;
        let too_large = |size| PullError::TooLarge {
            what: "component layer",
            size,
            cap,
        };
        let declared = u64::try_from(layer.size).unwrap_or(0);
        if declared > cap {
            return Err(too_large(declared));
        }
        let mut out = Capped {
            bytes: Vec::new(),
            cap,
        };
        client
            .pull_blob(reference, layer.digest.as_str(), &mut out)
            .await
            .map_err(|e| match e {
                OciDistributionError::IoError(io)
                    if io.kind() == std::io::ErrorKind::FileTooLarge =>
                {
                    too_large(cap + 1)
                }
                OciDistributionError::DigestError(
                    oci_client::errors::DigestError::VerificationError { expected, actual },
                ) => PullError::DigestMismatch {
                    what: "component layer",
                    expected,
                    actual,
                },
                e => classify(&source.registry, e),
            })?;
        // oci-client checked the bytes against the digest; checked again here, so that what
        // is cached under a digest is known to hash to it whatever the client does.
        let actual = sha256_digest(&out.bytes);
        if actual != layer.digest {
            return Err(PullError::DigestMismatch {
                what: "component layer",
                expected: layer.digest.clone(),
                actual,
            });
        }
        Ok(out.bytes)
    }
}

/// The component layer of `manifest` (the bytes of manifest `digest`): checked against the
/// cap and the digest, and as a CNCF Wasm artifact.
fn checked_manifest(manifest: &[u8], digest: &str) -> Result<OciDescriptor, PullError> {
    let size = manifest.len() as u64;
    if size > MAX_MANIFEST_BYTES {
        return Err(PullError::TooLarge {
            what: "manifest",
            size,
            cap: MAX_MANIFEST_BYTES,
        });
    }
    let actual = sha256_digest(manifest);
    if actual != digest {
        return Err(PullError::DigestMismatch {
            what: "manifest",
            expected: digest.to_owned(),
            actual,
        });
    }
    let not_component = |reason: String| PullError::NotAComponent {
        digest: digest.to_owned(),
        reason,
    };
    let manifest: OciImageManifest = serde_json::from_slice(manifest)
        .map_err(|e| not_component(format!("its manifest is not an OCI image manifest: {e}")))?;
    component_layer(&manifest).cloned().map_err(not_component)
}

/// Resolves once `stop` says the host is stopping; never without one.
async fn stopped(stop: Option<StopFn>) {
    let Some(stop) = stop else {
        return std::future::pending().await;
    };
    while !stop() {
        tokio::time::sleep(STOP_CHECK).await;
    }
}

/// Runs `work` to its end on a runtime of its own, on a thread of its own (so that it may be
/// called from anywhere, an async worker included, and blocks only its caller); a panic in
/// it is an error, not the caller's.
pub(crate) fn on_own_runtime<T: Send + 'static>(
    work: impl Future<Output = Result<T, PullError>> + Send + 'static,
) -> Result<T, PullError> {
    let thread = std::thread::Builder::new()
        .name("vvm-registry".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| PullError::Setup(format!("runtime: {e}")))?;
            runtime.block_on(async move {
                tokio::spawn(work).await.unwrap_or_else(|e| {
                    Err(PullError::Setup(format!("the registry client failed: {e}")))
                })
            })
        })
        .map_err(|e| PullError::Setup(format!("thread: {e}")))?;
    thread.join().unwrap_or_else(|_| {
        Err(PullError::Setup(
            "the registry client's thread failed".into(),
        ))
    })
}

/// The one `application/wasm` layer of a CNCF Wasm artifact, or what the manifest is instead.
fn component_layer(
    manifest: &OciImageManifest,
) -> Result<&oci_client::manifest::OciDescriptor, String> {
    if manifest.config.media_type != oci_wasm::WASM_MANIFEST_CONFIG_MEDIA_TYPE {
        return Err(format!(
            "its config is {:?}, not {:?} (push it with `vvm-host push`, wkg or oras)",
            manifest.config.media_type,
            oci_wasm::WASM_MANIFEST_CONFIG_MEDIA_TYPE
        ));
    }
    match manifest.layers.as_slice() {
        [layer]
            if layer.media_type == oci_wasm::WASM_LAYER_MEDIA_TYPE
                && valid_digest(&layer.digest) =>
        {
            Ok(layer)
        }
        [layer] if layer.media_type == oci_wasm::WASM_LAYER_MEDIA_TYPE => Err(format!(
            "its layer's digest {:?} is not sha256",
            layer.digest
        )),
        [layer] => Err(format!(
            "its layer is {:?}, not {:?}",
            layer.media_type,
            oci_wasm::WASM_LAYER_MEDIA_TYPE
        )),
        layers => Err(format!("it has {} layers, not one", layers.len())),
    }
}

/// The client for one pull or push, set up as `options` say.
pub(crate) fn client(options: &RegistryOptions) -> Result<Client, PullError> {
    // reqwest takes rustls's process-wide provider; the host's is ring. Installing it again
    // is refused harmlessly.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut extra_root_certificates = Vec::new();
    if let Some(path) = &options.ca_file {
        let data = crate::fs::read_file(path, 1 << 20)
            .map_err(|e| PullError::Setup(format!("CA file {}: {e}", path.display())))?;
        extra_root_certificates.push(Certificate {
            encoding: CertificateEncoding::Pem,
            data,
        });
    }
    let config = ClientConfig {
        protocol: ClientProtocol::HttpsExcept(options.insecure.clone()),
        extra_root_certificates,
        connect_timeout: Some(CONNECT_TIMEOUT),
        read_timeout: Some(READ_TIMEOUT),
        user_agent: concat!("vvm-host/", env!("CARGO_PKG_VERSION")),
        ..ClientConfig::default()
    };
    Client::try_from(config).map_err(|e| PullError::Setup(e.to_string()))
}

/// oci-client's error `e`, from `registry`, as a user reads it.
pub(crate) fn classify(registry: &str, e: OciDistributionError) -> PullError {
    let registry = registry.to_owned();
    let not_found = |what: String| PullError::NotFound { what };
    let unauthorized = |status| PullError::Unauthorized {
        registry: registry.clone(),
        status,
        hint: "; give credentials with `docker login` (Docker's config.json or a credential helper)",
    };
    match e {
        OciDistributionError::UnauthorizedError { .. }
        | OciDistributionError::AuthenticationFailure(_)
        | OciDistributionError::ServerError { code: 401, .. } => unauthorized("401 Unauthorized"),
        OciDistributionError::RegistryError { envelope, .. } => {
            let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|e| &e.code).collect();
            if codes
                .iter()
                .any(|c| matches!(c, OciErrorCode::Unauthorized))
            {
                unauthorized("401 Unauthorized")
            } else if codes.iter().any(|c| matches!(c, OciErrorCode::Denied)) {
                unauthorized("403 Denied")
            } else if codes.iter().any(|c| {
                matches!(
                    c,
                    OciErrorCode::ManifestUnknown
                        | OciErrorCode::BlobUnknown
                        | OciErrorCode::NameUnknown
                        | OciErrorCode::NotFound
                )
            }) {
                not_found(
                    envelope
                        .errors
                        .iter()
                        .map(|e| e.message.as_str())
                        .collect::<Vec<_>>()
                        .join("; "),
                )
            } else {
                PullError::Registry {
                    registry,
                    reason: envelope.to_string(),
                }
            }
        }
        OciDistributionError::ImageManifestNotFoundError(what) => not_found(what),
        OciDistributionError::ServerError { code: 403, .. } => unauthorized("403 Denied"),
        OciDistributionError::ServerError { code: 404, .. } => not_found("404".into()),
        OciDistributionError::ServerError { code, message, .. } => PullError::Registry {
            registry,
            reason: format!("server error {code}: {}", one_line(&message)),
        },
        OciDistributionError::DigestError(oci_client::errors::DigestError::VerificationError {
            expected,
            actual,
        }) => PullError::DigestMismatch {
            what: "manifest or layer",
            expected,
            actual,
        },
        OciDistributionError::RequestError(e) => match e.status().map(|s| s.as_u16()) {
            Some(401) => unauthorized("401 Unauthorized"),
            Some(403) => unauthorized("403 Denied"),
            Some(404) => not_found("404".into()),
            Some(code) => PullError::Registry {
                registry,
                reason: format!("server error {code}"),
            },
            // No retry helps a certificate the host does not trust.
            None if error_chain(&e).contains("certificate") => PullError::Untrusted {
                registry,
                reason: error_chain(&e),
            },
            None => PullError::Unreachable {
                registry,
                reason: error_chain(&e),
            },
        },
        OciDistributionError::IoError(e) => PullError::Unreachable {
            registry,
            reason: e.to_string(),
        },
        e => PullError::Registry {
            registry,
            reason: one_line(&e.to_string()),
        },
    }
}

/// `e` and its sources, `: `-joined (reqwest's own message is only "error sending request").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    one_line(&text)
}

/// `text` on one line, cut to 300 characters: a registry's answer may be a page of HTML.
fn one_line(text: &str) -> String {
    let line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(300)
        .collect();
    line.trim().to_owned()
}

/// A writer into memory that fails once more than `cap` bytes come, so an endless or lying
/// registry stops at the cap.
struct Capped {
    bytes: Vec<u8>,
    cap: u64,
}

impl AsyncWrite for Capped {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if (self.bytes.len() + buf.len()) as u64 > self.cap {
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::FileTooLarge,
                "over the cap",
            )));
        }
        self.bytes.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(config: &str, layers: &[(&str, &str)]) -> Vec<u8> {
        let layers: Vec<serde_json::Value> = layers
            .iter()
            .map(|(media_type, digest)| {
                serde_json::json!({"mediaType": media_type, "digest": digest, "size": 3})
            })
            .collect();
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": config, "digest": sha256_digest(b"{}"), "size": 2},
            "layers": layers,
        }))
        .unwrap()
    }

    #[test]
    fn only_a_cncf_wasm_artifact_with_one_component_layer_is_taken() {
        let wasm = sha256_digest(b"abc");
        let config = oci_wasm::WASM_MANIFEST_CONFIG_MEDIA_TYPE;
        let good = manifest(config, &[("application/wasm", &wasm)]);
        let layer = checked_manifest(&good, &sha256_digest(&good)).unwrap();
        assert_eq!(layer.digest, wasm);
        for (bad, says) in [
            (
                manifest(
                    "application/vnd.oci.image.config.v1+json",
                    &[("application/wasm", &wasm)],
                ),
                "its config is",
            ),
            (
                manifest(config, &[("application/vnd.oci.image.layer.v1.tar", &wasm)]),
                "its layer is",
            ),
            (manifest(config, &[]), "0 layers"),
            (
                manifest(config, &[("application/wasm", "sha512:00")]),
                "not sha256",
            ),
            (b"not json".to_vec(), "not an OCI image manifest"),
        ] {
            let err = checked_manifest(&bad, &sha256_digest(&bad)).unwrap_err();
            assert!(matches!(err, PullError::NotAComponent { .. }), "{err}");
            assert!(err.to_string().contains(says), "{err}");
        }
    }

    #[test]
    fn a_manifest_that_does_not_hash_to_its_digest_or_is_too_large_is_refused() {
        let good = manifest(oci_wasm::WASM_MANIFEST_CONFIG_MEDIA_TYPE, &[]);
        let other = sha256_digest(b"other");
        let err = checked_manifest(&good, &other).unwrap_err();
        assert!(
            matches!(
                err,
                PullError::DigestMismatch {
                    what: "manifest",
                    ..
                }
            ),
            "{err}"
        );
        let huge = vec![b' '; usize::try_from(MAX_MANIFEST_BYTES).unwrap() + 1];
        let err = checked_manifest(&huge, &sha256_digest(&huge)).unwrap_err();
        assert!(
            matches!(
                err,
                PullError::TooLarge {
                    what: "manifest",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[tokio::test]
    async fn the_layer_writer_stops_at_the_cap() {
        use tokio::io::AsyncWriteExt as _;
        let mut out = Capped {
            bytes: Vec::new(),
            cap: 4,
        };
        out.write_all(b"abcd").await.unwrap();
        let err = out.write_all(b"e").await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::FileTooLarge);
        assert_eq!(out.bytes, b"abcd");
    }

    #[test]
    fn registry_answers_are_named_for_a_user_and_only_failures_that_may_pass_are_retried() {
        let r = "127.0.0.1:5000";
        let e = classify(
            r,
            OciDistributionError::UnauthorizedError { url: "u".into() },
        );
        assert!(
            matches!(e, PullError::Unauthorized { .. }) && !e.is_transient(),
            "{e}"
        );
        assert!(e.to_string().contains("docker login"), "{e}");
        let server = |code| OciDistributionError::ServerError {
            code,
            url: "u".into(),
            message: "<html>\nbusy</html>".into(),
        };
        assert!(matches!(
            classify(r, server(404)),
            PullError::NotFound { .. }
        ));
        assert!(matches!(
            classify(r, server(403)),
            PullError::Unauthorized { .. }
        ));
        let busy = classify(r, server(503));
        assert!(busy.is_transient(), "{busy}");
        assert!(!busy.to_string().contains('\n'), "{busy}");
        assert!(!classify(r, server(400)).is_transient());
        let unreachable = PullError::Unreachable {
            registry: r.into(),
            reason: "refused".into(),
        };
        assert!(unreachable.is_transient());
    }

    #[test]
    fn a_pull_is_given_up_once_the_host_stops() {
        // A listener that accepts and never answers: the pull would wait for its timeout.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = silent.local_addr().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let options = RegistryOptions {
            insecure: vec![addr.to_string()],
            ..RegistryOptions::default()
        };
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let puller =
            Puller::new(options, BlobCache::beside(tmp.path())).until(Arc::new(move || {
                flag.load(std::sync::atomic::Ordering::Relaxed)
            }));
        let source: SourceRef = format!("oci://{addr}/hello:v1").parse().unwrap();
        let pulling = std::thread::spawn(move || puller.pull(&source));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let err = pulling.join().unwrap().unwrap_err();
        assert!(matches!(err, PullError::Stopped), "{err}");
        drop(silent);
    }

    #[test]
    fn an_unreachable_registry_is_tried_three_times_and_then_named() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        // A registry that hangs up on every connection.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        std::thread::spawn({
            let accepted = Arc::clone(&accepted);
            move || {
                for stream in listener.incoming() {
                    accepted.fetch_add(1, Ordering::SeqCst);
                    drop(stream);
                }
            }
        });
        let tmp = tempfile::tempdir().unwrap();
        let options = RegistryOptions {
            insecure: vec![addr.to_string()],
            ..RegistryOptions::default()
        };
        let puller = Puller::new(options, BlobCache::beside(tmp.path()));
        let source: SourceRef = format!("oci://{addr}/hello:v1").parse().unwrap();
        let err = puller.pull(&source).unwrap_err();
        assert!(matches!(err, PullError::Unreachable { .. }), "{err}");
        assert!(err.to_string().contains(&addr.to_string()), "{err}");
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            usize::try_from(ATTEMPTS).unwrap()
        );
    }

    #[test]
    fn a_pinned_digest_in_the_cache_is_taken_without_a_request() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = BlobCache::beside(tmp.path());
        let wasm = cache.put(b"\0asm component").unwrap();
        let config = oci_wasm::WASM_MANIFEST_CONFIG_MEDIA_TYPE;
        let m = cache
            .put(&manifest(config, &[("application/wasm", &wasm)]))
            .unwrap();
        // No registry listens on this address: a request would fail.
        let source: SourceRef = format!("oci://127.0.0.1:9/hello@{m}").parse().unwrap();
        let puller = Puller::new(RegistryOptions::default(), cache);
        let pulled = puller.pull(&source).unwrap();
        assert!(pulled.from_cache);
        assert_eq!(pulled.bytes, b"\0asm component");
        assert_eq!(pulled.reference, source);
    }
}
