//! The content-addressed cache of pulled components (SPEC §13, "Components by digest"):
//! `<cache-dir>/oci/sha256/<hex>`, beside the compile cache, holds each manifest and each
//! component layer pulled, named by the SHA-256 of its bytes. Every read hashes what it read
//! and takes it only if it matches its name, so a damaged or planted file is never run; a
//! pinned digest already here starts with the registry down.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

/// The cache's directory under the compile cache's.
pub const DIR_NAME: &str = "oci";

/// A content-addressed directory of blobs, by `sha256:` digest.
#[derive(Clone, Debug)]
pub struct BlobCache {
    dir: PathBuf,
}

/// The hex SHA-256 of `bytes`, as a digest: `sha256:<hex>`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(bytes)))
}

/// Lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

impl BlobCache {
    /// The cache under compile cache directory `cache_dir` (made when first written).
    pub fn beside(cache_dir: &Path) -> Self {
        Self {
            dir: cache_dir.join(DIR_NAME).join("sha256"),
        }
    }

    /// Where blob `digest` is kept; `None` for a digest that is not `sha256:` and 64 hex
    /// digits (no path is made from anything else).
    fn path(&self, digest: &str) -> Option<PathBuf> {
        super::reference::valid_digest(digest).then(|| self.dir.join(&digest["sha256:".len()..]))
    }

    /// Blob `digest`, if it is here and its bytes hash to it, at most `max` bytes. A file
    /// that does not match is removed (and said), as if it were not there.
    pub fn get(&self, digest: &str, max: u64) -> Option<Vec<u8>> {
        let path = self.path(digest)?;
        let bytes = crate::fs::read_file(&path, max).ok()?;
        if sha256_digest(&bytes) == digest {
            return Some(bytes);
        }
        tracing::warn!(file = %path.display(), "a cached blob does not match its digest: removed");
        let _ = std::fs::remove_file(&path);
        None
    }

    /// Keeps `bytes` under their own digest, which it returns: written to a temporary file,
    /// synced, then renamed into place, so a reader never sees a part.
    ///
    /// # Errors
    /// When the directory cannot be made or the file cannot be written.
    pub fn put(&self, bytes: &[u8]) -> Result<String, std::io::Error> {
        let digest = sha256_digest(bytes);
        let path = self.dir.join(&digest["sha256:".len()..]);
        if path.is_file() {
            return Ok(digest);
        }
        std::fs::create_dir_all(&self.dir)?;
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let written = (|| {
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(bytes)?;
            file.sync_all()?;
            std::fs::rename(&tmp, &path)
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written.map(|()| digest)
    }

    /// The directory blobs are kept in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blob_is_kept_under_its_digest_and_read_back_only_if_it_matches() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = BlobCache::beside(tmp.path());
        assert_eq!(cache.get(&sha256_digest(b"x"), 10), None);
        let digest = cache.put(b"component").unwrap();
        assert_eq!(digest, sha256_digest(b"component"));
        assert_eq!(cache.get(&digest, 100).as_deref(), Some(&b"component"[..]));
        // Over the cap: not read.
        assert_eq!(cache.get(&digest, 3), None);
        // Damaged on disk: refused and removed.
        let path = cache.dir().join(&digest["sha256:".len()..]);
        std::fs::write(&path, b"planted").unwrap();
        assert_eq!(cache.get(&digest, 100), None);
        assert!(!path.exists());
    }

    #[test]
    fn no_path_is_made_from_a_digest_that_is_not_one() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = BlobCache::beside(tmp.path());
        assert_eq!(cache.get("sha256:../../etc/passwd", 100), None);
        assert_eq!(cache.get("md5:abc", 100), None);
    }
}
