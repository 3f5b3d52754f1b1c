//! Guest state and configuration under the real `vvm-host serve` (SPEC §10): the Rust example
//! `rust-counter` reads its `[service.NAME.config]` (plain, from the environment, from a file)
//! through `wasi:config` and counts through `wasi:keyvalue`; `vvm-host kv` shows what it stored; and
//! no secret reaches the log at `trace`, nor `status`.
//!
//! `trace` for everything but the compiler and wasmtime's engine internals (type registry,
//! code memory): their lines are about machine code and never see a configuration value.
//! Even so, a loaded machine's reader can fall behind at trace and the host then drops lines,
//! so the trace run waits for the guest's writes in the store, never for a line.

use std::path::Path;
use std::process::Command;

use rustix::process::Signal;
use testkit::guests;
use testkit::host::Host;

use crate::BIN;

/// `RUST_LOG` for these tests.
const TRACE: &str =
    "trace,cranelift_codegen=info,cranelift_frontend=info,regalloc2=info,wasmtime::runtime=info";
const ENV_SECRET: &str = "env-secret-7f3a9c";
const FILE_SECRET: &str = "file-secret-b81d44";

/// Runs `vvm-host ARGS` in `dir`; its stdout, or a panic with its stderr.
fn tool(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .env("RUST_LOG", TRACE)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?}: {stderr}");
    assert!(!stderr.contains(ENV_SECRET) && !stderr.contains(FILE_SECRET));
    String::from_utf8(out.stdout).unwrap()
}

/// Starts `vvm-host serve` in `dir` with `VVM_E2E_TOKEN` set to the secret, at `rust_log`.
fn serve(dir: &Path, name: &'static str, rust_log: &str) -> Host {
    let token = format!("VVM_E2E_TOKEN={ENV_SECRET}");
    // Through env(1), which execs: the pid is vvm-host's.
    let args = [
        &token,
        BIN,
        "serve",
        "--lease",
        "5s",
        "--grace-period",
        "2s",
    ];
    Host::start("/usr/bin/env", name, dir, &args, rust_log)
}

/// The count `rust-counter` stored, read with `vvm-host kv get` (0 before its first write).
fn stored_count(dir: &Path) -> u64 {
    let out = Command::new(BIN)
        .args(["kv", "get", "rust-counter", "count"])
        .current_dir(dir)
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).parse().unwrap_or(0)
}

#[test]
fn a_guest_reads_its_config_and_no_secret_reaches_the_log_at_trace() {
    let dir = testkit::scratch::scratch_dir();
    let services = dir.path().join("services");
    std::fs::create_dir(&services).unwrap();
    std::fs::copy(
        guests::guest("rust-counter"),
        services.join("rust-counter.wasm"),
    )
    .unwrap();
    std::fs::write(dir.path().join("secret.txt"), FILE_SECRET).unwrap();
    std::fs::write(
        dir.path().join("vvm.toml"),
        "[service.rust-counter]\nenv = [\"TICK_MS=50\"]\n\
         [service.rust-counter.config]\ngreeting = \"hello from vvm.toml\"\n\
         token = { env = \"VVM_E2E_TOKEN\" }\nkey = { file = \"secret.txt\" }\n",
    )
    .unwrap();

    // At info, where no line is dropped: the guest got all three values.
    let mut host = serve(dir.path(), "info", "info");
    host.wait_for(&["rust-counter", "counter started", "; hello from vvm.toml"]);
    host.wait_for(&["rust-counter", "config keys: [greeting, key, token]"]);
    host.wait_for(&["rust-counter", "count 3"]);
    // An operator looks, read-only, while the host serves.
    let listed: serde_json::Value =
        serde_json::from_str(&tool(dir.path(), &["kv", "list", "rust-counter", "--json"])).unwrap();
    assert_eq!(listed["keys"], serde_json::json!(["count"]), "{listed}");
    assert_eq!(listed["usage"]["keys"], 1, "{listed}");
    assert!(stored_count(dir.path()) >= 3);
    let status = tool(dir.path(), &["status", "--json"]);
    host.signal(Signal::TERM);
    assert!(host.wait_exit().success());
    let mut lines: Vec<String> = host.lines().into_iter().map(|l| l.text).collect();

    // At trace, whose volume may cost lines (the writer drops what finds no room): wait for
    // the counter's writes in the store, not for a line.
    let before = stored_count(dir.path());
    let mut host = serve(dir.path(), "trace", TRACE);
    let patience = std::time::Instant::now() + std::time::Duration::from_mins(1);
    while stored_count(dir.path()) < before + 3 {
        assert!(
            std::time::Instant::now() < patience,
            "the counter never counted on"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    host.signal(Signal::TERM);
    assert!(host.wait_exit().success());
    let traced = host.lines().into_iter().map(|l| l.text);
    lines.extend(traced);
    assert!(
        lines.iter().any(|l| l.contains(r#""level":"TRACE""#)),
        "the second run logged at trace"
    );

    for text in lines.iter().chain([&status]) {
        assert!(
            !text.contains(ENV_SECRET) && !text.contains(FILE_SECRET),
            "a secret in: {text}"
        );
    }
}
