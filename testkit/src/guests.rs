//! The guest components of `guest-examples/`, built once per test binary by
//! running `guest-examples/build.sh` (cargo makes that a quick no-op when nothing changed).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// `guest-examples/out`, after building every guest once in this process.
pub fn out_dir() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest-examples");
        let output = Command::new("bash")
            .arg(examples.join("build.sh"))
            // The host's target dir is for another target; build.sh uses its own.
            .env_remove("CARGO_TARGET_DIR")
            .output()
            .expect("run guest-examples/build.sh");
        assert!(
            output.status.success(),
            "guest-examples/build.sh failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        examples.join("out")
    })
}

/// The built guest `name` (`rust-ticker`, or `test/spin` for a test guest).
pub fn guest(name: &str) -> PathBuf {
    out_dir().join(format!("{name}.wasm"))
}

/// Copies guests into `dir` under new names: `(guest, service name)`.
pub fn install(dir: &Path, guests: &[(&str, &str)]) {
    for (guest_name, service) in guests {
        std::fs::copy(guest(guest_name), dir.join(format!("{service}.wasm")))
            .unwrap_or_else(|e| panic!("copy guest {guest_name}: {e}"));
    }
}
