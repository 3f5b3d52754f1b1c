//! `vvm-host new` (issue 33) with the real binary: a project of each language and kind is made,
//! built by its own `./build.sh`, accepted by `vvm-host check` as its kind, and run by
//! `vvm-host serve`: a service greets from its configuration and counts in its key-value store;
//! an HTTP service answers its route with the fencing token and the status of the upstream it
//! calls; a scheduled service (issue 40), given the schedule `new` says to add to `vvm.toml`
//! (here every second), reports its fire time, term and run count at a fire time, and the run
//! ends `ok`.
//!
//! The Python and JavaScript builds use the toolchains `guest-examples/build.sh` installed (the
//! projects' build scripts take them from `VVM_COMPONENTIZE_PY` and `VVM_NODE_MODULES`), and
//! the Rust builds share a target folder that outlives the test, so a second run is quicker.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use rustix::process::Signal;
use testkit::guests;
use testkit::host::Host;
use testkit::http::{Behaviour, Server};

use crate::BIN;
use crate::incoming_http::{free_addr, get};

/// Each language and kind, with the world `vvm-host check` names for it.
const PROJECTS: [(&str, &str, &str); 9] = [
    ("rust", "service", "vvm:host/service"),
    ("rust", "http", "wasi:http/proxy"),
    ("rust", "schedule", "wasi:cli/command"),
    ("python", "service", "vvm:host/service"),
    ("python", "http", "wasi:http/proxy"),
    ("python", "schedule", "wasi:cli/command"),
    ("js", "service", "vvm:host/service"),
    ("js", "http", "wasi:http/proxy"),
    ("js", "schedule", "wasi:cli/command"),
];

/// The scheduled services' schedule here: every second, not the ten seconds `new` suggests.
const EVERY_SECOND: &str = "* * * * * *";

/// The upstream's status: not the handler's own 200, so that an answer shows it was called.
const UPSTREAM_STATUS: u16 = 202;

