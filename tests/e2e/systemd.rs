//! `contrib/vvm-host.service`: the restart policy the exit codes rely on, and that systemd
//! accepts the file.

use std::process::Command;

use crate::BIN;

const UNIT: &str = include_str!("../../contrib/vvm-host.service");

/// The values of `key=` in the unit, in order (blank values reset a list in systemd).
fn values(key: &str) -> Vec<&'static str> {
    UNIT.lines()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .collect()
}

/// Exit 75 (the killer) and a crash (a signal) restart the host; a clean stop (exit 0) does
/// not. `Restart=on-failure` restarts on a non-zero exit status not listed as a success and on
/// an unclean signal; it never restarts after exit 0 or a `systemctl stop`.
#[test]
fn the_unit_restarts_on_the_killer_and_crashes_but_not_after_a_clean_stop() {
    assert_eq!(values("Restart"), ["on-failure"]);
    let killer = vvm_host::killer::KILLER_EXIT_CODE.to_string();
    for key in ["RestartPreventExitStatus", "SuccessExitStatus"] {
        for listed in values(key) {
            assert!(
                !listed.split_whitespace().any(|code| code == killer),
                "{key}={listed} would stop the killer's exit from restarting the host"
            );
        }
    }
    let exec = values("ExecStart");
    assert!(
        exec.len() == 1 && exec[0].contains("vvm-host serve"),
        "{exec:?}"
    );
    // No option forbidding executable memory: wasmtime maps the code it compiles.
    assert!(values("MemoryDenyWriteExecute").is_empty());
}

/// `systemd-analyze verify` (when installed) accepts the unit without a warning, with
/// `ExecStart` pointed at the binary under test (verify checks that it is executable).
#[test]
fn systemd_analyze_verify_accepts_the_unit() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("systemd-analyze is not installed: not verified");
        return;
    }
    let dir = testkit::scratch::scratch_dir();
    let path = dir.path().join("vvm-host.service");
    std::fs::write(&path, UNIT.replace("/usr/local/bin/vvm-host", BIN)).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        !stderr.contains("vvm-host.service"),
        "warnings about the unit: {stderr}"
    );
}
