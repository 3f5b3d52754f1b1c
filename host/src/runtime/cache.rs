//! The on-disk compile cache (SPEC §6, §9): components compiled once, kept as
//! `<sha-256 of engine and file digest>.cwasm` files that any host on the machine maps instead of
//! compiling again, written so that a crash or a power loss never leaves a name for a partial
//! file, and pruned of what no host has used for a week.

use std::fmt::Write as _;
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// Where [`fetch`] found a component.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum From {
    /// Mapped from a cache entry.
    Cache,
    /// Compiled now (and written to the cache, if it could be).
    Compiled,
}

/// The compiled component for `bytes` (whose SHA-256 is `digest`), from the cache in `dir` if
/// it is there (else compiled and written there), and where it came from.
pub(crate) fn fetch(
    engine: &Engine,
    dir: &Path,
    bytes: &[u8],
    digest: &[u8; 32],
) -> wasmtime::Result<(Component, From)> {
    let cached = entry(engine, dir, digest);
    if cached.is_file() {
        // SAFETY: `deserialize_file` trusts the file to be the output of
        // `Component::serialize` for a compatible engine. The cache directory is written
        // only by this function (under a name that includes the hash of the engine's
        // compatibility configuration and of the source bytes), with a temporary file
        // flushed to disk and then renamed into place (`write_cache`), so a file at this
        // name is a complete serialization of these bytes by an engine like this one,
        // also after a crash or a power loss. wasmtime still checks the header and
        // engine compatibility; what it cannot check is deliberate tampering, and the
        // cache directory must be as trusted as the services directory itself. The file
        // is memory-mapped for the component's life: entries are only ever replaced by
        // rename (a new inode), never rewritten in place, so the mapping stays valid.
        #[allow(unsafe_code)]
        let loaded = unsafe { Component::deserialize_file(engine, &cached) };
        match loaded {
            Ok(component) => {
                // Used now: kept for another `CACHE_KEEP` (`prune_cache`). Its time only;
                // the mapped contents are not touched.
                let _ = std::fs::File::options()
                    .write(true)
                    .open(&cached)
                    .and_then(|f| f.set_modified(std::time::SystemTime::now()));
                return Ok((component, From::Cache));
            }
            Err(e) => tracing::warn!(
                path = %cached.display(), error = %format!("{e:#}"),
                "unusable compile cache entry; compiling again"
            ),
        }
    }
    let component = Component::new(engine, bytes)?;
    if let Err(e) = write_cache(&component, &cached) {
        tracing::warn!(path = %cached.display(), error = %e, "cannot write compile cache");
    }
    Ok((component, From::Compiled))
}

/// Whether `dir` has the component whose SHA-256 is `digest` compiled for `engine`.
pub(crate) fn cached(engine: &Engine, dir: &Path, digest: &[u8; 32]) -> bool {
    entry(engine, dir, digest).is_file()
}

/// The cache entry in `dir` of the component whose SHA-256 is `digest`, for `engine`.
fn entry(engine: &Engine, dir: &Path, digest: &[u8; 32]) -> std::path::PathBuf {
    dir.join(format!("{}.cwasm", key(engine, digest)))
}

/// Hex SHA-256 of the engine's compatibility hash and the component's SHA-256.
fn key(engine: &Engine, digest: &[u8; 32]) -> String {
    let mut hasher = ShaHasher(Sha256::new());
    engine.precompile_compatibility_hash().hash(&mut hasher);
    hasher.0.update(digest);
    hex(&hasher.0.finalize())
}

/// `bytes` in lower-case hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut hex, b| {
        let _ = write!(hex, "{b:02x}");
        hex
    })
}

/// Feeds `Hash` output into SHA-256, for a digest that is stable across processes.
struct ShaHasher(Sha256);

impl Hasher for ShaHasher {
    fn finish(&self) -> u64 {
        0
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

/// How long a compile cache entry that no host has used is kept. Entries are keyed by a
/// component's bytes and the engine, so each new version of a service, and each upgrade of
/// vvm-host, leaves the old ones unused for good.
const CACHE_KEEP: Duration = Duration::from_hours(7 * 24);
/// How long a cache write's temporary file may stand: one left by a process that died in the
/// middle of a write is removed after this.
const TEMPORARY_KEEP: Duration = Duration::from_hours(1);

/// Removes from the compile cache `dir` the entries no host has used (loaded, or written) for
/// [`CACHE_KEEP`], and temporary files older than an hour. Only names this module writes are
/// touched, so a cache directory shared by hosts, or pointed at a directory holding other
/// files, loses nothing else; an entry another host still has mapped stays readable to it.
/// Best effort: what cannot be read or removed stays.
pub(crate) fn prune_cache(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let now = std::time::SystemTime::now();
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(keep) = name.to_str().and_then(cache_file_keep) else {
            continue;
        };
        let unused = entry
            .metadata()
            .ok()
            .filter(std::fs::Metadata::is_file)
            .and_then(|meta| meta.modified().ok())
            .and_then(|modified| now.duration_since(modified).ok());
        if unused.is_some_and(|unused| unused > keep) && std::fs::remove_file(entry.path()).is_ok()
        {
            removed += 1;
        }
    }
    if removed > 0 {
        tracing::info!(dir = %dir.display(), removed, "unused compile cache entries removed");
    }
}

/// How long a file named `name` in the cache may go unused, if it is one this module writes:
/// `<sha-256 hex>.cwasm`, or `<sha-256 hex>.tmp<pid>` while being written.
fn cache_file_keep(name: &str) -> Option<Duration> {
    let (key, extension) = name.split_once('.')?;
    if key.len() != 64 || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    if extension == "cwasm" {
        return Some(CACHE_KEEP);
    }
    let pid = extension.strip_prefix("tmp")?;
    (!pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())).then_some(TEMPORARY_KEEP)
}

fn write_cache(component: &Component, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    use std::io::Write as _;
    let bytes = component.serialize().map_err(|e| format!("{e:#}"))?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let written = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(&bytes)?;
        // On disk before it has its name: after a power loss the name must not stand for a
        // file whose blocks were never written (see the SAFETY note in `fetch`).
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        // A full disk, say: no half-written file left behind for each try.
        let _ = std::fs::remove_file(&tmp);
    }
    Ok(written?)
}
