//! Where a component's bytes come from when not from a file (SPEC §13, "Components by
//! digest"): an OCI registry, named by `[service.NAME] source = "oci://..."`. This module
//! hands the runtime bytes and the digest they were pulled by, so the runtime never learns
//! about registries.
//!
//! - `reference`: [`SourceRef`], `oci://REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST]`.
//! - `blobs`: [`BlobCache`], the content-addressed cache of what was pulled, beside the
//!   compile cache.
//! - `auth`: registry credentials, from Docker's configuration and credential helpers.
//! - `error`: [`PullError`], a registry's and the client's errors as a user reads them.
//! - `pull`: [`Puller`]: resolve, fetch, verify, bound, retry, cache.
//! - `push`: [`push`], `vvm-host push`: a component written in the CNCF Wasm layout.
//!
//! Dependencies point one way: `reference`, `blobs`, `auth`, `error`, `pull`, `push`.

mod auth;
mod blobs;
mod error;
mod pull;
mod push;
mod reference;

pub use blobs::{BlobCache, sha256_digest};
pub use error::PullError;
pub use pull::{DEFAULT_PULL_TIMEOUT, MAX_MANIFEST_BYTES, Pulled, Puller, RegistryOptions, StopFn};
pub use push::{PushError, push};
pub use reference::{ReferenceError, SCHEME, SourceRef};