/// Runs `program` with `args` in `dir` with `env` added; its stdout, or a panic with its output.
fn run(program: &Path, args: &[&str], dir: &Path, env: &[(&str, PathBuf)]) -> String {
    let output = Command::new(program)
        .args(args)
        .current_dir(dir)
        .envs(env.iter().map(|(k, v)| (*k, v)))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{} {args:?} failed in {}:\n{stdout}{}",
        program.display(),
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// `vvm-host new` for each project in `dir`, then its `./build.sh`; copies the component into
/// `dir/services`.
fn make_and_build(dir: &Path) {
    let examples = guests::out_dir().parent().unwrap().to_owned();
    let env = [
        (
            "VVM_COMPONENTIZE_PY",
            examples.join(".venv/bin/componentize-py"),
        ),
        ("VVM_NODE_MODULES", examples.join("node_modules")),
        (
            "CARGO_TARGET_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("new-rust"),
        ),
    ];
    std::fs::create_dir(dir.join("services")).unwrap();
    for (lang, kind, _) in PROJECTS {
        let name = format!("new-{lang}-{kind}");
        let start = Instant::now();
        let args = ["new", "--lang", lang, "--kind", kind, &name];
        let said = run(Path::new(BIN), &args, dir, &[]);
        let next = format!("cd ./{name} && ./build.sh && cp {name}.wasm ../services/");
        assert!(said.contains(&next), "{said}");
        if kind == "schedule" {
            let toml = format!("    [service.{name}]\n    schedule = \"*/10 * * * * *\"\n");
            assert!(said.contains(&toml), "{said}");
        }
        let project = dir.join(&name);
        run(&project.join("build.sh"), &[], &project, &env);
        let wasm = format!("{name}.wasm");
        std::fs::copy(project.join(&wasm), dir.join("services").join(&wasm)).unwrap();
        println!("{name}: made and built in {:.1?}", start.elapsed());
    }
}

/// `vvm.toml`: a greeting for the services; for the HTTP services, `upstream` allowed and
/// configured as their `upstream-url`; for the scheduled services, a schedule.
fn config(upstream: &Server) -> String {
    let origin = format!("http://{}", upstream.addr());
    let mut toml = String::new();
    for (lang, kind, _) in PROJECTS {
        let name = format!("new-{lang}-{kind}");
        if kind == "http" {
            writeln!(toml, "[service.{name}]\nhttp = [\"{origin}\"]").unwrap();
            writeln!(
                toml,
                "[service.{name}.config]\nupstream-url = \"{origin}/up\""
            )
            .unwrap();
        } else if kind == "schedule" {
            writeln!(toml, "[service.{name}]\nschedule = \"{EVERY_SECOND}\"").unwrap();
        } else {
            writeln!(
                toml,
                "[service.{name}.config]\ngreeting = \"hi from vvm.toml\""
            )
            .unwrap();
        }
    }
    toml
}

/// The fire time of a log line's `fields`, in Unix seconds.
fn fire_time(fields: &serde_json::Value) -> Option<i64> {
    let at = humantime::parse_rfc3339(fields["fire_time"].as_str()?).ok()?;
    let secs = at.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs();
    i64::try_from(secs).ok()
}

#[test]
fn a_new_project_of_each_language_and_kind_builds_checks_and_runs() {
    let _heavy = crate::one_heavy_test_at_a_time();
    let dir = testkit::scratch::scratch_dir();
    make_and_build(dir.path());

    let start = Instant::now();
    let checked = run(Path::new(BIN), &["check", "services"], dir.path(), &[]);
    for (lang, kind, world) in PROJECTS {
        let line = format!("ok    new-{lang}-{kind} ({world})\n");
        assert!(checked.contains(&line), "{checked}");
    }
    println!("checked in {:.1?}", start.elapsed());

    let upstream = Server::start(Behaviour {
        status: UPSTREAM_STATUS,
        ..Behaviour::default()
    });
    std::fs::write(dir.path().join("vvm.toml"), config(&upstream)).unwrap();
    let addr = free_addr().to_string();
    // The compile cache is `services/.cache`, which `check` filled.
    let args = [
        "serve",
        "--lease",
        "5s",
        "--grace-period",
        "1s",
        "--http-addr",
        &addr,
    ];
    let start = Instant::now();
    let mut host = Host::start(BIN, "new", dir.path(), &args, "info");
    // Every HTTP service is routed before this line (the listener opens at the first one's).
    host.wait_for(&["services started"]);
    println!("serving in {:.1?}", start.elapsed());
    for (lang, kind, _) in PROJECTS {
        let name = format!("new-{lang}-{kind}");
        if kind == "http" {
            let (status, tokens, body) = get(addr.parse().unwrap(), &format!("/{name}/"));
            assert_eq!(
                (status, tokens),
                (200, vec!["1".to_owned()]),
                "{name}: {body}"
            );
            let answer = format!("hits 1 (term 1); upstream {UPSTREAM_STATUS}\n");
            assert_eq!(body, answer, "{name}");
        } else if kind == "schedule" {
            // Its first run prints its fire time, and then the host logs that run's end.
            let service = format!("\"service\":\"{name}\"");
            let report = "report for fire time ";
            let (at, said) = host.wait_for_from(0, &[&service, report, "(term 1): run 1\""]);
            let fire: Option<i64> = said.text.split(report).nth(1).and_then(|rest| {
                let digits = rest.split(' ').next()?;
                digits.parse().ok()
            });
            let (_, ended) = host.wait_for_from(at, &[&service, "scheduled run ended"]);
            let ended: serde_json::Value = serde_json::from_str(&ended.text).unwrap();
            let fields = &ended["fields"];
            assert_eq!(fields["outcome"], "ok", "{name}: {ended}");
            assert_eq!(fields["term"], 1, "{name}: {ended}");
            assert_eq!(
                fire_time(fields),
                fire,
                "{name}: {} then {ended}",
                said.text
            );
        } else {
            let service = format!("\"service\":\"{name}\"");
            host.wait_for(&[&service, "started, term 1: hi from vvm.toml"]);
            host.wait_for(&[&service, "count 2"]);
        }
    }
    // One call from each HTTP service, with the host's fencing token.
    let calls = upstream.wait_for_requests(3);
    assert_eq!(calls.len(), 3, "{calls:?}");
    for call in &calls {
        assert_eq!((call.method.as_str(), call.path.as_str()), ("GET", "/up"));
        assert_eq!(call.header("vvm-fencing-token"), Some("1"), "{call:?}");
    }
    // The services return when the lease's stop signal comes.
    host.signal(Signal::TERM);
    assert!(host.wait_exit().success());
    for (lang, _, _) in PROJECTS.iter().filter(|(_, kind, _)| *kind == "service") {
        let service = format!("\"service\":\"new-{lang}-service\"");
        host.wait_for(&[&service, "\"message\":\"stopping\""]);
    }
}
