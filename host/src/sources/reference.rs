//! A registry source's reference (SPEC §13, "Components by digest"):
//! `oci://REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST]`, parsed and checked once, when the
//! settings are read, so that a typo is an error naming the service before anything is pulled.

use std::fmt;
use std::str::FromStr;

/// The scheme a registry source starts with.
pub const SCHEME: &str = "oci://";

/// `oci://REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST]`: where a service's component is pulled
/// from. A digest pins it (the digest is what runs); a tag alone is resolved to a digest at
/// each load.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SourceRef {
    /// The registry's host, and port if any: `ghcr.io`, `127.0.0.1:5000`.
    pub registry: String,
    /// The repository: `acme/hello`.
    pub repository: String,
    /// The tag, if one is named: `v1`.
    pub tag: Option<String>,
    /// The manifest digest, if one is named: `sha256:` and 64 lowercase hex digits.
    pub digest: Option<String>,
}

/// Why a source is not a valid reference; each names the part that is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReferenceError {
    /// It does not start with `oci://`.
    #[error("a registry source starts with oci:// (oci://REGISTRY/REPOSITORY@sha256:DIGEST)")]
    Scheme,
    /// No `/` after the registry, or an empty or invalid registry.
    #[error("no registry host before the repository (oci://REGISTRY/REPOSITORY@sha256:DIGEST)")]
    Registry,
    /// The repository is empty or has a character a registry does not take.
    #[error(
        "repository {0:?}: lowercase letters, digits and . _ - between slashes, not at either end"
    )]
    Repository(String),
    /// The tag is empty, too long or has a character a registry does not take.
    #[error("tag {0:?}: up to 128 letters, digits, _ . -, not starting with . or -")]
    Tag(String),
    /// The digest is not `sha256:` and 64 lowercase hex digits.
    #[error("digest {0:?}: sha256: and 64 lowercase hex digits")]
    Digest(String),
    /// Neither a tag nor a digest.
    #[error("no digest or tag: pin a digest (@sha256:...) or name a tag (:TAG)")]
    Unnamed,
}

impl SourceRef {
    /// Whether a digest pins it.
    pub fn is_pinned(&self) -> bool {
        self.digest.is_some()
    }

    /// The same reference pinned to `digest` (its tag kept, for reading).
    #[must_use]
    pub fn pinned(&self, digest: &str) -> Self {
        Self {
            digest: Some(digest.to_owned()),
            ..self.clone()
        }
    }

    /// oci-client's reference: by digest when there is one (the tag is then only a label).
    pub(crate) fn oci(&self) -> oci_client::Reference {
        let (registry, repository) = (self.registry.clone(), self.repository.clone());
        match (&self.tag, &self.digest) {
            (_, Some(digest)) => {
                oci_client::Reference::with_digest(registry, repository, digest.clone())
            }
            (Some(tag), None) => oci_client::Reference::with_tag(registry, repository, tag.clone()),
            (None, None) => oci_client::Reference::with_tag(registry, repository, "latest".into()),
        }
    }
}

impl fmt::Display for SourceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

impl FromStr for SourceRef {
    type Err = ReferenceError;

    fn from_str(text: &str) -> Result<Self, ReferenceError> {
        let rest = text.strip_prefix(SCHEME).ok_or(ReferenceError::Scheme)?;
        let (registry, rest) = rest.split_once('/').ok_or(ReferenceError::Registry)?;
        if !valid_registry(registry) {
            return Err(ReferenceError::Registry);
        }
        let (named, digest) = match rest.split_once('@') {
            Some((named, digest)) => (named, Some(digest)),
            None => (rest, None),
        };
        let (repository, tag) = match named.rsplit_once(':') {
            Some((repository, tag)) if !tag.contains('/') => (repository, Some(tag)),
            _ => (named, None),
        };
        if !valid_repository(repository) {
            return Err(ReferenceError::Repository(repository.to_owned()));
        }
        if let Some(tag) = tag.filter(|t| !valid_tag(t)) {
            return Err(ReferenceError::Tag(tag.to_owned()));
        }
        if let Some(digest) = digest.filter(|d| !valid_digest(d)) {
            return Err(ReferenceError::Digest(digest.to_owned()));
        }
        if tag.is_none() && digest.is_none() {
            return Err(ReferenceError::Unnamed);
        }
        Ok(Self {
            registry: registry.to_owned(),
            repository: repository.to_owned(),
            tag: tag.map(str::to_owned),
            digest: digest.map(str::to_owned),
        })
    }
}

