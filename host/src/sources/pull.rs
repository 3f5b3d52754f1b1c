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
use oci_client::errors::OciDistributionError;
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use oci_client::{Client, RegistryOperation};
use tokio::io::AsyncWrite;

use super::auth::credentials;
use super::blobs::{BlobCache, sha256_digest};
use super::error::{PullError, classify};
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
mod tests;
