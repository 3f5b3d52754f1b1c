//! `vvm-host push FILE.wasm REF` (SPEC §13): a component written to a registry in the CNCF
//! Wasm layout (oci-wasm: config `application/vnd.wasm.config.v0+json`, one
//! `application/wasm` layer), and the digest to pin. The config's `created` is the Unix
//! epoch, so pushing the same file twice gives the same digest.

use std::path::{Path, PathBuf};

use oci_client::RegistryOperation;
use oci_client::errors::OciDistributionError;
use oci_wasm::{WasmClient, WasmConfig};

use super::auth::credentials;
use super::error::{PullError, classify};
use super::pull::{RegistryOptions, client, on_own_runtime};
use super::reference::{SourceRef, valid_digest};

/// Why a push failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PushError {
    /// The file could not be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: crate::fs::FileError,
    },
    /// The file is not a WebAssembly component.
    #[error("{}: not a Wasm component: {reason}", path.display())]
    NotAComponent {
        /// The file.
        path: PathBuf,
        /// What the decoder said.
        reason: String,
    },
    /// A push names a tag to write; a digest is what the registry gives back.
    #[error("{0}: a push needs a tag (oci://REGISTRY/REPOSITORY:TAG), not a digest")]
    NoTag(String),
    /// The registry refused or could not be reached.
    #[error(transparent)]
    Registry(#[from] PullError),
}

/// Pushes component file `path` to `target` (which names a tag) and returns the reference
/// pinned to the manifest's digest. Blocks, on a runtime of its own: call it from a thread
/// that is not an async worker.
///
/// # Errors
/// As [`PushError`] says.
pub fn push(
    path: &Path,
    target: &SourceRef,
    options: &RegistryOptions,
) -> Result<SourceRef, PushError> {
    if target.tag.is_none() || target.digest.is_some() {
        return Err(PushError::NoTag(target.to_string()));
    }
    let bytes =
        crate::fs::read_file(path, options.max_blob_bytes).map_err(|source| PushError::Read {
            path: path.to_owned(),
            source,
        })?;
    let (mut config, layer) =
        WasmConfig::from_raw_component(bytes, None).map_err(|e| PushError::NotAComponent {
            path: path.to_owned(),
            reason: format!("{e:#}"),
        })?;
    config.created = chrono::DateTime::UNIX_EPOCH;
    let options = options.clone();
    let target = target.clone();
    let pinned = on_own_runtime(async move {
        let fail = |e: OciDistributionError| classify(&target.registry, e);
        let client = client(&options)?;
        let reference = target.oci();
        let auth = credentials(&target.registry);
        client
            .auth(&reference, &auth, RegistryOperation::Push)
            .await
            .map_err(fail)?;
        let wasm = WasmClient::new(client.clone());
        let pushed = wasm.push(&reference, &auth, layer, config, None);
        let pushed = tokio::time::timeout(options.timeout, pushed)
            .await
            .map_err(|_| PullError::Timeout(options.timeout))?
            .map_err(|e| match e.downcast::<OciDistributionError>() {
                Ok(e) => fail(e),
                Err(e) => PullError::Registry {
                    registry: target.registry.clone(),
                    reason: format!("{e:#}"),
                },
            })?;
        // distribution answers with the manifest's URL by digest; else ask by tag.
        let by_url = pushed
            .manifest_url
            .rsplit('/')
            .next()
            .filter(|d| valid_digest(d))
            .map(str::to_owned);
        let digest = match by_url {
            Some(digest) => digest,
            None => client
                .fetch_manifest_digest(&reference, &auth)
                .await
                .map_err(fail)?,
        };
        Ok(target.pinned(&digest))
    })?;
    Ok(pinned)
}
