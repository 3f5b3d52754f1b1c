//! Why a registry source could not be pulled or pushed (SPEC §13), in words for a user: the
//! registry's and the client's errors sorted into the reasons an operator acts on (unreachable,
//! refused, not found, digest mismatch, not a component, too large), each with what to do.
//! No message carries a credential.

use std::path::PathBuf;
use std::time::Duration;

use oci_client::errors::{OciDistributionError, OciErrorCode};

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
    pub(crate) fn is_transient(&self) -> bool {
        matches!(self, Self::Unreachable { .. })
            || matches!(self, Self::Registry { reason, .. } if reason.starts_with("server error 5"))
    }
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
