//! Quiet tools (SPEC §8): `status` and `check` print their result on stdout and nothing else
//! unless `-v`; `status --json` for scripts; log colour only on a terminal, never with
//! `NO_COLOR`.

use std::path::Path;
use std::process::{Command, Output};

use rustix::process::Signal;

use crate::BIN;
use crate::serve;
use testkit::guests;
use testkit::host::cluster_dir;

/// Runs `vvm-host <args>` in `dir` as a script would: pipes, no `RUST_LOG`, text logs.
pub(crate) fn tool(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .env_remove("VVM_LOG_FORMAT")
        .env_remove("NO_COLOR")
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn status_prints_only_its_result_and_the_same_as_json() {
    let dir = cluster_dir();
    let mut host = serve("a", dir.path(), "20s");
    let leading = host.wait_for(&["leading"]);
    let v: serde_json::Value = serde_json::from_str(&leading.text).unwrap();
    let term = v["fields"]["term"].as_u64().unwrap();

    let out = tool(dir.path(), &["status", "--cluster-size", "2"]);
    assert!(out.status.success());
    assert_eq!(text(&out.stderr), "", "nothing but the result");
    let table = text(&out.stdout);
    assert_eq!(table.lines().count(), 3, "a header and two slots: {table}");

    let out = tool(dir.path(), &["status", "--cluster-size", "2", "--json"]);
    assert!(out.status.success());
    assert_eq!(text(&out.stderr), "");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let slots = json["slots"].as_array().unwrap();
    assert_eq!(slots.len(), 2, "{json}");
    assert_eq!(slots[0]["slot"], 1);
    assert_eq!(slots[0]["term"], term);
    let holder = slots[0]["holder"].as_str().unwrap();
    let row = table.lines().find(|l| l.starts_with("1 ")).unwrap();
    assert!(
        row.contains(holder) && row.contains(&format!(" {term} ")),
        "{table} vs {json}"
    );
    assert!(slots[0]["time_left_ms"].as_u64().unwrap() > 0);
    assert!(
        slots[1]["holder"].is_null() && slots[1]["term"].is_null(),
        "{json}"
    );

    // -v adds the log lines, on stderr; to a pipe they carry no colour codes.
    let out = tool(dir.path(), &["status", "-v"]);
    let logs = text(&out.stderr);
    assert!(logs.contains("INFO"), "{logs}");
    assert!(
        !out.stderr.contains(&0x1b),
        "ANSI codes in a pipe: {logs:?}"
    );

    host.signal(Signal::TERM);
    assert!(host.wait_exit().success());
}

#[test]
fn check_prints_each_error_once_on_stdout_and_nothing_on_stderr() {
    let dir = testkit::scratch::scratch_dir();
    let services = dir.path().join("services");
    std::fs::create_dir(&services).unwrap();
    std::fs::copy(guests::guest("rust-ticker"), services.join("ticker.wasm")).unwrap();
    std::fs::copy(
        guests::guest("test/truncated"),
        services.join("broken.wasm"),
    )
    .unwrap();
    let out = tool(dir.path(), &["check"]);
    assert!(!out.status.success());
    assert_eq!(text(&out.stderr), "", "nothing but the result");
    let stdout = text(&out.stdout);
    assert_eq!(stdout.matches("broken.wasm").count(), 1, "{stdout}");
    assert!(stdout.contains("1 ok, 1 bad"), "{stdout}");

    let out = tool(dir.path(), &["check", "-v"]);
    assert!(text(&out.stderr).contains("service rejected"));
    assert!(!out.stderr.contains(&0x1b), "ANSI codes in a pipe");
}

/// On a terminal (a pty, through util-linux `script`) log lines are coloured, unless
/// `NO_COLOR` is set.
#[test]
fn log_colour_only_on_a_terminal_and_never_with_no_color() {
    let dir = testkit::scratch::scratch_dir();
    std::fs::create_dir(dir.path().join("services")).unwrap();
    let on_a_terminal = |no_color: Option<&str>| {
        let mut command = Command::new("script");
        command
            .args(["-qec", &format!("{BIN} check -v"), "/dev/null"])
            .current_dir(dir.path())
            .env_remove("RUST_LOG")
            .env_remove("VVM_LOG_FORMAT")
            .env_remove("NO_COLOR");
        if let Some(v) = no_color {
            command.env("NO_COLOR", v);
        }
        let out = command.output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stdout));
        assert!(
            text(&out.stdout).contains("0 ok, 0 bad"),
            "{}",
            text(&out.stdout)
        );
        out.stdout.contains(&0x1b)
    };
    assert!(on_a_terminal(None), "a terminal gets colour");
    assert!(!on_a_terminal(Some("1")), "NO_COLOR is honoured");
}