/// A host name or address, with a port if any (`[::1]:5000` too).
fn valid_registry(registry: &str) -> bool {
    !registry.is_empty()
        && registry.len() <= 255
        && registry
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
}

/// The distribution spec's path components: `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`, `/`-joined.
fn valid_repository(repository: &str) -> bool {
    !repository.is_empty()
        && repository.len() <= 255
        && repository.split('/').all(|part| {
            let bytes = part.as_bytes();
            let edge = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
            bytes.first().is_some_and(edge)
                && bytes.last().is_some_and(edge)
                && bytes.iter().all(|b| edge(b) || b"._-".contains(b))
        })
}

/// `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`.
fn valid_tag(tag: &str) -> bool {
    let bytes = tag.as_bytes();
    let ok = |b: &u8| b.is_ascii_alphanumeric() || b"_.-".contains(b);
    (1..=128).contains(&bytes.len())
        && bytes
            .first()
            .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
        && bytes.iter().all(ok)
}

/// `sha256:` and 64 lowercase hex digits: the only algorithm taken, so that a service's
/// digest is comparable with the SHA-256 of a file.
pub(crate) fn valid_digest(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn a_digest_a_tag_or_both_are_taken_and_shown_as_written() {
        for text in [
            format!("oci://127.0.0.1:5000/acme/hello@{D}"),
            "oci://ghcr.io/acme/hello:v1".to_owned(),
            format!("oci://ghcr.io/acme/hello:v1.2-rc_3@{D}"),
            format!("oci://[::1]:5000/hello@{D}"),
        ] {
            let r: SourceRef = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(r.to_string(), text);
        }
        let r: SourceRef = format!("oci://localhost:5000/a/b:v1@{D}").parse().unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str()),
            ("localhost:5000", "a/b")
        );
        assert_eq!(
            (r.tag.as_deref(), r.digest.as_deref()),
            (Some("v1"), Some(D))
        );
        assert!(r.is_pinned());
        assert_eq!(r.oci().digest(), Some(D));
    }

    #[test]
    fn a_bad_reference_names_the_part_that_is_wrong() {
        let err = |text: &str| text.parse::<SourceRef>().unwrap_err();
        assert_eq!(err("ghcr.io/acme/hello:v1"), ReferenceError::Scheme);
        assert_eq!(err("oci://hello:v1"), ReferenceError::Registry);
        assert_eq!(err("oci:///hello:v1"), ReferenceError::Registry);
        assert_eq!(
            err("oci://ghcr.io/Acme/hello:v1"),
            ReferenceError::Repository("Acme/hello".into())
        );
        assert_eq!(
            err("oci://ghcr.io/acme//hello:v1"),
            ReferenceError::Repository("acme//hello".into())
        );
        assert_eq!(
            err("oci://ghcr.io/acme/hello:-v1"),
            ReferenceError::Tag("-v1".into())
        );
        assert_eq!(
            err("oci://ghcr.io/acme/hello@sha256:abc"),
            ReferenceError::Digest("sha256:abc".into())
        );
        assert_eq!(
            err(&format!(
                "oci://ghcr.io/acme/hello@{}",
                D.to_uppercase().replace("SHA", "sha")
            )),
            ReferenceError::Digest(D.to_uppercase().replace("SHA", "sha"))
        );
        assert_eq!(err("oci://ghcr.io/acme/hello"), ReferenceError::Unnamed);
        assert_eq!(
            err("oci://ghcr.io/acme/hello\n:v1"),
            ReferenceError::Repository("acme/hello\n".into())
        );
    }

    #[test]
    fn pinning_keeps_the_tag_for_reading() {
        let r: SourceRef = "oci://ghcr.io/acme/hello:v1".parse().unwrap();
        assert!(!r.is_pinned());
        assert_eq!(
            r.pinned(D).to_string(),
            format!("oci://ghcr.io/acme/hello:v1@{D}")
        );
    }
}
